// Package service is dlock's one semantic layer between the protocol APIs
// (HTTP, gRPC, WebSocket) and the Raft node: it validates requests, turns them
// into commands, waits for queued acquires in FIFO order, and turns results into
// answers and typed errors. Every protocol calls the same methods, so every
// protocol behaves the same.
package service

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/dlock/dlock/fence"
	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/fsm"
	"github.com/dlock/dlock/internal/raftnode"
	"github.com/dlock/dlock/internal/state"
	"github.com/dlock/dlock/internal/watch"
)

// Node is what the service needs from the Raft node (raftnode.Node).
type Node interface {
	Apply(ctx context.Context, e *command.Envelope) (*fsm.Response, error)
	LinearizableRead(ctx context.Context) error
	// CatchUp waits, bounded, until the local state has applied index.
	CatchUp(ctx context.Context, index uint64) error
	// LeaderlessFor is how long this node has known no leader.
	LeaderlessFor() time.Duration
	// LeaderContact: does this node know a leader, and since when has it
	// not heard from it (0 on the leader, -1 never).
	LeaderContact() (known bool, since time.Duration)
	FSM() *fsm.FSM
	Status() raftnode.Status
	Ready() error
	Healthy() error
	ProbeMembers(ctx context.Context, timeout time.Duration) map[string]raftnode.MemberHealth
	Join(ctx context.Context, id, raftAddr string) error
	Remove(ctx context.Context, id string) error
	TransferLeadership(ctx context.Context, id string) error
	// SetEndorser lets the service add to the leader's answers to writes
	// forwarded by followers (Service.endorse).
	SetEndorser(f raftnode.Endorser)
}

// Service implements the lock, session, election, watch and cluster calls.
type Service struct {
	node    Node
	fsm     *fsm.FSM
	hub     *watch.Hub
	waiters *waitRegistry
	tokens  *tokenUses
	logger  *slog.Logger
	rec     Recorder
	signer  atomic.Pointer[signer]
	aclOn   bool
	lim     *limiter // nil: no limits (SetLimits)

	// life ends when the node shuts down: every queued acquire's wait ends
	// then, so each withdraws its place while Raft still runs (a wait left
	// behind would be granted to a client that is no longer there), and so
	// does every wait for the local state to catch up.
	life    context.Context
	endLife context.CancelFunc
	// leaderGone is closed while this node has known no leader for a while
	// (followLeaderless), ending the queued acquires that wait here.
	leaderGone atomic.Pointer[chan struct{}]
}

// New builds the service over a node and its event hub (which must have been
// registered as an FSM observer before Raft started), and subscribes to applied
// events to wake waiting acquires.
func New(node Node, hub *watch.Hub, logger *slog.Logger) *Service {
	if logger == nil {
		logger = slog.Default()
	}
	s := &Service{node: node, fsm: node.FSM(), hub: hub, waiters: newWaitRegistry(), tokens: newTokenUses(), logger: logger}
	s.life, s.endLife = context.WithCancel(context.Background())
	s.fsm.AddObserver(s.waiters)
	s.fsm.AddObserver(s.tokens)
	node.SetEndorser(s.endorse)
	gone := make(chan struct{})
	s.leaderGone.Store(&gone)
	go s.followLeaderless()
	return s
}

// Recorder observes each request's latency and outcome (the metrics package).
type Recorder interface {
	Op(op string, d time.Duration, err error)
}

// SetRecorder installs a recorder; call before serving.
func (s *Service) SetRecorder(r Recorder) { s.rec = r }

func (s *Service) observe(op string, start time.Time, err *error) {
	if s.rec != nil {
		s.rec.Op(op, time.Since(start), *err)
	}
}

// Close ends every open watch stream and every queued acquire's wait (each
// withdraws its place in line through Raft and answers "unavailable", so its
// client retries on another node). Call it before the API servers drain and
// before Raft stops.
func (s *Service) Close() {
	s.endLife()
	if s.hub != nil {
		s.hub.Close()
	}
}

// catchUp waits until this node has applied the entry at index (a follower
// answering from its own state must have applied what the leader answered
// from). The node bounds the wait; shutting down ends it too.
func (s *Service) catchUp(ctx context.Context, index uint64) error {
	if s.fsm.AppliedIndex() >= index {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.life, cancel)
	defer stop()
	err := s.node.CatchUp(ctx, index)
	if err != nil && s.life.Err() != nil {
		return apierror.Wrap(apierror.Unavailable, errShuttingDown, "this node is shutting down; retry through another node")
	}
	return err
}

// cancelTimeout bounds the clean-up a cancelled acquire commits after its
// client has gone.
const cancelTimeout = 5 * time.Second

func ms(t int64) time.Time {
	if t == 0 {
		return time.Time{}
	}
	return time.UnixMilli(t).UTC()
}

func invalid(format string, args ...any) error {
	return apierror.New(apierror.InvalidArgument, format, args...)
}

func checkID(field, v string, required bool) error {
	if v == "" {
		if required {
			return invalid("%s is required", field)
		}
		return nil
	}
	if len(v) > command.MaxClientID {
		return invalid("%s is %d bytes; the limit is %d", field, len(v), command.MaxClientID)
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x21 || v[i] > 0x7e {
			return invalid("%s may contain only printable ASCII without spaces", field)
		}
	}
	return nil
}

func checkTTL(ttl int64, required bool) error {
	if ttl == 0 && !required {
		return nil
	}
	if ttl < command.MinTTLms || ttl > command.MaxTTLms {
		return invalid("ttl_ms must be between %d and %d (1 s to 600 s), got %d", command.MinTTLms, command.MaxTTLms, ttl)
	}
	return nil
}

func parseLease(field, v string) (command.LeaseID, error) {
	id, err := command.ParseLeaseID(v)
	if err != nil {
		return id, invalid("%s must be the 32-hex-digit id the grant returned", field)
	}
	return id, nil
}

func normalize(name string) (string, error) {
	n, err := command.NormalizeName(name)
	if err != nil {
		return "", invalid("bad lock name: %v", err)
	}
	return n, nil
}

// envelope builds a command. A request without request_id gets a server-made
// one, so the node may retry it through a leader change without acting twice.
func envelope(clientID, requestID string, body command.Body) *command.Envelope {
	if requestID == "" {
		var b [12]byte
		_, _ = rand.Read(b[:])
		requestID = "srv-" + hex.EncodeToString(b[:])
	}
	return &command.Envelope{ClientID: clientID, RequestID: requestID, Body: body}
}

// applyOK commits one command and turns the state machine's refusal into its
// API error.
func (s *Service) applyOK(ctx context.Context, e *command.Envelope, what string) (command.Result, error) {
	resp, err := s.node.Apply(ctx, e)
	if err != nil {
		return command.Result{}, err
	}
	if resp.Result.Status != command.StatusOK {
		return command.Result{}, statusErr(resp.Result, what)
	}
	return resp.Result, nil
}

func statusErr(r command.Result, what string) error {
	switch r.Status {
	case command.StatusNotHolder:
		return apierror.New(apierror.NotHolder, "%s refused: the caller does not hold this lock with that fencing_token and lease_id (it may have expired or been released); acquire it again", what)
	case command.StatusSessionNotFound:
		return apierror.New(apierror.SessionNotFound, "session not found (it expired, was deleted, or belongs to another client_id); create a new session")
	case command.StatusInvalid:
		return invalid("%s: %s", what, r.Message)
	}
	return apierror.New(apierror.Internal, "%s: unexpected result %s", what, r.Status)
}

func holderView(h command.Holder) *Holder {
	return &Holder{ClientID: h.ClientID, FencingToken: h.Token, GrantedAt: ms(h.GrantedAt), ExpiresAt: ms(h.ExpiresAt)}
}

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
	if err := s.authorizeTakeover(ctx, req.Takeover, req.ClientID); err != nil {
		return nil, err
	}
	// A wait in line ends when the token that queued it is revoked.
	ctx, untrack := s.trackToken(ctx, tok)
	defer untrack()
	g, err := s.acquire(ctx, acquireArgs{key: name, what: "lock", clientID: req.ClientID, requestID: req.RequestID,
		ttlMs: req.TTLms, sessionID: req.SessionID, waitMs: req.WaitTimeoutMs, takeover: req.Takeover})
	if g == nil {
		return nil, err
	}
	res := &AcquireResponse{Acquired: g.granted, FencingToken: g.token, TokenProof: g.proof, LeaseRef: g.leaseRef, ExpiresAt: g.expiresAt, LeaseID: g.leaseID, Revision: g.revision}
	if g.holder != nil {
		res.Holder = holderView(*g.holder)
	}
	return res, err
}

type acquireArgs struct {
	key, what           string
	clientID, requestID string
	ttlMs               int64
	sessionID           string
	waitMs              int64
	value               string
	takeover            bool
}

// grantAnswer is the protocol-neutral outcome of an acquire or campaign. With a
// lock_held or wait_timeout error it still says who holds the key.
type grantAnswer struct {
	granted   bool
	token     uint64
	expiresAt time.Time
	leaseID   string
	revision  uint64
	holder    *command.Holder
	proof     string
	leaseRef  string
	// index is the log entry that made the grant, or refused it (holder
	// set), when this answer comes straight from it (0 when it was read from
	// the local state, which has then applied the grant already).
	index uint64
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
	body := &command.Acquire{Name: a.key, WaitMs: a.waitMs, Value: a.value, Takeover: a.takeover}
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
		h := r.Holder
		return &grantAnswer{holder: &h, revision: r.Revision, index: resp.Index},
			apierror.New(apierror.LockHeld, "%s %q is held by %q; retry later, or wait in line for it", a.what, displayName(a.key), r.Holder.ClientID)
	case command.StatusQueued:
		return s.await(ctx, a, env.RequestID, body.Session, r, resp.Index, time.Duration(a.waitMs)*time.Millisecond)
	case command.StatusQueueFull:
		return nil, s.queueFullErr(a, body.MaxWaiters)
	}
	return nil, statusErr(r, a.what)
}

func displayName(key string) string {
	name, _ := command.SplitKey(key)
	return name
}

type waitOutcome int

const (
	stillWaiting waitOutcome = iota
	wasGranted
	grantEnded
	waitGone
)

// liveGrant describes the grant (lease, seq) of key if it still holds; token 0
// matches any token.
func liveGrant(st *state.State, key string, lease command.LeaseID, seq, token uint64) *grantAnswer {
	h := st.LockHolder(key)
	l, ok := st.Lease(lease)
	if !ok || h.Holder != lease || h.GrantSeq != seq || (token != 0 && h.Token != token) {
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
			}
			return s.timedOut(a)
		case <-ctx.Done():
			return s.abandon(a, w, context.Cause(ctx))
		case <-s.life.Done():
			return s.abandon(a, w, errShuttingDown)
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
	if ctx.Err() != nil || errors.Is(err, errShuttingDown) || a.requestID == "" {
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
	if a.requestID == "" {
		return s.abandon(a, w, errNoLeaderHere)
	}
	return nil, &apierror.Error{Code: apierror.NoLeader, RetryAfter: time.Second, Err: errNoLeaderHere,
		Message: fmt.Sprintf(noLeaderHere+", so it would not hear of the grant; your place in line for %q is kept until wait_timeout_ms: retry with the same request_id through another node", displayName(a.key))}
}

// errShuttingDown ends the waits of a node that is shutting down.
var errShuttingDown = errors.New("this node is shutting down; retry on another node")

func (s *Service) timedOut(a acquireArgs) (*grantAnswer, error) {
	var li state.LockInfo
	s.fsm.Read(func(st *state.State) { li = st.GetLock(a.key) })
	res := &grantAnswer{}
	if li.Held {
		h := li.Holder
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
	release := a.requestID == "" || isRevoked
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
	if a.requestID != "" {
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

// Release gives a lock back and hands it to the next waiter.
func (s *Service) Release(ctx context.Context, req ReleaseRequest) (_ *ReleaseResponse, err error) {
	defer s.observe("release", time.Now(), &err)
	name, id, err := s.admitHolder(ctx, holderProof{req.Name, req.ClientID, req.LeaseID, req.RequestID, req.FencingToken}, "client_id", command.PermLock)
	if err != nil {
		return nil, err
	}
	r, err := s.applyOK(ctx, envelope(req.ClientID, req.RequestID, &command.Release{Name: name, LeaseID: id, Token: req.FencingToken}), "release")
	if err != nil {
		return nil, err
	}
	return &ReleaseResponse{Released: true, Revision: r.Revision}, nil
}

// Renew extends the lease that holds a lock.
func (s *Service) Renew(ctx context.Context, req RenewRequest) (_ *RenewResponse, err error) {
	defer s.observe("renew", time.Now(), &err)
	name, id, err := s.admitHolder(ctx, holderProof{req.Name, req.ClientID, req.LeaseID, req.RequestID, req.FencingToken}, "client_id", command.PermLock)
	if err != nil {
		return nil, err
	}
	return s.renew(ctx, req, name, id)
}

func (s *Service) renew(ctx context.Context, req RenewRequest, key string, id command.LeaseID) (*RenewResponse, error) {
	if err := checkTTL(req.TTLms, false); err != nil {
		return nil, err
	}
	r, err := s.applyOK(ctx, envelope(req.ClientID, req.RequestID, &command.Renew{Name: key, LeaseID: id, Token: req.FencingToken, TTLms: req.TTLms}), "renew")
	if err != nil {
		return nil, err
	}
	return &RenewResponse{Renewed: true, ExpiresAt: ms(r.ExpiresAt), TTLms: r.TTLms, Revision: r.Revision}, nil
}

func (s *Service) read(ctx context.Context, stale bool) error {
	if stale {
		return nil
	}
	return s.node.LinearizableRead(ctx)
}

// staleRead describes a stale answer's freshness; nil for a linearizable one.
func (s *Service) staleRead(stale bool) *StaleRead {
	if !stale {
		return nil
	}
	known, since := s.node.LeaderContact()
	return &StaleRead{KnownLeader: known, LastContact: since}
}

func lockView(li state.LockInfo, rev uint64) LockView {
	v := LockView{Name: li.Name, Held: li.Held, Waiters: li.Waiters, Revision: rev}
	if li.Held {
		v.Holder = holderView(li.Holder)
	}
	return v
}

// admitRead is how a read of one lock or election starts: admission, the
// name, the ACL, and (unless stale) the linearizable read barrier.
func (s *Service) admitRead(ctx context.Context, name string, stale bool) (string, error) {
	if err := s.admit(ctx, ""); err != nil {
		return "", err
	}
	n, err := normalize(name)
	if err != nil {
		return "", err
	}
	if err := s.authorize(ctx, command.PermRead, n, ""); err != nil {
		return "", err
	}
	if err := s.read(ctx, stale); err != nil {
		return "", err
	}
	return n, nil
}

// GetLock returns one lock. Linearizable unless stale.
func (s *Service) GetLock(ctx context.Context, name string, stale bool) (_ *LockView, err error) {
	defer s.observe("get_lock", time.Now(), &err)
	n, err := s.admitRead(ctx, name, stale)
	if err != nil {
		return nil, err
	}
	var v LockView
	s.fsm.Read(func(st *state.State) { v = lockView(st.GetLock(n), st.Revision()) })
	v.Stale = s.staleRead(stale)
	return &v, nil
}

// ListLocks lists locks by prefix, a page at a time.
func (s *Service) ListLocks(ctx context.Context, req ListRequest) (_ *ListResponse, err error) {
	defer s.observe("list_locks", time.Now(), &err)
	if err = s.admit(ctx, ""); err != nil {
		return nil, err
	}
	prefix, err := command.ValidatePrefix(req.Prefix)
	if err != nil {
		return nil, invalid("bad prefix: %v", err)
	}
	if err := s.authorize(ctx, command.PermRead, prefix, ""); err != nil {
		return nil, err
	}
	after := req.After
	if after != "" {
		if after, err = normalize(after); err != nil {
			return nil, err
		}
	}
	limit := req.Limit
	switch {
	case limit == 0:
		limit = DefaultListLimit
	case limit < 0 || limit > MaxListLimit:
		return nil, invalid("limit must be between 1 and %d", MaxListLimit)
	}
	if err := s.read(ctx, req.Stale); err != nil {
		return nil, err
	}
	out := &ListResponse{Locks: []LockView{}, Stale: s.staleRead(req.Stale)}
	s.fsm.Read(func(st *state.State) {
		infos, more := st.ListLocks(prefix, after, limit)
		out.Revision, out.More = st.Revision(), more
		for _, li := range infos {
			out.Locks = append(out.Locks, lockView(li, out.Revision))
		}
	})
	return out, nil
}

// CreateSession creates an explicit session.
func (s *Service) CreateSession(ctx context.Context, req CreateSessionRequest) (_ *SessionResponse, err error) {
	defer s.observe("session_create", time.Now(), &err)
	if err = s.admit(ctx, req.ClientID); err != nil {
		return nil, err
	}
	if err := checkID("client_id", req.ClientID, true); err != nil {
		return nil, err
	}
	if err := s.authorize(ctx, 0, "", req.ClientID); err != nil {
		return nil, err
	}
	if err := checkID("request_id", req.RequestID, false); err != nil {
		return nil, err
	}
	if err := checkTTL(req.TTLms, true); err != nil {
		return nil, err
	}
	counts, err := s.checkSessionCap(req.ClientID, req.RequestID)
	if err != nil {
		return nil, err
	}
	r, err := s.applyOK(ctx, envelope(req.ClientID, req.RequestID, &command.CreateSession{TTLms: req.TTLms}), "create session")
	if err != nil {
		return nil, err
	}
	if counts {
		s.leaseCreated(req.ClientID)
	}
	return &SessionResponse{SessionID: r.LeaseID.String(), TTLms: r.TTLms, ExpiresAt: ms(r.ExpiresAt), Revision: r.Revision}, nil
}

func (s *Service) sessionID(v string) (command.LeaseID, error) {
	id, err := command.ParseLeaseID(v)
	if err != nil {
		return id, invalid("session id must be the 32-hex-digit id that session create returned")
	}
	return id, nil
}

// admitSessionCall is how a call on an existing session starts: admission,
// the session id and the ids of the caller and request, and the ACL.
func (s *Service) admitSessionCall(ctx context.Context, clientID, sessionID, requestID string) (command.LeaseID, error) {
	if err := s.admit(ctx, clientID); err != nil {
		return command.LeaseID{}, err
	}
	id, err := s.sessionID(sessionID)
	if err != nil {
		return id, err
	}
	if err := checkID("client_id", clientID, false); err != nil {
		return command.LeaseID{}, err
	}
	if err := s.authorize(ctx, 0, "", clientID); err != nil {
		return command.LeaseID{}, err
	}
	if err := checkID("request_id", requestID, false); err != nil {
		return command.LeaseID{}, err
	}
	return id, nil
}

// KeepAlive renews a session.
func (s *Service) KeepAlive(ctx context.Context, req KeepAliveRequest) (_ *SessionResponse, err error) {
	defer s.observe("session_keepalive", time.Now(), &err)
	id, err := s.admitSessionCall(ctx, req.ClientID, req.SessionID, req.RequestID)
	if err != nil {
		return nil, err
	}
	r, err := s.applyOK(ctx, envelope(req.ClientID, req.RequestID, &command.KeepAlive{LeaseID: id}), "keepalive")
	if err != nil {
		return nil, err
	}
	return &SessionResponse{SessionID: r.LeaseID.String(), TTLms: r.TTLms, ExpiresAt: ms(r.ExpiresAt), Revision: r.Revision}, nil
}

// DeleteSession ends a session, releasing its locks and dropping its waits.
func (s *Service) DeleteSession(ctx context.Context, req DeleteSessionRequest) (_ *DeleteSessionResponse, err error) {
	defer s.observe("session_delete", time.Now(), &err)
	id, err := s.admitSessionCall(ctx, req.ClientID, req.SessionID, req.RequestID)
	if err != nil {
		return nil, err
	}
	counts := s.countsLeases(req.ClientID, req.RequestID)
	r, err := s.applyOK(ctx, envelope(req.ClientID, req.RequestID, &command.DeleteSession{LeaseID: id}), "delete session")
	if err != nil {
		return nil, err
	}
	if counts {
		s.leaseDeleted(req.ClientID)
	}
	return &DeleteSessionResponse{Deleted: true, Revision: r.Revision}, nil
}

// Cluster describes the cluster as this node sees it.
func (s *Service) Cluster(ctx context.Context) (*ClusterInfo, error) {
	if err := s.admit(ctx, ""); err != nil {
		return nil, err
	}
	if err := s.authorize(ctx, 0, "", ""); err != nil {
		return nil, err
	}
	return s.cluster(ctx, false)
}

// ClusterHealth is Cluster plus a probe of every member (reachable, applied
// index, round trip), for operators; it takes up to memberProbeTimeout.
func (s *Service) ClusterHealth(ctx context.Context) (*ClusterInfo, error) {
	if err := s.admit(ctx, ""); err != nil {
		return nil, err
	}
	if err := s.authorize(ctx, 0, "", ""); err != nil {
		return nil, err
	}
	return s.cluster(ctx, true)
}

const memberProbeTimeout = 500 * time.Millisecond

func (s *Service) cluster(ctx context.Context, probe bool) (*ClusterInfo, error) {
	health := map[string]raftnode.MemberHealth{}
	if probe {
		health = s.node.ProbeMembers(ctx, memberProbeTimeout)
	}
	st := s.node.Status()
	ci := &ClusterInfo{NodeID: st.ID, LeaderID: st.LeaderID, LeaderAPI: st.LeaderAPI, Term: st.Term,
		CommitIndex: st.CommitIndex, AppliedIndex: st.AppliedIndex, Revision: st.Revision, LastToken: st.LastToken, Members: []Member{}}
	if st.CheckpointIndex != 0 {
		ci.CheckpointIndex, ci.CheckpointDigest = st.CheckpointIndex, fmt.Sprintf("%016x", st.CheckpointDigest)
	}
	for _, m := range st.Servers {
		mem := Member{ID: m.ID, RaftAddr: m.RaftAddr, APIAddr: m.APIAddr, Suffrage: m.Suffrage, State: m.State}
		if probe {
			h := health[m.ID]
			mem.Reachable, mem.AppliedIndex, mem.LastContactMs = &h.Reachable, h.Applied, float64(h.LastContact.Microseconds())/1000
		}
		ci.Members = append(ci.Members, mem)
	}
	return ci, nil
}

// Healthy reports liveness.
func (s *Service) Healthy() error { return s.node.Healthy() }

// Ready reports readiness: a leader is known and this node is caught up.
func (s *Service) Ready() error {
	if err := s.node.Ready(); err != nil {
		return apierror.Wrap(apierror.Unavailable, err, "not ready: %v", err)
	}
	return nil
}
