package demo

import (
	"context"
	"fmt"
	"time"

	"github.com/dlock/dlock/client"
)

// cleanupTimeout bounds a release made while giving up on a step.
const cleanupTimeout = 3 * time.Second

// held is a client's hold of a lock through a Mutex, which renews it.
type held struct {
	who string
	m   *client.Mutex
	l   *client.Lease
}

func (h *held) grant() grant {
	return grant{ClientID: h.who, Lock: h.l.Name(), FencingToken: h.l.Token(), LeaseRef: h.l.LeaseRef(), TokenProof: h.l.TokenProof()}
}

func (h *held) unlock(ctx context.Context) error {
	if err := h.m.Unlock(ctx); err != nil {
		return fmt.Errorf("%s's release of %s: %w", h.who, h.m.Name(), err)
	}
	return nil
}

// lock waits in the lock's queue until ctx ends (its deadline is the
// server-side wait bound).
func (e *env) lock(ctx context.Context, who, name string, ttl time.Duration) (*held, error) {
	m := e.clients[who].NewMutex(name, client.WithTTL(ttl))
	l, err := m.Lock(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s's lock of %s: %w", who, name, err)
	}
	return &held{who: who, m: m, l: l}, nil
}

// pending is a lock being waited for in the background.
type pending struct {
	who    string
	cancel context.CancelFunc
	done   chan struct{}
	h      *held // set before done is closed
	err    error
}

// lockAsync queues who for name, waiting at most WaitTimeout. Call abandon
// (deferred) so that the goroutine has ended when the step returns.
func (e *env) lockAsync(ctx context.Context, who, name string, ttl time.Duration) *pending {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.WaitTimeout)
	p := &pending{who: who, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.h, p.err = e.lock(ctx, who, name, ttl)
	}()
	return p
}

func (p *pending) granted() bool {
	select {
	case <-p.done:
		return p.err == nil
	default:
		return false
	}
}

func (p *pending) result(ctx context.Context) (*held, error) {
	select {
	case <-p.done:
		return p.h, p.err
	case <-ctx.Done():
		return nil, fmt.Errorf("%s still waiting: %w", p.who, ctx.Err())
	}
}

// abandon withdraws a wait still in line and returns once the goroutine
// has; the client withdraws within its own clean-up bound.
func (p *pending) abandon() {
	p.cancel()
	<-p.done
}

// waitQueue waits until name has the given number of clients in line, or
// until p (the last to queue) is done: granted already, on a machine slow
// enough that the holder's lease ran out first, or failed.
func (e *env) waitQueue(ctx context.Context, name string, waiters int, p *pending) error {
	var pErr error
	err := e.waitUntil(ctx, fmt.Sprintf("%d client(s) waiting for %s", waiters, name), nil, func() (bool, error) {
		select {
		case <-p.done:
			pErr = p.err
			return true, nil
		default:
		}
		st, err := e.clients["client1"].Status(ctx, name)
		if err != nil {
			return false, err
		}
		return st.Waiters == waiters, fmt.Errorf("%d waiting", st.Waiters)
	})
	if err != nil {
		return err
	}
	return pErr
}

// checkHolder reads name and checks who holds it, with which token, and how
// many wait.
func (e *env) checkHolder(ctx context.Context, name, who string, token uint64, waiters int) error {
	st, err := e.clients["client1"].Status(ctx, name)
	if err != nil {
		return fmt.Errorf("read %s: %w", name, err)
	}
	if !st.Held || st.Holder == nil || st.Holder.ClientID != who || st.Holder.FencingToken != token || st.Waiters != waiters {
		got := "nobody"
		if st.Holder != nil {
			got = fmt.Sprintf("%s with token %d", st.Holder.ClientID, st.Holder.FencingToken)
		}
		return fmt.Errorf("%s is held by %s with %d waiting; want %s with token %d and %d waiting", name, got, st.Waiters, who, token, waiters)
	}
	return nil
}
