package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
)

// MaxLimit is the largest limit of a Semaphore.
const MaxLimit = 10_000

// Semaphore is a counting lock: up to Limit holders at once, each with its
// own lease and fencing token, granted in FIFO order. Every client that uses
// the lock must ask for the same limit: the first acquire of an unused lock
// sets it, and an acquire with another limit fails with ErrLimitMismatch.
// Unlike Mutex, the Semaphores of one Client do not exclude each other
// locally: each Acquire takes one of the Limit places.
type Semaphore struct {
	m     *Mutex // the name and options (TTL, session, subtree, takeover)
	limit int
}

// NewSemaphore returns a Semaphore for the lock called name that admits up
// to limit holders (1 to MaxLimit). The MutexOptions apply to every grant:
// WithTTL, WithSession, WithSubtree, WithTakeover.
func (c *Client) NewSemaphore(name string, limit int, opts ...MutexOption) *Semaphore {
	return &Semaphore{m: c.NewMutex(name, opts...), limit: limit}
}

// Name is the lock's name.
func (s *Semaphore) Name() string { return s.m.name }

// Limit is how many holders the Semaphore admits at once.
func (s *Semaphore) Limit() int { return s.limit }

// Acquire waits in the lock's FIFO queue for one of its places until it is
// granted or ctx ends, as Mutex.Lock does; the Lease is kept renewed until
// Release.
func (s *Semaphore) Acquire(ctx context.Context) (*Lease, error) { return s.acquire(ctx, true) }

// TryAcquire takes a place only if one is free now and nobody waits ahead;
// otherwise it fails with ErrLockHeld.
func (s *Semaphore) TryAcquire(ctx context.Context) (*Lease, error) { return s.acquire(ctx, false) }

func (s *Semaphore) acquire(ctx context.Context, wait bool) (*Lease, error) {
	if s.limit < 1 || s.limit > MaxLimit {
		return nil, invalidf("semaphore %q: limit %d: use 1 to %d", s.m.name, s.limit, MaxLimit)
	}
	return s.m.grant(ctx, wait, lockKind{limit: s.limit, subtree: s.m.subtree})
}

// Release gives a place back (the next in line gets it at once) and stops
// renewing its lease. It fails with ErrNotHolder if the place was lost.
func (s *Semaphore) Release(ctx context.Context, l *Lease) error {
	return releaseLease(ctx, s.m.name, l)
}

// WithSemaphore runs fn while holding one of the limit places of the lock
// called name, as WithLock does for a Mutex.
func (c *Client) WithSemaphore(ctx context.Context, name string, limit int, fn func(ctx context.Context, l *Lease) error, opts ...MutexOption) error {
	s := c.NewSemaphore(name, limit, opts...)
	return c.withLease(ctx, name, func(ctx context.Context) (*Lease, error) { return s.Acquire(ctx) },
		func(ctx context.Context, l *Lease) error { return s.Release(ctx, l) }, fn)
}

// RWMutex is a shared/exclusive (readers/writer) lock: any number of
// readers (RLock) hold it together, a writer (Lock) holds it alone. Grants
// are FIFO: a writer waiting in line keeps out the readers that come after
// it (no writer starvation), and readers next to each other at the head of
// the line are let in together. With WithSubtree, every grant covers the
// names below the lock too.
type RWMutex struct {
	m *Mutex // the writer's lock; its options apply to readers too
}

// NewRWMutex returns an RWMutex for the lock called name. The MutexOptions
// apply to readers and the writer: WithTTL, WithSession, WithSubtree,
// WithTakeover.
func (c *Client) NewRWMutex(name string, opts ...MutexOption) *RWMutex {
	return &RWMutex{m: c.NewMutex(name, opts...)}
}

// Name is the lock's name.
func (rw *RWMutex) Name() string { return rw.m.name }

// RLock waits for a shared grant until it is granted or ctx ends. Each RLock
// is a grant of its own (its own lease and fencing token): give it back
// with RUnlock.
func (rw *RWMutex) RLock(ctx context.Context) (*Lease, error) {
	return rw.m.grant(ctx, true, lockKind{shared: true, subtree: rw.m.subtree})
}

// TryRLock takes a shared grant only if it can be had now (no writer holds
// it or waits ahead); otherwise it fails with ErrLockHeld.
func (rw *RWMutex) TryRLock(ctx context.Context) (*Lease, error) {
	return rw.m.grant(ctx, false, lockKind{shared: true, subtree: rw.m.subtree})
}

// RUnlock gives a shared grant back and stops renewing its lease.
func (rw *RWMutex) RUnlock(ctx context.Context, l *Lease) error {
	return releaseLease(ctx, rw.m.name, l)
}

// Lock waits for the exclusive grant, as Mutex.Lock.
func (rw *RWMutex) Lock(ctx context.Context) (*Lease, error) { return rw.m.Lock(ctx) }

// TryLock takes the exclusive grant only if it can be had now, as
// Mutex.TryLock.
func (rw *RWMutex) TryLock(ctx context.Context) (*Lease, error) { return rw.m.TryLock(ctx) }

// Unlock gives the exclusive grant back, as Mutex.Unlock.
func (rw *RWMutex) Unlock(ctx context.Context) error { return rw.m.Unlock(ctx) }

// grant takes one grant of the given kind without the Mutex's local
// exclusion and without keeping it in the Mutex: Semaphore places and
// shared grants are many at once.
func (m *Mutex) grant(ctx context.Context, wait bool, kind lockKind) (*Lease, error) {
	if err := m.check(); err != nil {
		return nil, err
	}
	return m.c.lockLease(ctx, m.name, m.ttl, m.session, wait, m.takeover, kind)
}

// check refuses a name or TTL the server would.
func (m *Mutex) check() error {
	if m.session == nil {
		if err := checkTTL(m.ttl); err != nil {
			return err
		}
	}
	_, err := lockPath(m.name, "")
	return err
}

func releaseLease(ctx context.Context, name string, l *Lease) error {
	if l == nil || strings.TrimPrefix(l.Name(), "/") != name {
		return fmt.Errorf("%w: release of %q with a lease that is not one of its grants", ErrNotHolder, name)
	}
	return l.release(ctx)
}

// withLease runs fn while holding a lease taken by take, given back by
// give, as WithLock does: fn's context ends when the lease may be lost.
func (c *Client) withLease(ctx context.Context, name string, take func(context.Context) (*Lease, error),
	give func(context.Context, *Lease) error, fn func(ctx context.Context, l *Lease) error) error {
	l, err := take(ctx)
	if err != nil {
		return err
	}
	fctx, cancel := context.WithCancelCause(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case <-l.Done():
			cancel(l.Err())
		case <-fctx.Done():
		}
	})
	defer func() {
		// Stop watching before giving the lease back, which also closes
		// Done.
		cancel(nil)
		wg.Wait()
		uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), c.reqTimeout)
		defer ucancel()
		if uerr := give(uctx, l); uerr != nil && !errors.Is(uerr, ErrLeaseLost) {
			// fn's work is done; a failed release only delays the next
			// holder until the TTL runs out.
			c.log.Warn("dlock: could not release lock; it expires after its TTL", "lock", name, "err", uerr)
		}
	}()
	err = fn(fctx, l)
	if err == nil {
		err = l.Err()
	}
	return err
}
