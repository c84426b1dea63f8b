package server_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dlock/dlock/internal/server"
	"github.com/dlock/dlock/internal/shard"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
)

// TestStaleMoveStepKeepsTheShardAvailable grows a 3-node, 4-shard cluster
// by a joined n4, moves shard 1's replica from n1 to n4 and, while n1's
// old copy still runs (its stop is held), has the shard's leader run a
// step of the move with the map from before the move ended — as a
// reconcile round that read that map just before the end does. The step
// must not add n1 back: a re-added n1 would be promoted (its old copy has
// the whole log), then stop and delete its data, leaving the shard four
// voters of which n2 and n3 are no majority once n4 dies. So n4 is then
// killed, and calls on shard 1's names must still be answered through
// every other node.
func TestStaleMoveStepKeepsTheShardAvailable(t *testing.T) {
	c, g, n4 := joinedCluster(t)
	var mid shard.Map
	testutil.Eventually(t, 30*time.Second, "the move's first map", func() error {
		var err error
		mid, err = server.InFlightMap(c.Server("n2"), 1, "n1", n4)
		return err
	})

	reached, free := holdStop(t, "n1", g)
	var out map[string]any
	if code := doRetried(t, c, http.MethodPost, c.URL("n2")+"/api/v1/cluster/shards/move", map[string]any{"shard": 1, "from": "n1", "to": n4}, &out); code != 200 {
		t.Fatalf("move shard 1 n1 → %s: %d %v", n4, code, out)
	}
	select {
	case <-reached:
	case <-time.After(60 * time.Second):
		t.Fatal("n1 never began to stop shard 1's group")
	}

	staleStep(t, c, g, mid, "n1", []string{"n2", "n3", n4})
	free()
	testutil.Eventually(t, 60*time.Second, "n1 stopped shard 1", func() error {
		if groupNode(c.Server("n1"), g) != nil {
			return fmt.Errorf("n1 still runs shard 1")
		}
		return nil
	})

	// n4 dies: n2 and n3 must be a majority of shard 1's voters, and every
	// node answers calls on its names (n1 by forwarding).
	c.Kill(n4)
	lockVia(t, c, n4+" down", "n1", "n2", "n3")
}

// staleStep runs a step of shard 1's move with map stale on the leader of
// group g (among replicas), waits until no member waits for promotion,
// and checks the step did not make gone a member again.
func staleStep(t *testing.T, c *testcluster.Cluster, g uint64, stale shard.Map, gone string, replicas []string) {
	t.Helper()
	testutil.Eventually(t, 60*time.Second, "a step of the move with an older map ran on the shard's leader", func() error {
		for _, id := range replicas {
			if n := groupNode(c.Server(id), g); n != nil && n.IsLeader() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				err := server.MoveStep(ctx, c.Server(id), stale, 1)
				cancel()
				t.Logf("the stale step on %s: %v", id, err)
				return nil
			}
		}
		return fmt.Errorf("no leader of shard 1")
	})
	// A member added as a non-voter is promoted once caught up, which the
	// old copy is: wait until nothing waits for promotion.
	var members []raft.Server
	testutil.Eventually(t, 60*time.Second, "shard 1 has no non-voter", func() error {
		for _, id := range replicas {
			if n := groupNode(c.Server(id), g); n != nil && n.IsLeader() {
				f := n.Raft().GetConfiguration()
				if err := f.Error(); err != nil {
					return err
				}
				members = f.Configuration().Servers
				for _, s := range members {
					if s.Suffrage != raft.Voter {
						return fmt.Errorf("shard 1's members: %+v", members)
					}
				}
				return nil
			}
		}
		return fmt.Errorf("no leader of shard 1")
	})
	for _, s := range members {
		if string(s.ID) == gone {
			t.Errorf("the stale step added %s back to shard 1: members %+v", gone, members)
		}
	}
}

// lockVia locks and releases a name of shard 1 through each of nodes.
func lockVia(t *testing.T, c *testcluster.Cluster, what string, nodes ...string) {
	t.Helper()
	for _, id := range nodes {
		name := "hotel/via-" + id
		var a acquireAnswer
		if code := doRetried(t, c, http.MethodPost, c.URL(id)+"/api/v1/locks/"+name+"/acquire",
			map[string]any{"client_id": "k", "ttl_ms": 60000, "request_id": strings.ReplaceAll(what, " ", "-") + "-" + id}, &a); code != 200 || !a.Acquired {
			t.Fatalf("%s: acquire %s via %s: %d %+v", what, name, id, code, a)
		}
		if code := release(t, c, id, name, "k", a); code != 200 {
			t.Fatalf("%s: release %s via %s: %d", what, name, id, code)
		}
	}
}

// joinedCluster is a 3-node, 4-shard cluster grown by a joined node (its
// id returned), every range's replicas written out; g is shard 1's group.
func joinedCluster(t *testing.T) (*testcluster.Cluster, uint64, string) {
	t.Helper()
	m, err := shard.NewMap(shard.DefaultBounds(4))
	if err != nil {
		t.Fatal(err)
	}
	c := testcluster.NewWith(t, 3, testcluster.Options{Shards: &m})
	n4 := c.Join()
	testutil.Eventually(t, 60*time.Second, "n4 is a voter of the meta group with every replica set written out", func() error {
		mm := c.Server("n2").ShardMap()
		if len(mm.Replicas) == 0 || len(mm.Replicas[1]) != 3 {
			return fmt.Errorf("map %+v", mm)
		}
		for _, s := range c.Server("n2").MembersNode().Status().Servers {
			if s.ID == n4 && s.Suffrage == "voter" {
				return nil
			}
		}
		return fmt.Errorf("n4 is not a voter of the meta group yet")
	})
	return c, m.Groups[1], n4
}

// holdStop holds node's stop of group g (a move took it off the node)
// until free is called: its old copy still runs and answers the group.
// reached is signalled when the stop is held.
func holdStop(t *testing.T, node string, g uint64) (<-chan struct{}, func()) {
	reached := make(chan struct{}, 1)
	released := make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(released) }) }
	server.SetStopHook(func(n string, grp uint64) {
		if n != node || grp != g {
			return
		}
		select {
		case reached <- struct{}{}:
		default:
		}
		select {
		case <-released:
		case <-time.After(3 * time.Minute):
		}
	})
	t.Cleanup(func() { server.SetStopHook(nil); free() })
	return reached, free
}

// TestMoveStepWithAnEarlierMovesMap runs a step with the map of a move
// that ended before the current one: shard 1 moved from n1 to n4 and back,
// and while n4's old copy still runs, the shard's leader runs a step with
// the first move's map (n4 its target). It must not add n4 back: promoted,
// then gone, it would leave n2 and n3 no majority once n1 dies.
func TestMoveStepWithAnEarlierMovesMap(t *testing.T) {
	c, g, n4 := joinedCluster(t)
	var first shard.Map
	testutil.Eventually(t, 30*time.Second, "the first move's map", func() error {
		var err error
		first, err = server.InFlightMap(c.Server("n2"), 1, "n1", n4)
		return err
	})
	move := func(from, to string) {
		t.Helper()
		var out map[string]any
		if code := doRetried(t, c, http.MethodPost, c.URL("n2")+"/api/v1/cluster/shards/move", map[string]any{"shard": 1, "from": from, "to": to}, &out); code != 200 {
			t.Fatalf("move shard 1 %s → %s: %d %v", from, to, code, out)
		}
	}
	move("n1", n4)
	testutil.Eventually(t, 60*time.Second, "n1 stopped shard 1", func() error {
		if groupNode(c.Server("n1"), g) != nil {
			return fmt.Errorf("n1 still runs shard 1")
		}
		return nil
	})
	reached, free := holdStop(t, n4, g)
	move(n4, "n1")
	select {
	case <-reached:
	case <-time.After(60 * time.Second):
		t.Fatal("n4 never began to stop shard 1's group")
	}
	staleStep(t, c, g, first, n4, []string{"n1", "n2", "n3"})
	free()
	testutil.Eventually(t, 60*time.Second, "n4 stopped shard 1", func() error {
		if groupNode(c.Server(n4), g) != nil {
			return fmt.Errorf("n4 still runs shard 1")
		}
		return nil
	})
	c.Kill("n1")
	lockVia(t, c, "n1 down", n4, "n2", "n3")
}
