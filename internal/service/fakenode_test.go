package service

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/fsm"
	"github.com/dlock/dlock/internal/raftnode"
)

// fakeNode is the service tests' one in-memory Node. It commits every write
// at once to a leader's state machine; the service reads local, which is
// the leader's too unless the node lags (newFakeNode(true)): then local
// applies the committed entries only when ship says so — a follower whose
// state trails the leader's. There is no Raft and no lease reaper, so
// nothing expires unless the test says so.
type fakeNode struct {
	leader, local *fsm.FSM

	mu      sync.Mutex
	log     [][]byte
	shipped int  // entries applied to local
	lag     bool // hold entries back from local
	// stuck makes CatchUp fail at once, as raftnode's does after
	// CatchUpTimeout, for a node that falls behind for good.
	stuck atomic.Bool
	// leaderless is what LeaderlessFor answers (a time.Duration).
	leaderless atomic.Int64
	// onExpire runs on the first ExpireWaits, which then fails without
	// applying anything, as Apply does when the request's client hangs up
	// before the command is committed.
	onExpire func()
	once     sync.Once
	// endorser, when set (endorseAsLeader), endorses every answer of a
	// lagging node as the leader does a forwarded write's.
	endorser raftnode.Endorser
}

func newFakeNode(lag bool) *fakeNode {
	n := &fakeNode{leader: fsm.New(nil), lag: lag}
	n.local = n.leader
	if lag {
		n.local = fsm.New(nil)
	}
	return n
}

func (n *fakeNode) Apply(_ context.Context, e *command.Envelope) (*fsm.Response, error) {
	if _, ok := e.Body.(*command.ExpireWaits); ok && n.onExpire != nil {
		hooked := false
		n.once.Do(func() { hooked = true; n.onExpire() })
		if hooked {
			return nil, &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Err: context.Canceled,
				Message: "the request could not be committed in time; retry shortly"}
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	data, err := command.EncodeChecked(e.Stamped(time.Now().UnixMilli()))
	if err != nil {
		return nil, err
	}
	n.log = append(n.log, data)
	index := uint64(len(n.log))
	resp := n.leader.Apply(&raft.Log{Index: index, Type: raft.LogCommand, Data: data}).(*fsm.Response)
	if !n.lag {
		n.shipped = len(n.log)
	} else if n.endorser != nil {
		resp.Endorsement = n.endorser(e, resp)
	}
	return resp, nil
}

// ship applies the held-back entries to the local state machine.
func (n *fakeNode) ship() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for ; n.shipped < len(n.log); n.shipped++ {
		n.local.Apply(&raft.Log{Index: uint64(n.shipped + 1), Type: raft.LogCommand, Data: n.log[n.shipped]})
	}
}

// CatchUp waits as long as ctx lets it (raftnode bounds it; here the test
// does, by shipping the entries or shutting the service down), or, when the
// node is stuck, fails at once.
func (n *fakeNode) CatchUp(ctx context.Context, index uint64) error {
	if n.stuck.Load() && n.local.AppliedIndex() < index {
		return &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Message: "this node has not applied it in time"}
	}
	return n.local.WaitApplied(ctx, index)
}

func (n *fakeNode) FSM() *fsm.FSM                          { return n.local }
func (n *fakeNode) LinearizableRead(context.Context) error { return nil }
func (n *fakeNode) LeaderlessFor() time.Duration           { return time.Duration(n.leaderless.Load()) }
func (n *fakeNode) LeaderContact() (bool, time.Duration) {
	if d := n.LeaderlessFor(); d > 0 {
		return false, d
	}
	return true, 0
}
func (n *fakeNode) Status() raftnode.Status { return raftnode.Status{} }
func (n *fakeNode) Ready() error            { return nil }
func (n *fakeNode) Healthy() error          { return nil }
func (n *fakeNode) ProbeMembers(context.Context, time.Duration) map[string]raftnode.MemberHealth {
	return nil
}
func (n *fakeNode) Join(context.Context, string, string) error       { return nil }
func (n *fakeNode) Remove(context.Context, string) error             { return nil }
func (n *fakeNode) TransferLeadership(context.Context, string) error { return nil }

// SetEndorser is the local service's: this node answers as a follower, whose
// endorser never runs (leaderView is the leader's side).
func (n *fakeNode) SetEndorser(raftnode.Endorser) {}

// keyedService is a service over a fakeNode whose cluster has a
// token-signing key (seed 7), as a cluster's first leader installs one.
func keyedService(t *testing.T) (*fakeNode, *Service) {
	t.Helper()
	n := newFakeNode(false)
	s := New(n, nil, nil)
	t.Cleanup(s.Close)
	if _, err := n.Apply(context.Background(), &command.Envelope{ClientID: "dlock", Body: &command.SetTokenKey{Seed: [32]byte{7}}}); err != nil {
		t.Fatal(err)
	}
	return n, s
}
