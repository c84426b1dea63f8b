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
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/fsm"
	"github.com/dlock/dlock/internal/raftnode"
	"github.com/dlock/dlock/internal/state"
	"github.com/dlock/dlock/internal/watch"
)

// Node is what the service needs of its Raft node, in the parts its callers
// use: the replicated state (every write and linearizable read), the leader
// (waits that must end once this node has known none for a while), the
// cluster calls, and the hook that endorses grants forwarded by followers.
type Node interface {
	Replicator
	LeaderWatch
	Membership
	// SetEndorser lets the service add to the leader's answers to writes
	// forwarded by followers (Service.endorse).
	SetEndorser(f raftnode.Endorser)
}

// Replicator changes and reads the replicated state: every write goes
// through Raft (Apply), and every read is of the local state machine once
// it has caught up.
type Replicator interface {
	Apply(ctx context.Context, e *command.Envelope) (*fsm.Response, error)
	LinearizableRead(ctx context.Context) error
	// CatchUp waits, bounded, until the local state has applied index.
	CatchUp(ctx context.Context, index uint64) error
	FSM() *fsm.FSM
}

// LeaderWatch says whether this node follows a leader: a node cut off from
// every leader would never hear of a grant or an event, so waits end.
type LeaderWatch interface {
	// LeaderlessFor is how long this node has known no leader.
	LeaderlessFor() time.Duration
	// LeaderContact: does this node know a leader, and since when has it
	// not heard from it (0 on the leader, -1 never).
	LeaderContact() (known bool, since time.Duration)
}

// Membership is the cluster calls: status, health and member changes.
type Membership interface {
	Status() raftnode.Status
	Ready() error
	Healthy() error
	ProbeMembers(ctx context.Context, timeout time.Duration) map[string]raftnode.MemberHealth
	Join(ctx context.Context, id, raftAddr string) error
	Remove(ctx context.Context, id string) error
	TransferLeadership(ctx context.Context, id string) error
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
	// browserHosts are the further names browsers may use (BrowserHost).
	browserHosts atomic.Pointer[map[string]bool]
	aclOn        bool
	// acl is the state ACL tokens are read from: this group's, or on a
	// sharded node the meta group's (SetACLState); aclShared says which.
	acl       *fsm.FSM
	aclRead   linearReader
	aclShared atomic.Bool
	lim       *limiter // nil: no limits (SetLimits)

	// life ends when the node shuts down: every queued acquire's wait ends
	// then, so each withdraws its place while Raft still runs (a wait left
	// behind would be granted to a client that is no longer there), and so
	// does every wait for the local state to catch up.
	life    context.Context
	endLife context.CancelFunc
	// leaderGone is closed while this node has known no leader for a while
	// (followLeaderless), ending the queued acquires that wait here.
	leaderGone atomic.Pointer[chan struct{}]
	// handedOff is closed when this node gives up its replica of the shard
	// (HandOff).
	handedOff chan struct{}
	handOnce  sync.Once
}

// HandOff ends every queued acquire's wait here without withdrawing it:
// this node is giving up its replica of the shard (a move), and the wait's
// place in line stays in the replicated queue. Each answers wrong_shard,
// which the shard router retries, with the same request_id, through a node
// that still runs the shard, where the retry finds its place. A wait
// without a request_id (nobody could come back for it) is withdrawn.
func (s *Service) HandOff() { s.handOnce.Do(func() { close(s.handedOff) }) }

func (s *Service) handedOffNow() bool {
	select {
	case <-s.handedOff:
		return true
	default:
		return false
	}
}

// New builds the service over a node and its event hub (which must have been
// registered as an FSM observer before Raft started), and subscribes to applied
// events to wake waiting acquires.
func New(node Node, hub *watch.Hub, logger *slog.Logger) *Service {
	if logger == nil {
		logger = slog.Default()
	}
	s := &Service{node: node, fsm: node.FSM(), hub: hub, waiters: newWaitRegistry(), tokens: newTokenUses(), logger: logger}
	s.acl, s.aclRead = s.fsm, node
	s.life, s.endLife = context.WithCancel(context.Background())
	s.handedOff = make(chan struct{})
	s.fsm.AddObserver(s.waiters)
	s.fsm.AddObserver(ownACL{s})
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
	case command.StatusLockLost:
		return &apierror.Error{Code: apierror.LockLost, FencingToken: r.Token, Message: fmt.Sprintf(
			"%s refused: the grant with fencing token %d was revoked by an operator (see its history); stop using the resource and acquire again", what, r.Token)}
	case command.StatusWrongShard:
		return wrongShardErr(what)
	}
	return apierror.New(apierror.Internal, "%s: unexpected result %s", what, r.Status)
}

// wrongShardErr refuses a request for a name this shard no longer owns:
// its range was split and the name went to the new shard. The router
// re-routes it there (the service alone cannot).
func wrongShardErr(what string) error {
	return &apierror.Error{Code: apierror.WrongShard, RetryAfter: time.Second, Message: fmt.Sprintf(
		"%s refused: this shard no longer owns the name (its range was split); retry with the same request_id and it is routed to the new shard", what)}
}

// readOwned runs fn on the state if this shard owns name, under one read
// lock (a split between a check and the read would answer for a name that
// left).
func (s *Service) readOwned(name string, fn func(*state.State)) error {
	owns := true
	s.fsm.Read(func(st *state.State) {
		if owns = st.Owns(name); owns {
			fn(st)
		}
	})
	if !owns {
		return wrongShardErr("read")
	}
	return nil
}

func holderView(h command.Holder) *Holder {
	return &Holder{ClientID: h.ClientID, FencingToken: h.Token, GrantedAt: ms(h.GrantedAt), ExpiresAt: ms(h.ExpiresAt)}
}

func modeName(shared bool) string {
	if shared {
		return ModeShared
	}
	return ModeExclusive
}

// lockHolderView is a lock holder's view, with its grant's mode.
func lockHolderView(h state.Holder) Holder {
	v := holderView(h.Holder)
	v.Mode, v.Subtree = modeName(h.Shared), h.Subtree
	return *v
}

type acquireArgs struct {
	key, what           string
	clientID, requestID string
	ttlMs               int64
	sessionID           string
	waitMs              int64
	value               string
	takeover            bool
	lockDelayMs         int64
	limit               int64
	shared, subtree     bool
}

// grantAnswer is the protocol-neutral outcome of an acquire or campaign. With a
// lock_held or wait_timeout error it still says who holds the key.
type grantAnswer struct {
	granted   bool
	token     uint64
	expiresAt time.Time
	leaseID   string
	revision  uint64
	holder    *Holder
	// limit is the lock's limit, with a limit_mismatch error.
	limit    int
	proof    string
	leaseRef string
	// index is the log entry that made the grant, or refused it (holder
	// set), when this answer comes straight from it (0 when it was read from
	// the local state, which has then applied the grant already).
	index uint64
}

type waitOutcome int

const (
	stillWaiting waitOutcome = iota
	wasGranted
	grantEnded
	waitGone
	// movedAway: the lock's name left this shard (a split) with its wait.
	movedAway
)

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
	body := &command.Renew{Name: key, LeaseID: id, Token: req.FencingToken, TTLms: req.TTLms}
	if req.Value != nil {
		if len(*req.Value) > command.MaxValueLen {
			return nil, invalid("value is %d bytes; the limit is %d", len(*req.Value), command.MaxValueLen)
		}
		body.Value, body.SetValue = *req.Value, true
	}
	r, err := s.applyOK(ctx, envelope(req.ClientID, req.RequestID, body), "renew")
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
	v := LockView{Name: li.Name, Held: li.Held, Waiters: li.Waiters, Revision: rev, Limit: li.Limit, Subtree: li.Subtree, Holders: []Holder{},
		Value: li.Value}
	if li.DelayedUntil != 0 {
		v.DelayedUntil = ms(li.DelayedUntil)
	}
	for _, h := range li.Holders {
		v.Holders = append(v.Holders, lockHolderView(h))
	}
	if li.Held {
		v.Holder = &v.Holders[0]
		v.Mode = modeName(li.Shared)
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
	if err := s.readOwned(n, func(st *state.State) {
		v = lockView(st.GetLock(n), st.Revision())
		for _, w := range st.LockQueue(n) {
			v.Queue = append(v.Queue, Waiter{ClientID: w.ClientID, EnqueuedAt: ms(w.EnqueuedAt), WaitDeadline: ms(w.Deadline)})
		}
	}); err != nil {
		return nil, err
	}
	v.Stale = s.staleRead(stale)
	return &v, nil
}

// ListLocks lists locks by prefix, a page at a time.
func (s *Service) ListLocks(ctx context.Context, req ListRequest) (_ *ListResponse, err error) {
	defer s.observe("list_locks", time.Now(), &err)
	if err = s.admit(ctx, ""); err != nil {
		return nil, err
	}
	prefix, after, limit, err := s.listArgs(ctx, req)
	if err != nil {
		return nil, err
	}
	out := &ListResponse{Locks: []LockView{}, Stale: s.staleRead(req.Stale)}
	s.fsm.Read(func(st *state.State) {
		infos, more := st.ListLocks(prefix, after, limit)
		out.Revision, out.More = st.Revision(), more
		for _, sp := range st.Splits() {
			out.SplitGroups = append(out.SplitGroups, sp.Group)
		}
		for _, li := range infos {
			out.Locks = append(out.Locks, lockView(li, out.Revision))
		}
	})
	return out, nil
}

// listArgs checks a listing's prefix, cursor and page size and the caller's
// read permission on the prefix, then waits for the read barrier (unless
// stale).
func (s *Service) listArgs(ctx context.Context, req ListRequest) (prefix, after string, limit int, err error) {
	if prefix, err = command.ValidatePrefix(req.Prefix); err != nil {
		return "", "", 0, invalid("bad prefix: %v", err)
	}
	if err = s.authorize(ctx, command.PermRead, prefix, ""); err != nil {
		return "", "", 0, err
	}
	if after = req.After; after != "" {
		if after, err = normalize(after); err != nil {
			return "", "", 0, err
		}
	}
	switch limit = req.Limit; {
	case limit == 0:
		limit = DefaultListLimit
	case limit < 0 || limit > MaxListLimit:
		return "", "", 0, invalid("limit must be between 1 and %d", MaxListLimit)
	}
	if err = s.read(ctx, req.Stale); err != nil {
		return "", "", 0, err
	}
	return prefix, after, limit, nil
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
	r, err := s.applyOK(ctx, envelope(req.ClientID, req.RequestID, &command.CreateSession{TTLms: req.TTLms, LeaseID: req.LeaseID}), "create session")
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

// KeepAlive renews a session and lists the grants it lost after
// req.LostAfter. They are read from this node's state once it has applied
// the renewal: every grant lost at or before the renewal's revision is then
// here, so a client that sends the revision of each answer it read as the
// next LostAfter misses none (it may hear of a later one twice).
func (s *Service) KeepAlive(ctx context.Context, req KeepAliveRequest) (_ *KeepAliveResponse, err error) {
	defer s.observe("session_keepalive", time.Now(), &err)
	id, err := s.admitSessionCall(ctx, req.ClientID, req.SessionID, req.RequestID)
	if err != nil {
		return nil, err
	}
	resp, err := s.node.Apply(ctx, envelope(req.ClientID, req.RequestID, &command.KeepAlive{LeaseID: id}))
	if err != nil {
		return nil, err
	}
	r := resp.Result
	if r.Status != command.StatusOK {
		return nil, statusErr(r, "keepalive")
	}
	if err := s.catchUp(ctx, resp.Index); err != nil {
		return nil, err
	}
	out := &KeepAliveResponse{SessionID: r.LeaseID.String(), TTLms: r.TTLms, ExpiresAt: ms(r.ExpiresAt), Revision: r.Revision, Lost: []LostGrant{}}
	s.fsm.Read(func(st *state.State) {
		for _, g := range st.SessionLost(id, req.LostAfter) {
			name, election := command.SplitKey(g.Key)
			kind := "lock"
			if election {
				kind = "election"
			}
			out.Lost = append(out.Lost, LostGrant{Kind: kind, Name: name, FencingToken: g.Token, Cause: g.Cause.String(), Reason: g.Reason, Revision: g.Revision})
		}
		for _, sp := range st.Splits() {
			out.SplitGroups = append(out.SplitGroups, sp.Group)
		}
	})
	return out, nil
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
		mem := Member{ID: m.ID, RaftAddr: m.RaftAddr, APIAddr: m.APIAddr, Version: m.Version, Suffrage: m.Suffrage, State: m.State}
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
