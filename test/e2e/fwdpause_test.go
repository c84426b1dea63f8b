package e2e

import (
	"fmt"
	"net/http"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/testutil"
)

// waitPlaced waits until every shard of a 4-shard cluster placed on 3
// replicas each has a leader, as node via sees it, and returns the shards.
func waitPlaced(t *testing.T, c *procCluster, via string, not ...string) shardReplicas {
	t.Helper()
	var ci shardReplicas
	testutil.Eventually(t, 30*time.Second*slow, "every shard has a leader", func() (bool, string) {
		var err error
		ci, err = clusterShards(t, c.url(via))
		if err != nil || len(ci.Shards) != 4 {
			return false, fmt.Sprint(ci, err)
		}
		for _, s := range ci.Shards {
			if s.LeaderID == "" || slices.Contains(not, s.LeaderID) || len(s.Replicas) != 3 {
				return false, fmt.Sprint(ci)
			}
		}
		return true, ""
	})
	return ci
}

// TestForwardedCallsPassAPausedReplicaProcess pauses (SIGSTOP) each replica
// of a shard in turn, on a 4-process cluster with 4 shards on 3 replicas
// each, and calls through the one node that runs none of that shard's
// replicas: every call — writes with and without a request_id, reads —
// answers within its own deadline, because the node passes a replica that
// does not start reading a call in time over for the next one. (Before,
// the node waited on the paused replica for the whole deadline, call after
// call.)
func TestForwardedCallsPassAPausedReplicaProcess(t *testing.T) {
	c := startClusterWith(t, 4, "--shards", "4", "--shard-replicas", "3", "--raft-engine", "etcd")
	var paused *node
	// Before the cluster's clean-up (clean-ups run last first): a stopped
	// process would not see its SIGTERM.
	t.Cleanup(func() {
		if paused != nil {
			_ = paused.p.Signal(syscall.SIGCONT)
		}
	})
	if ci := waitPlaced(t, c, "n1"); !slices.Equal(ci.Shards[1].Replicas, []string{"n2", "n3", "n4"}) {
		t.Fatalf("shard 1's replicas %v", ci.Shards[1].Replicas)
	}
	// once sends one call with the request's own deadline (requestTimeout):
	// it must answer, and with want (0: any status).
	once := func(method, path string, body map[string]any, want int) *response {
		t.Helper()
		start := time.Now()
		r, err := call(method, c.url("n1")+path, body)
		if err != nil {
			t.Fatalf("%s %s through n1 with %s paused: no answer within the request's deadline: %v", method, path, paused.id, err)
		}
		if want != 0 && r.Status != want {
			t.Fatalf("%s %s through n1 with %s paused: %s, want %d", method, path, paused.id, r, want)
		}
		t.Logf("%s %s with %s paused: %d in %s", method, path, paused.id, r.Status, time.Since(start).Round(time.Millisecond))
		return r
	}
	// keyed sends a call that is safe to repeat, again after a 503 (a
	// shard electing a new leader), as a client would; each try must
	// answer within its deadline.
	keyed := func(method, path string, body map[string]any) *response {
		t.Helper()
		var r *response
		testutil.Eventually(t, 30*time.Second*slow, method+" "+path, func() (bool, string) {
			r = once(method, path, body, 0)
			return r.Status != http.StatusServiceUnavailable, r.String()
		})
		if r.Status != http.StatusOK {
			t.Fatalf("%s %s through n1 with %s paused: %s", method, path, paused.id, r)
		}
		return r
	}
	for round, id := range []string{"n2", "n3", "n4"} {
		paused = c.node(id)
		if err := paused.p.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		t.Logf("paused %s (pid %d)", id, paused.p.Pid())
		// Shard 1 leads on a live replica (an election, if it led there),
		// as another live node sees it: the first call through n1 meets
		// the paused replica.
		waitPlaced(t, c, c.others("n1", id)[0], id)
		for i := range 3 {
			name := fmt.Sprintf("/api/v1/locks/hotel/p%d-%d", round, i)
			client := fmt.Sprintf("c%d-%d", round, i)
			a := checkGrant(t, "acquire "+name, keyed(http.MethodPost, name+"/acquire",
				map[string]any{"client_id": client, "ttl_ms": 60000, "request_id": "a-" + client}))
			var v lockView
			if err := keyed(http.MethodGet, name, nil).decode(&v); err != nil {
				t.Fatal(err)
			}
			checkHeld(t, name+" through n1", v, client, a.FencingToken, 0)
			keyed(http.MethodPost, name+"/release",
				map[string]any{"client_id": client, "fencing_token": a.FencingToken, "lease_id": a.LeaseID, "request_id": "r-" + client})
			// Without a request_id: sent once, answered once.
			b := checkGrant(t, "acquire "+name+" again", once(http.MethodPost, name+"/acquire",
				map[string]any{"client_id": client, "ttl_ms": 60000}, http.StatusOK))
			once(http.MethodPost, name+"/release",
				map[string]any{"client_id": client, "fencing_token": b.FencingToken, "lease_id": b.LeaseID}, http.StatusOK)
		}
		if err := paused.p.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		paused = nil
	}
}
