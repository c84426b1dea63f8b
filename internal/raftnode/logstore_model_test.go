package raftnode

import (
	"bytes"
	"fmt"
	"math/rand"
	"os"
	"testing"

	"github.com/hashicorp/raft"
)

// TestLogStoreMatchesModel drives each log store kind with the operation mix a
// Raft node under faults produces — appends, tail truncations (a follower
// dropping a conflicting suffix), head compactions, clearing everything
// (after installing a snapshot) and reopening (a restart) — and checks every
// read against an in-memory model. A store that returns a stale entry for a
// rewritten index would make replicas apply different commands.
func TestLogStoreMatchesModel(t *testing.T) {
	for _, kind := range logStoreKinds {
		t.Run(string(kind), func(t *testing.T) {
			seed := seedFromEnv()
			rng := rand.New(rand.NewSource(seed))
			dir := t.TempDir()
			store, closeFn, err := OpenLogStore(kind, dir)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = closeFn() }()

			model := map[uint64]*raft.Log{}
			var first, last uint64
			term := uint64(1)
			gen := 0
			entry := func(i uint64) *raft.Log {
				gen++
				return &raft.Log{Index: i, Term: term, Type: raft.LogCommand,
					Data: []byte(fmt.Sprintf("t%d-i%d-g%d-%s", term, i, gen, bytes.Repeat([]byte{'x'}, rng.Intn(300))))}
			}
			check := func(op string, all bool) {
				t.Helper()
				f, err := store.FirstIndex()
				if err != nil {
					t.Fatalf("after %s: FirstIndex: %v", op, err)
				}
				l, err := store.LastIndex()
				if err != nil {
					t.Fatalf("after %s: LastIndex: %v", op, err)
				}
				if f != first || l != last {
					t.Fatalf("after %s: store has [%d,%d], model [%d,%d]", op, f, l, first, last)
				}
				if last == 0 {
					return
				}
				idxs := []uint64{first, last}
				if all {
					idxs = idxs[:0]
					for i := first; i <= last; i++ {
						idxs = append(idxs, i)
					}
				} else {
					for k := 0; k < 8; k++ {
						idxs = append(idxs, first+uint64(rng.Int63n(int64(last-first+1))))
					}
				}
				for _, i := range idxs {
					var got raft.Log
					if err := store.GetLog(i, &got); err != nil {
						t.Fatalf("after %s: GetLog(%d) in [%d,%d]: %v", op, i, first, last, err)
					}
					want := model[i]
					if got.Index != want.Index || got.Term != want.Term || !bytes.Equal(got.Data, want.Data) {
						t.Fatalf("after %s: GetLog(%d) = term %d %q, want term %d %q", op, i, got.Term, got.Data, want.Term, want.Data)
					}
				}
			}
			for step := 0; step < 3000; step++ {
				var op string
				switch r := rng.Intn(100); {
				case r < 55 || last == 0: // append a batch
					n := 1 + rng.Intn(40)
					start := last + 1
					if last == 0 && first == 0 {
						start = 1
					} else if last == 0 {
						start = first
					}
					var batch []*raft.Log
					for i := start; i < start+uint64(n); i++ {
						e := entry(i)
						batch = append(batch, e)
						model[i] = e
					}
					if err := store.StoreLogs(batch); err != nil {
						t.Fatalf("step %d: StoreLogs [%d,%d]: %v", step, start, start+uint64(n)-1, err)
					}
					if first == 0 || last == 0 {
						first = start
					}
					last = start + uint64(n) - 1
					op = fmt.Sprintf("append [%d,%d]", start, last)
				case r < 75: // truncate a suffix (conflict), new term
					if last <= first {
						continue
					}
					from := first + 1 + uint64(rng.Int63n(int64(last-first)))
					if err := store.DeleteRange(from, last); err != nil {
						t.Fatalf("step %d: DeleteRange(%d,%d): %v", step, from, last, err)
					}
					for i := from; i <= last; i++ {
						delete(model, i)
					}
					op = fmt.Sprintf("truncate tail [%d,%d]", from, last)
					last = from - 1
					term++
				case r < 85: // compact a prefix (snapshot taken)
					if last <= first+10 {
						continue
					}
					to := first + uint64(rng.Int63n(int64(last-first-5)))
					if err := store.DeleteRange(first, to); err != nil {
						t.Fatalf("step %d: DeleteRange(%d,%d): %v", step, first, to, err)
					}
					for i := first; i <= to; i++ {
						delete(model, i)
					}
					op = fmt.Sprintf("compact head [%d,%d]", first, to)
					first = to + 1
				case r < 88: // install a snapshot: drop everything, continue after it
					if last == 0 {
						continue
					}
					if err := store.DeleteRange(first, last); err != nil {
						t.Fatalf("step %d: DeleteRange all (%d,%d): %v", step, first, last, err)
					}
					for i := first; i <= last; i++ {
						delete(model, i)
					}
					op = fmt.Sprintf("clear [%d,%d]", first, last)
					first = last + uint64(1+rng.Intn(100))
					last = 0
				default: // restart
					if err := closeFn(); err != nil {
						t.Fatalf("step %d: close: %v", step, err)
					}
					store, closeFn, err = OpenLogStore(kind, dir)
					if err != nil {
						t.Fatalf("step %d: reopen: %v", step, err)
					}
					op = "reopen"
				}
				if last == 0 {
					// An empty store reports 0 for both ends.
					savedFirst := first
					first = 0
					check(op, false)
					first = savedFirst
					continue
				}
				check(op, op == "reopen" || step%50 == 0)
			}
		})
	}
}

func seedFromEnv() int64 {
	var s int64 = 1
	fmt.Sscan(os.Getenv("DLOCK_LOGSTORE_SEED"), &s)
	return s
}
