// The apply helper: every write goes through Apply, which proposes on the
// leader or forwards to it, retries through leader changes while that is safe,
// and returns the FSM's result. Reads go through LinearizableRead.

package raftnode

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/fsm"
	"github.com/dlock/dlock/internal/wire"
)

// errRetry marks an attempt that certainly did not reach the log (no leader,
// leader not ready, proposal refused): trying again is always safe.
var errRetry = errors.New("not applied; retry")

// errUnknown marks an attempt whose outcome is unknown (leadership lost after
// the proposal was appended, or a forwarded request lost mid-flight).
var errUnknown = errors.New("outcome unknown")

const maxForwardBody = 1 << 20

// ForwardAttemptTimeout bounds one forwarded write's round trip to the leader
// (never beyond the request's own deadline). A leader that answers nothing in
// that time is stuck or gone; Apply then tries again, by then perhaps with a
// newly elected leader. It is far above a healthy commit's latency.
const ForwardAttemptTimeout = 2 * time.Second

// retryAfter is the Retry-After a client is given with code.
func retryAfter(c apierror.Code) time.Duration {
	if apierror.HTTPStatus(c) == http.StatusServiceUnavailable {
		return time.Second
	}
	return 0
}

// Apply commits a command and returns what the state machine answered. Any node
// may call it: a follower forwards to the leader. It retries through elections
// until ctx (or ApplyTimeout when ctx has no deadline) ends; after an unknown
// outcome it retries only commands that are safe to repeat (a request_id, or an
// idempotent command).
func (n *Node) Apply(ctx context.Context, e *command.Envelope) (*fsm.Response, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, n.cfg.ApplyTimeout)
		defer cancel()
	}
	backoff := 5 * time.Millisecond
	for {
		if err := n.stoppedErr(); err != nil {
			return nil, err
		}
		var resp *fsm.Response
		var err error
		if n.raft.State() == raft.Leader {
			resp, err = n.applyLocal(ctx, e)
		} else {
			resp, err = n.forwardApply(ctx, e)
		}
		switch {
		case err == nil && resp == nil:
			// Never answer (nil, nil): every caller reads the response.
			return nil, &apierror.Error{Code: apierror.Internal, Message: "internal error; see the server log",
				Err: errors.New("raft apply: no response and no error")}
		case err == nil:
			return resp, nil
		case errors.Is(err, errRetry):
		case errors.Is(err, errUnknown):
			if e.RequestID == "" && !e.Idempotent() {
				return nil, &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Err: err,
					Message: "leadership changed while the request was in flight and its outcome is unknown; retry with a request_id to make retries safe"}
			}
		default:
			return nil, err
		}
		if err := n.noLeader(); err != nil {
			return nil, err
		}
		if time.Until(deadline(ctx)) <= 0 {
			// The deadline has passed though ctx may not say so yet (its
			// timer has not fired): stop here rather than spin until it does.
			cause := ctx.Err()
			if cause == nil {
				cause = context.DeadlineExceeded
			}
			return nil, n.unavailable(cause)
		}
		select {
		case <-ctx.Done():
			return nil, n.unavailable(ctx.Err())
		case <-n.ctx.Done():
			return nil, &apierror.Error{Code: apierror.Unavailable, Message: "this node is shutting down; use another node", RetryAfter: time.Second}
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 100*time.Millisecond)
	}
}

// NoLeaderWait is how long a node may know no leader before requests on it
// are answered no_leader: several elections' worth, so a request rides out a
// failover, while a node cut off from the majority answers in seconds instead
// of holding every request for the whole apply timeout. The service ends
// watches and queued acquires on the same mark (LeaderlessFor).
const NoLeaderWait = 2 * time.Second

// noLeader answers no_leader once this node has known no leader for
// NoLeaderWait.
func (n *Node) noLeader() error {
	if n.LeaderlessFor() < NoLeaderWait {
		return nil
	}
	return &apierror.Error{Code: apierror.NoLeader, RetryAfter: time.Second,
		Message: "this node has known no leader for a while: it is cut off from the majority, or a quorum of nodes is down; try another node"}
}

func (n *Node) unavailable(cause error) error {
	if leader, _ := n.raft.LeaderWithID(); leader == "" {
		return &apierror.Error{Code: apierror.NoLeader, RetryAfter: time.Second, Err: cause,
			Message: "the cluster has no leader right now (an election is under way or a quorum of nodes is down); retry shortly"}
	}
	return &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Err: cause,
		Message: "the request could not be committed in time; retry shortly"}
}

// Propose applies a command only if this node is the ready leader, without
// forwarding or retrying. The lease reaper uses it.
func (n *Node) Propose(ctx context.Context, e *command.Envelope) error {
	_, err := n.applyLocal(ctx, e)
	return err
}

// stamp returns the leader timestamp for the next entry: the wall clock, but
// never earlier than anything already in the log.
func (n *Node) stamp() int64 {
	for {
		prev := n.lastTS.Load()
		ts := max(time.Now().UnixMilli(), prev)
		if n.lastTS.CompareAndSwap(prev, ts) {
			return ts
		}
	}
}

// leaseClockBase is one leader's start on the lease clock: the clock as the
// log stood when it took over, the moment (monotonic) it did, and the term of
// that leadership (command.Envelope.ClockTerm).
type leaseClockBase struct {
	base  int64
	start time.Time
	term  uint64
}

// stamped is e as this leader proposes it: with its timestamp, its lease
// clock reading and any new lease id (command.Envelope.Stamped).
func (n *Node) stamped(e *command.Envelope) *command.Envelope {
	c := e.Stamped(n.stamp())
	c.Clock, c.ClockTerm = 0, 0 // never what came over the wire
	if lc := n.leaseClock.Load(); lc != nil {
		c.Clock, c.ClockTerm = lc.base+time.Since(lc.start).Milliseconds(), lc.term
	}
	return c
}

// An Endorser adds to the leader's answer to a forwarded write what only the
// layer above knows how to make — a grant's token proof, which must be signed
// with the key current once the grant is applied. The leader has applied the
// entry when it answers; the follower has not, and without the endorsement it
// would have to wait until it has (a second commit round: it hears of the
// commit only from the leader's next AppendEntries) before it could sign.
// It runs on the leader's forwarding handler, once per forwarded write, and
// returns "" when it has nothing to add.
type Endorser func(e *command.Envelope, resp *fsm.Response) string

// SetEndorser installs the endorser; until it is set, forwarded writes are
// answered without endorsements.
func (n *Node) SetEndorser(f Endorser) { n.endorser.Store(&f) }

// endorse is the endorsement of resp, the answer to the forwarded write e.
func (n *Node) endorse(e *command.Envelope, resp *fsm.Response) string {
	if f := n.endorser.Load(); f != nil {
		return (*f)(e, resp)
	}
	return ""
}

// applyLocal proposes e on this node, the ready leader.
func (n *Node) applyLocal(ctx context.Context, e *command.Envelope) (*fsm.Response, error) {
	if !n.ready.Load() {
		return nil, errRetry
	}
	if guarded(e) {
		if err := n.disk.check(); err != nil {
			return nil, err
		}
	}
	data, err := command.EncodeChecked(n.stamped(e))
	if err != nil {
		return nil, apierror.Wrap(apierror.TooLarge, err, "the request is too large to replicate; send less data")
	}
	if time.Until(deadline(ctx)) <= 0 {
		// Nothing was proposed, so this is safe to retry. Never ctx.Err():
		// it is still nil between the deadline and the moment ctx's timer
		// fires, and callers would take (nil, nil) for a success.
		return nil, fmt.Errorf("%w: the deadline passed before the command was proposed", errRetry)
	}
	resp, err := n.packer.submit(ctx, data)
	if err != nil && !errors.Is(err, errRetry) && n.Err() != nil {
		// The write may have reached the disk before its fsync failed.
		return nil, fmt.Errorf("%w: this node's storage failed while the entry was written: %v", errUnknown, err)
	}
	return resp, err
}

func deadline(ctx context.Context) time.Time {
	if d, ok := ctx.Deadline(); ok {
		return d
	}
	return time.Now().Add(10 * time.Second)
}

// leaderAddr is the raft address of the current leader, if known and not self.
func (n *Node) leaderAddr() (string, bool) {
	addr, id := n.raft.LeaderWithID()
	if addr == "" || string(id) == n.cfg.ID {
		return "", false
	}
	return string(addr), true
}

func (n *Node) forwardApply(ctx context.Context, e *command.Envelope) (*fsm.Response, error) {
	addr, ok := n.leaderAddr()
	if !ok {
		return nil, errRetry
	}
	n.forwarded.Add(1)
	// Each attempt gets its own, shorter timeout (never beyond ctx's), so a
	// leader that stopped answering does not use up the whole request: the
	// next attempt can reach the leader elected in its place.
	actx, cancel := context.WithTimeout(ctx, ForwardAttemptTimeout)
	defer cancel()
	body, status, err := n.forward(actx, addr, "/forward/apply", command.Encode(e))
	if err != nil {
		// The request may or may not have reached the leader, whether the
		// attempt failed or timed out or ctx ended: never a bare context
		// error, which would reach the client as an internal error.
		return nil, fmt.Errorf("%w: forward to leader %s: %v", errUnknown, addr, err)
	}
	if status != http.StatusOK {
		// The leader's client-facing error, if it sent one (serveMember's
		// format).
		var we wireError
		if json.Unmarshal(body, &we) == nil && we.Code != "" {
			return nil, &apierror.Error{Code: we.Code, Message: we.Message, RetryAfter: retryAfter(we.Code),
				Err: fmt.Errorf("forward to leader %s: status %d", addr, status)}
		}
	}
	switch status {
	case http.StatusOK:
	case http.StatusServiceUnavailable:
		return nil, errRetry
	case http.StatusConflict:
		return nil, fmt.Errorf("%w: %s", errUnknown, body)
	default:
		return nil, fmt.Errorf("forward to leader %s: status %d: %s", addr, status, body)
	}
	r := wire.NewReader(body)
	resp := &fsm.Response{Index: r.Uvarint()}
	resp.Result = command.DecodeResult(r)
	// The trailing fields are absent from leaders of earlier versions: the
	// Replayed flag, then the Seq (a leader that does not pack names each
	// command by its entry's index), then the endorsement (SetEndorser),
	// then the result's lock-model fields (command.EncodeResultExt).
	resp.Seq = resp.Index
	if r.Len() > 0 {
		resp.Result.Replayed = r.Bool()
	}
	if r.Len() > 0 {
		resp.Seq = r.Uvarint()
	}
	if r.Len() > 0 {
		resp.Endorsement = r.String()
	}
	if r.Len() > 0 {
		command.DecodeResultExt(r, &resp.Result)
	}
	if err := r.Err(); err != nil {
		return nil, fmt.Errorf("forward to leader %s: bad answer: %w", addr, err)
	}
	return resp, nil
}

func (n *Node) forward(ctx context.Context, addr, path string, payload []byte) ([]byte, int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+path, bytes.NewReader(payload))
	if err != nil {
		return nil, 0, err
	}
	req.Header.Set("X-Dlock-From", n.cfg.ID)
	if g := n.group(); g != defaultGroup {
		req.Header.Set(groupHeader, strconv.FormatUint(g, 10))
	}
	res, err := n.fwdClient.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, maxForwardBody))
	if err != nil {
		return nil, 0, err
	}
	return body, res.StatusCode, nil
}

// forwardHandler serves other nodes: apply a command here (only if this node is
// the ready leader — never forward again, so requests cannot loop) and read-index.
func (n *Node) forwardHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /forward/apply", func(w http.ResponseWriter, r *http.Request) {
		data, err := io.ReadAll(io.LimitReader(r.Body, maxForwardBody))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		e, err := command.Decode(data)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		resp, err := n.applyLocal(r.Context(), e)
		switch {
		case err == nil:
		case errors.Is(err, errRetry):
			http.Error(w, "not the leader", http.StatusServiceUnavailable)
			return
		case errors.Is(err, errUnknown), errors.Is(err, raft.ErrRaftShutdown):
			// Raft answers ErrRaftShutdown also for entries that were
			// appended or even committed: the outcome is unknown.
			http.Error(w, err.Error(), http.StatusConflict)
			return
		default:
			// Send the client-facing error back, as serveMember does.
			ae := apierror.From(err)
			if ae.Code == apierror.Internal {
				n.logger.Error("forwarded write failed", "from", r.Header.Get("X-Dlock-From"), "err", err)
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(apierror.HTTPStatus(ae.Code))
			_ = json.NewEncoder(w).Encode(wireError{Code: ae.Code, Message: ae.Message})
			return
		}
		wr := &wire.Writer{}
		wr.Uvarint(resp.Index)
		command.EncodeResult(wr, &resp.Result)
		// EncodeResult is the snapshot's format, which leaves Replayed
		// out; the forwarding node needs it (Service.replayedGrant).
		wr.Bool(resp.Result.Replayed)
		wr.Uvarint(resp.Seq)
		// Followers of earlier versions stop reading before it, and before
		// the result's newer fields.
		wr.String(n.endorse(e, resp))
		command.EncodeResultExt(wr, &resp.Result)
		_, _ = w.Write(wr.Buf)
	})
	mux.HandleFunc("POST /forward/join", n.serveMember(func(r memberRequest) error { return n.joinLocal(context.Background(), r.ID, r.RaftAddr) }))
	mux.HandleFunc("POST /forward/remove", n.serveMember(func(r memberRequest) error { return n.removeLocal(context.Background(), r.ID) }))
	mux.HandleFunc("POST /forward/transfer", n.serveMember(func(r memberRequest) error { return n.TransferLeadership(context.Background(), r.ID) }))
	mux.HandleFunc("POST /forward/status", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{"id": n.cfg.ID, "applied": n.fsm.AppliedIndex(), "state": n.raft.State().String(), "engine": n.cfg.Engine})
	})
	mux.HandleFunc("POST /forward/readindex", func(w http.ResponseWriter, r *http.Request) {
		idx, err := n.readIndexLocal()
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write(binary.AppendUvarint(nil, idx))
	})
	return mux
}

// readIndexLocal confirms this node still leads (a heartbeat round to a quorum)
// and returns the index a read must wait for: at least every entry any replica
// had applied when the call began, since a replica may already have shown one
// to a client (a watch event) that the leader has not applied yet. That is
// the commit index, as in etcd's ReadIndex: a follower applies an entry once
// it learns the commit, which can be before the leader's own FSM has (the
// etcd engine's leader applies only what is durable on its own disk;
// hashicorp/raft's leader hands commits to its FSM goroutine, which may lag).
//
// The etcd engine hands every entry, no-ops included, to the FSM, and its
// ReadIndex answers the confirmed commit index. hashicorp/raft never hands
// no-ops and barriers (the commit notices) to the FSM, whose applied index
// would never reach one: there it is the last entry at or below the commit
// index that the FSM sees.
func (n *Node) readIndexLocal() (uint64, error) {
	if !n.ready.Load() {
		return 0, errRetry
	}
	idx := n.fsm.AppliedIndex()
	commit := n.raft.CommitIndex()
	f := n.raft.VerifyLeader()
	if err := f.Error(); err != nil {
		return 0, fmt.Errorf("%w: %v", errRetry, err)
	}
	if ri, ok := f.(confirmedRead); ok {
		return max(idx, ri.Index()), nil
	}
	return max(idx, n.fsmEntryAtOrBelow(commit, idx)), nil
}

// maxReadIndexWalk bounds how many entries fsmEntryAtOrBelow reads back: the
// leader appends at most a no-op and a barrier after its last command of a
// term, so a longer run than this is a log it does not understand.
const maxReadIndexWalk = 64

// fsmEntryAtOrBelow is the index of the last entry at or below index that
// hashicorp/raft hands to the FSM (a command or a configuration), or applied
// if none is above it. A log it cannot read answers index itself: a read then
// waits for a later entry, or answers unavailable at CatchUpTimeout, but never
// reads behind the commit.
func (n *Node) fsmEntryAtOrBelow(index, applied uint64) uint64 {
	for i := index; i > applied; i-- {
		var l raft.Log
		if index-i >= maxReadIndexWalk || n.hlogs == nil || n.hlogs.GetLog(i, &l) != nil {
			return index
		}
		if l.Type == raft.LogCommand || l.Type == raft.LogConfiguration {
			return i
		}
	}
	return applied
}

// LinearizableRead returns once the local state machine reflects every write
// acknowledged before the call. The leader confirms its leadership; a follower
// asks the leader for its applied index and waits until it has applied as much.
func (n *Node) LinearizableRead(ctx context.Context) error {
	if err := n.stoppedErr(); err != nil {
		return err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, n.cfg.ApplyTimeout)
		defer cancel()
	}
	backoff := 5 * time.Millisecond
	for {
		var idx uint64
		var err error
		if n.raft.State() == raft.Leader {
			idx, err = n.readIndexLocal()
		} else if addr, ok := n.leaderAddr(); ok {
			var body []byte
			var status int
			body, status, err = n.forward(ctx, addr, "/forward/readindex", nil)
			if err == nil && status != http.StatusOK {
				err = errRetry
			}
			if err == nil {
				var k int
				idx, k = binary.Uvarint(body)
				if k <= 0 {
					err = errors.New("bad read index answer")
				}
			}
		} else {
			err = errRetry
		}
		if err == nil {
			return n.CatchUp(ctx, idx)
		}
		if err := n.noLeader(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return n.unavailable(ctx.Err())
		case <-n.ctx.Done():
			return &apierror.Error{Code: apierror.Unavailable, Message: "this node is shutting down; use another node", RetryAfter: time.Second}
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 100*time.Millisecond)
	}
}

// CatchUpTimeout bounds how long a request waits for this node to apply an
// entry the leader has committed. A member applies it within a heartbeat or
// two; one that has not in this long was removed from the cluster (the leader
// no longer sends it the log) or was cut off just after the leader answered,
// and would otherwise hold the request until its client gives up — and hold up
// this node's graceful shutdown, which waits for open requests.
const CatchUpTimeout = 2 * time.Second

// CatchUp waits until this node has applied the entry at index, so a follower
// answers from state at least as new as what the leader answered. It gives up
// after CatchUpTimeout, or when ctx ends or the node shuts down, answering
// "unavailable": the client should retry through another node (with the same
// request_id, a write already committed is answered from there).
func (n *Node) CatchUp(ctx context.Context, index uint64) error {
	if n.fsm.AppliedIndex() >= index {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, CatchUpTimeout)
	defer cancel()
	stop := context.AfterFunc(n.ctx, cancel)
	defer stop()
	err := n.fsm.WaitApplied(wctx, index)
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return n.unavailable(err)
	case n.ctx.Err() != nil:
		return &apierror.Error{Code: apierror.Unavailable, Err: err, RetryAfter: time.Second,
			Message: "this node is shutting down; use another node"}
	}
	// Not wrapping err: the caller's context did not end, only this wait.
	return &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second,
		Err:     fmt.Errorf("log index %d not applied here within %s", index, CatchUpTimeout),
		Message: fmt.Sprintf("this node has not applied log entry %d, which the leader committed, within %s: it is behind, cut off, or no longer a member; retry through another node (with the same request_id, a write already committed is answered from there)", index, CatchUpTimeout)}
}

// awaitFuture waits for a Raft future, but no longer than ctx. A future that
// was still queued when Raft shut down is never answered (hashicorp/raft
// #498), and a goroutine blocked on it would hold up Shutdown forever; the
// waiting goroutine started here ends when the future is answered, or stays
// parked on a dead Raft until the process exits.
func awaitFuture(ctx context.Context, f raft.Future) error {
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("waiting for raft: %w", ctx.Err())
	}
}
