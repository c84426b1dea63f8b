package raftnode

import (
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

// BenchmarkGroupsAppend: N Raft groups each append one ~100-byte entry per
// durable (fsynced) write, all at once, through one shared store (pebble
// commits concurrent batches as one WAL write and one fsync) against N
// separate stores (one fsync each). One op is one durable append of one
// group; compare ns/op of shared and separate at the same N.
//
//	go test -run '^$' -bench BenchmarkGroupsAppend -benchtime 2000x ./internal/raftnode/
func BenchmarkGroupsAppend(b *testing.B) {
	for _, n := range []int{1, 4, 16, 64} {
		for _, shared := range []bool{true, false} {
			name := "separate"
			if shared {
				name = "shared"
			}
			b.Run(fmt.Sprintf("%s/groups=%d", name, n), func(b *testing.B) {
				benchGroups(b, n, shared)
			})
		}
	}
}

func benchGroups(b *testing.B, groups int, shared bool) {
	dir := b.TempDir()
	stores := make([]*multiStore, groups)
	for g := range groups {
		if shared && g > 0 {
			stores[g] = stores[0]
			continue
		}
		s, err := openMultiStore(filepath.Join(dir, fmt.Sprint(g)))
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		stores[g] = s
	}
	data := make([]byte, 100)
	per := b.N/groups + 1
	b.ResetTimer()
	var wg sync.WaitGroup
	errs := make(chan error, groups)
	for g := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, group := stores[g], uint64(g+1)
			for i := range per {
				idx := uint64(i + 1)
				e := raftpb.Entry{Term: 1, Index: idx, Type: raftpb.EntryNormal, Data: data}
				if err := s.Save(group, raftpb.HardState{Term: 1, Commit: idx}, []raftpb.Entry{e}, raftpb.Snapshot{}, true); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	b.ReportMetric(float64(per*groups)/b.Elapsed().Seconds(), "appends/s")
}
