// Group commit across requests: the leader packs concurrent writes into one
// log entry while its earlier entries are still being committed.

package raftnode

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/fsm"
)

// DefaultPackInFlight is how many log entries the leader's packer lets be
// under commit at once. The first goes out at once; a second only beside an
// entry of a lone write (packer.mayPropose). Writes that arrive meanwhile
// wait and go out together in the next entry, so under load one log entry
// carries tens of writes and every replica stores, replicates and bookkeeps
// one entry instead of one per write (11–12 % less CPU per lock+unlock cycle
// at 64–256 workers, docs/benchmarks.md), while a lone write never waits for
// anything but an entry under commit.
const DefaultPackInFlight = 2

// DefaultCommitNoticeDelay is how long the leader lets a commit go
// unannounced to the followers before it appends a barrier to announce it
// (packer.notice).
const DefaultCommitNoticeDelay = time.Millisecond

// DefaultPackLinger is how long a lone write waits for company when the
// lone writes before it came in pairs (packer.linger).
const DefaultPackLinger = 100 * time.Microsecond

// applier is the call the packer makes into Raft to propose (raft.Raft.Apply).
type applier func(data []byte, timeout time.Duration) raft.ApplyFuture

// barrierer appends an entry the state machine never sees (raft.Raft.Barrier).
type barrierer func(timeout time.Duration) raft.Future

// proposal is one encoded command on its way into a log entry.
type proposal struct {
	data     []byte
	deadline time.Time
	done     chan proposalResult // buffered: answering never waits for the caller
}

type proposalResult struct {
	resp *fsm.Response
	err  error
}

// packer owns the queue of proposals on the leader. One goroutine (run) takes
// them in arrival order, waits until it may propose (mayPropose), packs
// whatever queued meanwhile into one entry and proposes it; a goroutine per
// entry waits for Raft's answer, counts the entry out of commit and answers
// each proposal. When the writes stop, run announces the last commit to the
// followers (notice).
type packer struct {
	apply   applier
	queue   chan *proposal
	maxCmds int

	// Entries under commit: how many, and how many of them carry more than
	// one write. freed is signalled when one is answered. owed says an entry
	// ended since the last notice: once none is under commit, no entry is
	// left to carry the news of its commit to the followers.
	mu          sync.Mutex
	inFlight    int
	packed      int
	maxInFlight int
	owed        bool
	freed       chan struct{}

	barrier     barrierer
	noticeDelay time.Duration

	maxBytes int
	stopped  <-chan struct{}

	// lingerFor is how long a lone write waits for company (zero: never);
	// run's own: paired says the last lone writes came in pairs, lastLone
	// when the last one was proposed.
	lingerFor time.Duration
	paired    bool
	lastLone  time.Time

	// Counters for metrics: entries proposed and the commands in them.
	entries  atomic.Uint64
	commands atomic.Uint64
	notices  atomic.Uint64
	lingers  atomic.Uint64
}

func newPacker(apply applier, barrier barrierer, inFlight int, noticeDelay, linger time.Duration, stopped <-chan struct{}) *packer {
	return &packer{
		apply:   apply,
		queue:   make(chan *proposal),
		maxCmds: command.MaxPacked,
		freed:   make(chan struct{}, 1),

		barrier:     barrier,
		noticeDelay: noticeDelay,

		maxInFlight: inFlight,
		maxBytes:    command.MaxEntryBytes,
		stopped:     stopped,
		lingerFor:   linger,
	}
}

// submit hands one encoded command (within command.MaxEntryBytes) to the
// packer and waits for the state machine's answer. Errors are apply.go's:
// errRetry if it certainly was not proposed, errUnknown if it may have been.
func (p *packer) submit(ctx context.Context, data []byte) (*fsm.Response, error) {
	pr := &proposal{data: data, deadline: deadline(ctx), done: make(chan proposalResult, 1)}
	select {
	case p.queue <- pr:
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: the deadline passed before the command was proposed", errRetry)
	case <-p.stopped:
		return nil, fmt.Errorf("%w: the node is shutting down", errRetry)
	}
	select {
	case r := <-pr.done:
		return r.resp, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: waiting for raft: %v", errUnknown, ctx.Err())
	}
}

// run packs and proposes until stopped. Proposals it still holds then were
// never proposed and are answered errRetry; entries already proposed are
// answered by Raft (or, if Raft never answers a future queued when it shut
// down, hashicorp/raft #498, by their callers' deadlines).
func (p *packer) run() {
	var next *proposal // taken from the queue but did not fit in the last entry
	notice := time.NewTimer(p.noticeDelay)
	notice.Stop()
	defer notice.Stop()
	var noticeC <-chan time.Time // notice's channel while it is armed
	for {
		if next == nil {
			if p.noticeOwed() && noticeC == nil {
				notice.Reset(p.noticeDelay)
				noticeC = notice.C
			}
			select {
			case next = <-p.queue:
				notice.Stop()
				noticeC = nil
			case <-p.freed: // maybe the last entry under commit ended
				continue
			case <-noticeC:
				noticeC = nil
				p.notice()
				continue
			case <-p.stopped:
				return
			}
		}
		// While it may not propose, later requests queue up behind next and
		// join its entry.
		for !p.mayPropose() {
			select {
			case <-p.freed:
			case <-p.stopped:
				next.done <- proposalResult{err: fmt.Errorf("%w: the node is shutting down", errRetry)}
				return
			}
		}
		batch := []*proposal{next}
		next = p.fill(&batch)
		if next == nil && len(batch) == 1 && p.linger() {
			next = p.waitForCompany(&batch)
		}
		p.propose(batch)
	}
}

// fill adds to batch what is queued, within the entry's bounds; it returns
// the proposal that did not fit (nil if none).
func (p *packer) fill(batch *[]*proposal) *proposal {
	size := 0
	for _, pr := range *batch {
		size += len(pr.data)
	}
	for len(*batch) < p.maxCmds {
		select {
		case q := <-p.queue:
			if size+len(q.data)+command.PackedOverhead(len(*batch)+1) > p.maxBytes {
				return q
			}
			*batch = append(*batch, q)
			size += len(q.data)
		default:
			return nil
		}
	}
	return nil
}

// linger says whether a lone write is to wait lingerFor for company: when
// the last two lone writes came within lingerFor of each other. A
// contended lock hands off that way — the releaser queues again as the next
// holder releases — and one entry then carries both: every node writes,
// replicates, acknowledges and applies once per hand-off instead of twice,
// which the hand-offs of both engines gain more from than the wait costs
// (docs/benchmarks.md). A lone writer (one client, or writes far apart) never
// waits.
func (p *packer) linger() bool {
	if p.lingerFor <= 0 {
		return false
	}
	now := time.Now()
	last := p.lastLone
	p.lastLone = now
	if !p.paired && !last.IsZero() && now.Sub(last) < p.lingerFor {
		p.paired = true
		return false // this one's partner already went
	}
	return p.paired
}

// waitForCompany waits up to lingerFor for a second write to join batch's
// lone one, then takes whatever else queued; it returns the proposal that
// did not fit. Writes stop lingering once one waited alone.
func (p *packer) waitForCompany(batch *[]*proposal) *proposal {
	p.lingers.Add(1)
	t := time.NewTimer(p.lingerFor)
	defer t.Stop()
	var next *proposal
	select {
	case q := <-p.queue:
		if len((*batch)[0].data)+len(q.data)+command.PackedOverhead(2) > p.maxBytes {
			next = q
		} else {
			*batch = append(*batch, q)
			next = p.fill(batch)
		}
	case <-t.C:
	case <-p.stopped:
	}
	p.paired = len(*batch) > 1
	return next
}

// mayPropose says whether a new entry may go out now: always when none is
// under commit; beside others (up to maxInFlight) only while each of those
// carries a single write. Under load, entries carry many writes and the next
// waits to carry more, which is what saves CPU; a lone write beside a lone
// write is a light load, where the commit's latency matters more (a
// contended lock's next holder releasing while the last one queues again).
func (p *packer) mayPropose() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inFlight == 0 || (p.inFlight < p.maxInFlight && p.packed == 0)
}

// noticeOwed says whether the followers have yet to learn of a commit while
// no entry is under commit (whose own answer would come first).
func (p *packer) noticeOwed() bool {
	if p.barrier == nil {
		return false // the engine announces commits itself (etcd engine)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.owed && p.inFlight == 0
}

// notice tells the followers about the last commit. hashicorp/raft sends
// the leader's commit index only with AppendEntries, and when no new entry
// follows, only after its CommitTimeout (50–100 ms): until then a follower's
// watchers do not see the write, and a linearizable read — or a write whose
// answer it reads from its own state (a place in line, an election's
// leader) — through that follower waits for it. A barrier is the cheapest
// entry that makes Raft send at once: the state machine never sees it, and
// reads wait for the state machine's index, not Raft's, so nothing waits for
// the barrier's own commit. run sends it only after noticeDelay of quiet, so
// a client that writes again at once (its next entry carries the news) pays
// nothing. A forwarded grant does not wait for it either: the leader signs
// it and the follower answers at once (Endorser). Announcing every
// forwarded write at once would put a barrier's fsync in front of the same
// client's next write.
func (p *packer) notice() {
	p.mu.Lock()
	owed := p.owed && p.inFlight == 0
	if owed {
		p.owed = false
	}
	p.mu.Unlock()
	if !owed {
		return
	}
	p.notices.Add(1)
	// Not awaited: if leadership was lost meanwhile it fails, and the new
	// leader's own entries carry its commits. The timeout bounds only the
	// wait to enter Raft's queue, which is nearly empty when the leader is
	// this quiet.
	_ = p.barrier(p.noticeDelay)
}

// track counts the entry of batch in (+1) or out (-1) of commit.
func (p *packer) track(batch []*proposal, delta int) {
	p.mu.Lock()
	p.inFlight += delta
	if len(batch) > 1 {
		p.packed += delta
	}
	// An entry that ends owes a notice even if it failed: when it never
	// reached the log (ErrEnqueueTimeout), an earlier commit may still be
	// unannounced; when leadership was lost, the barrier simply fails.
	if delta < 0 {
		p.owed = true
	}
	p.mu.Unlock()
	if delta < 0 {
		select {
		case p.freed <- struct{}{}:
		default:
		}
	}
}

// propose sends one entry of batch to Raft.
func (p *packer) propose(batch []*proposal) {
	// A proposal whose deadline has passed is dropped before it reaches the
	// log (its caller has stopped waiting or is about to): safe to retry.
	now := time.Now()
	live := batch[:0]
	timeout := time.Duration(1<<63 - 1)
	for _, pr := range batch {
		left := pr.deadline.Sub(now)
		if left <= 0 {
			pr.done <- proposalResult{err: fmt.Errorf("%w: the deadline passed before the command was proposed", errRetry)}
			continue
		}
		live = append(live, pr)
		timeout = min(timeout, left)
	}
	if len(live) == 0 {
		return
	}
	data := live[0].data
	if len(live) > 1 {
		cmds := make([][]byte, len(live))
		for i, pr := range live {
			cmds[i] = pr.data
		}
		data = command.EncodePacked(cmds)
	}
	p.entries.Add(1)
	p.commands.Add(uint64(len(live)))
	p.track(live, +1)
	// Raft's timeout only bounds the wait to enter its queue; the answer is
	// awaited without one (each caller gives up at its own deadline).
	f := p.apply(data, timeout)
	go func() {
		err := f.Error()
		p.track(live, -1)
		if err != nil {
			err = applyError(err)
			for _, pr := range live {
				pr.done <- proposalResult{err: err}
			}
			return
		}
		switch r := f.Response().(type) {
		case *fsm.Response:
			if len(live) == 1 {
				live[0].done <- proposalResult{resp: r}
				return
			}
		case []fsm.Response:
			if len(r) == len(live) {
				for i, pr := range live {
					pr.done <- proposalResult{resp: &r[i]}
				}
				return
			}
		}
		err = fmt.Errorf("raft apply: unexpected FSM response %T for %d commands", f.Response(), len(live))
		for _, pr := range live {
			pr.done <- proposalResult{err: err}
		}
	}()
}

// applyError classifies an error of Raft's apply future: errRetry if the entry
// certainly did not reach the log, errUnknown if it may have.
func applyError(err error) error {
	switch {
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipTransferInProgress), errors.Is(err, raft.ErrEnqueueTimeout):
		return fmt.Errorf("%w: %v", errRetry, err)
	case errors.Is(err, raft.ErrLeadershipLost):
		// Proposed but not known to be committed or dropped.
		return fmt.Errorf("%w: %v", errUnknown, err)
	case errors.Is(err, raft.ErrRaftShutdown):
		return &apierror.Error{Code: apierror.Unavailable, Message: "this node is shutting down; use another node", RetryAfter: time.Second, Err: err}
	}
	return fmt.Errorf("raft apply: %w", err)
}
