package service

import (
	"context"
	"testing"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/state"
)

// heldByHolder is a service over a fakeNode with "job" held by "holder".
func heldByHolder(t *testing.T) (*fakeNode, *Service, *AcquireResponse) {
	t.Helper()
	node, s := watchedService(t)
	held, err := s.Acquire(context.Background(), AcquireRequest{Name: "job", ClientID: "holder", TTLms: 30_000})
	if err != nil || !held.Acquired {
		t.Fatalf("holder's acquire: %+v, %v", held, err)
	}
	return node, s, held
}

// A queued acquire without a request_id whose wait times out just as its
// client hangs up: committing the expiry fails, and the grant that raced in
// just before (the holder released) must not be left behind for a client that
// never hears of it — it is released, as for any cancelled acquire.
func TestAwaitTimeoutWithClientGoneLeavesNoGrantBehind(t *testing.T) {
	node, s, held := heldByHolder(t)
	ctx := context.Background()
	reqCtx, hangUp := context.WithCancel(ctx)
	defer hangUp()
	node.onExpire = func() {
		// The holder lets go and the lock goes to the queued waiter, just
		// as the wait times out; then the waiter's client hangs up.
		if _, err := s.Release(ctx, ReleaseRequest{Name: "job", ClientID: "holder", FencingToken: held.FencingToken, LeaseID: held.LeaseID}); err != nil {
			t.Errorf("holder's release: %v", err)
		}
		hangUp()
	}
	key, err := command.NormalizeName("job")
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.Acquire(reqCtx, AcquireRequest{Name: "job", ClientID: "waiter", TTLms: 30_000, WaitTimeoutMs: 50})
	if err == nil {
		t.Fatalf("the waiter's acquire succeeded (%+v) though committing its expiry failed", res)
	}
	var li state.LockInfo
	node.local.Read(func(st *state.State) { li = st.GetLock(key) })
	if li.Held {
		t.Fatalf("acquire failed (%v), yet the lock is left held by %q (token %d) for it", err, li.Holder.ClientID, li.Holder.Token)
	}
}

// The same race with a client still there: it is told why the expiry could
// not be committed (the commit's own code), and nothing is left behind either.
func TestAwaitTimeoutCommitFailureKeepsItsCode(t *testing.T) {
	node, s, held := heldByHolder(t)
	ctx := context.Background()
	node.onExpire = func() {
		if _, err := s.Release(ctx, ReleaseRequest{Name: "job", ClientID: "holder", FencingToken: held.FencingToken, LeaseID: held.LeaseID}); err != nil {
			t.Errorf("holder's release: %v", err)
		}
	}
	_, err := s.Acquire(ctx, AcquireRequest{Name: "job", ClientID: "waiter", TTLms: 30_000, WaitTimeoutMs: 50})
	ae := apierror.From(err)
	if ae.Code != apierror.Unavailable || ae.RetryAfter <= 0 {
		t.Fatalf("acquire whose expiry could not be committed: %v; want the commit's unavailable with Retry-After", err)
	}
	key, _ := command.NormalizeName("job")
	var li state.LockInfo
	node.local.Read(func(st *state.State) { li = st.GetLock(key) })
	if li.Held {
		t.Fatalf("the lock is left held by %q for an acquire that was answered unavailable", li.Holder.ClientID)
	}
}
