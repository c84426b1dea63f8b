// Package expiry is the leader's lease reaper: one deadline heap (monotonic
// clock) for every active lease and queued wait, and one goroutine that commits
// conditional ExpireLeases / ExpireWaits commands when deadlines pass. It runs
// only while its node is the ready leader (Promote/Demote); followers keep no
// timers. The clock and the proposer are injected so tests drive time by hand.
package expiry

import (
	"container/heap"
	"context"
	"log/slog"
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

// item is one deadline: a lease's (name empty) or a wait's. The leader keeps
// one per held lock, so it is kept small: 64 bytes, half of what a time.Time
// and a WaitRef beside the lease fields took (docs/benchmarks.md, held locks).
type item struct {
	deadline time.Duration // since the reaper's epoch, on the monotonic clock
	gen      uint64        // a lease's renewal generation; a wait's seq
	lease    command.LeaseID
	name     string // a wait's lock name (lock names are never empty)
	index    int32
}

func (it *item) isWait() bool { return it.name != "" }

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
	kick   chan struct{}
}

// New makes an inactive reaper.
func New(clock Clock, proposer Proposer, reader StateReader, logger *slog.Logger) *Reaper {
	if logger == nil {
		logger = slog.Default()
	}
	return &Reaper{clock: clock, proposer: proposer, reader: reader, logger: logger, epoch: clock.Now(),
		leases: map[command.LeaseID]*item{}, waits: map[waitKey]*item{}, kick: make(chan struct{}, 1)}
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
	r.logger.Info("lease reaper timers started", "leases", len(leases), "waits", len(waits))
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

// Len is the number of tracked deadlines.
func (r *Reaper) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.h)
}

func (r *Reaper) resetLocked() {
	r.h = nil
	r.leases = map[command.LeaseID]*item{}
	r.waits = map[waitKey]*item{}
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
		}
	}
	r.mu.Unlock()
	if changed {
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
	it := &item{deadline: d, lease: w.LeaseID, name: w.Name, gen: w.Seq}
	heap.Push(&r.h, it)
	r.waits[k] = it
}

// Due collects what is due at now (at most MaxBatch of each kind) and pushes
// those deadlines back by RetryAfter, so a proposal in flight is not repeated
// at once. It returns the time of the next deadline (zero when none).
func (r *Reaper) Due(now time.Time) (leases []command.LeaseGen, waits []command.WaitRef, next time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.active {
		return nil, nil, time.Time{}
	}
	at := now.Sub(r.epoch)
	for len(r.h) > 0 && r.h[0].deadline <= at && len(leases) < MaxBatch && len(waits) < MaxBatch {
		it := r.h[0]
		if it.isWait() {
			waits = append(waits, it.waitRef())
		} else {
			leases = append(leases, command.LeaseGen{LeaseID: it.lease, Gen: it.gen})
		}
		it.deadline = at + RetryAfter
		heap.Fix(&r.h, 0)
	}
	if len(r.h) > 0 {
		next = r.epoch.Add(r.h[0].deadline)
	}
	return leases, waits, next
}

// Run expires due deadlines until ctx ends. It is the reaper's only goroutine.
func (r *Reaper) Run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		leases, waits, next := r.Due(r.clock.Now())
		if len(leases) > 0 {
			r.propose(ctx, &command.ExpireLeases{Leases: leases})
		}
		if len(waits) > 0 {
			r.propose(ctx, &command.ExpireWaits{Waits: waits})
		}
		if len(leases) > 0 || len(waits) > 0 {
			continue // more may be due; Due bounded the batch
		}
		r.tick(ctx, r.clock.Now())
		// Read the clock again: a tick's commit may have taken a while, and
		// next must not be counted from before it.
		now := r.clock.Now()
		wait := time.Hour
		if !next.IsZero() {
			wait = max(next.Sub(now), time.Millisecond)
		}
		if r.tracking() {
			wait = min(wait, max(r.nextCheck.Sub(now), time.Millisecond))
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
			// Go 1.23+ timers: Reset at the top of the loop discards any stale
			// expiry, so no drain is needed here.
		case <-timer.C:
		}
	}
}

// tracking reports whether the reaper leads and any lease or wait runs.
func (r *Reaper) tracking() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.active && len(r.h) > 0
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
		r.logger.Warn("proposing expiry failed; will retry", "err", err)
	}
}
