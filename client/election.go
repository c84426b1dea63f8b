package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"net/http"
	"strings"
	"sync"
	"time"
)

// ErrNoElectionLeader: the election has no leader now (Election.Leader).
var ErrNoElectionLeader = errors.New("dlock: election has no leader")

// ElectionLeader is the current winner of an election.
type ElectionLeader struct {
	CandidateID  string `json:"candidate_id"`
	Value        string `json:"value"`
	FencingToken uint64 `json:"fencing_token"`
	// Since is when it was elected, in the leader node's wall clock.
	Since time.Time `json:"since"`
	// ExpiresAt is the server's expiry of the leader's lease as of a read
	// (for display). It is zero in views Observe builds from events.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
}

// LeaderView is the state of an election at one revision.
type LeaderView struct {
	Name string `json:"name"`
	// Leader is nil while the seat is vacant.
	Leader *ElectionLeader `json:"leader"`
	// Campaigners is how many wait in line behind the leader.
	Campaigners int    `json:"campaigners"`
	Revision    uint64 `json:"revision"`
}

// Election is a leader election: campaigners wait in the server's FIFO
// queue, and when the leader resigns or its lease ends the next one is
// elected in the same step, with a new fencing token. An Election holds no
// state of its own; every Campaign returns its own Leadership.
type Election struct {
	c        *Client
	name     string
	ttl      time.Duration
	session  *Session
	takeover bool
}

// NewElection returns the election called name (slash-separated segments of
// A-Z a-z 0-9 . _ : -; elections and locks have separate namespaces). It
// takes the options of NewMutex: WithTTL for the leader's own lease (default
// 30 s), or WithSession to hold the seat under a session, and WithTakeover
// to take the seat (or a place in line) from another lease of the same
// candidate id.
func (c *Client) NewElection(name string, opts ...MutexOption) *Election {
	m := Mutex{ttl: DefaultTTL}
	for _, o := range opts {
		o(&m)
	}
	return &Election{c: c, name: strings.TrimPrefix(name, "/"), ttl: m.ttl, session: m.session, takeover: m.takeover}
}

// Name is the election's name.
func (e *Election) Name() string { return e.name }

// electionPath is the escaped path of an election, with an action for
// POSTs; names are escaped as lock names are.
func electionPath(name, action string) (string, error) {
	p, err := lockPath(name, action)
	if err != nil {
		return "", invalidf("election name is empty")
	}
	return "/elections" + strings.TrimPrefix(p, "/locks"), nil
}

// localElectionKey names an election in the client's local exclusion, apart
// from locks (no lock name contains a NUL).
func localElectionKey(name string) string { return "\x00election\x00" + name }

// Campaign waits in the election's FIFO queue until this client is elected
// with value, or until ctx ends. It waits and retries as Mutex.Lock does: a
// deadline on ctx becomes the server-side wait bound, retries repeat the
// same request id, and when ctx ends first Campaign returns an error
// wrapping ctx.Err() (and ErrWaitTimeout for a deadline) after withdrawing
// the wait, or resigning a seat granted at that moment.
//
// With WithSession, a session that ends while Campaign waits ends the
// campaign with an error wrapping ErrSessionExpired: Campaign never returns
// a leadership that the session no longer backs.
//
// Campaigns of one Client for one election exclude each other locally (at
// the server they are one candidate): a second one waits until the first
// Leadership resigns or is lost. Resign when done.
func (e *Election) Campaign(ctx context.Context, value string) (*Leadership, error) {
	if e.session == nil {
		if err := checkTTL(e.ttl); err != nil {
			return nil, err
		}
	}
	if _, err := electionPath(e.name, ""); err != nil {
		return nil, err
	}
	unlock, err := e.c.locals.lock(ctx, localElectionKey(e.name))
	if err != nil {
		return nil, waitCtxError(ctx, "campaign", e.name, true, nil)
	}
	l, err := e.campaign(ctx, value)
	if err != nil {
		unlock()
		return nil, err
	}
	l.holdLocal(unlock)
	return l, nil
}

type campaignParams struct {
	value     string
	sessionID string
	wait      time.Duration
	requestID string
	takeover  bool
}

func (e *Election) campaign(ctx context.Context, value string) (*Leadership, error) {
	c, s := e.c, e.session
	params := func(requestID string, wait time.Duration) campaignParams {
		p := campaignParams{value: value, requestID: requestID, wait: wait, takeover: e.takeover}
		if s != nil {
			p.sessionID = s.id
		}
		return p
	}
	g, sent, err := c.waitInLine(ctx, line{
		what: "campaign", name: e.name, ttl: e.ttl, session: s, wait: true,
		send: func(ctx context.Context, requestID string, wait time.Duration) (*Grant, time.Time, error) {
			return e.send(ctx, params(requestID, wait))
		},
		withdraw: func(ctx context.Context, requestID string) { e.withdraw(ctx, params(requestID, 0)) },
		giveBack: e.giveBack,
		renew: func(ctx context.Context, g *Grant) (time.Time, error) {
			return e.renew(ctx, g.FencingToken, g.LeaseID, renewAttemptTimeout(e.ttl, c.reqTimeout))
		},
		sessionEnded: func(cause error) error { return sessionEnded(e.name, cause) },
	})
	if err != nil {
		return nil, err
	}
	l, err := e.newLeadership(g, sent, value)
	if err != nil {
		e.giveBack(ctx, g)
		return nil, err
	}
	return l, nil
}

func sessionEnded(name string, cause error) error {
	if errors.Is(cause, ErrSessionExpired) {
		return fmt.Errorf("campaign %q: the session ended: %w", name, cause)
	}
	return fmt.Errorf("campaign %q: the session ended: %w: %w", name, ErrSessionExpired, cause)
}

// send is one logical campaign request, retried under p.requestID.
func (e *Election) send(ctx context.Context, p campaignParams) (*Grant, time.Time, error) {
	path, err := electionPath(e.name, "campaign")
	if err != nil {
		return nil, time.Time{}, err
	}
	req := campaignRequest{CandidateID: e.c.id, Value: p.value, SessionID: p.sessionID,
		WaitTimeoutMs: p.wait.Milliseconds(), RequestID: p.requestID, Takeover: p.takeover}
	if p.sessionID == "" {
		req.TTLms = e.ttl.Milliseconds()
	}
	var out campaignResponse
	sent, err := e.c.do(ctx, call{method: http.MethodPost, path: path, body: req, out: &out,
		timeout: e.c.reqTimeout + p.wait, requestID: p.requestID})
	if err != nil {
		return nil, sent, err
	}
	if !out.Leader || out.FencingToken == 0 || out.LeaseID == "" {
		return nil, sent, fmt.Errorf("dlock: campaign %q: the server answered 2xx without electing", e.name)
	}
	return &Grant{Name: e.name, ClientID: e.c.id, FencingToken: out.FencingToken, LeaseID: out.LeaseID,
		ExpiresAt: out.ExpiresAt, Revision: out.Revision, TokenProof: out.TokenProof, LeaseRef: out.LeaseRef}, sent, nil
}

// withdraw makes sure a campaign whose caller gave up leaves nothing
// behind, as Client.withdraw does for locks: the same request again without
// waiting withdraws a wait still in line, or returns a seat won meanwhile,
// which is then resigned.
func (e *Election) withdraw(ctx context.Context, p campaignParams) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(cleanupTimeout, e.c.reqTimeout))
	defer cancel()
	p.wait, p.takeover = 0, false // as Client.withdraw
	g, _, err := e.send(ctx, p)
	if err == nil {
		e.giveBack(ctx, g)
		return
	}
	if !errors.Is(err, ErrLockHeld) && !errors.Is(err, ErrWaitTimeout) && !errors.Is(err, ErrSessionExpired) {
		e.c.log.Warn("dlock: could not withdraw an abandoned campaign; the server drops it at its wait timeout or TTL",
			"election", e.name, "err", err)
	}
}

// giveBack resigns a seat nobody will use.
func (e *Election) giveBack(ctx context.Context, g *Grant) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(cleanupTimeout, e.c.reqTimeout))
	defer cancel()
	if err := e.resign(ctx, g.FencingToken, g.LeaseID); err != nil && !errors.Is(err, ErrNotHolder) {
		e.c.log.Warn("dlock: could not resign an unused election; it ends after its TTL", "election", e.name, "err", err)
	}
}

func (e *Election) holderCall(ctx context.Context, action string, token uint64, leaseID string, value *string, ttl, attemptTimeout time.Duration) (time.Time, error) {
	path, err := electionPath(e.name, action)
	if err != nil {
		return time.Time{}, err
	}
	id := newRequestID()
	return e.c.do(ctx, call{method: http.MethodPost, path: path, timeout: attemptTimeout, requestID: id,
		body: electionHolderRequest{CandidateID: e.c.id, FencingToken: token, LeaseID: leaseID, Value: value,
			TTLms: ttl.Milliseconds(), RequestID: id}})
}

func (e *Election) resign(ctx context.Context, token uint64, leaseID string) error {
	_, err := e.holderCall(ctx, "resign", token, leaseID, nil, 0, 0)
	return err
}

func (e *Election) renew(ctx context.Context, token uint64, leaseID string, attemptTimeout time.Duration) (time.Time, error) {
	return e.holderCall(ctx, "renew", token, leaseID, nil, 0, attemptTimeout)
}

// Leader returns the election's current leader (a linearizable read), or an
// error wrapping ErrNoElectionLeader when the seat is vacant.
func (e *Election) Leader(ctx context.Context) (*ElectionLeader, error) {
	path, err := electionPath(e.name, "")
	if err != nil {
		return nil, err
	}
	var v LeaderView
	if _, err := e.c.do(ctx, call{method: http.MethodGet, path: path, out: &v}); err != nil {
		return nil, err
	}
	if v.Leader == nil {
		return nil, fmt.Errorf("election %q: %w", e.name, ErrNoElectionLeader)
	}
	return v.Leader, nil
}

// Observe streams the election's state: the current view first, then a new
// view after every change — a new leader, a proclaimed value, a change in
// the line, and a vacancy (Leader == nil) whenever the seat is empty. A
// resignation or an expiry that hands the seat to the next in line shows
// as two views of one revision: the vacancy, then the new leader.
//
// A broken stream is resumed transparently on another node, which sends its
// current view first; a view that says nothing new is not repeated, and no
// view older than one already yielded is. The sequence ends when ctx ends
// or the loop stops, or with an error that retrying cannot fix (a bad name).
func (e *Election) Observe(ctx context.Context) iter.Seq2[LeaderView, error] {
	return func(yield func(LeaderView, error) bool) {
		path, err := electionPath(e.name, "")
		if err != nil {
			yield(LeaderView{}, err)
			return
		}
		path += "?observe=true"
		var last *LeaderView
		fresh := false
		err = e.c.follow(ctx, streamSpec{
			what: "observe election " + e.name,
			path: func() string { fresh = true; return path },
			record: func(r sseRecord) (bool, error) {
				if r.event != "leader" {
					return true, nil
				}
				var v LeaderView
				if err := json.Unmarshal(r.data, &v); err != nil {
					return false, fmt.Errorf("dlock: observe election %q: bad view from the server: %w", e.name, err)
				}
				first := fresh
				fresh = false
				switch {
				case last == nil:
				case v.Revision < last.Revision:
					return true, nil // older than what the caller saw
				case sameView(v, *last) && (first || v.Revision == last.Revision):
					// A reconnect's current view that says nothing new.
					last.Revision = v.Revision
					return true, nil
				}
				last = &v
				return yield(v, nil), nil
			},
		})
		if err != nil {
			yield(LeaderView{}, err)
		}
	}
}

// sameView reports whether two views show the same leader, value and line.
func sameView(a, b LeaderView) bool {
	if a.Campaigners != b.Campaigners || (a.Leader == nil) != (b.Leader == nil) {
		return false
	}
	return a.Leader == nil || (a.Leader.CandidateID == b.Leader.CandidateID &&
		a.Leader.FencingToken == b.Leader.FencingToken && a.Leader.Value == b.Leader.Value)
}

// Leadership is one won election. It renews its lease every TTL/3 (or, under
// a Session, lives as long as the session) until Resign or until it is lost.
type Leadership struct {
	*held
	e *Election

	localOnce sync.Once
	unlock    func()

	mu       sync.Mutex
	value    string
	resigned bool
}

func (e *Election) newLeadership(g *Grant, sent time.Time, value string) (*Leadership, error) {
	c := e.c
	h, err := c.keep("leadership of election "+e.name, e.name, g, sent, e.ttl, e.session, func(ctx context.Context, h *held) (time.Time, error) {
		return e.renew(ctx, h.token, h.leaseID, renewAttemptTimeout(e.ttl, c.reqTimeout))
	})
	if err != nil {
		return nil, err
	}
	return &Leadership{held: h, e: e, value: value}, nil
}

// holdLocal keeps the client's local hold on the election until the
// leadership ends: at once when it is lost (from then on the client does
// not count itself leader, and a new Campaign may take the seat over), or
// after the resign request on Resign.
func (l *Leadership) holdLocal(unlock func()) {
	l.unlock = unlock
	go func() {
		<-l.k.done
		if !errors.Is(l.k.errValue(), ErrReleased) {
			l.releaseLocal()
		}
	}()
}

func (l *Leadership) releaseLocal() {
	l.localOnce.Do(func() {
		if l.unlock != nil {
			l.unlock()
		}
	})
}

// Value is the leader's value: the campaign's, or the last proclaimed.
func (l *Leadership) Value() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.value
}

// Proclaim changes the leader's value without an election. It fails with
// the leadership's error once Done is closed, and with an error wrapping
// ErrNotHolder (and then ends the leadership) if the server says this client
// no longer leads.
func (l *Leadership) Proclaim(ctx context.Context, value string) error {
	if err := l.Err(); err != nil {
		return fmt.Errorf("proclaim in election %q: %w", l.e.name, err)
	}
	_, err := l.e.holderCall(ctx, "proclaim", l.token, l.leaseID, &value, 0, 0)
	if errors.Is(err, ErrNotHolder) {
		if l.k.end(lost(err)) {
			l.e.c.log.Warn("dlock: leadership of election "+l.e.name+" lost", "err", err)
		}
	}
	if err != nil {
		return fmt.Errorf("proclaim in election %q: %w", l.e.name, err)
	}
	l.mu.Lock()
	l.value = value
	l.mu.Unlock()
	return nil
}

// Resign stops renewing and gives the seat up; the next campaigner in line
// is elected at once. Call it when done, also after the leadership was lost
// (then it fails with ErrNotHolder joined with the loss, unless the server
// still counted this client as leader). Resign after a successful Resign
// does nothing.
func (l *Leadership) Resign(ctx context.Context) error {
	l.mu.Lock()
	done := l.resigned
	l.mu.Unlock()
	if done {
		return nil
	}
	l.k.end(ErrReleased)
	// Wait for the renewer, so no renewal can race with the resign.
	<-l.k.finished
	defer l.releaseLocal()
	err := l.e.resign(ctx, l.token, l.leaseID)
	if err == nil {
		l.mu.Lock()
		l.resigned = true
		l.mu.Unlock()
		return nil
	}
	if errors.Is(err, ErrNotHolder) {
		if lerr := l.Err(); errors.Is(lerr, ErrLeaseLost) {
			return errors.Join(err, lerr)
		}
	}
	return err
}

// The election bodies of the HTTP API (docs/api.md).

type campaignRequest struct {
	CandidateID   string `json:"candidate_id"`
	Value         string `json:"value"`
	TTLms         int64  `json:"ttl_ms,omitempty"`
	SessionID     string `json:"session_id,omitempty"`
	WaitTimeoutMs int64  `json:"wait_timeout_ms,omitempty"`
	RequestID     string `json:"request_id,omitempty"`
	Takeover      bool   `json:"takeover,omitempty"`
}

type campaignResponse struct {
	Leader       bool      `json:"leader"`
	FencingToken uint64    `json:"fencing_token"`
	TokenProof   string    `json:"token_proof"`
	LeaseRef     string    `json:"lease_ref"`
	ExpiresAt    time.Time `json:"expires_at"`
	LeaseID      string    `json:"lease_id"`
	Revision     uint64    `json:"revision"`
}

// electionHolderRequest is the body of proclaim (with Value), renew and
// resign.
type electionHolderRequest struct {
	CandidateID  string  `json:"candidate_id"`
	FencingToken uint64  `json:"fencing_token"`
	LeaseID      string  `json:"lease_id"`
	Value        *string `json:"value,omitempty"`
	TTLms        int64   `json:"ttl_ms,omitempty"`
	RequestID    string  `json:"request_id,omitempty"`
}
