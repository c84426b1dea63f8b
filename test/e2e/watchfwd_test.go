package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/testutil"
)

// sseRec is one record of an SSE stream.
type sseRec struct {
	event string
	data  string
}

// openSSE opens an SSE stream and delivers its records until ctx ends or
// the stream does (then the channel closes).
func openSSE(t *testing.T, ctx context.Context, url string) <-chan sseRec {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
	if res.StatusCode != http.StatusOK {
		res.Body.Close()
		t.Fatalf("open %s: status %d", url, res.StatusCode)
	}
	out := make(chan sseRec, 1024)
	go func() {
		defer close(out)
		defer res.Body.Close()
		sc := bufio.NewScanner(res.Body)
		var cur sseRec
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				cur.event = line[7:]
			case strings.HasPrefix(line, "data: "):
				cur.data = line[6:]
				select {
				case out <- cur:
				case <-ctx.Done():
					return
				}
				cur = sseRec{}
			}
		}
	}()
	return out
}

// TestWatchThroughNodeWithoutReplicaProcess watches a shard through the
// one process of a 4-process, 3-replica cluster that runs none of its
// replicas, while each replica in turn is killed -9 and restarted: the
// stream, relayed from a replica over the raft port, never ends and sees
// every grant once and in order.
func TestWatchThroughNodeWithoutReplicaProcess(t *testing.T) {
	c := startClusterWith(t, 4, "--shards", "4", "--shard-replicas", "3", "--raft-engine", "etcd")
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
		if !slices.Equal(ci.Shards[1].Replicas, []string{"n2", "n3", "n4"}) {
			t.Fatalf("shard 1's replicas %v", ci.Shards[1].Replicas)
		}
		return true, ""
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream := openSSE(t, ctx, c.url("n1")+"/api/v1/watch?prefix=hotel/")

	grant := func(via, client string) {
		t.Helper()
		var a acquireAnswer
		for _, step := range []struct {
			op   string
			body map[string]any
		}{
			{"acquire", map[string]any{"client_id": client, "ttl_ms": 60000, "request_id": "a-" + client}},
			{"release", map[string]any{"client_id": client, "request_id": "r-" + client}},
		} {
			if step.op == "release" {
				step.body["fencing_token"], step.body["lease_id"] = a.FencingToken, a.LeaseID
			}
			testutil.Eventually(t, 60*time.Second*slow, step.op+" hotel/seq as "+client, func() (bool, string) {
				r, err := call(http.MethodPost, c.url(via)+"/api/v1/locks/hotel/seq/"+step.op, step.body)
				if err != nil || r.Status == http.StatusServiceUnavailable {
					return false, fmt.Sprint(r, err)
				}
				if r.Status != http.StatusOK {
					t.Fatalf("%s hotel/seq as %s via %s: %s", step.op, client, via, r)
				}
				if step.op == "acquire" {
					a = checkGrant(t, "acquire hotel/seq as "+client, r)
				}
				return true, ""
			})
		}
	}
	var want, got []string
	expect := func(what string) {
		t.Helper()
		timeout := time.After(60 * time.Second * slow)
		for len(got) < len(want) {
			select {
			case r, ok := <-stream:
				if !ok {
					t.Fatalf("%s: the relayed stream ended (grants seen %v)", what, got)
				}
				if r.event == "error" {
					t.Fatalf("%s: the relayed stream ended with %s", what, r.data)
				}
				var ev struct {
					Type     string `json:"type"`
					Name     string `json:"name"`
					ClientID string `json:"client_id"`
				}
				if err := json.Unmarshal([]byte(r.data), &ev); err != nil {
					t.Fatalf("%s: bad event %q: %v", what, r.data, err)
				}
				if ev.Type == "acquired" && ev.Name == "hotel/seq" {
					got = append(got, ev.ClientID)
					if !slices.Equal(got, want[:min(len(got), len(want))]) {
						t.Fatalf("%s: grants seen %v, want %v (each once, in order)", what, got, want)
					}
				}
			case <-timeout:
				t.Fatalf("%s: grants seen %v, want %v", what, got, want)
			}
		}
	}
	for round, victim := range []string{"", "n2", "n3", "n4"} {
		via := []string{"n1", "n2", "n3", "n4"}
		if victim != "" {
			c.kill(victim)
			via = slices.DeleteFunc(via, func(s string) bool { return s == victim })
		}
		for i := range 4 {
			client := fmt.Sprintf("c%d-%d", round, i)
			grant(via[i%len(via)], client)
			want = append(want, client)
		}
		expect(fmt.Sprintf("with %q killed", victim))
		if victim != "" {
			c.start(victim, false)
			c.waitReady(30*time.Second*slow, victim)
		}
	}
	t.Logf("%d grants seen once each through n1 while each replica of shard 1 was killed in turn", len(got))
}
