package client_test

import (
	"context"
	"errors"
	"strings"
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

// waitLost waits (bounded) for a grant's Done and checks its error wraps
// ErrLeaseLost and want.
func waitLost(t *testing.T, what string, done <-chan struct{}, errOf func() error, want error) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: Done did not close after the revoke (the session keepalive did not report it)", what)
	}
	if err := errOf(); !errors.Is(err, client.ErrLeaseLost) || !errors.Is(err, want) {
		t.Fatalf("%s: Err = %v; want ErrLeaseLost and %v", what, err, want)
	}
}

// A revoke of a lock held under a Session reaches its holder at the
// session's next keepalive: the Lease's Done closes with ErrLockLost,
// WithLock's context is cancelled, and the session lives on with its other
// locks. The same holds for a Semaphore's and an RWMutex's grants, an
// election's seat (RevokeElection), and a grant taken over by another lease
// of the same client id (ErrNotHolder).
func TestRevokeUnderSession(t *testing.T) {
	c := startCluster(t)
	holder, ops := c.client("worker-s"), c.client("operator")
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	// A TTL far longer than the test's waits would allow, were Done only
	// to close when the session is lost: the keepalive (every TTL/3) must
	// be what reports the revoke.
	s, err := holder.NewSession(ctx, 6*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())

	// WithLock under the session, revoked while fn runs.
	held := make(chan uint64, 1)
	ended := make(chan error, 1)
	go func() {
		ended <- holder.WithLock(ctx, "sess/job", func(ctx context.Context, l *client.Lease) error {
			held <- l.Token()
			<-ctx.Done()
			return context.Cause(ctx)
		}, client.WithSession(s))
	}()
	token := <-held
	other, err := holder.NewMutex("sess/other", client.WithSession(s)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ops.Revoke(ctx, "sess/job", token, "stuck"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-ended:
		if !errors.Is(err, client.ErrLeaseLost) || !errors.Is(err, client.ErrLockLost) {
			t.Fatalf("WithLock ended with %v; want ErrLeaseLost and ErrLockLost", err)
		}
		var ae *client.APIError
		if !errors.As(err, &ae) || ae.FencingToken != token || !strings.Contains(ae.Message, "stuck") {
			t.Fatalf("WithLock's error %v: want lock_lost naming token %d and the reason", err, token)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the revoked holder's WithLock (under a session) was not cancelled")
	}
	// Only that grant ended: the session and its other lock live on.
	select {
	case <-s.Done():
		t.Fatalf("the session ended: %v", s.Err())
	case <-other.Done():
		t.Fatalf("the session's other lock ended: %v", other.Err())
	default:
	}
	if st := c.get("sess/other"); !st.Held || st.Holder.FencingToken != other.Token() {
		t.Fatalf("sess/other %+v, want still held with token %d", st, other.Token())
	}

	// A Semaphore's grant and an RWMutex's read grant, revoked together
	// with their lock's other holders.
	sem, err := holder.NewSemaphore("sess/pool", 2, client.WithSession(s)).Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rl, err := holder.NewRWMutex("sess/rw", client.WithSession(s)).RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ops.Revoke(ctx, "sess/pool", 0, "drain"); err != nil {
		t.Fatal(err)
	}
	if _, err := ops.Revoke(ctx, "sess/rw", 0, "drain"); err != nil {
		t.Fatal(err)
	}
	waitLost(t, "semaphore", sem.Done(), sem.Err, client.ErrLockLost)
	waitLost(t, "read lock", rl.Done(), rl.Err, client.ErrLockLost)

	// An election's seat under the session.
	lead, err := holder.NewElection("sess/leader", client.WithSession(s)).Campaign(ctx, "me")
	if err != nil {
		t.Fatal(err)
	}
	revoked, err := ops.RevokeElection(ctx, "sess/leader", lead.Token(), "failover drill")
	if err != nil || len(revoked) != 1 || revoked[0] != lead.Token() {
		t.Fatalf("RevokeElection: %v %v", revoked, err)
	}
	waitLost(t, "leadership", lead.Done(), lead.Err, client.ErrLockLost)
	h, err := ops.History(ctx, "sess/leader", client.HistoryOptions{Election: true, Limit: 1})
	if err != nil || len(h.Grants) != 1 || h.Grants[0].EndCause != "revoked" || h.Grants[0].Reason != "failover drill" {
		t.Fatalf("election history %+v %v", h, err)
	}

	// The same client id takes sess/other over under a lease of its own
	// (a restarted process): the session's grant ends with ErrNotHolder.
	again := c.client("worker-s")
	taken, err := again.NewMutex("sess/other", client.WithTakeover(), client.WithTTL(5*time.Second)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waitLost(t, "taken-over lock", other.Done(), other.Err, client.ErrNotHolder)
	if taken.Token() <= other.Token() {
		t.Fatalf("takeover token %d, want above %d", taken.Token(), other.Token())
	}
	select {
	case <-s.Done():
		t.Fatalf("the session ended: %v", s.Err())
	default:
	}
}
