package state

// Micro-benchmarks of the state machine's apply path, so regressions show in
// review: `go test -run '^$' -bench . -benchmem ./internal/state`. Each applies
// commands the way the FSM does (Apply, then TakeEvents), with increasing log
// index and leader timestamp; the "Decoded" variants include decoding the log
// entry, as fsm.ApplyBatch does for every entry.

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/dlock/dlock/internal/command"
)

// benchLease is a deterministic lease id for benchmarks.
func benchLease(n int) command.LeaseID {
	var id command.LeaseID
	id[0] = 0xBE
	id[1], id[2], id[3], id[4] = byte(n>>24), byte(n>>16), byte(n>>8), byte(n)
	for i := 5; i < 16; i++ {
		id[i] = byte(n*13 + i)
	}
	return id
}

// benchState applies envelopes with increasing index and timestamp.
type benchState struct {
	s   *State
	idx uint64
	ts  int64
}

func newBenchState() *benchState { return &benchState{s: New(), ts: 1_700_000_000_000} }

func (b *benchState) apply(tb testing.TB, client, reqID string, body command.Body) command.Result {
	b.idx++
	b.ts++
	r := b.s.Apply(b.idx, &command.Envelope{TS: b.ts, ClientID: client, RequestID: reqID, Body: body})
	b.s.TakeEvents()
	return r
}

func (b *benchState) must(tb testing.TB, r command.Result, want command.Status) command.Result {
	if r.Status != want {
		tb.Fatalf("status %v (%s), want %v", r.Status, r.Message, want)
	}
	return r
}

// hold puts n held locks (each with its own lease) into the state.
func (b *benchState) hold(tb testing.TB, n int) {
	for i := range n {
		b.must(tb, b.apply(tb, fmt.Sprintf("holder-%d", i), "", &command.Acquire{Name: fmt.Sprintf("held/%d", i), LeaseID: benchLease(1<<30 + i), TTLms: 60_000}), command.StatusOK)
	}
}

// BenchmarkApplyAcquireRelease is the uncontended cycle: acquire with ttl_ms
// (a new implicit lease) and release, with 0 or 100,000 other locks held.
func BenchmarkApplyAcquireRelease(b *testing.B) {
	for _, held := range []int{0, 100_000} {
		b.Run(fmt.Sprintf("held=%d", held), func(b *testing.B) {
			st := newBenchState()
			st.hold(b, held)
			names := make([]string, 64)
			for i := range names {
				names[i] = fmt.Sprintf("bench/worker-%d", i)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				name := names[i%len(names)]
				r := st.must(b, st.apply(b, "w", "", &command.Acquire{Name: name, LeaseID: benchLease(i), TTLms: 10_000}), command.StatusOK)
				st.must(b, st.apply(b, "w", "", &command.Release{Name: name, LeaseID: r.LeaseID, Token: r.Token}), command.StatusOK)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
		})
	}
}

// BenchmarkApplyAcquireReleaseDecoded is the same cycle from encoded log
// entries, with request ids (so the dedup table, full after 100,000 entries,
// is part of the cost), as every HTTP request through the client carries.
func BenchmarkApplyAcquireReleaseDecoded(b *testing.B) {
	st := newBenchState()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		st.idx++
		st.ts++
		acq := command.Encode(&command.Envelope{TS: st.ts, ClientID: "w", RequestID: fmt.Sprintf("a%d", i),
			Body: &command.Acquire{Name: "bench/lock", LeaseID: benchLease(i), TTLms: 10_000}})
		e, err := command.Decode(acq)
		if err != nil {
			b.Fatal(err)
		}
		r := st.must(b, st.s.Apply(st.idx, e), command.StatusOK)
		st.s.TakeEvents()
		st.idx++
		st.ts++
		rel := command.Encode(&command.Envelope{TS: st.ts, ClientID: "w", RequestID: fmt.Sprintf("r%d", i),
			Body: &command.Release{Name: "bench/lock", LeaseID: r.LeaseID, Token: r.Token}})
		if e, err = command.Decode(rel); err != nil {
			b.Fatal(err)
		}
		st.must(b, st.s.Apply(st.idx, e), command.StatusOK)
		st.s.TakeEvents()
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
}

// BenchmarkApplySessionAcquireRelease locks and unlocks 16 names under one
// session.
func BenchmarkApplySessionAcquireRelease(b *testing.B) {
	st := newBenchState()
	sess := benchLease(7)
	st.must(b, st.apply(b, "s", "", &command.CreateSession{LeaseID: sess, TTLms: 10_000}), command.StatusOK)
	names := make([]string, 16)
	for i := range names {
		names[i] = fmt.Sprintf("bench/s/%d", i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		name := names[i%len(names)]
		r := st.must(b, st.apply(b, "s", "", &command.Acquire{Name: name, LeaseID: sess, Session: true}), command.StatusOK)
		st.must(b, st.apply(b, "s", "", &command.Release{Name: name, LeaseID: sess, Token: r.Token}), command.StatusOK)
	}
}

// BenchmarkApplyRenew renews one of 1,000 or 100,000 held locks per op.
func BenchmarkApplyRenew(b *testing.B) {
	for _, held := range []int{1_000, 100_000} {
		b.Run(fmt.Sprintf("held=%d", held), func(b *testing.B) {
			st := newBenchState()
			type h struct {
				name  string
				lease command.LeaseID
				token uint64
			}
			hs := make([]h, held)
			for i := range held {
				name := fmt.Sprintf("held/%d", i)
				r := st.must(b, st.apply(b, fmt.Sprintf("c%d", i), "", &command.Acquire{Name: name, LeaseID: benchLease(i), TTLms: 60_000}), command.StatusOK)
				hs[i] = h{name, r.LeaseID, r.Token}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				x := hs[i%held]
				st.must(b, st.apply(b, fmt.Sprintf("c%d", i%held), "", &command.Renew{Name: x.name, LeaseID: x.lease, Token: x.token}), command.StatusOK)
			}
		})
	}
}

// BenchmarkApplyContendedHandoff: 64 waiters queue on one lock; each op is a
// release that hands the lock to the head of the queue in the same step, plus
// the releaser queueing again (two entries per hand-off).
func BenchmarkApplyContendedHandoff(b *testing.B) {
	const waiters = 64
	st := newBenchState()
	type w struct {
		client string
		lease  command.LeaseID
	}
	ws := make([]w, waiters)
	next := 0
	newLease := func() command.LeaseID { next++; return benchLease(next) }
	var holder, token = -1, uint64(0)
	for i := range waiters {
		ws[i] = w{fmt.Sprintf("c%d", i), newLease()}
		r := st.apply(b, ws[i].client, "", &command.Acquire{Name: "hot", LeaseID: ws[i].lease, TTLms: 10_000, WaitMs: 3_600_000})
		if r.Status == command.StatusOK {
			holder, token = i, r.Token
		}
	}
	if holder != 0 {
		b.Fatalf("holder %d", holder)
	}
	queue := make([]int, 0, waiters)
	for i := 1; i < waiters; i++ {
		queue = append(queue, i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		h := ws[holder]
		st.must(b, st.apply(b, h.client, "", &command.Release{Name: "hot", LeaseID: h.lease, Token: token}), command.StatusOK)
		// The head got it with the next token.
		holder, queue = queue[0], append(queue[1:], holder)
		token = st.s.LastToken()
		ws[queue[len(queue)-1]].lease = newLease()
		q := ws[queue[len(queue)-1]]
		st.must(b, st.apply(b, q.client, "", &command.Acquire{Name: "hot", LeaseID: q.lease, TTLms: 10_000, WaitMs: 3_600_000}), command.StatusQueued)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "handoffs/s")
}

// BenchmarkSnapshot and BenchmarkRestore: a state with 100,000 held locks.
func BenchmarkSnapshot(b *testing.B) {
	st := newBenchState()
	st.hold(b, 100_000)
	b.ReportAllocs()
	b.ResetTimer()
	var n int
	for range b.N {
		n = len(st.s.Snapshot())
	}
	b.SetBytes(int64(n))
}

func BenchmarkRestore(b *testing.B) {
	st := newBenchState()
	st.hold(b, 100_000)
	snap := st.s.Snapshot()
	b.SetBytes(int64(len(snap)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := Restore(snap); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHeldMemory reports the Go heap the replicated state keeps per held
// lock (each with its own implicit lease, acquired with a request id as the
// HTTP API does, so the dedup table is full), for the "1,000,000 held locks
// under 1 GiB" target: `go test -run '^$' -bench HeldMemory -benchtime 1x`.
func BenchmarkHeldMemory(b *testing.B) {
	const n = 200_000
	for range b.N {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		st := newBenchState()
		for i := range n {
			st.must(b, st.apply(b, fmt.Sprintf("worker-%08d", i), fmt.Sprintf("req-%08d", i),
				&command.Acquire{Name: fmt.Sprintf("bench/held/%08d", i), LeaseID: benchLease(i), TTLms: 600_000}), command.StatusOK)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "heap-B/lock")
		runtime.KeepAlive(st)
	}
}

// heldTwice takes n locks, releases each and takes it again under a new
// lease: every lock is held and has one ended grant in the history (or
// fewer, when the history's bounds drop them).
func heldTwice(b *testing.B, st *benchState, n int) {
	// Each command gets strings of its own, as decoding a log entry gives.
	client := func(i int) string { return fmt.Sprintf("worker-%08d", i) }
	name := func(i int) string { return fmt.Sprintf("bench/held/%08d", i) }
	for i := range n {
		r := st.apply(b, client(i), fmt.Sprintf("req-%08d", i), &command.Acquire{Name: name(i), LeaseID: benchLease(i), TTLms: 600_000})
		st.must(b, r, command.StatusOK)
		st.must(b, st.apply(b, client(i), fmt.Sprintf("rel-%08d", i), &command.Release{Name: name(i), LeaseID: benchLease(i), Token: r.Token}), command.StatusOK)
		st.must(b, st.apply(b, client(i), fmt.Sprintf("again-%08d", i),
			&command.Acquire{Name: name(i), LeaseID: benchLease(n + i), TTLms: 600_000}), command.StatusOK)
	}
}

// BenchmarkHeldMemoryWithHistory is BenchmarkHeldMemory where every lock
// was held and released once before it was taken again: the history keeps
// one ended grant per lock (the most a million locks keep under the default
// bound of a million records in all). Its heap-B/lock less
// BenchmarkHeldMemory's is what one ended grant costs.
func BenchmarkHeldMemoryWithHistory(b *testing.B) {
	const n = 200_000
	for range b.N {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		st := newBenchState()
		heldTwice(b, st, n)
		runtime.GC()
		runtime.ReadMemStats(&after)
		if got, _ := st.s.HistoryStats(); got != n {
			b.Fatalf("%d history records, want %d", got, n)
		}
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "heap-B/lock")
		runtime.KeepAlive(st)
	}
}

// BenchmarkMillionHeldWithHistory is the "1,000,000 held locks under 1
// GiB" target with the history full: a million held locks, each released
// and taken again once, so the history is at its default bounds (the byte
// budget binds first). It reports the state's whole heap (about 3 minutes).
func BenchmarkMillionHeldWithHistory(b *testing.B) {
	const n = 1_000_000
	for range b.N {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		st := newBenchState()
		heldTwice(b, st, n)
		runtime.GC()
		runtime.ReadMemStats(&after)
		records, bytes := st.s.HistoryStats()
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "heap-MiB")
		b.ReportMetric(float64(records), "history-records")
		b.ReportMetric(float64(bytes)/(1<<20), "history-counted-MiB")
		runtime.KeepAlive(st)
	}
}

// BenchmarkDedupFill is a fresh state's dedup table filling up: every
// command of a new cluster carries a request id (the client's or the
// server's), so the first DedupCapacity commands each add an entry.
func BenchmarkDedupFill(b *testing.B) {
	keys := make([]dedupKey, DedupCapacity)
	for i := range keys {
		keys[i] = dedupKey{"client", fmt.Sprintf("srv-%024d", i)}
	}
	b.ReportAllocs()
	for b.Loop() {
		s := New()
		for i, k := range keys {
			s.remember(k, command.Result{Status: command.StatusOK, Token: uint64(i)})
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*DedupCapacity), "ns/entry")
}

// BenchmarkRenewMillionHeld is the apply cost of a renewal with a million
// held locks, the history empty (each lock taken once) or at its default
// budget (each taken, released and taken again: the byte budget drops the
// oldest records). A renewal never ends a grant, so it does no history work;
// what a full history can cost it is memory: a larger live heap for Go's
// collector to scan. Run the two alternately (-count) and compare medians:
//
//	GOMEMLIMIT=900MiB go test -run '^$' -bench RenewMillionHeld -benchtime 3000000x -count 5 ./internal/state/
func BenchmarkRenewMillionHeld(b *testing.B) {
	const n = 1_000_000
	for _, history := range []string{"empty", "full"} {
		b.Run("history="+history, func(b *testing.B) {
			st := newBenchState()
			leaseOf := func(i int) command.LeaseID { return benchLease(i) }
			if history == "full" {
				heldTwice(b, st, n)
				leaseOf = func(i int) command.LeaseID { return benchLease(n + i) }
			} else {
				for i := range n {
					st.must(b, st.apply(b, fmt.Sprintf("worker-%08d", i), fmt.Sprintf("req-%08d", i),
						&command.Acquire{Name: fmt.Sprintf("bench/held/%08d", i), LeaseID: benchLease(i), TTLms: 600_000}), command.StatusOK)
				}
			}
			records, bytes := st.s.HistoryStats()
			renews := make([]command.Renew, n)
			clients := make([]string, n)
			for i := range n {
				name := fmt.Sprintf("bench/held/%08d", i)
				renews[i] = command.Renew{Name: name, LeaseID: leaseOf(i), Token: st.s.GetLock(name).Holder.Token}
				clients[i] = fmt.Sprintf("worker-%08d", i)
			}
			runtime.GC()
			b.ResetTimer()
			i := 0
			for b.Loop() {
				st.must(b, st.apply(b, clients[i], "", &renews[i]), command.StatusOK)
				if i++; i == n {
					i = 0
				}
			}
			b.ReportMetric(float64(records), "history-records")
			b.ReportMetric(float64(bytes)/(1<<20), "history-counted-MiB")
		})
	}
}
