package service

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/fsm"
	"github.com/dlock/dlock/internal/raftnode"
	"github.com/dlock/dlock/internal/state"
)

// memNode applies every command straight to a local FSM, as a one-node
// cluster would, but without Raft and without a lease reaper, so nothing
// expires unless the test says so. Its first ExpireWaits runs onExpire and
// then fails without applying anything, as Apply does when the request's
// client hangs up before the command is committed.
type memNode struct {
	f        *fsm.FSM
	mu       sync.Mutex
	index    uint64
	once     sync.Once
	onExpire func()
	// leaderless is what LeaderlessFor answers (a time.Duration).
	leaderless atomic.Int64
}

func newMemNode() *memNode {
	return &memNode{f: fsm.New(slog.New(slog.NewTextHandler(io.Discard, nil)))}
}

func (n *memNode) Apply(ctx context.Context, e *command.Envelope) (*fsm.Response, error) {
	if _, ok := e.Body.(*command.ExpireWaits); ok && n.onExpire != nil {
		hooked := false
		n.once.Do(func() { hooked = true; n.onExpire() })
		if hooked {
			return nil, &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Err: context.Canceled,
				Message: "the request could not be committed in time; retry shortly"}
		}
	}
	data, err := command.EncodeChecked(e.Stamped(time.Now().UnixMilli()))
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.index++
	return n.f.Apply(&raft.Log{Index: n.index, Type: raft.LogCommand, Data: data}).(*fsm.Response), nil
}

func (n *memNode) LinearizableRead(context.Context) error { return nil }
func (n *memNode) LeaderlessFor() time.Duration           { return time.Duration(n.leaderless.Load()) }
func (n *memNode) LeaderContact() (bool, time.Duration) {
	if d := n.LeaderlessFor(); d > 0 {
		return false, d
	}
	return true, 0
}
func (n *memNode) CatchUp(ctx context.Context, index uint64) error {
	return n.f.WaitApplied(ctx, index)
}
func (n *memNode) FSM() *fsm.FSM           { return n.f }
func (n *memNode) Status() raftnode.Status { return raftnode.Status{} }
func (n *memNode) Ready() error            { return nil }
func (n *memNode) Healthy() error          { return nil }
func (n *memNode) ProbeMembers(context.Context, time.Duration) map[string]raftnode.MemberHealth {
	return nil
}
func (n *memNode) Join(context.Context, string, string) error       { return nil }
func (n *memNode) Remove(context.Context, string) error             { return nil }
func (n *memNode) TransferLeadership(context.Context, string) error { return nil }
func (n *memNode) SetEndorser(raftnode.Endorser)                    {}

// heldByHolder is a service over a memNode with "job" held by "holder".
func heldByHolder(t *testing.T) (*memNode, *Service, *AcquireResponse) {
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
	node.f.Read(func(st *state.State) { li = st.GetLock(key) })
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
	node.f.Read(func(st *state.State) { li = st.GetLock(key) })
	if li.Held {
		t.Fatalf("the lock is left held by %q for an acquire that was answered unavailable", li.Holder.ClientID)
	}
}
