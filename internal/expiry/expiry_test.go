package expiry

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/state"
	"github.com/dlock/dlock/internal/testutil"
)

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// stateHolder applies commands to a real state and feeds the reaper, as the FSM does.
type stateHolder struct {
	mu    sync.Mutex
	st    *state.State
	index uint64
	ts    int64
	clock int64
	obs   *Reaper
}

func (h *stateHolder) Read(fn func(*state.State)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	fn(h.st)
}

func (h *stateHolder) apply(advanceMs int64, e *command.Envelope) command.Result {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.index++
	h.ts += advanceMs
	h.clock += advanceMs
	e.TS, e.Clock = h.ts, h.clock
	r := h.st.Apply(h.index, e)
	if h.obs != nil {
		h.obs.Applied(h.index, h.st.TakeEvents())
	} else {
		h.st.TakeEvents()
	}
	return r
}

type recordingProposer struct {
	mu  sync.Mutex
	got []command.Body
}

func (p *recordingProposer) Propose(_ context.Context, e *command.Envelope) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.got = append(p.got, e.Body)
	return nil
}

func lid(b byte) command.LeaseID { return command.LeaseID{b} }

func setup(t *testing.T) (*fakeClock, *stateHolder, *Reaper) {
	clock := &fakeClock{now: time.Unix(1000, 0)}
	h := &stateHolder{st: state.New(), ts: 1_000_000}
	r := New(clock, &recordingProposer{}, h, nil)
	return clock, h, r
}

func TestPromoteCountsRemainingTimeFromTakeover(t *testing.T) {
	clock, h, r := setup(t)
	// Lease granted at ts, then 4 s of log pass (another entry) before takeover.
	h.apply(0, &command.Envelope{ClientID: "a", Body: &command.Acquire{Name: "x", LeaseID: lid(1), TTLms: 10_000}})
	h.apply(4_000, &command.Envelope{ClientID: "b", Body: &command.Acquire{Name: "y", LeaseID: lid(2), TTLms: 10_000}})
	// The new leader takes over much later by its own clock: irrelevant, only
	// the time left as of the newest entry counts (6 s for x, 10 s for y),
	// counted from the takeover, not from when this reaper was made.
	clock.Advance(time.Hour)
	r.Promote()
	if l, w, _ := r.Due(clock.Now().Add(5_999 * time.Millisecond)); len(l)+len(w) != 0 {
		t.Fatalf("expired before the holder's full TTL: %v %v", l, w)
	}
	l, _, _ := r.Due(clock.Now().Add(6 * time.Second))
	if len(l) != 1 || l[0].LeaseID != lid(1) || l[0].Gen != 1 {
		t.Fatalf("due at 6 s: %+v", l)
	}
	if l, _, _ := r.Due(clock.Now().Add(6_500 * time.Millisecond)); len(l) != 0 {
		t.Fatalf("y due before its 10 s, or x proposed again within RetryAfter: %+v", l)
	}
	// At 10 s y is due, and x (proposed at 6 s, never applied) is due again.
	l, _, _ = r.Due(clock.Now().Add(10 * time.Second))
	if len(l) != 2 {
		t.Fatalf("due at 10 s: %+v", l)
	}
}

func TestRenewalMovesDeadlineAndBumpsGeneration(t *testing.T) {
	clock, h, r := setup(t)
	h.obs = r
	r.Promote()
	res := h.apply(0, &command.Envelope{ClientID: "a", Body: &command.Acquire{Name: "x", LeaseID: lid(1), TTLms: 3_000}})
	clock.Advance(2 * time.Second)
	h.apply(2_000, &command.Envelope{ClientID: "a", Body: &command.Renew{Name: "x", LeaseID: lid(1), Token: res.Token}})
	if l, _, _ := r.Due(clock.Now().Add(2999 * time.Millisecond)); len(l) != 0 {
		t.Fatalf("renewed lease due early: %+v", l)
	}
	l, _, _ := r.Due(clock.Now().Add(3 * time.Second))
	if len(l) != 1 || l[0].Gen != 2 {
		t.Fatalf("want gen 2 due at renewal+TTL, got %+v", l)
	}
	// A stale expiry (gen 1) does nothing; the current one expires the lease.
	h.apply(0, &command.Envelope{Body: &command.ExpireLeases{Leases: []command.LeaseGen{{LeaseID: lid(1), Gen: 1}}}})
	if held := h.st.GetLock("x").Held; !held {
		t.Fatalf("stale generation expired the lease")
	}
	h.apply(0, &command.Envelope{Body: &command.ExpireLeases{Leases: l}})
	if held := h.st.GetLock("x").Held; held {
		t.Fatalf("current generation did not expire the lease")
	}
	if r.Len() != 0 {
		t.Fatalf("expired lease still tracked: %d", r.Len())
	}
}

func TestWaitDeadlinesAndDemote(t *testing.T) {
	clock, h, r := setup(t)
	h.obs = r
	r.Promote()
	h.apply(0, &command.Envelope{ClientID: "a", Body: &command.Acquire{Name: "x", LeaseID: lid(1), TTLms: 60_000}})
	q := h.apply(0, &command.Envelope{ClientID: "b", Body: &command.Acquire{Name: "x", LeaseID: lid(2), TTLms: 60_000, WaitMs: 2_000}})
	_, w, _ := r.Due(clock.Now().Add(2 * time.Second))
	if len(w) != 1 || w[0] != (command.WaitRef{LeaseID: lid(2), Name: "x", Seq: q.Seq}) {
		t.Fatalf("wait due: %+v", w)
	}
	// Due pushed it back by RetryAfter, so it is not proposed twice at once.
	if _, w, _ := r.Due(clock.Now().Add(2 * time.Second)); len(w) != 0 {
		t.Fatalf("in-flight expiry proposed again: %+v", w)
	}
	r.Demote()
	if l, w, _ := r.Due(clock.Now().Add(time.Hour)); len(l)+len(w) != 0 || r.Active() {
		t.Fatalf("a demoted reaper must expire nothing")
	}
	h.apply(0, &command.Envelope{ClientID: "c", Body: &command.Acquire{Name: "z", LeaseID: lid(3), TTLms: 1_000}})
	if r.Len() != 0 {
		t.Fatalf("a follower must not track deadlines")
	}
}

func TestRunProposesDueExpiries(t *testing.T) {
	clock, h, r := setup(t)
	p := r.proposer.(*recordingProposer)
	h.obs = r
	r.Promote()
	h.apply(0, &command.Envelope{ClientID: "a", Body: &command.Acquire{Name: "x", LeaseID: lid(1), TTLms: 1_000}})
	clock.Advance(time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	testutil.Eventually(t, 5*time.Second, "Run to propose the due lease's expiry", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.got) > 0
	})
	cancel()
	<-done
	p.mu.Lock()
	defer p.mu.Unlock()
	el, ok := p.got[0].(*command.ExpireLeases)
	if !ok || len(el.Leases) != 1 || el.Leases[0].LeaseID != lid(1) {
		t.Fatalf("proposed %+v", p.got[0])
	}
}

// The leader keeps one item per held lock: a million of them must stay small
// (docs/benchmarks.md, held locks). A field added here should be a decision.
func TestItemStaysSmall(t *testing.T) {
	if size := unsafe.Sizeof(item{}); size > 64 {
		t.Fatalf("a deadline item is %d bytes; it was 64", size)
	}
}

// A wait is tracked by lease and lock, and its sequence says which wait it is:
// an ended wait's deadline is dropped, a new wait for the same lease and lock
// takes over the slot with its own sequence and deadline, and the end of an
// older wait (another sequence) never drops the newer one's deadline.
func TestWaitSequenceOnEndAndRequeue(t *testing.T) {
	timer := func(lease byte, name string, seq uint64, ms int64) state.Event {
		return state.Event{Type: state.EventWaitTimer, LeaseID: lid(lease), Name: name, Seq: seq, RemainingMs: ms}
	}
	gone := func(lease byte, name string, seq uint64) state.Event {
		return state.Event{Type: state.EventWaitGone, LeaseID: lid(lease), Name: name, Seq: seq}
	}
	ref := func(lease byte, name string, seq uint64) command.WaitRef {
		return command.WaitRef{LeaseID: lid(lease), Name: name, Seq: seq}
	}
	cases := []struct {
		name string
		// Each entry is one Applied call, all at the same instant.
		entries [][]state.Event
		// want is due dueMs after that instant and nothing is due a millisecond
		// earlier; with no want, nothing is ever due and nothing stays tracked.
		dueMs int64
		want  []command.WaitRef
	}{
		{name: "ended wait is dropped",
			entries: [][]state.Event{{timer(2, "x", 5, 2_000)}, {gone(2, "x", 5)}}},
		{name: "ended in the entry that queued it",
			entries: [][]state.Event{{timer(2, "x", 5, 2_000), gone(2, "x", 5)}}},
		{name: "queued again after it ended",
			entries: [][]state.Event{{timer(2, "x", 5, 2_000)}, {gone(2, "x", 5)}, {timer(2, "x", 9, 5_000)}},
			dueMs:   5_000, want: []command.WaitRef{ref(2, "x", 9)}},
		{name: "new sequence replaces the old deadline",
			entries: [][]state.Event{{timer(2, "x", 5, 2_000)}, {timer(2, "x", 9, 5_000)}},
			dueMs:   5_000, want: []command.WaitRef{ref(2, "x", 9)}},
		{name: "new sequence with a shorter deadline",
			entries: [][]state.Event{{timer(2, "x", 5, 5_000)}, {timer(2, "x", 9, 2_000)}},
			dueMs:   2_000, want: []command.WaitRef{ref(2, "x", 9)}},
		{name: "old wait's end after the new wait keeps the new deadline",
			entries: [][]state.Event{{timer(2, "x", 5, 2_000)}, {timer(2, "x", 9, 5_000)}, {gone(2, "x", 5)}},
			dueMs:   5_000, want: []command.WaitRef{ref(2, "x", 9)}},
		{name: "old wait's end in the same entry keeps the new deadline",
			entries: [][]state.Event{{timer(2, "x", 5, 2_000), timer(2, "x", 9, 5_000), gone(2, "x", 5)}},
			dueMs:   5_000, want: []command.WaitRef{ref(2, "x", 9)}},
		{name: "new wait ends after replacing the old",
			entries: [][]state.Event{{timer(2, "x", 5, 2_000)}, {timer(2, "x", 9, 5_000)}, {gone(2, "x", 9)}}},
		{name: "another lease's end on the same lock",
			entries: [][]state.Event{{timer(2, "x", 5, 2_000), timer(3, "x", 6, 3_000)}, {gone(3, "x", 6)}},
			dueMs:   2_000, want: []command.WaitRef{ref(2, "x", 5)}},
		{name: "the same lease's end on another lock",
			entries: [][]state.Event{{timer(2, "x", 5, 2_000)}, {timer(2, "y", 6, 3_000)}, {gone(2, "y", 6)}},
			dueMs:   2_000, want: []command.WaitRef{ref(2, "x", 5)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clock, _, r := setup(t)
			r.Promote()
			for _, e := range c.entries {
				r.Applied(0, e)
			}
			now := clock.Now()
			if len(c.want) == 0 {
				if l, w, _ := r.Due(now.Add(time.Hour)); len(l)+len(w) != 0 || r.Len() != 0 {
					t.Fatalf("an ended wait is still tracked: due %v %v, %d deadlines", l, w, r.Len())
				}
				return
			}
			if l, w, _ := r.Due(now.Add(time.Duration(c.dueMs-1) * time.Millisecond)); len(l)+len(w) != 0 {
				t.Fatalf("due before %d ms: %v %v", c.dueMs, l, w)
			}
			if l, w, _ := r.Due(now.Add(time.Duration(c.dueMs) * time.Millisecond)); len(l) != 0 || !slices.Equal(w, c.want) {
				t.Fatalf("due at %d ms: %v %+v, want %+v", c.dueMs, l, w, c.want)
			}
			if r.Len() != len(c.want) {
				t.Fatalf("%d deadlines tracked, want %d", r.Len(), len(c.want))
			}
		})
	}
}

// The same through the state machine: a session's wait is cancelled and queued
// again (a new sequence); the first wait's deadline expires nothing, and the
// reaper proposes the second one, at its own deadline.
func TestRequeuedWaitKeepsItsOwnDeadline(t *testing.T) {
	clock, h, r := setup(t)
	h.obs = r
	r.Promote()
	h.apply(0, &command.Envelope{ClientID: "b", Body: &command.CreateSession{LeaseID: lid(9), TTLms: 60_000}})
	h.apply(0, &command.Envelope{ClientID: "a", Body: &command.Acquire{Name: "x", LeaseID: lid(1), TTLms: 60_000}})
	q1 := h.apply(0, &command.Envelope{ClientID: "b", Body: &command.Acquire{Name: "x", LeaseID: lid(9), Session: true, WaitMs: 2_000}})
	if q1.Status != command.StatusQueued {
		t.Fatalf("first wait: %+v", q1)
	}
	first := command.WaitRef{LeaseID: lid(9), Name: "x", Seq: q1.Seq}
	if res := h.apply(0, &command.Envelope{ClientID: "b", Body: &command.CancelWait{Wait: first}}); res.Status != command.StatusOK {
		t.Fatalf("cancel: %+v", res)
	}
	clock.Advance(time.Second)
	q2 := h.apply(1_000, &command.Envelope{ClientID: "b", Body: &command.Acquire{Name: "x", LeaseID: lid(9), Session: true, WaitMs: 5_000}})
	if q2.Status != command.StatusQueued || q2.Seq == q1.Seq {
		t.Fatalf("second wait: %+v (first seq %d)", q2, q1.Seq)
	}
	if _, w, _ := r.Due(clock.Now().Add(4_999 * time.Millisecond)); len(w) != 0 {
		t.Fatalf("due before the second wait's deadline: %+v", w)
	}
	_, w, _ := r.Due(clock.Now().Add(5 * time.Second))
	second := command.WaitRef{LeaseID: lid(9), Name: "x", Seq: q2.Seq}
	if len(w) != 1 || w[0] != second {
		t.Fatalf("due at the second wait's deadline: %+v, want %+v", w, second)
	}
	h.apply(0, &command.Envelope{Body: &command.ExpireWaits{Waits: w}})
	if n := h.st.GetLock("x").Waiters; n != 0 {
		t.Fatalf("the second wait did not expire: %d waiters", n)
	}
	// Two leases remain (the holder's and the session), no wait.
	if r.Len() != 2 {
		t.Fatalf("%d deadlines tracked, want the 2 leases'", r.Len())
	}
}

// applyingProposer commits what it is given to the state holder, as Raft
// would, with the lease clock advanced by step.
type applyingProposer struct {
	h    *stateHolder
	step int64
	mu   sync.Mutex
	got  []command.Body
}

func (p *applyingProposer) Propose(_ context.Context, e *command.Envelope) error {
	p.mu.Lock()
	p.got = append(p.got, e.Body)
	p.mu.Unlock()
	p.h.apply(p.step, e)
	return nil
}

func (p *applyingProposer) ticks() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, b := range p.got {
		if _, ok := b.(*command.Tick); ok {
			n++
		}
	}
	return n
}

// While leases run and nothing else carries the lease clock forward, the
// leader commits a Tick every TickInterval; entries that carry it make ticks
// unnecessary; a follower, or a leader with nothing running, never ticks.
func TestTickOnlyWhenTheLogIsQuiet(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1000, 0)}
	h := &stateHolder{st: state.New(), ts: 1_000_000}
	p := &applyingProposer{h: h, step: 250}
	r := New(clock, p, h, nil)
	h.obs = r
	ctx := context.Background()

	r.tick(ctx, clock.Now()) // a follower
	r.Promote()
	r.tick(ctx, clock.Now()) // nothing running
	if n := p.ticks(); n != 0 {
		t.Fatalf("%d ticks without a running lease, or on a follower", n)
	}
	h.apply(0, &command.Envelope{ClientID: "a", Body: &command.Acquire{Name: "x", LeaseID: lid(1), TTLms: 10_000}})
	r.tick(ctx, clock.Now())
	first := p.ticks()
	for i := 0; i < 4; i++ {
		clock.Advance(TickInterval)
		r.tick(ctx, clock.Now())
	}
	if n := p.ticks() - first; n != 4 {
		t.Fatalf("%d ticks in 4 quiet intervals, want 4", n)
	}
	// Not again before the interval is up.
	clock.Advance(TickInterval / 2)
	r.tick(ctx, clock.Now())
	// Entries of their own carry the clock: no tick needed.
	before := p.ticks()
	for i := 0; i < 4; i++ {
		clock.Advance(TickInterval)
		h.apply(100, &command.Envelope{ClientID: "b", Body: &command.RegisterMember{ID: "n1"}})
		r.tick(ctx, clock.Now())
	}
	if n := p.ticks() - before; n != 0 {
		t.Fatalf("%d ticks while other entries moved the clock", n)
	}
	r.Demote()
	clock.Advance(TickInterval)
	r.tick(ctx, clock.Now())
	if n := p.ticks() - before; n != 0 {
		t.Fatal("a demoted reaper ticked")
	}
}

// A lock-delay's end is committed when it is due on the lease clock, once:
// a delay that has ended is dropped instead of proposed again.
func TestLockDelayDeadline(t *testing.T) {
	clock, h, r := setup(t)
	h.obs = r
	r.Promote()
	res := h.apply(0, &command.Envelope{ClientID: "a", Body: &command.Acquire{Name: "x", LeaseID: lid(1), TTLms: 1_000, LockDelayMs: 5_000}})
	h.apply(0, &command.Envelope{ClientID: "b", Body: &command.Acquire{Name: "x", LeaseID: lid(2), TTLms: 1_000, WaitMs: 60_000}})
	clock.Advance(time.Second)
	h.apply(1_000, &command.Envelope{Body: &command.ExpireLeases{Leases: []command.LeaseGen{{LeaseID: lid(1), Gen: 1}}}})
	if h.st.GetLock("x").DelayedUntil == 0 {
		t.Fatal("no lock-delay after the expiry")
	}
	if w, _ := r.DueAll(clock.Now().Add(4_999 * time.Millisecond)); len(w.Delays) != 0 {
		t.Fatalf("delay due early: %+v", w)
	}
	w, _ := r.DueAll(clock.Now().Add(5 * time.Second))
	if len(w.Delays) != 1 || w.Delays[0] != (command.EndLockDelay{Name: "x", Token: res.Token}) {
		t.Fatalf("due at 5 s: %+v", w)
	}
	r.settle(&w)
	if len(w.Delays) != 1 {
		t.Fatal("settle dropped a delay the state still has")
	}
	clock.Advance(5 * time.Second)
	h.apply(5_000, &command.Envelope{Body: &w.Delays[0]})
	if li := h.st.GetLock("x"); !li.Held || li.Holder.ClientID != "b" {
		t.Fatalf("after the delay: %+v", li)
	}
	// Proposed once and applied: when its retry comes due, it is dropped.
	w, _ = r.DueAll(clock.Now().Add(RetryAfter))
	r.settle(&w)
	if len(w.Delays) != 0 || len(r.delays) != 0 {
		t.Fatalf("an ended delay is still proposed or tracked: %+v", w)
	}
}

// The history's age bound is one deadline: due when the oldest record is
// MaxAgeMs old on the lease clock; trimmed by a TrimHistory; gone when the
// history is empty. It needs no ticks.
func TestHistoryDeadline(t *testing.T) {
	clock, h, r := setup(t)
	h.obs = r
	r.Promote()
	h.apply(0, &command.Envelope{Body: &command.SetHistoryRetention{PerName: 4, MaxEntries: 100, MaxBytes: 1 << 20, MaxAgeMs: 60_000}})
	res := h.apply(0, &command.Envelope{ClientID: "a", Body: &command.Acquire{Name: "x", LeaseID: lid(1), TTLms: 10_000}})
	h.apply(0, &command.Envelope{ClientID: "a", Body: &command.Release{Name: "x", LeaseID: lid(1), Token: res.Token}})
	if r.tracking() {
		t.Fatal("the history's deadline alone asks for ticks")
	}
	if w, _ := r.DueAll(clock.Now().Add(59_999 * time.Millisecond)); w.Trim {
		t.Fatal("trim due early")
	}
	// Due by the leader's clock, but no entry has carried the lease clock
	// that far: put back, not proposed.
	w, _ := r.DueAll(clock.Now().Add(60 * time.Second))
	if !w.Trim {
		t.Fatal("trim not due at 60 s")
	}
	r.settle(&w)
	if w.Trim || r.hist == nil {
		t.Fatalf("trim proposed before the lease clock reached it, or its deadline dropped: %+v", w)
	}
	clock.Advance(60 * time.Second)
	h.apply(60_000, &command.Envelope{Body: &command.Tick{}})
	w, _ = r.DueAll(clock.Now())
	r.settle(&w)
	if !w.Trim {
		t.Fatal("trim not proposed once due on the lease clock")
	}
	h.apply(0, &command.Envelope{Body: &command.TrimHistory{}})
	if n, _ := h.st.HistoryStats(); n != 0 {
		t.Fatalf("%d records after the trim", n)
	}
	w, _ = r.DueAll(clock.Now().Add(RetryAfter))
	r.settle(&w)
	if w.Trim || r.hist != nil {
		t.Fatal("an empty history keeps a deadline")
	}
}

// A leader whose flags ask for other history bounds commits them.
func TestRunProposesRetention(t *testing.T) {
	_, _, r := setup(t)
	p := r.proposer.(*recordingProposer)
	want := state.HistoryRetention{PerName: 4, MaxEntries: 10, MaxBytes: 1 << 20, MaxAgeMs: 3_600_000}
	r.SetRetention(want)
	r.Promote()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	testutil.Eventually(t, 10*time.Second, "the leader proposes its retention", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, b := range p.got {
			if sr, ok := b.(*command.SetHistoryRetention); ok && *sr == (command.SetHistoryRetention{PerName: want.PerName, MaxEntries: want.MaxEntries, MaxBytes: want.MaxBytes, MaxAgeMs: want.MaxAgeMs}) {
				return true
			}
		}
		return false
	})
}

// Applied wakes a sleeping Run only for a deadline before the one Run sleeps
// until (under load every grant sets a timer, nearly always a later one), and
// for any deadline while nothing was tracked (the tick checks must start).
func TestAppliedWakesRunOnlyForAnEarlierDeadline(t *testing.T) {
	clock, h, r := setup(t)
	h.obs = r
	r.Promote()
	<-r.kick // Promote's
	if got := r.sleep(clock.Now()); got != time.Hour {
		t.Fatalf("with nothing tracked Run sleeps %s, want 1h", got)
	}
	clock.Advance(55 * time.Minute)
	h.apply(0, &command.Envelope{ClientID: "a", Body: &command.Acquire{Name: "x", LeaseID: lid(1), TTLms: command.MaxTTLms}})
	if len(r.kick) != 1 {
		t.Fatal("the first tracked deadline, after Run's hour of sleep with nothing tracked, did not wake it")
	}
	<-r.kick
	r.sleepsUntil = 0 // Run woke
	// Run is awake: no change wakes it, it reads the heap before it sleeps.
	h.apply(0, &command.Envelope{ClientID: "b", Body: &command.Acquire{Name: "y", LeaseID: lid(2), TTLms: 90_000}})
	if len(r.kick) != 0 {
		t.Fatal("a change woke a Run that is awake")
	}
	r.nextCheck = clock.Now().Add(time.Minute)
	if got := r.sleep(clock.Now()); got != time.Minute {
		t.Fatalf("Run sleeps %s, want until its next tick check (1m)", got)
	}
	h.apply(0, &command.Envelope{ClientID: "c", Body: &command.Acquire{Name: "z", LeaseID: lid(3), TTLms: 120_000}})
	if len(r.kick) != 0 {
		t.Fatal("a later deadline woke Run")
	}
	h.apply(0, &command.Envelope{ClientID: "d", Body: &command.Acquire{Name: "w", LeaseID: lid(4), TTLms: 1_000}})
	if len(r.kick) != 1 {
		t.Fatal("an earlier deadline did not wake Run")
	}
}
