// A queued acquire's whole life, from the request to its answer: propose,
// wait in line (await), and every way a wait ends — granted, replayed from
// the dedup table, lost before it was answered, timed out, withdrawn because
// its caller went away (abandon), left on a node that lost its leader
// (leaveLine) or could not follow it (cannotFollow), or given back when the
// grant could not be answered (giveBack). keepsPlace is the one rule for
// which of those leave the place in line (and a grant) for the client's
// retry.

package service

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/dlock/dlock/fence"
	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/fsm"
	"github.com/dlock/dlock/internal/state"
)

// keepsPlace reports whether a wait, or a grant nobody heard of, stays for
// the client to claim: only when it sent a request_id of its own can it
// retry through another node and be answered from the dedup table with this
// very wait. Without one nobody can come back for it, so it is withdrawn or
// released.
func keepsPlace(a acquireArgs) bool { return a.requestID != "" }

// Acquire takes a lock, or waits for it in FIFO order when WaitTimeoutMs > 0.
func (s *Service) Acquire(ctx context.Context, req AcquireRequest) (_ *AcquireResponse, err error) {
	defer s.observe("acquire", time.Now(), &err)
	if err = s.admit(ctx, req.ClientID); err != nil {
		return nil, err
	}
	name, err := normalize(req.Name)
	if err != nil {
		return nil, err
	}
	if err := checkID("client_id", req.ClientID, true); err != nil {
		return nil, err
	}
	tok, err := s.authToken(ctx, command.PermLock, name, req.ClientID)
	if err != nil {
		return nil, err
	}
	if err := s.authorizeTakeover(tok, req.Takeover, req.ClientID); err != nil {
		return nil, err
	}
	shared, err := checkLockModel(req)
	if err != nil {
		return nil, err
	}
	// A wait in line ends when the token that queued it is revoked.
	ctx, untrack := s.trackToken(ctx, tok)
	defer untrack()
	g, err := s.acquire(ctx, acquireArgs{key: name, what: "lock", clientID: req.ClientID, requestID: req.RequestID,
		ttlMs: req.TTLms, sessionID: req.SessionID, waitMs: req.WaitTimeoutMs, takeover: req.Takeover,
		value: req.Value, lockDelayMs: req.LockDelayMs, limit: req.Limit, shared: shared, subtree: req.Subtree})
	if g == nil {
		return nil, err
	}
	res := &AcquireResponse{Acquired: g.granted, FencingToken: g.token, TokenProof: g.proof, LeaseRef: g.leaseRef, ExpiresAt: g.expiresAt,
		LeaseID: g.leaseID, Revision: g.revision, Holder: g.holder, Limit: g.limit}
	return res, err
}

// checkLockModel validates an acquire's limit and mode; it reports whether
// the mode is shared.
func checkLockModel(req AcquireRequest) (bool, error) {
	var shared bool
	switch req.Mode {
	case "", ModeExclusive:
	case ModeShared:
		shared = true
	default:
		return false, invalid("mode must be %q (the default) or %q, got %q", ModeExclusive, ModeShared, req.Mode)
	}
	switch {
	case req.Limit < 0 || req.Limit > command.MaxLimit:
		return false, invalid("limit must be between 1 and %d (a counting lock's holders at once; 1, the default, is a mutex), got %d", command.MaxLimit, req.Limit)
	case shared && req.Limit > 1:
		return false, invalid("a counting lock (limit above 1) is exclusive only: drop the limit to take a shared lock, or the mode to take one of its %d places", req.Limit)
	}
	return shared, nil
}

// acquire is the one acquire path behind locks and election campaigns. Every
// grant it answers carries the cluster's proof of it.
func (s *Service) acquire(ctx context.Context, a acquireArgs) (*grantAnswer, error) {
	g, err := s.acquireOnce(ctx, a)
	if err == nil && g != nil && g.granted {
		// Sign with the key current once the grant is applied here, never
		// with an older one: a follower lagging behind a rotation would
		// otherwise sign with a retired key a token above that key's
		// published bound (max_token), and resources would refuse the
		// proof as forged. On the leader the grant is applied already. If
		// the caller gives up first, it will not read the answer anyway.
		// A follower need not wait when the leader has signed the grant
		// for it (endorse), right after applying it.
		if g.index > 0 && g.proof == "" {
			if err := s.catchUp(ctx, g.index); err != nil {
				s.giveBack(a, g)
				return nil, err
			}
		}
		g.leaseRef = fence.LeaseRef(g.leaseID)
		if g.proof == "" {
			g.proof = s.proof(a.key, g.token, a.clientID, g.leaseRef)
		}
	}
	return g, err
}

// endorse runs on the leader for every write a follower forwarded
// (raftnode.Endorser): a grant made by the command itself is signed here,
// where it has been applied, so the follower can answer its client at once
// instead of first applying the grant to sign it. The same bytes either way
// (Ed25519 is deterministic), unless a key rotation commits in between —
// then the newer key signs, as on the leader's own path. A replayed grant
// is not endorsed: the follower reads its fate from its own state.
func (s *Service) endorse(e *command.Envelope, resp *fsm.Response) string {
	a, ok := e.Body.(*command.Acquire)
	r := &resp.Result
	if !ok || r.Status != command.StatusOK || r.Seq != resp.Seq {
		return ""
	}
	return s.proof(a.Name, r.Token, e.ClientID, fence.LeaseRef(r.LeaseID.String()))
}

func (s *Service) acquireOnce(ctx context.Context, a acquireArgs) (*grantAnswer, error) {
	if err := checkID("request_id", a.requestID, false); err != nil {
		return nil, err
	}
	if a.waitMs < 0 || a.waitMs > command.MaxWaitMs {
		return nil, invalid("wait_timeout_ms must be between 0 and %d, got %d", command.MaxWaitMs, a.waitMs)
	}
	if len(a.value) > command.MaxValueLen {
		return nil, invalid("value is %d bytes; the limit is %d", len(a.value), command.MaxValueLen)
	}
	if a.lockDelayMs < 0 || a.lockDelayMs > command.MaxLockDelayMs {
		return nil, invalid("lock_delay_ms must be between 0 and %d, got %d", command.MaxLockDelayMs, a.lockDelayMs)
	}
	body := &command.Acquire{Name: a.key, WaitMs: a.waitMs, Value: a.value, Takeover: a.takeover, Limit: a.limit, Shared: a.shared, Subtree: a.subtree,
		LockDelayMs: a.lockDelayMs}
	switch {
	case a.sessionID != "" && a.ttlMs != 0:
		return nil, invalid("give either ttl_ms (a lease for this %s alone) or session_id, not both", a.what)
	case a.sessionID != "":
		id, err := parseLease("session_id", a.sessionID)
		if err != nil {
			return nil, err
		}
		body.Session, body.LeaseID = true, id
	default:
		if a.ttlMs == 0 {
			return nil, invalid("ttl_ms is required (%d to %d) unless session_id is given", command.MinTTLms, command.MaxTTLms)
		}
		if err := checkTTL(a.ttlMs, true); err != nil {
			return nil, err
		}
		body.TTLms = a.ttlMs
	}
	counts, err := s.checkCaps(a, !body.Session)
	if err != nil {
		return nil, err
	}
	body.MaxWaiters = s.maxWaiters(a)
	env := envelope(a.clientID, a.requestID, body)
	resp, err := s.node.Apply(ctx, env)
	if err != nil {
		return nil, err
	}
	r := resp.Result
	if counts && (r.Status == command.StatusOK || r.Status == command.StatusQueued) {
		s.leaseCreated(a.clientID)
	}
	switch r.Status {
	case command.StatusOK:
		if r.Seq != resp.Seq {
			// Not granted by this entry: a retry answered from the dedup
			// table (or the same lease again). The grant may have ended
			// since; a dead grant must not be handed out as a live one.
			return s.replayedGrant(ctx, a, r, resp.Index)
		}
		return &grantAnswer{granted: true, token: r.Token, expiresAt: ms(r.ExpiresAt), leaseID: r.LeaseID.String(), revision: r.Revision,
			index: resp.Index, proof: resp.Endorsement}, nil
	case command.StatusLockHeld:
		return refused(a, r, resp.Index)
	case command.StatusLimitMismatch:
		return &grantAnswer{limit: int(r.Limit), revision: r.Revision, index: resp.Index}, apierror.New(apierror.LimitMismatch,
			"lock %q is in use with limit %d; acquire it with limit %d (a shared request needs limit 1), or wait until nobody holds or waits for it to set another",
			displayName(a.key), r.Limit, r.Limit)
	case command.StatusQueued:
		return s.await(ctx, a, env.RequestID, body.Session, r, resp.Index, time.Duration(a.waitMs)*time.Millisecond)
	case command.StatusQueueFull:
		return nil, s.queueFullErr(a, body.MaxWaiters)
	case command.StatusLockDelayed:
		left := time.Duration(r.TTLms) * time.Millisecond
		return nil, &apierror.Error{Code: apierror.LockDelayed, RetryAfter: left, Message: fmt.Sprintf(
			"%s %q is in a lock-delay (its last grant ended by expiry or revoke): nobody gets it for another %s; retry then, or wait in line (wait_timeout_ms)",
			a.what, displayName(a.key), left)}
	}
	return nil, statusErr(r, a.what)
}

// refused is the lock_held answer: who holds what keeps the request out —
// the lock itself, a subtree grant above it, or a grant inside the subtree
// asked for — or, when only requests ahead of it in line do, no holder.
func refused(a acquireArgs, r command.Result, index uint64) (*grantAnswer, error) {
	g := &grantAnswer{revision: r.Revision, index: index}
	name := displayName(a.key)
	if r.Holder.ClientID == "" && r.Holder.Token == 0 {
		return g, apierror.New(apierror.LockHeld, "%s %q is kept out by requests waiting ahead of it in line (for it, or through a subtree); retry later, or wait in line for it", a.what, name)
	}
	h := holderView(r.Holder)
	g.holder = h
	if _, election := command.SplitKey(a.key); !election {
		h.Mode, h.Subtree, h.Lock = modeName(r.HolderShared), r.HolderSubtree, r.Message
	}
	if h.Lock != "" {
		return g, apierror.New(apierror.LockHeld, "%s %q is held through %q by %q (a subtree lock covers both); retry later, or wait in line for it", a.what, name, h.Lock, h.ClientID)
	}
	return g, apierror.New(apierror.LockHeld, "%s %q is held by %q; retry later, or wait in line for it", a.what, name, r.Holder.ClientID)
}

func displayName(key string) string {
	name, _ := command.SplitKey(key)
	return name
}

// liveGrant describes the grant (lease, seq) of key if it still holds; token 0
// matches any token.
func liveGrant(st *state.State, key string, lease command.LeaseID, seq, token uint64) *grantAnswer {
	h, held := st.LockGrant(key, lease)
	l, ok := st.Lease(lease)
	if !ok || !held || h.GrantSeq != seq || (token != 0 && h.Token != token) {
		return nil
	}
	return &grantAnswer{granted: true, token: h.Token, expiresAt: ms(l.ExpiresAt()), leaseID: lease.String(), revision: st.Revision()}
}

// checkWait looks at the local state for the fate of one queued acquire, sent
// with requestID: still in line, granted and holding, granted but ended since
// (the dedup entry of the request records the grant), or gone without a grant.
func (s *Service) checkWait(name string, w command.WaitRef, clientID, requestID string) (waitOutcome, *grantAnswer, bool) {
	out, leaseAlive := waitGone, false
	var res *grantAnswer
	s.fsm.Read(func(st *state.State) {
		if !st.Owns(name) {
			// Split off to another shard, wait and all: the router asks
			// there again with the same request_id.
			out = movedAway
			return
		}
		_, leaseAlive = st.Lease(w.LeaseID)
		if res = liveGrant(st, name, w.LeaseID, w.Seq, 0); res != nil {
			out = wasGranted
			return
		}
		if seq, ok := st.WaitSeq(w.LeaseID, name); ok && seq == w.Seq {
			out = stillWaiting
			return
		}
		if r, ok := st.Lookup(clientID, requestID); ok && r.Status == command.StatusOK && r.LeaseID == w.LeaseID && r.Seq == w.Seq {
			out, res = grantEnded, &grantAnswer{token: r.Token}
		}
	})
	return out, res, leaseAlive
}

// replayedGrant answers a grant that was not made by this request's own log
// entry: still holding, it is the answer; ended, the caller learns that it was
// granted and lost before it heard of it.
func (s *Service) replayedGrant(ctx context.Context, a acquireArgs, r command.Result, index uint64) (*grantAnswer, error) {
	// A follower may not have applied the entry the leader answered from yet.
	if err := s.catchUp(ctx, index); err != nil {
		if r.Replayed && r.Status == command.StatusOK {
			// The grant was made by an earlier try of this very request
			// (the node resent it after an unknown outcome): as for a
			// direct grant, nobody without a request_id can claim it.
			s.giveBack(a, &grantAnswer{leaseID: r.LeaseID.String(), token: r.Token})
		}
		return nil, err
	}
	var g *grantAnswer
	s.fsm.Read(func(st *state.State) { g = liveGrant(st, a.key, r.LeaseID, r.Seq, r.Token) })
	if g != nil {
		return g, nil
	}
	return s.grantLost(a, r.Token)
}

// grantLost is the answer to a request whose grant ended before the caller
// heard of it: its reply was lost, and a retry came after the unclaimed lease
// lapsed (or the lock was taken over). It was granted — the token was used —
// so this is not a timeout, and not a grant the caller may act on.
func (s *Service) grantLost(a acquireArgs, token uint64) (*grantAnswer, error) {
	return &grantAnswer{token: token}, apierror.New(apierror.LockLost,
		"%s %q was granted to this request (fencing token %d) but the grant ended before its answer reached you (nobody renewed its lease); acquire again with a new request_id",
		a.what, displayName(a.key), token)
}

// await blocks a queued acquire until it is granted, times out, or its caller
// goes away. The wait itself is replicated; this only watches for its fate.
func (s *Service) await(ctx context.Context, a acquireArgs, requestID string, session bool, r command.Result, index uint64, wait time.Duration) (*grantAnswer, error) {
	name := a.key
	w := command.WaitRef{LeaseID: r.LeaseID, Name: name, Seq: r.Seq}
	sig := s.waiters.add(w.LeaseID)
	defer s.waiters.remove(w.LeaseID, sig)
	// A follower may not have applied the entry the leader answered from yet.
	if err := s.catchUp(ctx, index); err != nil {
		return s.cannotFollow(ctx, a, w, err)
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		noLeader := s.noLeader()
		out, res, alive := s.checkWait(name, w, a.clientID, requestID)
		switch out {
		case wasGranted:
			return res, nil
		case grantEnded:
			return s.grantLost(a, res.token)
		case waitGone:
			if session && !alive {
				return nil, apierror.New(apierror.SessionNotFound, "the session ended while waiting for %s %q; create a new session", a.what, displayName(name))
			}
			return s.timedOut(a)
		case movedAway:
			return nil, wrongShardErr("the wait for " + a.what + " " + strconv.Quote(displayName(name)))
		}
		select {
		case <-sig:
		case <-timer.C:
			// Withdraw the wait through Raft, then answer with what really
			// happened: a grant that raced with the timeout wins.
			resp, err := s.node.Apply(ctx, envelope(a.clientID, "", &command.ExpireWaits{Waits: []command.WaitRef{w}}))
			if err != nil {
				// The client may have gone while the expiry was being
				// committed, and a grant may have raced in: withdraw as a
				// cancelled acquire does, so nothing is left behind. A
				// client still there is told why the commit failed.
				g, aerr := s.abandon(a, w, err)
				if _, ok := errors.AsType[*apierror.Error](err); ok {
					return nil, err
				}
				return g, aerr
			}
			if err := s.catchUp(ctx, resp.Index); err != nil {
				return s.cannotFollow(ctx, a, w, err)
			}
			switch out, res, _ := s.checkWait(name, w, a.clientID, requestID); out {
			case wasGranted:
				return res, nil
			case grantEnded:
				return s.grantLost(a, res.token)
			case movedAway:
				return nil, wrongShardErr("the wait for " + a.what + " " + strconv.Quote(displayName(name)))
			}
			return s.timedOut(a)
		case <-ctx.Done():
			return s.abandon(a, w, context.Cause(ctx))
		case <-s.life.Done():
			return s.abandon(a, w, errShuttingDown)
		case <-s.handedOff:
			if !keepsPlace(a) {
				return s.abandon(a, w, errShuttingDown)
			}
			return nil, wrongShardErr("the wait for " + a.what + " " + strconv.Quote(displayName(name)))
		case <-noLeader:
			return s.leaveLine(a, w)
		}
	}
}

// cannotFollow answers a queued acquire whose node could not apply what the
// leader committed (catchUp failed). If its client went away, the node is
// shutting down, or nobody can come back for the wait (no request_id), it is
// withdrawn (abandon). Otherwise the node is behind or cut off: as on a node
// without a leader (leaveLine), the place in line is kept for the client's
// retry with its request_id through another node.
func (s *Service) cannotFollow(ctx context.Context, a acquireArgs, w command.WaitRef, err error) (*grantAnswer, error) {
	if revoked(ctx) {
		return s.abandon(a, w, context.Cause(ctx))
	}
	if ctx.Err() != nil || errors.Is(err, errShuttingDown) || !keepsPlace(a) {
		return s.abandon(a, w, err)
	}
	return nil, err
}

// leaveLine answers a queued acquire on a node that has known no leader for a
// while: it would never hear of its grant here. With a request_id of the
// client's the place in line is kept (until wait_timeout_ms), and the client's
// retry with that request_id through another node waits in it there; without
// one, nobody can come back for it, so it is withdrawn (if the leader can be
// reached at all; else it ends at its wait timeout).
func (s *Service) leaveLine(a acquireArgs, w command.WaitRef) (*grantAnswer, error) {
	if !keepsPlace(a) {
		return s.abandon(a, w, errNoLeaderHere)
	}
	return nil, &apierror.Error{Code: apierror.NoLeader, RetryAfter: time.Second, Err: errNoLeaderHere,
		Message: fmt.Sprintf(noLeaderHere+", so it would not hear of the grant; your place in line for %q is kept until wait_timeout_ms: retry with the same request_id through another node", displayName(a.key))}
}

func (s *Service) timedOut(a acquireArgs) (*grantAnswer, error) {
	var li state.LockInfo
	s.fsm.Read(func(st *state.State) { li = st.GetLock(a.key) })
	res := &grantAnswer{}
	if li.Held {
		h := lockHolderView(li.Holders[0])
		if _, election := command.SplitKey(a.key); election {
			h.Mode = ""
		}
		res.holder = &h
	}
	return res, apierror.New(apierror.WaitTimeout, "gave up waiting for %s %q after %s without getting it; wait longer or try again later", a.what, displayName(a.key), time.Duration(a.waitMs)*time.Millisecond)
}

// abandon withdraws a wait whose caller went away. If the lock was granted to
// that very wait in the meantime it is released too, so nothing is left
// behind — but only when the request had no request_id of the client's: a
// client that sent one may retry it elsewhere and be answered with this grant
// (the dedup table points the retry at this wait), and releasing it then would
// take the lock from a holder that was told it has it. Such an unclaimed grant
// ends when its lease does.
func (s *Service) abandon(a acquireArgs, w command.WaitRef, cause error) (*grantAnswer, error) {
	ctx, cancel := context.WithTimeout(context.Background(), cancelTimeout)
	defer cancel()
	// A revoked token's grant is released even with a request_id: a retry
	// of the request would be refused by the ACL check anyway.
	isRevoked := errors.Is(cause, errTokenRevoked)
	if keepsPlace(a) && !isRevoked && s.handedOffNow() {
		// The node gave up its replica while this wait was ending here:
		// keep its place for the router's retry through a replica.
		return nil, wrongShardErr("the wait for " + a.what + " " + strconv.Quote(displayName(a.key)))
	}
	release := !keepsPlace(a) || isRevoked
	if _, err := s.node.Apply(ctx, envelope(a.clientID, "", &command.CancelWait{Wait: w, ReleaseIfGranted: release})); err != nil {
		s.logger.Warn("could not withdraw an abandoned wait; it ends at its wait timeout", "lock", displayName(a.key), "err", err)
	}
	if isRevoked {
		e := revokedErr("this acquire was sent with")
		e.Message += fmt.Sprintf(" (the wait for %q was withdrawn)", displayName(a.key))
		return nil, e
	}
	if errors.Is(cause, errShuttingDown) {
		return nil, apierror.Wrap(apierror.Unavailable, cause, "this node is shutting down; the wait for %q was withdrawn; acquire again through another node", displayName(a.key))
	}
	if errors.Is(cause, errNoLeaderHere) {
		return nil, &apierror.Error{Code: apierror.NoLeader, RetryAfter: time.Second, Err: cause,
			Message: fmt.Sprintf(noLeaderHere+", so it would not hear of the grant; the wait for %q was withdrawn if the leader could be reached; acquire again through another node", displayName(a.key))}
	}
	if ae, ok := errors.AsType[*apierror.Error](cause); ok && !errors.Is(cause, context.Canceled) && !errors.Is(cause, context.DeadlineExceeded) {
		// This node could not follow the leader: say so.
		return nil, &apierror.Error{Code: ae.Code, RetryAfter: ae.RetryAfter, Err: cause,
			Message: fmt.Sprintf("%s; the wait for %q was withdrawn", ae.Message, displayName(a.key))}
	}
	return nil, apierror.Wrap(apierror.Unavailable, cause, "the request was cancelled before %q was granted; the wait was withdrawn", displayName(a.key))
}

// giveBack releases a grant that could not be answered. As in abandon, only a
// request without a request_id of the client's: one with it is answered with
// this grant when retried through another node, and otherwise the grant ends
// with its lease.
func (s *Service) giveBack(a acquireArgs, g *grantAnswer) {
	if keepsPlace(a) {
		return
	}
	id, err := command.ParseLeaseID(g.leaseID)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), cancelTimeout)
	defer cancel()
	if _, err := s.node.Apply(ctx, envelope(a.clientID, "", &command.Release{Name: a.key, LeaseID: id, Token: g.token})); err != nil {
		s.logger.Warn("could not give back a grant this node could not answer; it ends with its lease", "lock", displayName(a.key), "err", err)
	}
}

// errShuttingDown ends the waits of a node that is shutting down.
var errShuttingDown = errors.New("this node is shutting down; retry on another node")
