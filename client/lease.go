package client

import (
	"context"
	"errors"
	"sync"
	"time"
)

// errNoRenewal is why a lease or session is lost when no renewal was
// answered in time.
var errNoRenewal = errors.New("no renewal was answered within the TTL")

// keeper is what leases and sessions share: the moment the client stops
// trusting them, Done, Err, and the one goroutine that keeps them alive (or,
// for a lock held under a session, watches the session).
type keeper struct {
	c    *Client
	what string // for logs: "lock NAME" or "session"
	ttl  time.Duration
	done chan struct{}
	// ctx ends with the keeper: it stops the goroutine and its requests.
	ctx      context.Context
	cancel   context.CancelFunc
	finished chan struct{} // closed when the goroutine has returned

	mu sync.Mutex
	// sent is when the last acquire or renew answered with success was sent
	// (its first attempt). The server keeps the lease at least until sent+ttl.
	sent  time.Time
	timer *time.Timer
	err   error
}

func newKeeper(c *Client, what string, ttl time.Duration, sent time.Time) *keeper {
	ctx, cancel := context.WithCancel(context.Background())
	return &keeper{c: c, what: what, ttl: ttl, sent: sent, done: make(chan struct{}), ctx: ctx, cancel: cancel, finished: make(chan struct{})}
}

func (k *keeper) expiresAt() time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.sent.Add(k.ttl)
}

func (k *keeper) errValue() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.err
}

// end closes Done with err, once; it reports whether this call ended it.
func (k *keeper) end(err error) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.endLocked(err)
}

func (k *keeper) endLocked(err error) bool {
	if k.err != nil {
		return false
	}
	k.err = err
	close(k.done)
	if k.timer != nil {
		k.timer.Stop()
	}
	k.cancel()
	return true
}

// extend moves the bound after a renewal sent at sent was answered with
// success. A lease that already ended stays ended: Done never reopens.
func (k *keeper) extend(sent time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.err == nil && sent.After(k.sent) {
		k.sent = sent
	}
}

// arm starts the timer that ends the keeper at sent+ttl. It runs on its own
// rather than in the renewing goroutine, so that a renewal stuck in a retry
// cannot delay the end.
func (k *keeper) arm() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.timer = time.AfterFunc(time.Until(k.sent.Add(k.ttl)), k.expire)
}

func (k *keeper) expire() {
	k.mu.Lock()
	if k.err != nil {
		k.mu.Unlock()
		return
	}
	// Renewals move the bound without touching the timer; re-arm for the
	// new bound instead.
	if d := time.Until(k.sent.Add(k.ttl)); d > 0 {
		k.timer.Reset(d)
		k.mu.Unlock()
		return
	}
	k.endLocked(lost(errNoRenewal))
	k.mu.Unlock()
	k.c.log.Warn("dlock: "+k.what+" lost", "err", errNoRenewal)
}

// keepAlive renews every ttl/3 until the keeper ends. Failures are retried
// until the bound, except answers that say the server dropped the lease.
func (k *keeper) keepAlive(renew func(ctx context.Context) (time.Time, error)) {
	defer close(k.finished)
	defer k.c.untrack(k)
	var retryAt time.Time
	for {
		k.mu.Lock()
		next, bound := k.sent.Add(k.ttl/3), k.sent.Add(k.ttl)
		k.mu.Unlock()
		if !retryAt.IsZero() {
			next = retryAt
		}
		if !sleep(k.ctx, time.Until(next)) {
			return
		}
		// A renewal answered after the bound cannot help: by then the lease
		// counts as lost, and it never comes back.
		ctx, cancel := context.WithDeadline(k.ctx, bound)
		sent, err := renew(ctx)
		cancel()
		switch {
		case err == nil:
			k.extend(sent)
			retryAt = time.Time{}
		case k.ctx.Err() != nil:
			return
		case errors.Is(err, ErrNotHolder), errors.Is(err, ErrSessionExpired), errors.Is(err, ErrLockLost):
			// ErrLockLost on a renewal: an operator revoked the grant.
			if k.end(lost(err)) {
				k.c.log.Warn("dlock: "+k.what+" lost", "err", err)
			}
			return
		default:
			k.c.log.Debug("dlock: renewal failed; retrying until the bound", "what", k.what, "err", err)
			retryAt = time.Now().Add(max(k.ttl/20, 20*time.Millisecond))
		}
	}
}

// follow ends the keeper when parent ends: a lock held under a session lives
// exactly as long as the session.
func (k *keeper) follow(parent *keeper) {
	defer close(k.finished)
	defer k.c.untrack(k)
	select {
	case <-parent.done:
		k.end(lost(parent.errValue()))
	case <-k.ctx.Done():
	}
}

// Lease is one holding of a lock. It renews itself (or, for a lock held under
// a Session, lives as long as the session) until Unlock or until it is lost.
// A grant an operator revokes (Client.Revoke) is lost at its next renewal,
// at most a third of the TTL later — under a Session, at the session's next
// keepalive, whose answer lists the grants the session lost: Done closes and
// Err wraps ErrLeaseLost and ErrLockLost. A grant taken over by another
// lease of this client id (WithTakeover) ends the same way, with
// ErrNotHolder.
type Lease struct {
	*held
}

// SetValue replaces the value the lock's holder shows in GET, list, watch
// events and the history (at most 4 KiB; "" clears it). It is sent as a
// renewal, so it also extends the lease.
func (l *Lease) SetValue(ctx context.Context, value string) error {
	if err := l.Err(); err != nil {
		return err
	}
	sent, _, err := l.k.c.renewWith(ctx, l.name, l.token, l.leaseID, 0, 0, &value)
	if err != nil {
		if errors.Is(err, ErrNotHolder) || errors.Is(err, ErrLockLost) {
			l.k.end(lost(err))
		}
		return err
	}
	if l.session == nil {
		l.k.extend(sent)
	}
	return nil
}

// release ends the lease and gives the lock back.
func (l *Lease) release(ctx context.Context) error {
	l.k.end(ErrReleased)
	// Wait for the renewer, so no renewal can race with the release.
	<-l.k.finished
	err := l.k.c.Release(ctx, l.name, l.token, l.leaseID)
	if errors.Is(err, ErrNotHolder) {
		if lerr := l.Err(); errors.Is(lerr, ErrLeaseLost) {
			return errors.Join(err, lerr)
		}
	}
	return err
}

// newLease starts keeping a granted lock: renewing it, or following its
// session.
func (c *Client) newLease(name string, g *Grant, sent time.Time, ttl time.Duration, s *Session) (*Lease, error) {
	h, err := c.keep("lock "+name, name, g, sent, ttl, s, func(ctx context.Context, h *held) (time.Time, error) {
		sent, _, err := c.renew(ctx, name, h.token, h.leaseID, 0, renewAttemptTimeout(ttl, c.reqTimeout))
		return sent, err
	})
	if err != nil {
		return nil, err
	}
	return &Lease{h}, nil
}

// renewAttemptTimeout bounds one attempt of a renewal, so that a node that
// hangs (cut off from the leader, say) leaves time to try another one
// within the TTL.
func renewAttemptTimeout(ttl, reqTimeout time.Duration) time.Duration {
	return min(max(ttl/3, 500*time.Millisecond), reqTimeout)
}
