// Package expiry is the leader's lease reaper: one deadline heap (monotonic
// clock) for every active lease, queued wait, lock-delay and the grant
// history's age bound, and one goroutine that commits conditional
// ExpireLeases / ExpireWaits / EndLockDelay / TrimHistory commands when
// deadlines pass. It runs
// only while its node is the ready leader (Promote/Demote); followers keep no
// timers. The clock and the proposer are injected so tests drive time by hand.
package expiry

import (
	"container/heap"
	"context"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/state"
)

// Proposer commits a command through Raft (only succeeds on the leader).
type Proposer interface {
	Propose(ctx context.Context, e *command.Envelope) error
}

// StateReader runs fn with the replicated state locked against applies.
type StateReader interface {
	Read(fn func(*state.State))
}

// Clock is the monotonic time source.
type Clock interface {
	Now() time.Time
}

// SystemClock is the real clock (time.Now carries a monotonic reading).
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// MaxBatch bounds how many expiries go into one command.
const MaxBatch = 1024

// RetryAfter is how long an expiry that was proposed but has not shown up as
// applied waits before being proposed again.
const RetryAfter = time.Second

// TickInterval is how often the leader checks, while any lease or wait is
// running, whether the lease clock (command.Envelope.Clock) has moved; when
// no entry has carried it forward since the last check, it commits a Tick. A
// successor counts every lease's time left as of the newest entry, so without
// ticks a quiet log would give each lease up to the time since its last
// renewal again (a whole TTL for a dead holder's lock) on every failover;
// with them a failover lengthens a lease by at most about two intervals plus
// the election. A busy log needs no ticks: its entries carry the clock.
const TickInterval = 250 * time.Millisecond

type waitKey struct {
	lease command.LeaseID
	name  string
}

// item is one deadline: a lease's, a wait's, a lock-delay's or the
// history's. The leader keeps one per held lock, so it is kept small: 64
// bytes, half of what a time.Time and a WaitRef beside the lease fields took
// (docs/benchmarks.md, held locks).
type item struct {
	deadline time.Duration // since the reaper's epoch, on the monotonic clock
	gen      uint64        // a lease's renewal generation; a wait's seq; a delay's token
	lease    command.LeaseID
	name     string // a wait's or a delay's lock name
	index    int32
	kind     itemKind
}

type itemKind uint8

const (
	kindLease itemKind = iota
	kindWait
	kindDelay
	kindHistory
)

func (it *item) isWait() bool { return it.kind == kindWait }

func (it *item) waitRef() command.WaitRef {
	return command.WaitRef{LeaseID: it.lease, Name: it.name, Seq: it.gen}
}

type deadlineHeap []*item

func (h deadlineHeap) Len() int           { return len(h) }
func (h deadlineHeap) Less(i, j int) bool { return h[i].deadline < h[j].deadline }
func (h deadlineHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = int32(i)
	h[j].index = int32(j)
}
func (h *deadlineHeap) Push(x any) {
	it := x.(*item)
	it.index = int32(len(*h))
	*h = append(*h, it)
}
func (h *deadlineHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	it.index = -1
	return it
}

// Reaper tracks deadlines and expires what is due. It implements fsm.Observer.
type Reaper struct {
	clock    Clock
	proposer Proposer
	reader   StateReader
	logger   *slog.Logger

	// epoch is what item deadlines count from.
	epoch time.Time

	// lastClock and nextCheck are Run's own (see TickInterval).
	lastClock int64
	nextCheck time.Time

	mu     sync.Mutex
	active bool
	h      deadlineHeap
	leases map[command.LeaseID]*item
	waits  map[waitKey]*item
	delays map[string]*item
	hist   *item // the history's age bound; nil when nothing is kept
	// retention is what this node's flags ask the history to keep (nil:
	// leave the state's as it is); retentionAt is when it was last proposed.
	retention   *state.HistoryRetention
	retentionAt time.Time
	kick        chan struct{}
	// sleepsUntil is the deadline Run's timer is set for while it sleeps
	// (zero while it works: it reads the heap before it sleeps again; the
	// largest duration while nothing is tracked), so a change that brings
	// no deadline before it wakes nobody: under load every grant and wait
	// sets a timer, nearly always a later one.
	sleepsUntil time.Duration
}

// New makes an inactive reaper.
func New(clock Clock, proposer Proposer, reader StateReader, logger *slog.Logger) *Reaper {
	if logger == nil {
		logger = slog.Default()
	}
	return &Reaper{clock: clock, proposer: proposer, reader: reader, logger: logger, epoch: clock.Now(),
		leases: map[command.LeaseID]*item{}, waits: map[waitKey]*item{}, delays: map[string]*item{}, kick: make(chan struct{}, 1)}
}

// SetRetention makes the leader commit these history bounds when the
// state's differ (flags of dlock serve). Call before Run.
func (r *Reaper) SetRetention(rt state.HistoryRetention) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.retention = &rt
}

// Promote starts tracking: every active lease and queued wait gets the time it
// had left as of the newest committed entry, counted again from now. That can
// extend a lease by about one election, never shorten it, and never renews it
// to a full TTL. Call it on the new leader after its barrier, before it serves.
func (r *Reaper) Promote() {
	r.reader.Read(func(s *state.State) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.active = true
		r.rebuildLocked(s)
	})
	r.poke()
}

// rebuildLocked starts every timer afresh from the state's remaining times.
func (r *Reaper) rebuildLocked(s *state.State) {
	leases, waits := s.Timers()
	now := r.clock.Now()
	r.resetLocked()
	for _, l := range leases {
		r.setLeaseLocked(now, l.LeaseID, l.Gen, l.RemainingMs)
	}
	for _, w := range waits {
		r.setWaitLocked(now, w.Wait, w.RemainingMs)
	}
	delays := s.DelayTimers()
	for _, d := range delays {
		r.setDelayLocked(now, d.Name, d.Token, d.RemainingMs)
	}
	if ms, ok := s.HistoryTimer(); ok {
		r.setHistLocked(now, ms)
	}
	r.logger.Info("lease reaper timers started", "leases", len(leases), "waits", len(waits), "lock_delays", len(delays))
}

// Demote stops tracking; a follower never expires anything.
func (r *Reaper) Demote() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.active {
		r.logger.Info("lease reaper demoted")
	}
	r.active = false
	r.resetLocked()
}

// Active reports whether the reaper is tracking (this node is the leader).
func (r *Reaper) Active() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.active
}

// Len is the number of tracked leases, waits and lock-delays (the
// history's one deadline aside).
func (r *Reaper) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.hist != nil {
		return len(r.h) - 1
	}
	return len(r.h)
}

func (r *Reaper) resetLocked() {
	r.h = nil
	r.leases = map[command.LeaseID]*item{}
	r.waits = map[waitKey]*item{}
	r.delays = map[string]*item{}
	r.hist = nil
	r.retentionAt = time.Time{}
}

func (r *Reaper) poke() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Applied follows lease and wait changes (fsm.Observer). Runs under the FSM lock.
func (r *Reaper) Applied(_ uint64, events []state.Event) {
	r.mu.Lock()
	if !r.active {
		r.mu.Unlock()
		return
	}
	now := r.clock.Now()
	changed := false
	for i := range events {
		e := &events[i]
		switch e.Type {
		case state.EventLeaseTimer:
			r.setLeaseLocked(now, e.LeaseID, e.Gen, e.RemainingMs)
			changed = true
		case state.EventLeaseGone:
			if it := r.leases[e.LeaseID]; it != nil {
				heap.Remove(&r.h, int(it.index))
				delete(r.leases, e.LeaseID)
			}
		case state.EventWaitTimer:
			r.setWaitLocked(now, command.WaitRef{LeaseID: e.LeaseID, Name: e.Name, Seq: e.Seq}, e.RemainingMs)
			changed = true
		case state.EventWaitGone:
			k := waitKey{e.LeaseID, e.Name}
			if it := r.waits[k]; it != nil && it.gen == e.Seq {
				heap.Remove(&r.h, int(it.index))
				delete(r.waits, k)
			}
		case state.EventDelayTimer:
			r.setDelayLocked(now, e.Name, e.Token, e.RemainingMs)
			changed = true
		case state.EventHistoryTimer:
			r.setHistLocked(now, e.RemainingMs)
			changed = true
		}
	}
	poke := changed && len(r.h) > 0 && r.h[0].deadline < r.sleepsUntil
	r.mu.Unlock()
	if poke {
		r.poke()
	}
}

// Restored rebuilds the timers from the new state if this node leads (a
// leader does not normally restore, but an operator's restore can do it).
func (r *Reaper) Restored(s *state.State) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.active {
		return
	}
	r.rebuildLocked(s)
}

// at is the deadline remainingMs after now, as an item keeps it.
func (r *Reaper) at(now time.Time, remainingMs int64) time.Duration {
	return now.Sub(r.epoch) + time.Duration(remainingMs)*time.Millisecond
}

func (r *Reaper) setLeaseLocked(now time.Time, id command.LeaseID, gen uint64, remainingMs int64) {
	d := r.at(now, remainingMs)
	if it := r.leases[id]; it != nil {
		it.gen, it.deadline = gen, d
		heap.Fix(&r.h, int(it.index))
		return
	}
	it := &item{deadline: d, lease: id, gen: gen}
	heap.Push(&r.h, it)
	r.leases[id] = it
}

func (r *Reaper) setWaitLocked(now time.Time, w command.WaitRef, remainingMs int64) {
	d := r.at(now, remainingMs)
	k := waitKey{w.LeaseID, w.Name}
	if it := r.waits[k]; it != nil {
		it.gen, it.deadline = w.Seq, d
		heap.Fix(&r.h, int(it.index))
		return
	}
	it := &item{deadline: d, lease: w.LeaseID, name: w.Name, gen: w.Seq, kind: kindWait}
	heap.Push(&r.h, it)
	r.waits[k] = it
}

func (r *Reaper) setDelayLocked(now time.Time, name string, token uint64, remainingMs int64) {
	d := r.at(now, remainingMs)
	if it := r.delays[name]; it != nil {
		it.gen, it.deadline = token, d
		heap.Fix(&r.h, int(it.index))
		return
	}
	it := &item{deadline: d, name: name, gen: token, kind: kindDelay}
	heap.Push(&r.h, it)
	r.delays[name] = it
}

func (r *Reaper) setHistLocked(now time.Time, remainingMs int64) {
	d := r.at(now, remainingMs)
	if r.hist != nil {
		r.hist.deadline = d
		heap.Fix(&r.h, int(r.hist.index))
		return
	}
	r.hist = &item{deadline: d, kind: kindHistory}
	heap.Push(&r.h, r.hist)
}

// dropLocked forgets a delay's or the history's deadline the state no
// longer has.
func (r *Reaper) dropLocked(it *item) {
	if it.index < 0 || int(it.index) >= len(r.h) || r.h[it.index] != it {
		return
	}
	heap.Remove(&r.h, int(it.index))
	switch it.kind {
	case kindDelay:
		if r.delays[it.name] == it {
			delete(r.delays, it.name)
		}
	case kindHistory:
		if r.hist == it {
			r.hist = nil
		}
	}
}

// DueWork is what Due found due.
type DueWork struct {
	Leases []command.LeaseGen
	Waits  []command.WaitRef
	// Delays are lock-delays to end (Name, Token).
	Delays []command.EndLockDelay
	// Trim: the history's oldest record is due to age out.
	Trim bool
}

func (d *DueWork) empty() bool {
	return len(d.Leases) == 0 && len(d.Waits) == 0 && len(d.Delays) == 0 && !d.Trim
}

// Due collects what is due at now (at most MaxBatch of each kind) and pushes
// those deadlines back by RetryAfter, so a proposal in flight is not repeated
// at once. It returns the time of the next deadline (zero when none).
func (r *Reaper) Due(now time.Time) (leases []command.LeaseGen, waits []command.WaitRef, next time.Time) {
	w, next := r.DueAll(now)
	return w.Leases, w.Waits, next
}

// DueAll is Due with every kind of deadline.
func (r *Reaper) DueAll(now time.Time) (w DueWork, next time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.active {
		return w, time.Time{}
	}
	at := now.Sub(r.epoch)
	for len(r.h) > 0 && r.h[0].deadline <= at && len(w.Leases) < MaxBatch && len(w.Waits) < MaxBatch && len(w.Delays) < MaxBatch {
		it := r.h[0]
		switch it.kind {
		case kindWait:
			w.Waits = append(w.Waits, it.waitRef())
		case kindDelay:
			w.Delays = append(w.Delays, command.EndLockDelay{Name: it.name, Token: it.gen})
		case kindHistory:
			w.Trim = true
		default:
			w.Leases = append(w.Leases, command.LeaseGen{LeaseID: it.lease, Gen: it.gen})
		}
		it.deadline = at + RetryAfter
		heap.Fix(&r.h, 0)
	}
	if len(r.h) > 0 {
		next = r.epoch.Add(r.h[0].deadline)
	}
	return w, next
}

// settle checks due lock-delays and the history's deadline against the
// state before they are proposed: a delay that ended, or a history that
// emptied or is not yet due on the lease clock (the leader's estimate ran
// ahead), is dropped or put back instead of proposed again and again.
func (r *Reaper) settle(w *DueWork) {
	type delayState struct {
		token uint64
		ok    bool
	}
	var (
		now    = r.clock.Now()
		states = make([]delayState, len(w.Delays))
		histMs int64
		histOK bool
	)
	r.reader.Read(func(s *state.State) {
		for i, d := range w.Delays {
			_, tok, ok := s.DelayOf(d.Name)
			states[i] = delayState{tok, ok}
		}
		if w.Trim {
			histMs, histOK = s.HistoryTimer()
		}
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	keep := w.Delays[:0]
	for i, d := range w.Delays {
		if states[i].ok && states[i].token == d.Token {
			keep = append(keep, d)
		} else if it := r.delays[d.Name]; it != nil && it.gen == d.Token {
			r.dropLocked(it)
		}
	}
	w.Delays = keep
	if w.Trim && r.hist != nil {
		switch {
		case !histOK:
			r.dropLocked(r.hist)
			w.Trim = false
		case histMs > 0:
			r.setHistLocked(now, histMs)
			w.Trim = false
		}
	}
}

// Run expires due deadlines until ctx ends. It is the reaper's only goroutine.
func (r *Reaper) Run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		w, _ := r.DueAll(r.clock.Now())
		if len(w.Leases) > 0 {
			r.propose(ctx, &command.ExpireLeases{Leases: w.Leases})
		}
		if len(w.Waits) > 0 {
			r.propose(ctx, &command.ExpireWaits{Waits: w.Waits})
		}
		if len(w.Delays) > 0 || w.Trim {
			r.settle(&w)
		}
		for i := range w.Delays {
			r.propose(ctx, &w.Delays[i])
		}
		if w.Trim {
			r.propose(ctx, &command.TrimHistory{})
		}
		if !w.empty() {
			continue // more may be due; Due bounded the batch
		}
		r.proposeRetention(ctx, r.clock.Now())
		r.tick(ctx, r.clock.Now())
		// Read the clock again: a tick's commit may have taken a while, and
		// the sleep must not be counted from before it.
		timer.Reset(r.sleep(r.clock.Now()))
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
			// Go 1.23+ timers: Reset at the top of the loop discards any stale
			// expiry, so no drain is needed here.
		case <-timer.C:
		}
		r.mu.Lock()
		r.sleepsUntil = 0
		r.mu.Unlock()
	}
}

// sleep returns how long Run sleeps from now: until the heap's first
// deadline and, while anything is tracked, at most until the next tick check.
// It records that, so Applied wakes Run only for a deadline before it would
// wake anyway; while nothing is tracked, any new deadline wakes it (the tick
// checks must start).
func (r *Reaper) sleep(now time.Time) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	at := now.Sub(r.epoch)
	wait := time.Hour
	if len(r.h) > 0 {
		wait = max(r.h[0].deadline-at, time.Millisecond)
	}
	if !r.trackingLocked() {
		r.sleepsUntil = math.MaxInt64
		return wait
	}
	wait = min(wait, max(r.nextCheck.Sub(now), time.Millisecond))
	r.sleepsUntil = at + wait
	return wait
}

// tracking reports whether the reaper leads and any lease, wait or
// lock-delay runs. The history's deadline alone needs no ticks: it is a day
// away, and a failover may only keep records a little longer.
func (r *Reaper) tracking() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.trackingLocked()
}

func (r *Reaper) trackingLocked() bool {
	n := len(r.h)
	if r.hist != nil {
		n--
	}
	return r.active && n > 0
}

// proposeRetention commits this node's history bounds when the state's
// differ (at most once per RetryAfter while they do).
func (r *Reaper) proposeRetention(ctx context.Context, now time.Time) {
	r.mu.Lock()
	want := r.retention
	due := r.active && want != nil && now.Sub(r.retentionAt) >= RetryAfter
	if due {
		r.retentionAt = now
	}
	r.mu.Unlock()
	if !due {
		return
	}
	var cur state.HistoryRetention
	r.reader.Read(func(s *state.State) { cur = s.HistoryRetentionBounds() })
	if cur == *want {
		return
	}
	r.logger.Info("setting the grant history's retention from this leader's flags",
		"per_name", want.PerName, "max_entries", want.MaxEntries, "max_bytes", want.MaxBytes, "max_age", time.Duration(want.MaxAgeMs)*time.Millisecond)
	r.propose(ctx, &command.SetHistoryRetention{PerName: want.PerName, MaxEntries: want.MaxEntries, MaxBytes: want.MaxBytes, MaxAgeMs: want.MaxAgeMs})
}

// tick commits a Tick when a check is due and the lease clock has not moved
// since the last one (see TickInterval).
func (r *Reaper) tick(ctx context.Context, now time.Time) {
	if now.Before(r.nextCheck) || !r.tracking() {
		return
	}
	r.nextCheck = now.Add(TickInterval)
	var c int64
	r.reader.Read(func(s *state.State) { c = s.LeaseClock() })
	if c == r.lastClock {
		r.propose(ctx, &command.Tick{})
		r.reader.Read(func(s *state.State) { c = s.LeaseClock() })
	}
	r.lastClock = c
}

func (r *Reaper) propose(ctx context.Context, b command.Body) {
	// etcd's lessor re-checks leadership before expiring: a reaper that was
	// demoted while collecting must not act. Raft refuses a deposed leader's
	// proposal anyway; this only saves the round trip.
	if !r.Active() {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := r.proposer.Propose(pctx, &command.Envelope{Body: b}); err != nil {
		r.logger.Warn("proposing expiry failed; will retry", "command", b.Type(), "err", err)
	}
}
