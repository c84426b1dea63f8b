package shard_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/shard"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
)

// TestMoveUnderLoad runs 4 shards on 3 of 4 nodes each, checks that any
// node serves any name (forwarding to a replica), then moves shard 1's
// replica off its leader to the node that lacked it while clients keep
// locking through every node: no acknowledged grant is lost, a waiter
// queued through the leaving node keeps its place and gets the lock,
// tokens per name rise, the leaving node stops the group and deletes its
// data, and every node still serves the shard.
func TestMoveUnderLoad(t *testing.T) {
	m0, err := shard.NewMap(shard.DefaultBounds(4))
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{"n1", "n2", "n3", "n4"}
	m, err := m0.Place(ids, 3)
	if err != nil {
		t.Fatal(err)
	}
	c := testcluster.NewWith(t, 4, testcluster.Options{Shards: &m})
	if got := c.IDs(); !slices.Equal(got, ids) {
		t.Fatalf("node ids %v", got)
	}
	// Shard 1 is [g, n), on n2, n3, n4.
	if !slices.Equal(m.Hosts(1, ids), []string{"n2", "n3", "n4"}) {
		t.Fatalf("shard 1's replicas %v", m.Hosts(1, ids))
	}
	leader := func(id int) string {
		for _, n := range c.Running() {
			if g := c.Server(n).ShardGroup(id); g != nil && g.IsLeader() {
				return n
			}
		}
		return ""
	}
	testutil.Eventually(t, 60*time.Second, "every shard has a leader on its replicas only", func() error {
		for k := range m.N() {
			if leader(k) == "" {
				return fmt.Errorf("shard %d has no leader", k)
			}
			for _, n := range ids {
				if hosted := c.Server(n).ShardGroup(k) != nil; hosted != m.Hosted(k, n, ids) {
					return fmt.Errorf("node %s runs shard %d: %v", n, k, hosted)
				}
			}
		}
		return nil
	})

	// Any node serves any name: n1 does not run shard 1, n4 not shard 0.
	held := map[string]service.AcquireResponse{}
	for _, tc := range []struct{ name, via string }{{"hotel/held", "n1"}, {"india/held", "n3"}, {"alpha/held", "n4"}} {
		var a service.AcquireResponse
		if code := post(t, c, c.URL(tc.via)+"/api/v1/locks/"+tc.name+"/acquire", map[string]any{"client_id": "holder-" + tc.name, "ttl_ms": 120000, "request_id": "h-" + tc.name}, &a); code != 200 || !a.Acquired {
			t.Fatalf("acquire %s via %s: %d %+v", tc.name, tc.via, code, a)
		}
		held[tc.name] = a
	}
	var list service.ListResponse
	if code := do(t, c, "GET", c.URL("n1")+"/api/v1/locks?prefix=", nil, &list); code != 200 || len(list.Locks) != 3 {
		t.Fatalf("list via n1: %d %+v", code, list)
	}

	// The move takes shard 1's replica off its leader.
	from := leader(1)
	to := "n1"
	// A waiter queued through the leaving node.
	waited := make(chan service.AcquireResponse, 1)
	go func() {
		var a service.AcquireResponse
		code := post(t, c, c.URL(from)+"/api/v1/locks/hotel/held/acquire", map[string]any{"client_id": "waiter", "ttl_ms": 120000,
			"wait_timeout_ms": 90000, "request_id": "w-hotel"}, &a)
		if code != 200 {
			t.Errorf("queued acquire of hotel/held: %d %+v", code, a)
		}
		waited <- a
	}()
	testutil.Eventually(t, 20*time.Second, "the waiter is queued", func() error {
		var v service.LockView
		do(t, c, "GET", c.URL("n2")+"/api/v1/locks/hotel/held", nil, &v)
		if v.Waiters != 1 {
			return fmt.Errorf("hotel/held has %d waiters", v.Waiters)
		}
		return nil
	})

	urls := make([]string, len(ids))
	for k, id := range ids {
		urls[k] = c.URL(id)
	}
	b := startBusy(t, c, urls, func(w int) []string {
		return []string{fmt.Sprintf("golf/w%d", w), fmt.Sprintf("kilo/w%d", w), fmt.Sprintf("alpha/w%d", w), "kilo/hot"}
	})

	// Bad moves change nothing.
	other := "n2"
	if from == other {
		other = "n4"
	}
	for i, bad := range []struct {
		body map[string]any
		code int
	}{
		{map[string]any{"shard": 9, "from": from, "to": to}, 400},
		{map[string]any{"shard": 1, "from": "n1", "to": from}, 200}, // its end holds: answered as done, nothing changed
		{map[string]any{"shard": 1, "from": from, "to": "n9"}, 400},
		{map[string]any{"shard": 1, "from": from, "to": from}, 400},
		{map[string]any{"shard": 1, "from": from}, 400},
		{map[string]any{"shard": 1, "from": from, "to": to, "extra": 1}, 400},
		{map[string]any{"shard": 1, "from": from, "to": other}, 409},
	} {
		var e map[string]any
		if code := post(t, c, c.URL("n2")+"/api/v1/cluster/shards/move", bad.body, &e); code != bad.code {
			t.Fatalf("bad move %d %v: %d %v, want %d", i, bad.body, code, e, bad.code)
		}
	}

	var ci service.ClusterInfo
	if code := post(t, c, c.URL("n4")+"/api/v1/cluster/shards/move", map[string]any{"shard": 1, "from": from, "to": to}, &ci); code != 200 {
		t.Fatalf("move: %d %+v", code, ci)
	}
	want := slices.Sorted(slices.Values(append(slices.DeleteFunc([]string{"n2", "n3", "n4"}, func(s string) bool { return s == from }), to)))
	if sh := ci.Shards[1]; !slices.Equal(sh.Replicas, want) || sh.Leaving != "" {
		t.Fatalf("after the move shard 1 is %+v; want replicas %v", sh, want)
	}
	// A repeated move (a retry after a lost answer) finds its end holding
	// and answers as the first did.
	var again service.ClusterInfo
	if code := post(t, c, c.URL("n2")+"/api/v1/cluster/shards/move", map[string]any{"shard": 1, "from": from, "to": to}, &again); code != 200 || !slices.Equal(again.Shards[1].Replicas, want) {
		t.Fatalf("repeated move: %d %+v", code, again)
	}
	g := m.Groups[1]
	testutil.Eventually(t, 30*time.Second, "the leaving node stopped the group and deleted its data", func() error {
		s := c.Server(from)
		if s.ShardGroup(1) != nil {
			return fmt.Errorf("%s still runs shard 1", from)
		}
		if ok, err := s.GroupStored(g); err != nil || ok {
			return fmt.Errorf("%s still stores group %d (%v)", from, g, err)
		}
		if c.Server(to).ShardGroup(1) == nil {
			return fmt.Errorf("%s does not run shard 1", to)
		}
		return nil
	})
	b.waitRounds("the clients go on after the move", b.rounds.Load()+40)

	// Acknowledged grants are still held, with their tokens, through
	// every node; the new replica's own state has them.
	for name, a := range held {
		for _, id := range ids {
			var v service.LockView
			if code := do(t, c, "GET", c.URL(id)+"/api/v1/locks/"+name, nil, &v); code != 200 || !v.Held || v.Holder.FencingToken != a.FencingToken {
				t.Fatalf("%s via %s after the move: %d %+v, want held with token %d", name, id, code, v, a.FencingToken)
			}
		}
	}
	var v service.LockView
	if code := do(t, c, "GET", c.URL(to)+"/api/v1/locks/hotel/held?stale=true", nil, &v); code != 200 || !v.Held || v.Holder.FencingToken != held["hotel/held"].FencingToken || v.Waiters != 1 {
		t.Fatalf("hotel/held in the new replica's own state: %d %+v", code, v)
	}
	// The waiter queued through the leaving node keeps its place.
	hh := held["hotel/held"]
	var rel service.ReleaseResponse
	if code := post(t, c, c.URL(from)+"/api/v1/locks/hotel/held/release", map[string]any{"client_id": "holder-hotel/held",
		"fencing_token": hh.FencingToken, "lease_id": hh.LeaseID}, &rel); code != 200 {
		t.Fatalf("release hotel/held: %d", code)
	}
	select {
	case a := <-waited:
		if !a.Acquired || a.FencingToken <= hh.FencingToken {
			t.Fatalf("the waiter got %+v; the holder's token was %d", a, hh.FencingToken)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the waiter queued through the leaving node never got the lock")
	}
	b.checkRising()
	t.Logf("moved shard 1 from %s to %s; %d rounds; %d 503s retried", from, to, b.rounds.Load(), retried503.Load())
}
