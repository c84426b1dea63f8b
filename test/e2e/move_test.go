package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/testutil"
)

type shardReplicas struct {
	Gen    uint64 `json:"shard_generation"`
	Shards []struct {
		ID       int      `json:"id"`
		LeaderID string   `json:"leader_id"`
		Replicas []string `json:"replicas"`
		Leaving  string   `json:"leaving"`
	} `json:"shards"`
}

func clusterShards(t testing.TB, url string) (shardReplicas, error) {
	var ci shardReplicas
	r, err := call(http.MethodGet, url+"/api/v1/cluster", nil)
	if err != nil {
		return ci, err
	}
	if r.Status != http.StatusOK {
		return ci, fmt.Errorf("status %d: %s", r.Status, r.Body)
	}
	return ci, json.Unmarshal(r.Body, &ci)
}

// TestMoveReplicaProcess is the operator story of moving a shard's
// replica on real processes: a 4-process cluster with 4 shards on 3 nodes
// each (--shard-replicas 3), clients locking through every node (each
// node serves every name, forwarding to a replica), and `dlock shards
// move` taking shard 1's replica off its leader to the node that lacked
// it: no client sees an error beyond retried 503s, tokens per name rise,
// a grant held across the move keeps its token, a waiter queued through
// the leaving node gets the lock after it. Then the replica moves back,
// and the shard's leader, which drives the move, is killed -9 in the
// middle and restarted: the move completes.
func TestMoveReplicaProcess(t *testing.T) {
	c := startClusterWith(t, 4, "--shards", "4", "--shard-replicas", "3", "--raft-engine", "etcd")
	var first shardReplicas
	testutil.Eventually(t, 30*time.Second*slow, "every shard has a leader", func() (bool, string) {
		ci, err := clusterShards(t, c.url("n1"))
		if err != nil || len(ci.Shards) != 4 {
			return false, fmt.Sprint(ci, err)
		}
		for _, s := range ci.Shards {
			if s.LeaderID == "" || len(s.Replicas) != 3 {
				return false, fmt.Sprint(ci)
			}
		}
		first = ci
		return true, ""
	})
	if !slices.Equal(first.Shards[1].Replicas, []string{"n2", "n3", "n4"}) {
		t.Fatalf("shard 1's replicas %v", first.Shards[1].Replicas)
	}
	var urls []string
	for _, id := range c.ids() {
		urls = append(urls, c.url(id))
	}
	from := first.Shards[1].LeaderID

	// Held across the move, taken through n1, which does not run shard 1;
	// a waiter queued through the leaving node.
	held := checkGrant(t, "acquire hotel/held", mustCall(t, http.MethodPost, c.url("n1")+"/api/v1/locks/hotel/held/acquire",
		map[string]any{"client_id": "holder", "ttl_ms": 120000, "request_id": "h1"}, http.StatusOK, nil))
	waiter := startCall(http.MethodPost, c.url(from)+"/api/v1/locks/hotel/held/acquire",
		map[string]any{"client_id": "waiter", "ttl_ms": 120000, "wait_timeout_ms": 120000, "request_id": "w1"}, 150*time.Second)
	testutil.Eventually(t, 10*time.Second*slow, "the waiter is queued", func() (bool, string) {
		v := getLock(t, c.url("n1"), "hotel/held")
		return v.Waiters == 1, fmt.Sprint(v)
	})

	b := startBusy(t, urls, 60000, true, func(w int) []string {
		return []string{fmt.Sprintf("golf/w%d", w), fmt.Sprintf("kilo/w%d", w), fmt.Sprintf("alpha/w%d", w), "kilo/hot"}
	})
	b.waitRounds("the clients are busy", 40)

	// Hostile moves change nothing; one whose end holds already (n1 runs
	// no copy, from does) answers as done, and changes nothing either.
	for _, bad := range []struct {
		body map[string]any
		code int
	}{
		{map[string]any{"shard": 7, "from": from, "to": "n1"}, 400},
		{map[string]any{"shard": 1, "from": "n1", "to": from}, 200},
		{map[string]any{"shard": 1, "from": "n1", "to": "n1"}, 400},
		{map[string]any{"shard": 1, "from": from, "to": "n8"}, 400},
		{map[string]any{"shard": "1", "from": from, "to": "n1"}, 400},
	} {
		r, err := call(http.MethodPost, c.url("n2")+"/api/v1/cluster/shards/move", bad.body)
		if err != nil || r.Status != bad.code {
			t.Fatalf("move %v: %v %v, want %d", bad.body, r, err, bad.code)
		}
	}

	bin := dlockBinary(t)
	out, errOut, code := runCLI(t, bin, nil, "shards", "move", "--shard", "1", "--from", from, "--to", "n1", "--endpoints", c.url("n3"))
	if code != 0 || !strings.Contains(out, "moved shard 1") {
		t.Fatalf("dlock shards move: exit %d\n%s%s", code, out, errOut)
	}
	before := b.rounds.Load()
	b.waitRounds("the clients go on after the move", before+60)
	out, errOut, code = runCLI(t, bin, nil, "members", "--endpoints", c.url("n4"))
	want := slices.Sorted(slices.Values(append(slices.DeleteFunc(slices.Clone(first.Shards[1].Replicas), func(s string) bool { return s == from }), "n1")))
	if code != 0 || !strings.Contains(out, strings.Join(want, ",")) {
		t.Fatalf("dlock members after the move: exit %d (want replicas %v)\n%s%s", code, want, out, errOut)
	}
	for _, id := range c.ids() {
		checkHeld(t, "after the move, on "+id, getLock(t, c.url(id), "hotel/held"), "holder", held.FencingToken, 1)
	}
	mustCall(t, http.MethodPost, c.url(from)+"/api/v1/locks/hotel/held/release",
		map[string]any{"client_id": "holder", "fencing_token": held.FencingToken, "lease_id": held.LeaseID}, http.StatusOK, nil)
	res := waiter.result(t, "the waiter queued through the leaving node", 60*time.Second)
	a := checkGrant(t, "waiter", res.r)
	if a.FencingToken <= held.FencingToken {
		t.Fatalf("the waiter's token %d is not above the holder's %d", a.FencingToken, held.FencingToken)
	}

	// Back again; the shard's leader, which drives the move, dies in the
	// middle and comes back.
	back := startCall(http.MethodPost, c.url("n1")+"/api/v1/cluster/shards/move", map[string]any{"shard": 1, "from": "n1", "to": from}, 150*time.Second)
	var leader string
	testutil.Eventually(t, 20*time.Second*slow, "the move back began", func() (bool, string) {
		ci, err := clusterShards(t, c.url("n2"))
		if err != nil || len(ci.Shards) < 2 {
			return false, fmt.Sprint(err)
		}
		leader = ci.Shards[1].LeaderID
		return ci.Shards[1].Leaving == "n1" && leader != "", fmt.Sprint(ci.Shards[1])
	})
	c.kill(leader)
	c.start(leader, false)
	c.waitReady(30*time.Second*slow, leader)
	select {
	case r := <-back.ch:
		// The answer may be lost with the killed node, or come before the
		// move is done (503); either way the move goes on.
		t.Logf("the first answer to the move back: %v %v", r.r, r.err)
	case <-time.After(160 * time.Second):
		t.Fatal("no answer to the move back")
	}
	testutil.Eventually(t, 120*time.Second*slow, "the move back is done", func() (bool, string) {
		ci, err := clusterShards(t, c.url("n3"))
		if err != nil || len(ci.Shards) < 2 {
			return false, fmt.Sprint(err)
		}
		s := ci.Shards[1]
		return s.Leaving == "" && slices.Equal(s.Replicas, first.Shards[1].Replicas) && s.LeaderID != "", fmt.Sprint(s)
	})
	before = b.rounds.Load()
	b.waitRounds("the clients go on after the move back", before+40)

	b.checkRising()
	t.Logf("moved shard 1 %s → n1 → %s; %d rounds; %d 503s retried", from, from, b.rounds.Load(), b.retried.Load())
}
