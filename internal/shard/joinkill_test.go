package shard_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/testutil"
)

// TestJoinedReplicaKilled kills a joined node holding one of a shard's
// three replicas — as a follower, as the shard's leader, and while it is
// still a non-voter catching up in a move — and checks that calls on the
// shard's names keep being answered through every other node: the one
// that runs no replica of the shard (it forwards), and the two that do (a
// majority of the shard's voters, which elect a leader when needed).
func TestJoinedReplicaKilled(t *testing.T) {
	c, _ := shardedOf(t, 3, 4)
	n4 := joinVoter(t, c)
	var mi service.ClusterInfo
	if code := post(t, c, c.URL(n4)+"/api/v1/cluster/shards/move", map[string]any{"shard": 1, "from": "n1", "to": n4}, &mi); code != 200 {
		t.Fatalf("move shard 1 n1 → n4: %d %+v", code, mi)
	}
	testutil.Eventually(t, 30*time.Second, "n1 stopped shard 1", func() error {
		if c.Server("n1").ShardGroup(1) != nil {
			return fmt.Errorf("n1 still runs shard 1")
		}
		return nil
	})

	round := 0
	// callsVia locks and releases a name of shard 1 ([g, n)) through each
	// of the initial nodes; post resends 503s for at most 45 s.
	callsVia := func(what string) {
		t.Helper()
		round++
		for _, id := range []string{"n1", "n2", "n3"} {
			name := fmt.Sprintf("hotel/%s", id)
			start := time.Now()
			var a service.AcquireResponse
			if code := post(t, c, c.URL(id)+"/api/v1/locks/"+name+"/acquire", map[string]any{"client_id": "k", "ttl_ms": 60000,
				"wait_timeout_ms": 10000, "request_id": fmt.Sprintf("k-%s-%d", id, round)}, &a); code != 200 || !a.Acquired {
				t.Fatalf("%s: acquire %s via %s: %d %+v after %v", what, name, id, code, a, time.Since(start))
			}
			var rel service.ReleaseResponse
			if code := post(t, c, c.URL(id)+"/api/v1/locks/"+name+"/release", map[string]any{"client_id": "k",
				"fencing_token": a.FencingToken, "lease_id": a.LeaseID}, &rel); code != 200 {
				t.Fatalf("%s: release %s via %s: %d", what, name, id, code)
			}
			t.Logf("%s: lock and release of %s via %s took %v", what, name, id, time.Since(start))
		}
	}
	caughtUp := func() {
		t.Helper()
		testutil.Eventually(t, 60*time.Second, "n4 runs shard 1 again, a voter", func() error {
			grp := c.Server(n4).ShardGroup(1)
			if grp == nil {
				return fmt.Errorf("n4 does not run shard 1")
			}
			for _, s := range grp.Status().Servers {
				if s.ID == n4 && s.Suffrage == "voter" {
					return nil
				}
			}
			return fmt.Errorf("n4 is not a voter of shard 1: %+v", grp.Status().Servers)
		})
	}
	callsVia("after the move")

	// n4 a follower of shard 1.
	c.Kill(n4)
	callsVia("n4 (a follower) down")
	c.Start(n4)
	caughtUp()
	callsVia("n4 back")

	// n4 the leader of shard 1. Its balancer hands the shard on to the
	// preferred voter within a second or so: kill it as soon as it leads.
	led := false
	testutil.Eventually(t, 60*time.Second, "n4 leads shard 1, then is killed", func() error {
		grp := c.Server(n4).ShardGroup(1)
		if grp == nil {
			return fmt.Errorf("n4 does not run shard 1")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := grp.TransferLeadership(ctx, n4); err != nil {
			return err
		}
		if !grp.IsLeader() {
			return fmt.Errorf("n4 does not lead shard 1")
		}
		c.Kill(n4)
		led = true
		return nil
	})
	if !led {
		t.Fatal("n4 never led shard 1")
	}
	callsVia("n4 (the leader) down")
	c.Start(n4)
	caughtUp()

	// n4 a non-voter catching up: move shard 1's replica on n4 to n1 and
	// back, killing n4 as soon as it is added again.
	if code := post(t, c, c.URL("n2")+"/api/v1/cluster/shards/move", map[string]any{"shard": 1, "from": n4, "to": "n1"}, &mi); code != 200 {
		t.Fatalf("move shard 1 n4 → n1: %d %+v", code, mi)
	}
	testutil.Eventually(t, 30*time.Second, "n4 stopped shard 1", func() error {
		if c.Server(n4).ShardGroup(1) != nil {
			return fmt.Errorf("n4 still runs shard 1")
		}
		return nil
	})
	done := make(chan int, 1)
	go func() {
		var mi service.ClusterInfo
		ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
		defer cancel()
		code, _ := c.Do(ctx, "POST", c.URL("n3")+"/api/v1/cluster/shards/move", map[string]any{"shard": 1, "from": "n1", "to": n4}, &mi)
		done <- code
	}()
	testutil.Eventually(t, 60*time.Second, "n4 added to shard 1, then killed", func() error {
		for _, id := range []string{"n2", "n3"} {
			grp := c.Server(id).ShardGroup(1)
			if grp == nil {
				continue
			}
			for _, s := range grp.Status().Servers {
				if s.ID == n4 {
					c.Kill(n4)
					t.Logf("killed n4 as a %s of shard 1 (as %s sees it)", s.Suffrage, id)
					return nil
				}
			}
		}
		return fmt.Errorf("n4 is not in shard 1 yet")
	})
	callsVia("n4 (joining shard 1) down")
	c.Start(n4)
	select {
	case code := <-done:
		if code != 200 {
			t.Fatalf("move shard 1 n1 → n4 with n4 killed and restarted: %d", code)
		}
	case <-time.After(160 * time.Second):
		t.Fatal("the move did not answer")
	}
	caughtUp()
	callsVia("after the second move")
	// The node that answered the move shows it done at once; another
	// node's map is its own replica of the meta group's, which catches up.
	want := []string{"n2", "n3", n4}
	var ci service.ClusterInfo
	if code := do(t, c, "GET", c.URL("n3")+"/api/v1/cluster", nil, &ci); code != 200 || !slices.Equal(ci.Shards[1].Replicas, want) || ci.Shards[1].Leaving != "" {
		t.Fatalf("shard 1 after the second move, as the node that answered it sees it: %d %+v", code, ci.Shards[1])
	}
	testutil.Eventually(t, 10*time.Second, "n2's map never showed the second move done", func() error {
		var ci service.ClusterInfo
		if code := do(t, c, "GET", c.URL("n2")+"/api/v1/cluster", nil, &ci); code != 200 || !slices.Equal(ci.Shards[1].Replicas, want) || ci.Shards[1].Leaving != "" {
			return fmt.Errorf("%d %+v", code, ci.Shards[1])
		}
		return nil
	})
}
