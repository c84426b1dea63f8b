package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock/dlock/client"
)

// An operator's revoke reaches the holder: WithLock's context is cancelled
// with a cause wrapping ErrLeaseLost and ErrLockLost, the waiter gets the
// lock with a higher token, and the history says revoked with the reason and
// the holder's value.
func TestRevokeCancelsWithLock(t *testing.T) {
	c := startCluster(t)
	holder, ops, next := c.client("worker-1"), c.client("operator"), c.client("worker-2")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	held := make(chan uint64, 1)
	ended := make(chan error, 1)
	go func() {
		ended <- holder.WithLock(ctx, "ops/job", func(ctx context.Context, l *client.Lease) error {
			if err := l.SetValue(ctx, "step 2 of 3"); err != nil {
				return err
			}
			held <- l.Token()
			<-ctx.Done()
			return context.Cause(ctx)
		}, client.WithTTL(3*time.Second), client.WithValue("step 1 of 3"))
	}()
	var token uint64
	select {
	case token = <-held:
	case err := <-ended:
		t.Fatalf("WithLock ended early: %v", err)
	}
	if st := c.get("ops/job"); st.Value != "step 2 of 3" {
		t.Fatalf("status %+v: want the value SetValue gave", st)
	}
	waiting := make(chan *client.Lease, 1)
	go func() {
		l, err := next.NewMutex("ops/job").Lock(ctx)
		if err != nil {
			t.Errorf("worker-2 Lock: %v", err)
		}
		waiting <- l
	}()
	revoked, err := ops.Revoke(ctx, "ops/job", token, "stuck")
	if err != nil || len(revoked) != 1 || revoked[0] != token {
		t.Fatalf("Revoke: %v %v", revoked, err)
	}
	select {
	case err := <-ended:
		if !errors.Is(err, client.ErrLeaseLost) || !errors.Is(err, client.ErrLockLost) {
			t.Fatalf("WithLock ended with %v; want ErrLeaseLost and ErrLockLost", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the revoked holder's WithLock was not cancelled")
	}
	l := <-waiting
	if l == nil || l.Token() <= token {
		t.Fatalf("worker-2's lease %+v, want a token above %d", l, token)
	}
	h, err := ops.History(ctx, "ops/job", client.HistoryOptions{Limit: 2})
	if err != nil || len(h.Grants) != 2 {
		t.Fatalf("History: %+v %v", h, err)
	}
	if g := h.Grants[1]; g.FencingToken != token || g.EndCause != "revoked" || g.Reason != "stuck" || g.Value != "step 2 of 3" || g.ClientID != "worker-1" {
		t.Fatalf("revoked record %+v", g)
	}
	if _, err := ops.Revoke(ctx, "ops/job", token, "again"); err == nil {
		t.Fatal("revoking an ended grant succeeded")
	}
	if _, err := ops.Revoke(ctx, "ops/job", 0, ""); !errors.Is(err, client.ErrInvalidArgument) {
		t.Fatalf("Revoke without a reason: %v", err)
	}
}

// During a lock-delay TryLock fails with ErrLockDelayed and says how long
// is left; Lock waits in line and gets the lock once it ends.
func TestLockDelayTryLock(t *testing.T) {
	c := startCluster(t)
	first, ops, other := c.client("first"), c.client("operator"), c.client("other")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	l, err := first.NewMutex("delayed/job", client.WithLockDelay(3*time.Second)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ops.Revoke(ctx, "delayed/job", l.Token(), "test"); err != nil {
		t.Fatal(err)
	}
	_, err = other.NewMutex("delayed/job").TryLock(ctx)
	var ae *client.APIError
	if !errors.Is(err, client.ErrLockDelayed) || !errors.As(err, &ae) || ae.RetryAfter <= 0 || ae.RetryAfter > 3*time.Second {
		t.Fatalf("TryLock in the delay: %v", err)
	}
	if st := c.get("delayed/job"); st.Held || st.DelayedUntil.IsZero() {
		t.Fatalf("status in the delay %+v", st)
	}
	l2, err := other.NewMutex("delayed/job").Lock(ctx)
	if err != nil || l2.Token() <= l.Token() {
		t.Fatalf("Lock after the delay: %v", err)
	}
	if _, err := other.NewMutex("x", client.WithLockDelay(61*time.Second)).TryLock(ctx); !errors.Is(err, client.ErrInvalidArgument) {
		t.Fatalf("a 61 s lock-delay: %v", err)
	}
}
