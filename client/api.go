package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// lockPath is the escaped path of a lock, with an action for POSTs. Each
// segment is escaped on its own so the slashes of the name stay readable in
// server logs.
func lockPath(name, action string) (string, error) {
	name = strings.TrimPrefix(name, "/")
	if name == "" {
		return "", invalidf("lock name is empty")
	}
	segs := strings.Split(name, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	p := "/locks/" + strings.Join(segs, "/")
	if action != "" {
		p += "/" + action
	}
	return p, nil
}

func checkTTL(ttl time.Duration) error {
	if ttl < minTTL || ttl > maxTTL || ttl%time.Millisecond != 0 {
		return invalidf("TTL %s: use whole milliseconds from %s to %s", ttl, minTTL, maxTTL)
	}
	return nil
}

// AcquireOptions are the parameters of a low-level Acquire.
type AcquireOptions struct {
	// TTL of a lease for this lock alone (1 s to 600 s). Ignored with Session.
	TTL time.Duration
	// Session holds the lock under a session instead of a lease of its own.
	Session *Session
	// Wait is how long to wait in the lock's FIFO queue (at most an hour);
	// 0 does not wait.
	Wait time.Duration
	// Takeover takes the lock (or a place in its queue) at once from
	// another lease of this client's ClientID, as WithTakeover does for a
	// Mutex. Never set by default.
	Takeover bool
	// Limit (1 to MaxLimit; 0 means 1) asks for one place of a counting
	// lock, as a Semaphore does.
	Limit int
	// Shared asks for a shared grant, as RWMutex.RLock does.
	Shared bool
	// Subtree makes the grant cover the names below the lock (WithSubtree).
	Subtree bool
}

type acquireParams struct {
	name      string
	ttl       time.Duration
	sessionID string
	wait      time.Duration
	requestID string
	takeover  bool
	kind      lockKind
}

// lockKind is what an acquire asks for beyond the name: a counting lock's
// limit, the shared mode, a subtree; and the holder's value and lock-delay.
type lockKind struct {
	limit           int
	shared, subtree bool
	value           string
	lockDelay       time.Duration
}

func (k lockKind) mode() string {
	if k.shared {
		return ModeShared
	}
	return ""
}

// acquire sends one logical acquire (retried under p.requestID) and returns
// the grant and when it was first sent.
func (c *Client) acquire(ctx context.Context, p acquireParams) (*Grant, time.Time, error) {
	path, err := lockPath(p.name, "acquire")
	if err != nil {
		return nil, time.Time{}, err
	}
	req := acquireRequest{ClientID: c.id, SessionID: p.sessionID, WaitTimeoutMs: p.wait.Milliseconds(), RequestID: p.requestID, Takeover: p.takeover,
		Limit: p.kind.limit, Mode: p.kind.mode(), Subtree: p.kind.subtree, Value: p.kind.value, LockDelayMs: p.kind.lockDelay.Milliseconds()}
	if p.sessionID == "" {
		req.TTLms = p.ttl.Milliseconds()
	}
	var out acquireResponse
	sent, err := c.do(ctx, call{method: http.MethodPost, path: path, body: req, out: &out,
		timeout: c.reqTimeout + p.wait, requestID: p.requestID})
	if err != nil {
		return nil, sent, err
	}
	if !out.Acquired || out.FencingToken == 0 || out.LeaseID == "" {
		return nil, sent, fmt.Errorf("dlock: acquire %q: the server answered 2xx without a grant", p.name)
	}
	return &Grant{Name: strings.TrimPrefix(p.name, "/"), ClientID: c.id, FencingToken: out.FencingToken,
		LeaseID: out.LeaseID, ExpiresAt: out.ExpiresAt, Revision: out.Revision, TokenProof: out.TokenProof, LeaseRef: out.LeaseRef}, sent, nil
}

// withdraw makes sure an acquire whose caller gave up leaves nothing behind.
// It repeats the request under its request id without waiting: the server
// answers a repeat with the first request's outcome, so a wait still in line
// times out at once and is withdrawn, and a grant (made while nobody was
// listening) comes back and is released. The server also withdraws a wait
// whose request is cancelled, but only if the node serving it is still alive
// and noticed; this makes it certain, and done when Lock returns.
func (c *Client) withdraw(ctx context.Context, p acquireParams) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(cleanupTimeout, c.reqTimeout))
	defer cancel()
	// The repeat is answered from the dedup table; should the table have
	// forgotten the request, a withdrawal must not take anything over.
	p.wait, p.takeover = 0, false
	g, _, err := c.acquire(ctx, p)
	if err == nil {
		c.giveBack(ctx, g)
		return
	}
	if !errors.Is(err, ErrLockHeld) && !errors.Is(err, ErrWaitTimeout) {
		c.log.Warn("dlock: could not withdraw an abandoned acquire; the server drops it at its wait timeout or TTL",
			"lock", p.name, "err", err)
	}
}

// Acquire sends one acquire request, waiting in line up to opts.Wait. It is
// the low-level call under Mutex: the grant is not renewed (see Renew) and
// not coordinated with Mutexes of this client. Prefer Mutex or WithLock.
func (c *Client) Acquire(ctx context.Context, name string, opts AcquireOptions) (*Grant, error) {
	p := acquireParams{name: name, ttl: opts.TTL, wait: opts.Wait, requestID: newRequestID(), takeover: opts.Takeover,
		kind: lockKind{limit: opts.Limit, shared: opts.Shared, subtree: opts.Subtree}}
	if opts.Session != nil {
		p.sessionID = opts.Session.id
	} else if err := checkTTL(opts.TTL); err != nil {
		return nil, err
	}
	if opts.Wait < 0 || opts.Wait > maxWait {
		return nil, invalidf("wait %s: use 0 to %s", opts.Wait, maxWait)
	}
	g, sent, err := c.acquire(ctx, p)
	if err != nil && ctx.Err() != nil && !sent.IsZero() {
		c.withdraw(ctx, p)
	}
	return g, err
}

// Release gives a lock back; the next in line gets it at once. It fails with
// ErrNotHolder if that token and lease id do not hold the lock.
func (c *Client) Release(ctx context.Context, name string, token uint64, leaseID string) error {
	path, err := lockPath(name, "release")
	if err != nil {
		return err
	}
	id := newRequestID()
	_, err = c.do(ctx, call{method: http.MethodPost, path: path, requestID: id,
		body: holderRequest{ClientID: c.id, FencingToken: token, LeaseID: leaseID, RequestID: id}})
	return err
}

// Renew extends the lease that holds a lock, optionally with a new TTL (0
// keeps it), and returns the server's new expiry (for display). It fails with
// ErrNotHolder if that token and lease id do not hold the lock.
func (c *Client) Renew(ctx context.Context, name string, token uint64, leaseID string, ttl time.Duration) (time.Time, error) {
	if ttl != 0 {
		if err := checkTTL(ttl); err != nil {
			return time.Time{}, err
		}
	}
	_, exp, err := c.renew(ctx, name, token, leaseID, ttl, 0)
	return exp, err
}

func (c *Client) renew(ctx context.Context, name string, token uint64, leaseID string, ttl, attemptTimeout time.Duration) (time.Time, time.Time, error) {
	return c.renewWith(ctx, name, token, leaseID, ttl, attemptTimeout, nil)
}

// renewWith is renew that also replaces the holder's value when value is
// not nil.
func (c *Client) renewWith(ctx context.Context, name string, token uint64, leaseID string, ttl, attemptTimeout time.Duration, value *string) (time.Time, time.Time, error) {
	path, err := lockPath(name, "renew")
	if err != nil {
		return time.Time{}, time.Time{}, err
	}
	id := newRequestID()
	var out renewResponse
	sent, err := c.do(ctx, call{method: http.MethodPost, path: path, out: &out, timeout: attemptTimeout, requestID: id,
		body: holderRequest{ClientID: c.id, FencingToken: token, LeaseID: leaseID, TTLms: ttl.Milliseconds(), RequestID: id, Value: value}})
	if err != nil {
		return sent, time.Time{}, err
	}
	return sent, out.ExpiresAt, nil
}

// Status reads one lock (a linearizable read). A lock nobody holds is
// {Held: false}.
func (c *Client) Status(ctx context.Context, name string) (*LockStatus, error) {
	path, err := lockPath(name, "")
	if err != nil {
		return nil, err
	}
	var out LockStatus
	if _, err := c.do(ctx, call{method: http.MethodGet, path: path, out: &out}); err != nil {
		return nil, err
	}
	return &out, nil
}

// List returns the locks whose names start with prefix that are held or
// waited for, in name order.
func (c *Client) List(ctx context.Context, prefix string) ([]LockStatus, error) {
	locks, _, err := c.list(ctx, prefix, 0)
	return locks, err
}

// Cluster returns a node's view of the cluster: members and leader.
func (c *Client) Cluster(ctx context.Context) (*ClusterInfo, error) {
	var out ClusterInfo
	if _, err := c.do(ctx, call{method: http.MethodGet, path: "/cluster", out: &out}); err != nil {
		return nil, err
	}
	return &out, nil
}

// ClusterHealth is Cluster plus a probe of every member by the answering node
// (reachable, applied index, round trip), for operators.
func (c *Client) ClusterHealth(ctx context.Context) (*ClusterInfo, error) {
	var out ClusterInfo
	if _, err := c.do(ctx, call{method: http.MethodGet, path: "/cluster?health=true", out: &out}); err != nil {
		return nil, err
	}
	return &out, nil
}

// AddMember adds the node id, reachable for Raft at raftAddr (its
// --raft-advertise address), to the cluster: it joins as a non-voter and is
// promoted once caught up. Adding a member that already exists with the same
// details does nothing. It returns the cluster as the answering node sees it.
func (c *Client) AddMember(ctx context.Context, id, raftAddr string) (*ClusterInfo, error) {
	var out ClusterInfo
	if _, err := c.do(ctx, call{method: http.MethodPost, path: "/cluster/members", out: &out, requestID: newRequestID(),
		body: memberRequest{ID: id, RaftAddr: raftAddr}}); err != nil {
		return nil, err
	}
	return &out, nil
}

// RemoveMember takes the node id out of the cluster. The cluster refuses a
// removal that would leave fewer reachable voters than a quorum. It returns
// the cluster as the answering node sees it.
//
// The cluster keeps no request id for a removal, so a retry after an attempt
// whose answer was lost is told that id is not a member. RemoveMember takes
// that as the lost attempt's success (either way id is no longer a member)
// and reads the cluster for its answer.
func (c *Client) RemoveMember(ctx context.Context, id string) (*ClusterInfo, error) {
	if id == "" {
		return nil, invalidf("member id is empty")
	}
	var out ClusterInfo
	_, err := c.do(ctx, call{method: http.MethodDelete, path: "/cluster/members/" + url.PathEscape(id), out: &out,
		requestID: newRequestID(), what: "remove member " + id, goneIsDone: true})
	if errors.Is(err, errDoneEarlier) {
		ci, err := c.Cluster(ctx)
		if err != nil {
			return nil, fmt.Errorf("remove member %s: removed, but reading the cluster afterwards failed: %w", id, err)
		}
		return ci, nil
	}
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// SplitShard splits a sharded cluster's range at the top-level name
// segment at, online: the names whose top-level segment is at or above it
// (up to the end of its range) move to a new shard, with their holders,
// queues and counters. It returns the cluster once the answering node
// routes by the new map. Repeated, it finds the split done and does
// nothing, so it is retried like any request.
func (c *Client) SplitShard(ctx context.Context, at string) (*ClusterInfo, error) {
	var out ClusterInfo
	if _, err := c.do(ctx, call{method: http.MethodPost, path: "/cluster/shards/split", out: &out,
		requestID: newRequestID(), body: splitRequest{At: at}, what: "shard split"}); err != nil {
		return nil, err
	}
	return &out, nil
}

type splitRequest struct {
	At string `json:"at"`
}

// MoveShard moves shard's replica on node from to node to, online: to
// joins the shard's group, catches up and becomes a voter, then from
// leaves it and deletes its copy. Holders, waiters and tokens stay. It
// returns the cluster once the move is done; an unavailable error after
// two minutes means it goes on (call again with the same arguments to
// wait for it). A move whose from is no replica is refused (a repeated,
// finished move too); a conflict error says to is a replica already or
// another move of the shard is in flight.
func (c *Client) MoveShard(ctx context.Context, shard int, from, to string) (*ClusterInfo, error) {
	var out ClusterInfo
	if _, err := c.do(ctx, call{method: http.MethodPost, path: "/cluster/shards/move", out: &out,
		body: moveRequest{Shard: shard, From: from, To: to}, what: "shard replica move"}); err != nil {
		return nil, err
	}
	return &out, nil
}

type moveRequest struct {
	Shard int    `json:"shard"`
	From  string `json:"from"`
	To    string `json:"to"`
}

// TransferLeadership hands the cluster's Raft leadership to the voter id, or
// to the most caught-up other voter when id is empty (before taking the
// leader down for maintenance, say). It returns the cluster as the
// answering node sees it afterwards.
//
// A transfer to a named voter is retried like any request: repeated, it finds
// that voter leading and does nothing. A transfer to any voter (id empty)
// would move leadership again, so it is not resent once it may have reached
// a node: if no answer comes back it fails with an error wrapping
// ErrOutcomeUnknown.
func (c *Client) TransferLeadership(ctx context.Context, id string) (*ClusterInfo, error) {
	var out ClusterInfo
	_, err := c.do(ctx, call{method: http.MethodPost, path: "/cluster/leadership-transfer", out: &out,
		requestID: newRequestID(), body: memberRequest{ID: id}, what: "leadership transfer", once: id == "",
		check: "read the cluster (Cluster) to see whether the leader changed before transferring again"})
	// Whether or not it succeeded, the leader may have changed: find it
	// again on the next request.
	c.mu.Lock()
	c.leader = ""
	c.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return &out, nil
}

type memberRequest struct {
	ID       string `json:"id,omitempty"`
	RaftAddr string `json:"raft_addr,omitempty"`
}
