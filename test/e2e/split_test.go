package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/testutil"
)

// TestSplitBusyRangeProcess is the operator story of an online split on
// real processes: a 3-process 4-shard cluster, clients locking and
// releasing names in every range through every node, and `dlock shards
// split --at m` in the middle: no client sees an error beyond 503s it
// retries with the same request_id, tokens per name only rise, a grant
// held across the split keeps its token, a waiter queued before it gets the
// lock after it, and `dlock members` shows the new shard and generation.
func TestSplitBusyRangeProcess(t *testing.T) {
	c := startClusterWith(t, 3, "--shards", "4", "--raft-engine", "etcd")
	testutil.Eventually(t, 30*time.Second*slow, "every shard has a leader", func() (bool, string) {
		l := shardLeaders(t, c.url("n1"))
		if len(l) != 4 {
			return false, fmt.Sprint(l)
		}
		for _, id := range l {
			if id == "" {
				return false, fmt.Sprint(l)
			}
		}
		return true, ""
	})
	var urls []string
	for _, id := range c.ids() {
		urls = append(urls, c.url(id))
	}

	// Held across the split, in the half that moves ("m" and above up to
	// "n"): "mike/held"; and one waiter behind it.
	held := checkGrant(t, "acquire mike/held", mustCall(t, http.MethodPost, c.url("n1")+"/api/v1/locks/mike/held/acquire",
		map[string]any{"client_id": "holder", "ttl_ms": 120000, "request_id": "h1"}, http.StatusOK, nil))
	waiter := startCall(http.MethodPost, c.url("n3")+"/api/v1/locks/mike/held/acquire",
		map[string]any{"client_id": "waiter", "ttl_ms": 120000, "wait_timeout_ms": 90000, "request_id": "w1"}, 100*time.Second)
	testutil.Eventually(t, 10*time.Second*slow, "the waiter is queued", func() (bool, string) {
		v := getLock(t, c.url("n2"), "mike/held")
		return v.Waiters == 1, fmt.Sprint(v)
	})

	b := startBusy(t, urls, 20000, false, func(w int) []string {
		return []string{fmt.Sprintf("golf/w%d", w), fmt.Sprintf("lima/w%d", w), fmt.Sprintf("mike/w%d", w), fmt.Sprintf("mike/x%d", w), "mike/hot"}
	})
	b.waitRounds("the clients are busy", 40)

	// The operator splits the busy range [g, n) at m.
	bin := dlockBinary(t)
	out, errOut, code := runCLI(t, bin, nil, "shards", "split", "--at", "m", "--endpoints", c.url("n2"))
	if code != 0 || !strings.Contains(out, "generation 2") {
		t.Fatalf("dlock shards split --at m: exit %d\n%s%s", code, out, errOut)
	}
	// Hostile input changes nothing.
	for _, bad := range []string{"a/b", "g", "", "M!"} {
		r, err := call(http.MethodPost, c.url("n1")+"/api/v1/cluster/shards/split", map[string]any{"at": bad})
		if err != nil || r.Status != http.StatusBadRequest {
			t.Fatalf("split at %q: %v %v, want 400", bad, r, err)
		}
	}
	before := b.rounds.Load()
	b.waitRounds("the clients go on after the split", before+80)

	// Every node routes by generation 2, with 5 shards, [m, n) among them.
	for _, id := range c.ids() {
		testutil.Eventually(t, 20*time.Second*slow, id+" shows the new shard", func() (bool, string) {
			r, err := call(http.MethodGet, c.url(id)+"/api/v1/cluster", nil)
			if err != nil || r.Status != http.StatusOK {
				return false, fmt.Sprint(r, err)
			}
			var ci struct {
				Gen    uint64 `json:"shard_generation"`
				Shards []struct {
					ID       int    `json:"id"`
					Start    string `json:"start"`
					End      string `json:"end"`
					LeaderID string `json:"leader_id"`
				} `json:"shards"`
			}
			_ = json.Unmarshal(r.Body, &ci)
			ok := ci.Gen == 2 && len(ci.Shards) == 5
			for _, s := range ci.Shards {
				ok = ok && s.LeaderID != ""
			}
			return ok, string(r.Body)
		})
	}
	out, errOut, code = runCLI(t, bin, nil, "members", "--endpoints", c.url("n3"))
	if code != 0 || !strings.Contains(out, "generation 2") || !strings.Contains(out, `["m", "n")`) {
		t.Fatalf("dlock members after the split: exit %d\n%s%s", code, out, errOut)
	}

	// The grant held across the split keeps its token; the waiter queued
	// before it gets the lock once the holder lets go.
	for _, id := range c.ids() {
		checkHeld(t, "after the split, on "+id, getLock(t, c.url(id), "mike/held"), "holder", held.FencingToken, 1)
	}
	mustCall(t, http.MethodPost, c.url("n2")+"/api/v1/locks/mike/held/release",
		map[string]any{"client_id": "holder", "fencing_token": held.FencingToken, "lease_id": held.LeaseID}, http.StatusOK, nil)
	res := waiter.result(t, "the waiter queued before the split", 30*time.Second)
	a := checkGrant(t, "waiter", res.r)
	if a.FencingToken <= held.FencingToken {
		t.Fatalf("the waiter's token %d is not above the holder's %d", a.FencingToken, held.FencingToken)
	}

	b.checkRising()
	t.Logf("%d rounds, %d after the split; %d 503s retried", b.rounds.Load(), b.rounds.Load()-before, b.retried.Load())
}
