package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// DefaultTTL is the lease TTL of a Mutex without WithTTL.
const DefaultTTL = 30 * time.Second

// MutexOption configures a Mutex (and WithLock).
type MutexOption func(*Mutex)

// WithTTL sets the TTL of the lock's own lease (1 s to 600 s, default 30 s):
// how long the lock outlives a holder that stopped renewing, and so how long
// after the last successful renewal the client treats it as lost.
func WithTTL(ttl time.Duration) MutexOption { return func(m *Mutex) { m.ttl = ttl } }

// WithSession holds the lock under a session instead of a lease of its own:
// the session's keepalive keeps it, and it is lost when the session is.
func WithSession(s *Session) MutexOption { return func(m *Mutex) { m.session = s } }

// WithTakeover lets Lock and TryLock take the lock — or a place in its
// queue — at once from another lease of this client's ClientID: the
// instant recovery of a process that restarted with the same ClientID while
// its previous incarnation's lease still runs. The previous holder's lease
// loses the lock (its renewals fail with ErrNotHolder), so use it only when
// that incarnation is certainly gone. Without it (the default), a lock held
// under the same ClientID is like any held lock: Lock waits for it, TryLock
// fails with ErrLockHeld. With ACLs, takeover needs a token whose
// client_ids name this ClientID (docs/security.md). For an Election it
// takes over the seat, or the place in line, of the same candidate id.
func WithTakeover() MutexOption { return func(m *Mutex) { m.takeover = true } }

// WithValue gives the holder a value (at most 4 KiB) that GET, list, watch
// events and the lock's history show while it holds the lock: who holds it,
// where, doing what. Lease.SetValue replaces it.
func WithValue(v string) MutexOption { return func(m *Mutex) { m.value = v } }

// WithLockDelay (0 to 60 s, whole milliseconds) keeps the lock from everyone
// for d after this client's grant ends by expiry or revoke — never after
// Unlock — for resources that cannot check fencing tokens: a holder that
// stopped renewing gets that much more time to notice before the next one
// starts.
func WithLockDelay(d time.Duration) MutexOption { return func(m *Mutex) { m.lockDelay = d } }

// WithSubtree makes the lock cover its name and every name below it: a
// Mutex on "billing" with WithSubtree keeps out "billing/job-A" and
// "billing/x/y" (not "billing2"), and waits for their holders. With an
// RWMutex, RLock takes a shared subtree lock (it keeps out writers inside
// the subtree, not readers) and Lock an exclusive one.
func WithSubtree() MutexOption { return func(m *Mutex) { m.subtree = true } }

// Mutex is a distributed lock. Mutexes of one Client also exclude each other
// locally, so two goroutines sharing a Client cannot both hold a name.
type Mutex struct {
	c         *Client
	name      string
	ttl       time.Duration
	session   *Session
	takeover  bool
	subtree   bool
	value     string
	lockDelay time.Duration

	mu     sync.Mutex
	lease  *Lease
	unlock func() // releases the local hold
}

// NewMutex returns a Mutex for the lock called name (slash-separated
// segments of A-Z a-z 0-9 . _ : -).
func (c *Client) NewMutex(name string, opts ...MutexOption) *Mutex {
	m := &Mutex{c: c, name: strings.TrimPrefix(name, "/"), ttl: DefaultTTL}
	for _, o := range opts {
		o(m)
	}
	return m
}

// Name is the lock's name.
func (m *Mutex) Name() string { return m.name }

// Lock waits for the lock in the server's FIFO queue until it is granted or
// ctx ends. A deadline on ctx becomes the server-side wait bound (a deadline
// beyond the server's limit of an hour per wait is kept by queueing again);
// when ctx ends first Lock returns an error that wraps ctx.Err() (and
// ErrWaitTimeout for a deadline), and leaves nothing behind on the server:
// the wait is withdrawn, or a grant made at that moment released.
//
// With WithSession, a session that ends while Lock waits ends the wait with
// the session's error (wrapping ErrLeaseLost): Lock never returns a lease
// that the session no longer backs.
//
// Like sync.Mutex, Lock blocks while this Mutex, or another Mutex of the same
// Client for the same name, holds the lock. Call Unlock when done, also after
// the lease was lost.
func (m *Mutex) Lock(ctx context.Context) (*Lease, error) { return m.lock(ctx, true) }

// TryLock takes the lock only if it is free now; otherwise it fails with
// ErrLockHeld (an *APIError naming the holder, when the holder is another
// client).
func (m *Mutex) TryLock(ctx context.Context) (*Lease, error) { return m.lock(ctx, false) }

func (m *Mutex) lock(ctx context.Context, wait bool) (*Lease, error) {
	if err := m.check(); err != nil {
		return nil, err
	}
	var unlock func()
	if wait {
		var err error
		if unlock, err = m.c.locals.lock(ctx, m.name); err != nil {
			return nil, ctxError(ctx, m.name, true, nil)
		}
	} else if unlock = m.c.locals.tryLock(m.name); unlock == nil {
		return nil, fmt.Errorf("%w: %q is held by another Mutex of this client", ErrLockHeld, m.name)
	}
	if len(m.value) > maxValueLen {
		return nil, fmt.Errorf("%w: WithValue of %d bytes; the limit is %d", ErrInvalidArgument, len(m.value), maxValueLen)
	}
	if m.lockDelay < 0 || m.lockDelay > maxLockDelay {
		return nil, fmt.Errorf("%w: WithLockDelay(%s) must be between 0 and %s", ErrInvalidArgument, m.lockDelay, maxLockDelay)
	}
	l, err := m.c.lockLease(ctx, m.name, m.ttl, m.session, wait, m.takeover, lockKind{subtree: m.subtree, value: m.value, lockDelay: m.lockDelay})
	if err != nil {
		unlock()
		return nil, err
	}
	m.mu.Lock()
	m.lease, m.unlock = l, unlock
	m.mu.Unlock()
	return l, nil
}

// Unlock releases the lock and stops renewing it. It fails with
// ErrNotHolder if the server no longer counts this client as the holder (the
// lease was lost; the error then also wraps ErrLeaseLost).
func (m *Mutex) Unlock(ctx context.Context) error {
	m.mu.Lock()
	l, unlock := m.lease, m.unlock
	m.lease, m.unlock = nil, nil
	m.mu.Unlock()
	if l == nil {
		return fmt.Errorf("%w: Unlock of %q, which this Mutex does not hold", ErrNotHolder, m.name)
	}
	defer unlock()
	return l.release(ctx)
}

// ctxError is the error of Lock (wait) or TryLock when ctx ended first.
// A deadline that ends a wait is ErrWaitTimeout, unless the cluster could
// not be reached, which is what the caller then needs to know.
func ctxError(ctx context.Context, name string, wait bool, last error) error {
	return waitCtxError(ctx, "lock", name, wait, last)
}

// waitCtxError is ctxError for any kind of wait in line ("lock", "campaign").
func waitCtxError(ctx context.Context, what, name string, wait bool, last error) error {
	cause := ctx.Err()
	err := cause
	if last != nil {
		if errors.Is(last, cause) {
			err = last
		} else {
			err = fmt.Errorf("%w (last error: %w)", cause, last)
		}
	}
	if wait && errors.Is(cause, context.DeadlineExceeded) && !errors.Is(last, ErrUnavailable) {
		return fmt.Errorf("%s %q: %w: %w", what, name, ErrWaitTimeout, err)
	}
	return fmt.Errorf("%s %q: %w", what, name, err)
}

// waitFor is the wait_timeout to ask the server for: the time left before
// ctx's deadline, less a margin so that the server says wait_timeout before
// ctx ends (a clean answer instead of a cancelled request), at most the
// server's limit.
func waitFor(ctx context.Context) time.Duration {
	dl, ok := ctx.Deadline()
	if !ok {
		return maxWait
	}
	left := time.Until(dl)
	left -= min(left/10, waitMargin)
	return min(max(left.Truncate(time.Millisecond), time.Millisecond), maxWait)
}

// waitAgain says whether a wait in line that the server ended with
// wait_timeout should queue again. The caller's ctx, not the server, decides
// how long to wait: the server's one-hour limit ends waits without a
// deadline and waits whose deadline is further away, and a node that saw a
// retried request hang up withdraws its wait early. After a wait that ran
// its course up to ctx's deadline, no more than the margin waitFor keeps is
// left, and the wait is over.
func waitAgain(ctx context.Context, sent time.Time, asked time.Duration) bool {
	if ctx.Err() != nil {
		return false
	}
	dl, ok := ctx.Deadline()
	return !ok || time.Since(sent) < asked*9/10 || time.Until(dl) > waitMargin
}

// lockLease acquires a lock of the given kind and starts keeping its lease;
// takeover as WithTakeover.
func (c *Client) lockLease(ctx context.Context, name string, ttl time.Duration, s *Session, wait, takeover bool, kind lockKind) (*Lease, error) {
	params := func(requestID string, wait time.Duration) acquireParams {
		p := acquireParams{name: name, ttl: ttl, requestID: requestID, wait: wait, takeover: takeover, kind: kind}
		if s != nil {
			p.sessionID = s.id
		}
		return p
	}
	g, sent, err := c.waitInLine(ctx, line{
		what: "lock", name: name, ttl: ttl, session: s, wait: wait,
		send: func(ctx context.Context, requestID string, wait time.Duration) (*Grant, time.Time, error) {
			return c.acquire(ctx, params(requestID, wait))
		},
		withdraw: func(ctx context.Context, requestID string) { c.withdraw(ctx, params(requestID, 0)) },
		giveBack: c.giveBack,
		renew: func(ctx context.Context, g *Grant) (time.Time, error) {
			sent, _, err := c.renew(ctx, name, g.FencingToken, g.LeaseID, 0, renewAttemptTimeout(ttl, c.reqTimeout))
			return sent, err
		},
		sessionEnded: func(cause error) error { return sessionLost(name, cause) },
	})
	if err != nil {
		return nil, err
	}
	l, err := c.newLease(name, g, sent, ttl, s)
	if err != nil {
		c.giveBack(ctx, g)
		return nil, err
	}
	return l, nil
}

// sessionLost is the error of a Lock under a session that ended.
func sessionLost(name string, cause error) error {
	return fmt.Errorf("lock %q under a session: %w", name, cause)
}

// giveBack releases a grant nobody will use, within a bound of its own
// since the caller's ctx may be over.
func (c *Client) giveBack(ctx context.Context, g *Grant) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(cleanupTimeout, c.reqTimeout))
	defer cancel()
	if err := c.Release(ctx, g.Name, g.FencingToken, g.LeaseID); err != nil && !errors.Is(err, ErrNotHolder) {
		c.log.Warn("dlock: could not give back an unused grant; it expires after its TTL", "lock", g.Name, "err", err)
	}
}

// WithLock runs fn while holding the lock called name, waiting for it as
// Mutex.Lock does. fn's context is cancelled the moment the lease may be lost
// (context.Cause is then the lease's error, wrapping ErrLeaseLost). The lock
// is released when fn returns, also when it panics. WithLock returns fn's
// error, else the lease's error if it was lost while fn ran, else nil.
func (c *Client) WithLock(ctx context.Context, name string, fn func(ctx context.Context, l *Lease) error, opts ...MutexOption) error {
	m := c.NewMutex(name, opts...)
	return c.withLease(ctx, name, m.Lock, func(ctx context.Context, _ *Lease) error { return m.Unlock(ctx) }, fn)
}

// localLocks makes Mutexes of one Client exclude each other: at the server
// they share a client id, and an acquire by the holder's own client id takes
// the lock over instead of waiting.
type localLocks struct {
	mu sync.Mutex
	m  map[string]*localLock
}

type localLock struct {
	ch   chan struct{} // holds a value while locked
	refs int
}

func (ll *localLocks) get(name string) *localLock {
	ll.mu.Lock()
	defer ll.mu.Unlock()
	if ll.m == nil {
		ll.m = map[string]*localLock{}
	}
	l := ll.m[name]
	if l == nil {
		l = &localLock{ch: make(chan struct{}, 1)}
		ll.m[name] = l
	}
	l.refs++
	return l
}

func (ll *localLocks) put(name string, l *localLock) {
	ll.mu.Lock()
	defer ll.mu.Unlock()
	if l.refs--; l.refs == 0 {
		delete(ll.m, name)
	}
}

func (ll *localLocks) lock(ctx context.Context, name string) (func(), error) {
	l := ll.get(name)
	select {
	case l.ch <- struct{}{}:
		return func() { <-l.ch; ll.put(name, l) }, nil
	case <-ctx.Done():
		ll.put(name, l)
		return nil, ctx.Err()
	}
}

func (ll *localLocks) tryLock(name string) func() {
	l := ll.get(name)
	select {
	case l.ch <- struct{}{}:
		return func() { <-l.ch; ll.put(name, l) }
	default:
		ll.put(name, l)
		return nil
	}
}

// untilSessionEnds is ctx, ended also when s (if any) ends: a wait under a
// session the client counts as lost must stop. The helper goroutine exits
// with the returned context.
func untilSessionEnds(ctx context.Context, s *Session) (context.Context, context.CancelFunc) {
	wctx, cancel := context.WithCancel(ctx)
	if s != nil {
		go func() {
			select {
			case <-s.Done():
				cancel()
			case <-wctx.Done():
			}
		}()
	}
	return wctx, cancel
}
