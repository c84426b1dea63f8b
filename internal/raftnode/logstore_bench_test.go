// Benchmarks for the durable log stores under dlock's write pattern: small
// commands appended in small batches, each batch fsynced, on the real disk.

package raftnode

import (
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// benchCommand is shaped like an encoded dlock acquire command (~100 bytes):
// the payload size, not its content, is what the stores are sensitive to.
var benchCommand = []byte(`{"op":"acquire","lock":"orders/region-eu/shard-0042","owner":"worker-7f3a9c","ttl_ms":15000,"fence":0}`)

func openBenchStore(b *testing.B, kind LogStoreKind) LogAndStableStore {
	b.Helper()
	// b.TempDir is under /tmp, which is on the real disk on the benchmark
	// machine (not tmpfs); fsync cost is the point of the measurement.
	store, closeFn, err := OpenLogStore(kind, b.TempDir())
	if err != nil {
		b.Fatalf("open %s store: %v", kind, err)
	}
	// As under a running node: the durable mark is written in the background.
	checked(store).mark.start(func(err error) { b.Errorf("durable mark: %v", err) })
	b.Cleanup(func() {
		if err := closeFn(); err != nil {
			b.Errorf("close %s store: %v", kind, err)
		}
	})
	return store
}

// newBatch returns n log entries sharing one payload; the stores copy or
// encode entries inside StoreLogs, so reusing them across calls is safe.
func newBatch(n int) []*raft.Log {
	batch := make([]*raft.Log, n)
	now := time.Now()
	for i := range batch {
		batch[i] = &raft.Log{Term: 1, Type: raft.LogCommand, Data: benchCommand, AppendedAt: now}
	}
	return batch
}

func BenchmarkLogStore(b *testing.B) {
	for _, kind := range logStoreKinds {
		for _, size := range []int{1, 16, 64} {
			b.Run(fmt.Sprintf("%s/batch=%d", kind, size), func(b *testing.B) {
				store := openBenchStore(b, kind)
				batch := newBatch(size)
				next := uint64(1)
				var ops int
				for b.Loop() {
					for _, l := range batch {
						l.Index = next
						next++
					}
					if err := store.StoreLogs(batch); err != nil {
						b.Fatalf("StoreLogs: %v", err)
					}
					ops++
				}
				b.ReportMetric(float64(ops*size)/b.Elapsed().Seconds(), "entries/s")
			})
		}
	}
}

// BenchmarkLogStoreGetLog reads recent entries, as a leader does when
// replicating to a follower that is slightly behind (raft's LogCache in
// front of the store absorbs only the most recent few).
func BenchmarkLogStoreGetLog(b *testing.B) {
	const stored, recent = 20_000, 1_000
	for _, kind := range logStoreKinds {
		b.Run(string(kind), func(b *testing.B) {
			store := openBenchStore(b, kind)
			batch := newBatch(64)
			for next := uint64(1); next <= stored; {
				for _, l := range batch {
					l.Index = next
					next++
				}
				if err := store.StoreLogs(batch); err != nil {
					b.Fatalf("StoreLogs: %v", err)
				}
			}
			last, err := store.LastIndex()
			if err != nil {
				b.Fatalf("LastIndex: %v", err)
			}
			var l raft.Log
			i := uint64(0)
			for b.Loop() {
				idx := last - i%recent
				i++
				if err := store.GetLog(idx, &l); err != nil {
					b.Fatalf("GetLog(%d): %v", idx, err)
				}
			}
		})
	}
}
