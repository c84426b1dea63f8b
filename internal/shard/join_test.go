package shard_test

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/raftnode"
	"github.com/dlock/dlock/internal/server"
	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/shard"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
)

type apiErr struct {
	Error struct{ Code, Message string } `json:"error"`
}

// memberIDs are the members a node's GET /cluster lists, with suffrage.
func memberIDs(t *testing.T, c *testcluster.Cluster, via string) (map[string]string, service.ClusterInfo) {
	t.Helper()
	var ci service.ClusterInfo
	if code := do(t, c, "GET", c.URL(via)+"/api/v1/cluster", nil, &ci); code != 200 {
		t.Fatalf("GET /cluster via %s: %d", via, code)
	}
	out := map[string]string{}
	for _, m := range ci.Members {
		out[m.ID] = m.Suffrage
	}
	return out, ci
}

// TestJoinMoveLeaveShardedCluster grows a 3-node, 4-shard cluster (every
// shard on every node) by a fourth node while clients keep locking: a node
// started with another shard map is refused and nothing changes; the new
// node joins the meta group as a voter, runs no shard, and serves every
// name by forwarding; a shard's replica moves onto it, survives its kill
// and restart, and moves back; removing it while it holds a replica is
// refused with conflict; then, leading the meta group, it is removed: the
// meta group hands leadership on, and the node stops itself.
func TestJoinMoveLeaveShardedCluster(t *testing.T) {
	c, m := shardedOf(t, 3, 4)
	initial := []string{"n1", "n2", "n3"}
	// Held across everything below, on shard 1 ([g, n)).
	var held service.AcquireResponse
	if code := post(t, c, c.URL("n1")+"/api/v1/locks/hotel/held/acquire", map[string]any{"client_id": "holder", "ttl_ms": 300000, "request_id": "h1"}, &held); code != 200 || !held.Acquired {
		t.Fatalf("acquire hotel/held: %d %+v", code, held)
	}
	urls := []string{c.URL("n1"), c.URL("n2"), c.URL("n3")}
	b := startBusy(t, c, urls, func(w int) []string {
		return []string{fmt.Sprintf("alpha/w%d", w), fmt.Sprintf("golf/w%d", w), fmt.Sprintf("november/w%d", w), fmt.Sprintf("tango/w%d", w), "golf/hot"}
	})
	_, before := memberIDs(t, c, "n2")

	// A node started with another shard map runs another meta group: its
	// join is refused, and the map and the members stay as they were.
	other, err := shard.NewMap(shard.DefaultBounds(3))
	if err != nil {
		t.Fatal(err)
	}
	badRaft := testcluster.FreePort(t)
	bad, err := server.Start(server.Config{Shards: &other, APIAddr: testcluster.FreePort(t), Join: []string{c.URL("n1")},
		Logger: slog.New(slog.DiscardHandler),
		Raft:   raftnode.Config{ID: "n9", DataDir: filepath.Join(t.TempDir(), "n9"), RaftAddr: badRaft, Engine: raftnode.EngineEtcd}})
	if err != nil {
		t.Fatal(err)
	}
	var e apiErr
	if code := post(t, c, c.URL("n2")+"/api/v1/cluster/members", map[string]any{"id": "n9", "raft_addr": badRaft}, &e); code != 400 ||
		e.Error.Code != "invalid_argument" || !strings.Contains(e.Error.Message, "--shards") || !strings.Contains(e.Error.Message, "nothing was changed") {
		t.Fatalf("join with another shard map: %d %+v", code, e)
	}
	for _, body := range []map[string]any{{"id": "n9"}, {"id": "n9", "raft_addr": "not an address"}, {"id": strings.Repeat("x", 200), "raft_addr": badRaft}} {
		if code := post(t, c, c.URL("n3")+"/api/v1/cluster/members", body, &e); code != 400 || e.Error.Code != "invalid_argument" {
			t.Fatalf("join %v: %d %+v", body, code, e)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	if err := bad.Shutdown(ctx); err != nil {
		t.Logf("stopping the refused node: %v", err)
	}
	cancel()
	members, after := memberIDs(t, c, "n1")
	if len(members) != 3 || after.ShardGeneration != before.ShardGeneration {
		t.Fatalf("after the refused join: members %v, generation %d (was %d)", members, after.ShardGeneration, before.ShardGeneration)
	}
	for _, s := range after.Shards {
		if len(s.Replicas) != 0 && !slices.Equal(s.Replicas, initial) {
			t.Fatalf("after the refused join, shard %d's replicas are %v", s.ID, s.Replicas)
		}
	}

	// The fourth node joins: every range's replica set is written out
	// first (the initial nodes), and the new node runs no shard.
	n4 := joinVoter(t, c)
	var ci service.ClusterInfo
	testutil.Eventually(t, 30*time.Second, "n4 routes by the map", func() error {
		var e apiErr
		if code := do(t, c, "GET", c.URL(n4)+"/api/v1/cluster", nil, &e); code != 200 {
			return fmt.Errorf("GET /cluster via n4: %d %+v", code, e)
		}
		_, ci = memberIDs(t, c, n4)
		return nil
	})
	if ci.ShardGeneration != before.ShardGeneration+1 {
		t.Fatalf("generation after the join %d, want %d", ci.ShardGeneration, before.ShardGeneration+1)
	}
	for _, s := range ci.Shards {
		if !slices.Equal(s.Replicas, initial) {
			t.Fatalf("after the join shard %d's replicas are %v, want %v", s.ID, s.Replicas, initial)
		}
	}
	if got := c.Server(n4).Shards(); len(got) != 0 {
		t.Fatalf("n4 runs %d shards before any move", len(got))
	}
	// n4 serves every name, forwarding to the replicas.
	for _, name := range []string{"alpha/n4", "hotel/n4", "oscar/n4", "uniform/n4"} {
		var a service.AcquireResponse
		if code := post(t, c, c.URL(n4)+"/api/v1/locks/"+name+"/acquire", map[string]any{"client_id": "via-n4", "ttl_ms": 60000, "request_id": "n4-" + name}, &a); code != 200 || !a.Acquired {
			t.Fatalf("acquire %s via n4: %d %+v", name, code, a)
		}
		var rel service.ReleaseResponse
		if code := post(t, c, c.URL(n4)+"/api/v1/locks/"+name+"/release", map[string]any{"client_id": "via-n4", "fencing_token": a.FencingToken, "lease_id": a.LeaseID}, &rel); code != 200 {
			t.Fatalf("release %s via n4: %d", name, code)
		}
	}
	var list service.ListResponse
	if code := do(t, c, "GET", c.URL(n4)+"/api/v1/locks?prefix=hotel/", nil, &list); code != 200 || len(list.Locks) != 1 {
		t.Fatalf("list via n4: %d %+v", code, list)
	}
	b.waitRounds("the clients go on after the join", b.rounds.Load()+40)

	// Shard 1's replica on n1 moves to n4.
	var mi service.ClusterInfo
	if code := post(t, c, c.URL(n4)+"/api/v1/cluster/shards/move", map[string]any{"shard": 1, "from": "n1", "to": n4}, &mi); code != 200 {
		t.Fatalf("move shard 1 n1 → n4: %d %+v", code, mi)
	}
	if s := mi.Shards[1]; !slices.Equal(s.Replicas, []string{"n2", "n3", n4}) || s.Leaving != "" {
		t.Fatalf("after the move shard 1 is %+v", s)
	}
	g := m.Groups[1]
	testutil.Eventually(t, 30*time.Second, "n1 stopped shard 1 and deleted its data", func() error {
		if c.Server("n1").ShardGroup(1) != nil {
			return fmt.Errorf("n1 still runs shard 1")
		}
		if ok, err := c.Server("n1").GroupStored(g); err != nil || ok {
			return fmt.Errorf("n1 still stores group %d (%v)", g, err)
		}
		return nil
	})
	checkHeldVia := func(what string, ids ...string) {
		t.Helper()
		for _, id := range ids {
			var v service.LockView
			if code := do(t, c, "GET", c.URL(id)+"/api/v1/locks/hotel/held", nil, &v); code != 200 || !v.Held || v.Holder.FencingToken != held.FencingToken {
				t.Fatalf("%s: hotel/held via %s: %d %+v, want held with token %d", what, id, code, v, held.FencingToken)
			}
		}
	}
	checkHeldVia("after the move", "n1", "n2", "n3", n4)
	b.waitRounds("the clients go on after the move", b.rounds.Load()+40)

	// Removing n4 while it holds a replica is refused; nothing changes.
	_, pre := memberIDs(t, c, "n1")
	e = apiErr{}
	if code := do(t, c, "DELETE", c.URL("n2")+"/api/v1/cluster/members/"+n4, nil, &e); code != 409 || e.Error.Code != "conflict" ||
		!strings.Contains(e.Error.Message, "dlock shards move --shard 1 --from "+n4) {
		t.Fatalf("remove n4 holding shard 1: %d %+v", code, e)
	}
	// So is removing an initial node, which holds the other shards.
	if code := do(t, c, "DELETE", c.URL(n4)+"/api/v1/cluster/members/n1", nil, &e); code != 409 || e.Error.Code != "conflict" || !strings.Contains(e.Error.Message, "[0 2 3]") {
		t.Fatalf("remove n1 holding shards: %d %+v", code, e)
	}
	if code := do(t, c, "DELETE", c.URL("n2")+"/api/v1/cluster/members/n8", nil, &e); code != 404 || e.Error.Code != "not_found" {
		t.Fatalf("remove a node that is no member: %d %+v", code, e)
	}
	if ms, ci := memberIDs(t, c, "n3"); len(ms) != 4 || ci.ShardGeneration != pre.ShardGeneration {
		t.Fatalf("after the refused removals: members %v, generation %d (was %d)", ms, ci.ShardGeneration, pre.ShardGeneration)
	}

	// n4 dies and comes back with its replica.
	c.Kill(n4)
	b.waitRounds("the clients go on with n4 down", b.rounds.Load()+20)
	c.Start(n4)
	testutil.Eventually(t, 60*time.Second, "n4 runs shard 1 again, caught up", func() error {
		grp := c.Server(n4).ShardGroup(1)
		if grp == nil {
			return fmt.Errorf("n4 does not run shard 1")
		}
		var v service.LockView
		if code := do(t, c, "GET", c.URL(n4)+"/api/v1/locks/hotel/held?stale=true", nil, &v); code != 200 || !v.Held || v.Holder.FencingToken != held.FencingToken {
			return fmt.Errorf("hotel/held in n4's own state: %d %+v", code, v)
		}
		return nil
	})

	// Back to n1.
	if code := post(t, c, c.URL("n2")+"/api/v1/cluster/shards/move", map[string]any{"shard": 1, "from": n4, "to": "n1"}, &mi); code != 200 {
		t.Fatalf("move shard 1 n4 → n1: %d %+v", code, mi)
	}
	testutil.Eventually(t, 30*time.Second, "n4 stopped shard 1 and deleted its data", func() error {
		if c.Server(n4).ShardGroup(1) != nil {
			return fmt.Errorf("n4 still runs shard 1")
		}
		if ok, err := c.Server(n4).GroupStored(g); err != nil || ok {
			return fmt.Errorf("n4 still stores group %d (%v)", g, err)
		}
		return nil
	})
	checkHeldVia("after the move back", "n1", "n2", "n3", n4)

	// n4 leads the meta group, then is removed: leadership moves on
	// first, and n4 stops itself.
	meta4 := c.Server(n4).MembersNode()
	testutil.Eventually(t, 30*time.Second, "n4 leads the meta group", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := meta4.TransferLeadership(ctx, n4); err != nil {
			return err
		}
		if !meta4.IsLeader() {
			return fmt.Errorf("n4 does not lead the meta group yet")
		}
		return nil
	})
	var out service.ClusterInfo
	if code := do(t, c, "DELETE", c.URL("n3")+"/api/v1/cluster/members/"+n4, nil, &out); code != 200 {
		t.Fatalf("remove n4: %d %+v", code, out)
	}
	// Once its removal is answered, no node takes n4 for a move's target,
	// however far behind the meta group the node asked is: each reads the
	// members linearizably first.
	for _, id := range initial {
		var e apiErr
		if code := post(t, c, c.URL(id)+"/api/v1/cluster/shards/move", map[string]any{"shard": 2, "from": "n1", "to": n4}, &e); code != 400 || !strings.Contains(e.Error.Message, "no node") {
			t.Fatalf("move shard 2 onto the removed n4 via %s: %d %+v", id, code, e)
		}
	}
	testutil.Eventually(t, 30*time.Second, "n4 is no member", func() error {
		for _, id := range initial {
			if ms, _ := memberIDs(t, c, id); len(ms) != 3 {
				return fmt.Errorf("members via %s: %v", id, ms)
			}
		}
		return nil
	})
	select {
	case <-c.Server(n4).Stopped():
	case <-time.After(30 * time.Second):
		t.Fatal("n4 did not stop itself after its removal")
	}
	c.Kill(n4)
	// A joined node's data dir refuses --initial-cluster: it would count
	// itself among the initial nodes.
	if s, err := server.Start(server.Config{Shards: &m, APIAddr: testcluster.FreePort(t), Logger: slog.New(slog.DiscardHandler),
		Raft: raftnode.Config{ID: n4, DataDir: c.DataDir(n4), RaftAddr: c.RaftAddr(n4), Engine: raftnode.EngineEtcd,
			InitialCluster: map[string]string{"n1": c.RaftAddr("n1"), "n2": c.RaftAddr("n2"), "n3": c.RaftAddr("n3"), n4: c.RaftAddr(n4)}}}); err == nil ||
		!strings.Contains(err.Error(), "joined a running sharded cluster") {
		if s != nil {
			s.Kill()
		}
		t.Fatalf("restart of a joined node with --initial-cluster: %v", err)
	}
	testutil.Eventually(t, 30*time.Second, "a meta leader among the initial nodes", func() error {
		for _, id := range initial {
			if c.Server(id).MembersNode().IsLeader() {
				return nil
			}
		}
		return fmt.Errorf("no meta leader")
	})
	b.waitRounds("the clients go on after the removal", b.rounds.Load()+40)
	checkHeldVia("after the removal", initial...)
	b.checkRising()

	// An initial node restarted with an --initial-cluster that lists n4
	// too (a config rendered from the grown cluster) starts, and goes on
	// by the initial nodes it first started with.
	c.Kill("n1")
	c.Tune = func(rc *raftnode.Config) {
		if rc.ID == "n1" {
			rc.InitialCluster[n4] = c.RaftAddr(n4)
		}
	}
	c.Start("n1")
	c.Tune = nil
	testutil.Eventually(t, 30*time.Second, "n1 serves again", func() error {
		var v service.LockView
		if code := do(t, c, "GET", c.URL("n1")+"/api/v1/locks/hotel/held", nil, &v); code != 200 || !v.Held || v.Holder.FencingToken != held.FencingToken {
			return fmt.Errorf("hotel/held via n1: %d %+v", code, v)
		}
		return nil
	})
	t.Logf("joined, moved onto, restarted, moved off and removed n4; %d rounds; %d 503s retried", b.rounds.Load(), retried503.Load())
}
