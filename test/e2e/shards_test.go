package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/testutil"
)

type shardsInfo struct {
	Shards []struct {
		ID       int    `json:"id"`
		LeaderID string `json:"leader_id"`
		Term     uint64 `json:"term"`
	} `json:"shards"`
}

func shardLeaders(t testing.TB, baseURL string) []string {
	r, err := call(http.MethodGet, baseURL+"/api/v1/cluster", nil)
	if err != nil || r.Status != http.StatusOK {
		return nil
	}
	var ci shardsInfo
	if r.decode(&ci) != nil {
		return nil
	}
	var out []string
	for _, s := range ci.Shards {
		out = append(out, s.LeaderID)
	}
	return out
}

// grantLog follows a watch over everything and records every grant.
type grantLog struct {
	mu     sync.Mutex
	grants []string // "shard/revision name"
}

func (g *grantLog) follow(ctx context.Context, t *testing.T, url string) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Errorf("watch %s: %v", url, err)
		return
	}
	go func() {
		defer res.Body.Close()
		sc := bufio.NewScanner(res.Body)
		for sc.Scan() {
			line, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok {
				continue
			}
			var ev struct {
				Type, Name string
				Revision   uint64
				Shard      *int
			}
			if json.Unmarshal([]byte(line), &ev) != nil || ev.Type != "acquired" || ev.Shard == nil {
				continue
			}
			g.mu.Lock()
			g.grants = append(g.grants, fmt.Sprintf("%d/%d %s", *ev.Shard, ev.Revision, ev.Name))
			g.mu.Unlock()
		}
	}()
}

func (g *grantLog) names() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []string
	for _, s := range g.grants {
		out = append(out, s[strings.IndexByte(s, ' ')+1:])
	}
	return out
}

// TestShardedKillNodeProcess is the operator story on real processes: a
// 3-process 4-shard cluster spreads its shard leaders over the nodes; locks
// in every range list in name order and a watch over everything sees each
// grant once; kill -9 of the node that leads two shards: both fail over and
// keep their holders (same tokens) and waiters, who get the locks next.
func TestShardedKillNodeProcess(t *testing.T) {
	c := startClusterWith(t, 3, "--shards", "4", "--raft-engine", "etcd")
	testutil.Eventually(t, 30*time.Second*slow, "shard leaders spread over the three nodes", func() (bool, string) {
		l := shardLeaders(t, c.url("n2"))
		return slices.Equal(l, []string{"n1", "n2", "n3", "n1"}), fmt.Sprint(l)
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var log grantLog
	log.follow(ctx, t, c.url("n2")+"/api/v1/watch")

	names := []string{"tango/job", "golf", "alpha/job", "november/x"} // shards 3, 1, 0, 2
	held := map[string]acquireAnswer{}
	for _, name := range names {
		r := mustCall(t, http.MethodPost, c.url("n3")+"/api/v1/locks/"+name+"/acquire",
			map[string]any{"client_id": "holder", "ttl_ms": 60000}, http.StatusOK, nil)
		held[name] = checkGrant(t, "holder acquire "+name, r)
	}
	var waits []*pending
	for _, name := range names {
		waits = append(waits, startCall(http.MethodPost, c.url("n2")+"/api/v1/locks/"+name+"/acquire",
			map[string]any{"client_id": "waiter", "ttl_ms": 60000, "wait_timeout_ms": 90000}, 100*time.Second))
	}
	for _, name := range names {
		testutil.Eventually(t, 10*time.Second*slow, "waiter queued on "+name, func() (bool, string) {
			v := getLock(t, c.url("n3"), name)
			return v.Waiters == 1, fmt.Sprint(v)
		})
	}
	var list struct {
		Locks []struct{ Name string } `json:"locks"`
	}
	mustCall(t, http.MethodGet, c.url("n2")+"/api/v1/locks?prefix=", nil, http.StatusOK, &list)
	var listed []string
	for _, l := range list.Locks {
		listed = append(listed, l.Name)
	}
	want := slices.Clone(names)
	slices.Sort(want)
	if !slices.Equal(listed, want) {
		t.Fatalf("list = %v, want %v", listed, want)
	}

	// kill -9 n1, which leads shards 0 and 3.
	c.kill("n1")
	testutil.Eventually(t, 20*time.Second*slow, "shards 0 and 3 fail over", func() (bool, string) {
		l := shardLeaders(t, c.url("n2"))
		if len(l) != 4 {
			return false, fmt.Sprint(l)
		}
		for _, id := range l {
			if id == "" || id == "n1" {
				return false, fmt.Sprint(l)
			}
		}
		return true, ""
	})
	for _, name := range names {
		for _, id := range []string{"n2", "n3"} {
			checkHeld(t, "after the kill, on "+id, getLock(t, c.url(id), name), "holder", held[name].FencingToken, 1)
		}
	}
	for i, name := range names {
		mustCall(t, http.MethodPost, c.url("n3")+"/api/v1/locks/"+name+"/release",
			map[string]any{"client_id": "holder", "fencing_token": held[name].FencingToken, "lease_id": held[name].LeaseID}, http.StatusOK, nil)
		res := waits[i].result(t, "the waiter on "+name, 20*time.Second)
		a := checkGrant(t, "waiter acquire "+name, res.r)
		if a.FencingToken <= held[name].FencingToken {
			t.Fatalf("%s: the waiter's token %d is not above the holder's %d", name, a.FencingToken, held[name].FencingToken)
		}
	}
	// Every grant, once each: the holders' and the waiters'.
	testutil.Eventually(t, 10*time.Second*slow, "the watch saw all 8 grants", func() (bool, string) {
		return len(log.names()) >= 8, fmt.Sprint(log.names())
	})
	got := log.names()
	slices.Sort(got)
	var wantGrants []string
	for _, n := range want {
		wantGrants = append(wantGrants, n, n)
	}
	if !slices.Equal(got, wantGrants) {
		t.Fatalf("the watch saw grants %v, want each name twice: %v", got, wantGrants)
	}
}
