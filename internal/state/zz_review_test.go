package state

import (
	"bytes"
	"testing"

	"github.com/dlock/dlock/internal/command"
)

// DESIGN §3: "Restore + replay gives the same state as never having
// snapshotted." An upgraded node that restores a version-5 snapshot (written
// by the old binary) must end up with the same state as an upgraded node that
// applied the same pre-upgrade (version 2, Clock 0) log from the start.
// Waits' ClockDeadline differ: log replay gives s.clock(0)+waitMs, the v5
// restore path gives Deadline - ts_at_snapshot.
func TestReviewV5RestoreMatchesLogReplayForWaits(t *testing.T) {
	apply := func(s *State, i uint64, ts int64, client string, b command.Body) {
		s.Apply(i, &command.Envelope{TS: ts, ClientID: client, Body: b}) // Clock 0: a version 2 entry
		s.TakeEvents()
	}
	build := func(s *State, upto uint64) {
		steps := []func(){
			func() { apply(s, 1, startTS, "a", &command.Acquire{Name: "x", LeaseID: lid(1), TTLms: 30_000}) },
			func() {
				apply(s, 2, startTS+100, "b", &command.Acquire{Name: "x", LeaseID: lid(2), TTLms: 30_000, WaitMs: 20_000})
			},
			func() { apply(s, 3, startTS+5_000, "c", &command.CreateSession{LeaseID: lid(3), TTLms: 10_000}) },
		}
		for i := uint64(0); i < upto; i++ {
			steps[i]()
		}
	}
	// Replica A: applied the whole log (no snapshot).
	a := New()
	build(a, 3)
	// Replica B: restored the old binary's v5 snapshot taken at index 3.
	src := New()
	build(src, 3)
	raw := toRaw(src)
	raw.version = 5
	b, err := Restore(raw.encode())
	if err != nil {
		t.Fatal(err)
	}
	_, wa := a.Timers()
	_, wb := b.Timers()
	t.Logf("log replay: waits %+v; v5 restore: waits %+v", wa, wb)
	if !bytes.Equal(a.Snapshot(), b.Snapshot()) {
		t.Fatalf("replicas that applied the same log differ after a v5 restore: wait time left %d ms (log) vs %d ms (v5 snapshot)",
			wa[0].RemainingMs, wb[0].RemainingMs)
	}
}

// Same setup, with the restored waits' ClockDeadline set as log replay would
// (Deadline - EnqueuedAt = waitMs, since the clock was 0): then the states are
// byte-identical, so ClockDeadline is the only difference.
func TestReviewV5RestoreOnlyClockDeadlineDiffers(t *testing.T) {
	apply := func(s *State, i uint64, ts int64, client string, b command.Body) {
		s.Apply(i, &command.Envelope{TS: ts, ClientID: client, Body: b})
		s.TakeEvents()
	}
	mk := func() *State {
		s := New()
		apply(s, 1, startTS, "a", &command.Acquire{Name: "x", LeaseID: lid(1), TTLms: 30_000})
		apply(s, 2, startTS+100, "b", &command.Acquire{Name: "x", LeaseID: lid(2), TTLms: 30_000, WaitMs: 20_000})
		apply(s, 3, startTS+5_000, "c", &command.CreateSession{LeaseID: lid(3), TTLms: 10_000})
		return s
	}
	a := mk()
	raw := toRaw(mk())
	raw.version = 5
	b, err := Restore(raw.encode())
	if err != nil {
		t.Fatal(err)
	}
	b.locks.Ascend(func(lk *Lock) bool {
		q := lk.Queue()
		for i := range q {
			q[i].ClockDeadline = q[i].Deadline - q[i].EnqueuedAt
		}
		return true
	})
	if !bytes.Equal(a.Snapshot(), b.Snapshot()) {
		t.Fatal("still differ")
	}
}
