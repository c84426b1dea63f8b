package raftnode

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/fsm"
	"github.com/dlock/dlock/internal/loopback"
	"github.com/dlock/dlock/internal/testutil"
)

// freeRaftAddr is a loopback address that nothing listens on right now and
// that no other node of this test process was given.
// testEngine is the engine the package's clusters run on:
// DLOCK_TEST_RAFT_ENGINE (hashicorp or etcd), default hashicorp.
func testEngine() EngineKind {
	k, err := ParseEngine(os.Getenv("DLOCK_TEST_RAFT_ENGINE"))
	if err != nil {
		panic(err)
	}
	return k
}

func freeRaftAddr(t testing.TB) string {
	t.Helper()
	addr, err := loopback.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// openTestCluster starts one node per id (a one-node cluster for one id),
// each with observers from obs (nil for none) and the given ApplyTimeout (0
// for the default), and waits for a ready leader, whose id it returns.
func openTestCluster(t *testing.T, ids []string, applyTimeout time.Duration, obs func(id string) []fsm.Observer) (map[string]*Node, string) {
	t.Helper()
	return openTestClusterWith(t, ids, func(cfg *Config) {
		cfg.ApplyTimeout = applyTimeout
		if obs != nil {
			cfg.Observers = obs(cfg.ID)
		}
	})
}

// openTestClusterWith is openTestCluster with each node's Config adjusted by
// set before it opens.
func openTestClusterWith(t testing.TB, ids []string, set func(*Config)) (map[string]*Node, string) {
	t.Helper()
	addrs := map[string]string{}
	for _, id := range ids {
		addrs[id] = freeRaftAddr(t)
	}
	nodes := map[string]*Node{}
	for _, id := range ids {
		cfg := Config{ID: id, DataDir: t.TempDir(), RaftAddr: addrs[id], InitialCluster: addrs,
			RaftLogLevel: "off", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
		cfg.Engine = testEngine()
		set(&cfg)
		n, err := Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		nodes[id] = n
		t.Cleanup(func() { _ = n.Shutdown() })
	}
	var leader string
	testutil.Eventually(t, 10*time.Second, "a ready leader", func() bool {
		for id, n := range nodes {
			if n.IsLeader() {
				leader = id
				return true
			}
		}
		return false
	})
	return nodes, leader
}

// openSingleNode opens a one-node cluster and waits until it is the ready leader.
func openSingleNode(t *testing.T) *Node {
	t.Helper()
	nodes, id := openTestCluster(t, []string{"n1"}, 0, nil)
	return nodes[id]
}

// hookCtx is a context whose at-th Err() call runs hook (after computing its
// answer). It places an event exactly between two of becomeReady's checks.
type hookCtx struct {
	context.Context
	mu    sync.Mutex
	calls int
	at    int
	hook  func()
}

func (c *hookCtx) Err() error {
	c.mu.Lock()
	c.calls++
	fire := c.calls == c.at
	c.mu.Unlock()
	err := c.Context.Err()
	if fire {
		c.hook()
	}
	return err
}

// becomeReady checks its term and leadership after the barrier, then promotes
// the reaper and opens the node. A demotion by followLeadership right after
// that check (the term ends, ready=false, reaper demoted) must stick: were it
// undone, the node would be ready with an active reaper while not leading,
// and when it led again it would serve reads and proposals before its barrier.
func TestBecomeReadyDoesNotUndoConcurrentDemotion(t *testing.T) {
	n := openSingleNode(t)
	base, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Err() call 1 is the loop condition, call 2 the check after the
	// barrier: demote just after it, as followLeadership does.
	ctx := &hookCtx{Context: base, at: 2, hook: func() { n.demote(cancel) }}
	n.becomeReady(ctx)
	if base.Err() == nil {
		t.Fatal("the demotion hook did not run")
	}
	if n.ready.Load() || n.reaper.Active() {
		t.Fatalf("after the term ended and the node was demoted, becomeReady left ready=%v, reaper active=%v",
			n.ready.Load(), n.reaper.Active())
	}
}

// A becomeReady whose term is still live does promote.
func TestBecomeReadyPromotesWhileTermIsLive(t *testing.T) {
	n := openSingleNode(t)
	n.demote(nil)
	if n.ready.Load() || n.reaper.Active() {
		t.Fatal("demote left the node ready")
	}
	n.becomeReady(context.Background())
	if !n.ready.Load() || !n.reaper.Active() {
		t.Fatalf("becomeReady in a live term left ready=%v, reaper active=%v", n.ready.Load(), n.reaper.Active())
	}
}

// LeaderlessFor is 0 on a node that knows a leader, and grows on one left
// alone when the other two stop; once it reaches NoLeaderWait, writes and
// linearizable reads there are answered no_leader at once instead of holding
// the request until its deadline.
func TestLeaderlessFor(t *testing.T) {
	nodes, leader := openTestCluster(t, []string{"n1", "n2", "n3"}, 0, nil)
	follower := followerKnowingLeader(t, nodes, leader)
	// Within a tick of knowing the leader, both say 0.
	testutil.Eventually(t, 5*time.Second, "leaderless for 0 on both with a leader known", func() (bool, string) {
		l, f := nodes[leader].LeaderlessFor(), nodes[follower].LeaderlessFor()
		return l == 0 && f == 0, fmt.Sprintf("leader %v, follower %v", l, f)
	})
	for id, n := range nodes {
		if id != follower {
			if err := n.Shutdown(); err != nil {
				t.Fatal(err)
			}
		}
	}
	testutil.Eventually(t, 20*time.Second, "the last node leaderless for NoLeaderWait", func() (bool, string) {
		d := nodes[follower].LeaderlessFor()
		return d >= NoLeaderWait, fmt.Sprint("leaderless for ", d)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // hang guard only
	defer cancel()
	_, err := nodes[follower].Apply(ctx, registerMemberEnvelope("alone-1"))
	if c := apierror.CodeOf(err); c != apierror.NoLeader || ctx.Err() != nil {
		t.Fatalf("a write on a node without a leader: %v (code %s); want no_leader before the deadline", err, c)
	}
	if err := nodes[follower].LinearizableRead(ctx); apierror.CodeOf(err) != apierror.NoLeader || ctx.Err() != nil {
		t.Fatalf("a read on a node without a leader: %v; want no_leader before the deadline", err)
	}
}
