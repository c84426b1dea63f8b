package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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
	ids := c.ids()
	var retried atomic.Int64
	// try resends a request answered 503, or not at all (a node killed
	// below), with the same body (the same request_id), as a client would.
	try := func(ctx context.Context, method, url string, body any) (*response, error) {
		for {
			r, err := callCtx(ctx, method, url, body)
			if err == nil && r.Status != http.StatusServiceUnavailable {
				return r, err
			}
			retried.Add(1)
			select {
			case <-ctx.Done():
				return r, ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
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

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var rounds atomic.Int64
	var mu sync.Mutex
	seqs := map[string][]uint64{}
	failures := make(chan string, 16)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			names := []string{fmt.Sprintf("golf/w%d", w), fmt.Sprintf("kilo/w%d", w), fmt.Sprintf("alpha/w%d", w), "kilo/hot"}
			for i := 0; ctx.Err() == nil; i++ {
				name := names[i%len(names)]
				via := c.url(ids[(w+i)%4])
				r, err := try(ctx, http.MethodPost, via+"/api/v1/locks/"+name+"/acquire", map[string]any{"client_id": fmt.Sprintf("w%d", w),
					"ttl_ms": 60000, "wait_timeout_ms": 30000, "request_id": fmt.Sprintf("w%d-%d", w, i)})
				if ctx.Err() != nil {
					return
				}
				var a acquireAnswer
				if err != nil || r.Status != http.StatusOK || r.decode(&a) != nil || !a.Acquired {
					failures <- fmt.Sprintf("worker %d acquire %s: %v %v", w, name, r, err)
					return
				}
				mu.Lock()
				seqs[name] = append(seqs[name], a.FencingToken)
				mu.Unlock()
				// With a request_id: a release resent after its answer
				// was lost with a killed node is answered from the dedup
				// table, not refused as not_holder.
				r, err = try(ctx, http.MethodPost, c.url(ids[(w+i+1)%4])+"/api/v1/locks/"+name+"/release",
					map[string]any{"client_id": fmt.Sprintf("w%d", w), "fencing_token": a.FencingToken, "lease_id": a.LeaseID,
						"request_id": fmt.Sprintf("r%d-%d", w, i)})
				if ctx.Err() != nil {
					return
				}
				if err != nil || r.Status != http.StatusOK {
					failures <- fmt.Sprintf("worker %d release %s: %v %v", w, name, r, err)
					return
				}
				rounds.Add(1)
			}
		}()
	}
	stop := func() {
		cancel()
		wg.Wait()
		select {
		case f := <-failures:
			t.Fatal(f)
		default:
		}
	}
	defer stop()
	waitRounds := func(what string, n int64) {
		testutil.Eventually(t, 60*time.Second*slow, what, func() (bool, string) {
			select {
			case f := <-failures:
				t.Fatal(f)
			default:
			}
			return rounds.Load() >= n, fmt.Sprint(rounds.Load(), " rounds")
		})
	}
	waitRounds("the clients are busy", 40)

	// Hostile moves change nothing.
	for _, bad := range []struct {
		body map[string]any
		code int
	}{
		{map[string]any{"shard": 7, "from": from, "to": "n1"}, 400},
		{map[string]any{"shard": 1, "from": "n1", "to": from}, 400},
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
	before := rounds.Load()
	waitRounds("the clients go on after the move", before+60)
	out, errOut, code = runCLI(t, bin, nil, "members", "--endpoints", c.url("n4"))
	want := slices.Sorted(slices.Values(append(slices.DeleteFunc(slices.Clone(first.Shards[1].Replicas), func(s string) bool { return s == from }), "n1")))
	if code != 0 || !strings.Contains(out, strings.Join(want, ",")) {
		t.Fatalf("dlock members after the move: exit %d (want replicas %v)\n%s%s", code, want, out, errOut)
	}
	for _, id := range ids {
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
	before = rounds.Load()
	waitRounds("the clients go on after the move back", before+40)

	stop()
	mu.Lock()
	defer mu.Unlock()
	for name, s := range seqs {
		for i := 1; i < len(s); i++ {
			if s[i] <= s[i-1] {
				t.Fatalf("%s: token %d after %d", name, s[i], s[i-1])
			}
		}
	}
	t.Logf("moved shard 1 %s → n1 → %s; %d rounds; %d 503s retried", from, from, rounds.Load(), retried.Load())
}
