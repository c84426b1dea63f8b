package e2e

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/testutil"
)

// TestJoinLeaveShardedProcess is the operator story of growing and
// shrinking a sharded cluster of real processes: 3 nodes, 4 shards on
// every node, clients locking through every node. A fourth process joins
// with the cluster's --shards and --join, becomes a voter of the meta
// group and runs no shard; `dlock shards move` puts shard 2's replica on
// it; it is killed -9 and restarted (without --join) and still holds the
// replica, and so is an initial node (without --initial-cluster); `dlock members remove` is refused while it does, naming the
// move to run; the replica moves back, the removal succeeds, and the
// removed process exits by itself, 0. No client sees an error beyond
// retried 503s, and tokens per name rise.
func TestJoinLeaveShardedProcess(t *testing.T) {
	c := startClusterWith(t, 3, "--shards", "4", "--raft-engine", "etcd")
	shardsOK := func(via string, ok func(shardReplicas) bool) shardReplicas {
		t.Helper()
		var got shardReplicas
		testutil.Eventually(t, 60*time.Second*slow, "the shards via "+via, func() (bool, string) {
			ci, err := clusterShards(t, c.url(via))
			if err != nil || len(ci.Shards) != 4 {
				return false, fmt.Sprint(ci, err)
			}
			for _, s := range ci.Shards {
				if s.LeaderID == "" {
					return false, fmt.Sprint(ci)
				}
			}
			got = ci
			return ok(ci), fmt.Sprint(ci)
		})
		return got
	}
	shardsOK("n1", func(shardReplicas) bool { return true })
	var urls []string
	for _, id := range c.ids() {
		urls = append(urls, c.url(id))
	}
	held := checkGrant(t, "acquire november/held", mustCall(t, http.MethodPost, c.url("n1")+"/api/v1/locks/november/held/acquire",
		map[string]any{"client_id": "holder", "ttl_ms": 300000, "request_id": "h1"}, http.StatusOK, nil))
	b := startBusy(t, urls, 60000, true, func(w int) []string {
		return []string{fmt.Sprintf("alpha/w%d", w), fmt.Sprintf("hotel/w%d", w), fmt.Sprintf("november/w%d", w), fmt.Sprintf("uniform/w%d", w), "oscar/hot"}
	})
	b.waitRounds("the clients are busy", 40)

	// Grow: n4 joins, a voter of the meta group, with every range's
	// replicas written out as the initial nodes.
	c.join("n1", "n4")
	c.waitReady(30*time.Second*slow, "n4")
	testutil.Eventually(t, 60*time.Second*slow, "n4 is a voter", func() (bool, string) {
		ci, err := getCluster(c.url("n2"))
		if err != nil {
			return false, err.Error()
		}
		for _, m := range ci.Members {
			if m.ID == "n4" {
				return m.Suffrage == "voter", fmt.Sprint(ci.Members)
			}
		}
		return false, fmt.Sprint(ci.Members)
	})
	shardsOK("n4", func(ci shardReplicas) bool {
		for _, s := range ci.Shards {
			if !slices.Equal(s.Replicas, []string{"n1", "n2", "n3"}) {
				return false
			}
		}
		return true
	})
	checkHeld(t, "via the new node", getLock(t, c.url("n4"), "november/held"), "holder", held.FencingToken, 0)

	bin := dlockBinary(t)
	out, errOut, code := runCLI(t, bin, nil, "shards", "move", "--shard", "2", "--from", "n3", "--to", "n4", "--endpoints", c.url("n4"))
	if code != 0 || !strings.Contains(out, "moved shard 2") {
		t.Fatalf("dlock shards move onto n4: exit %d\n%s%s", code, out, errOut)
	}
	b.waitRounds("the clients go on after the move", b.rounds.Load()+40)

	// n4 dies and comes back (a restart needs no --join) with its replica.
	c.kill("n4")
	b.waitRounds("the clients go on with n4 down", b.rounds.Load()+20)
	c.start("n4", false)
	c.waitReady(30*time.Second*slow, "n4")
	shardsOK("n4", func(ci shardReplicas) bool {
		return slices.Equal(ci.Shards[2].Replicas, []string{"n1", "n2", "n4"}) && ci.Shards[2].Leaving == ""
	})
	checkHeld(t, "on n4 after its restart", getLock(t, c.url("n4"), "november/held"), "holder", held.FencingToken, 0)
	// An initial node restarted without --initial-cluster still knows the
	// initial nodes from its data dir, though the members have grown.
	c.kill("n1")
	c.start("n1", false)
	c.waitReady(30*time.Second*slow, "n1")
	shardsOK("n1", func(ci shardReplicas) bool {
		return slices.Equal(ci.Shards[2].Replicas, []string{"n1", "n2", "n4"}) && slices.Equal(ci.Shards[0].Replicas, []string{"n1", "n2", "n3"})
	})

	// Shrink: refused while n4 holds shard 2, with the command to run.
	out, errOut, code = runCLI(t, bin, nil, "members", "remove", "n4", "--endpoints", c.url("n2"))
	if code == 0 || !strings.Contains(out+errOut, "dlock shards move --shard 2 --from n4") {
		t.Fatalf("dlock members remove n4 while it holds shard 2: exit %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = runCLI(t, bin, nil, "shards", "move", "--shard", "2", "--from", "n4", "--to", "n3", "--endpoints", c.url("n1"))
	if code != 0 || !strings.Contains(out, "moved shard 2") {
		t.Fatalf("dlock shards move off n4: exit %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = runCLI(t, bin, nil, "members", "remove", "n4", "--endpoints", c.url("n2"))
	if code != 0 {
		t.Fatalf("dlock members remove n4: exit %d\n%s%s", code, out, errOut)
	}
	nd := c.node("n4")
	testutil.Eventually(t, 30*time.Second*slow, "the removed n4 exits by itself", func() (bool, string) {
		return nd.p.Exited(), "still running"
	})
	if nd.p.ExitCode() != 0 {
		t.Fatalf("the removed n4 exited with %v, want 0", nd.p.WaitErr())
	}
	testutil.Eventually(t, 30*time.Second*slow, "three members", func() (bool, string) {
		ci, err := getCluster(c.url("n3"))
		return err == nil && len(ci.Members) == 3, fmt.Sprint(ci.Members, err)
	})
	b.waitRounds("the clients go on after the removal", b.rounds.Load()+40)
	b.checkRising()
	for _, id := range []string{"n1", "n2", "n3"} {
		checkHeld(t, "at the end, on "+id, getLock(t, c.url(id), "november/held"), "holder", held.FencingToken, 0)
	}
	t.Logf("grew to 4 and back to 3; %d rounds; %d 503s retried", b.rounds.Load(), b.retried.Load())
}
