package shard_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/raftnode"
	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/shard"
	"github.com/dlock/dlock/internal/state"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
)

// post is a request that may be answered 503 (the split moved its name and
// the new map had not arrived): it is retried, with the same request_id,
// as a client would. Any other failure fails the test.
func post(t *testing.T, c *testcluster.Cluster, u string, body map[string]any, out any) int {
	t.Helper()
	deadline := time.Now().Add(45 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
		code, err := c.Do(ctx, "POST", u, body, out)
		cancel()
		if err != nil {
			t.Errorf("POST %s: %v", u, err)
			return 0
		}
		if code != http.StatusServiceUnavailable || time.Now().After(deadline) {
			return code
		}
		retried503.Add(1)
		time.Sleep(20 * time.Millisecond)
	}
}

var retried503 atomic.Int64

// groupOf is the node's group of the shard with id, or nil.
func groupOf(s interface {
	Shards() []*raftnode.Node
	ShardMap() shard.Map
}, id int) *raftnode.Node {
	m := s.ShardMap()
	k := m.IndexOf(id)
	ns := s.Shards()
	if k < 0 || k >= len(ns) || len(ns) != m.N() {
		return nil
	}
	return ns[k]
}

// splitAtQ splits the default [n, t) range at q through node via and waits
// until every node runs the new shard 4.
func splitAtQ(t *testing.T, c *testcluster.Cluster, via string) {
	t.Helper()
	var ci service.ClusterInfo
	if code := post(t, c, c.URL(via)+"/api/v1/cluster/shards/split", map[string]any{"at": "q"}, &ci); code != 200 {
		t.Fatalf("split: %d %+v", code, ci)
	}
	for _, id := range c.IDs() {
		testutil.Eventually(t, 30*time.Second, "every node runs the new shard", func() error {
			if groupOf(c.Server(id), 4) == nil {
				return fmt.Errorf("node %s does not run shard 4 (map generation %d)", id, c.Server(id).ShardMap().Generation)
			}
			return nil
		})
	}
}

// TestSplitUnderLoad splits a busy range of a 3-node, 4-shard cluster
// while clients keep locking through every node: every request succeeds
// (503s retried with the same request_id are the only failures), tokens
// per name strictly rise, every grant acknowledged before the split is
// still held after it with its token, a queued waiter keeps its place and
// gets the lock, and a node restarted after the split recovers the new
// shard from its own disk.
func TestSplitUnderLoad(t *testing.T) {
	c, m := sharded(t, 3)
	ids := c.IDs()

	// Held across the split: two names that move, one that stays.
	held := map[string]service.AcquireResponse{}
	for i, name := range []string{"quebec/held", "sierra/held", "oscar/held"} {
		var a service.AcquireResponse
		if code := post(t, c, c.URL(ids[i%3])+"/api/v1/locks/"+name+"/acquire", map[string]any{"client_id": "holder-" + name, "ttl_ms": 120000, "request_id": "h-" + name}, &a); code != 200 || !a.Acquired {
			t.Fatalf("acquire %s: %d %+v", name, code, a)
		}
		held[name] = a
	}
	// A waiter queued behind a moving lock before the split.
	waited := make(chan service.AcquireResponse, 1)
	go func() {
		var a service.AcquireResponse
		code := post(t, c, c.URL(ids[1])+"/api/v1/locks/sierra/held/acquire", map[string]any{"client_id": "waiter", "ttl_ms": 120000,
			"wait_timeout_ms": 60000, "request_id": "w-sierra"}, &a)
		if code != 200 {
			t.Errorf("queued acquire of sierra/held: %d %+v", code, a)
		}
		waited <- a
	}()
	testutil.Eventually(t, 20*time.Second, "the waiter is queued", func() error {
		var v service.LockView
		do(t, c, "GET", c.URL(ids[0])+"/api/v1/locks/sierra/held", nil, &v)
		if v.Waiters != 1 {
			return fmt.Errorf("sierra/held has %d waiters", v.Waiters)
		}
		return nil
	})

	// Busy clients: each locks and releases its own names, in the range
	// that moves and the one that stays, plus a contended lock, through
	// every node in turn.
	urls := make([]string, len(ids))
	for k, id := range ids {
		urls[k] = c.URL(id)
	}
	b := startBusy(t, c, urls, func(w int) []string {
		return []string{fmt.Sprintf("papa/w%d", w), fmt.Sprintf("romeo/w%d", w), fmt.Sprintf("november/w%d", w), "romeo/hot"}
	})

	// Split [n, t) at q while they run.
	var ci service.ClusterInfo
	if code := post(t, c, c.URL(ids[2])+"/api/v1/cluster/shards/split", map[string]any{"at": "q"}, &ci); code != 200 {
		t.Fatalf("split: %d %+v", code, ci)
	}
	if ci.ShardGeneration != 2 || len(ci.Shards) != 5 {
		t.Fatalf("after the split: generation %d, %d shards: %+v", ci.ShardGeneration, len(ci.Shards), ci.Shards)
	}
	newID := -1
	for _, sh := range ci.Shards {
		if sh.Start == "q" && sh.End == "t" {
			newID = sh.ID
		}
	}
	if newID != 4 {
		t.Fatalf("no shard [q, t) with id 4 in %+v", ci.Shards)
	}
	// A repeated split finds it done; a hostile one is refused.
	if code := post(t, c, c.URL(ids[0])+"/api/v1/cluster/shards/split", map[string]any{"at": "q"}, &ci); code != 200 {
		t.Fatalf("repeated split: %d", code)
	}
	for _, bad := range []map[string]any{{"at": ""}, {"at": "a/b"}, {"at": "n"}, {"at": "é"}, {"at": "q", "extra": 1}, {}} {
		var e map[string]any
		if code := post(t, c, c.URL(ids[1])+"/api/v1/cluster/shards/split", bad, &e); code != 400 {
			t.Fatalf("split %v: %d %v, want 400", bad, code, e)
		}
	}
	// Every node routes by the new map and runs the new group.
	for _, id := range ids {
		testutil.Eventually(t, 30*time.Second, "every node follows the new map", func() error {
			s := c.Server(id)
			if g := s.ShardMap().Generation; g != 2 {
				return fmt.Errorf("node %s at generation %d", id, g)
			}
			if groupOf(s, newID) == nil {
				return fmt.Errorf("node %s does not run shard %d", id, newID)
			}
			return nil
		})
	}
	// Let the clients go on for a while on the new map.
	b.waitRounds("the clients go on after the split", b.rounds.Load()+60)

	// Grants acknowledged before the split are still held, with their
	// tokens, on the shard that owns them now, as every node sees it.
	for name, a := range held {
		for _, id := range ids {
			var v service.LockView
			if code := do(t, c, "GET", c.URL(id)+"/api/v1/locks/"+name, nil, &v); code != 200 || !v.Held || v.Holder.FencingToken != a.FencingToken {
				t.Fatalf("%s via %s after the split: %d %+v, want held with token %d", name, id, code, v, a.FencingToken)
			}
		}
	}
	for _, id := range ids {
		testutil.Eventually(t, 20*time.Second, "the new shard's state holds the moved grants", func() error {
			g := groupOf(c.Server(id), newID)
			if g == nil {
				return fmt.Errorf("node %s: no shard %d", id, newID)
			}
			var tok uint64
			g.FSM().Read(func(st *state.State) {
				if li := st.GetLock("sierra/held"); li.Held {
					tok = li.Holders[0].Token
				}
			})
			if tok != held["sierra/held"].FencingToken {
				return fmt.Errorf("node %s shard %d: sierra/held token %d", id, newID, tok)
			}
			return nil
		})
	}
	// The waiter queued before the split gets the lock when its holder,
	// who holds it on the new shard now, lets go.
	sh := held["sierra/held"]
	var rel service.ReleaseResponse
	if code := post(t, c, c.URL(ids[0])+"/api/v1/locks/sierra/held/release", map[string]any{"client_id": "holder-sierra/held",
		"fencing_token": sh.FencingToken, "lease_id": sh.LeaseID}, &rel); code != 200 {
		t.Fatalf("release sierra/held on the new shard: %d", code)
	}
	select {
	case a := <-waited:
		if !a.Acquired || a.FencingToken <= sh.FencingToken {
			t.Fatalf("the waiter got %+v; the holder's token was %d", a, sh.FencingToken)
		}
	case <-time.After(45 * time.Second):
		t.Fatal("the waiter queued before the split never got the lock")
	}
	b.checkRising()
	t.Logf("%d rounds; %d 503s retried", b.rounds.Load(), retried503.Load())

	// A node restarted after the split recovers the new shard from disk.
	victim := ids[1]
	c.Kill(victim)
	c.Start(victim)
	testutil.Eventually(t, 60*time.Second, "the restarted node runs the new shard with its state", func() error {
		s := c.Server(victim)
		if s.ShardMap().Generation != 2 {
			return fmt.Errorf("generation %d", s.ShardMap().Generation)
		}
		g := groupOf(s, newID)
		if g == nil {
			return fmt.Errorf("no shard %d", newID)
		}
		var tok uint64
		g.FSM().Read(func(st *state.State) {
			if li := st.GetLock("quebec/held"); li.Held {
				tok = li.Holders[0].Token
			}
		})
		if tok != held["quebec/held"].FencingToken {
			return fmt.Errorf("quebec/held token %d", tok)
		}
		return nil
	})
	var v service.LockView
	if code := do(t, c, "GET", c.URL(victim)+"/api/v1/locks/quebec/held", nil, &v); code != 200 || !v.Held || v.Holder.FencingToken != held["quebec/held"].FencingToken {
		t.Fatalf("quebec/held via the restarted node: %d %+v", code, v)
	}
	_ = m
}

// A merged watch over every shard follows a split made while it is open:
// every acknowledged grant is seen exactly once, a moved name's events come
// from its old shard up to the split and from the new one after it, and the
// resume vector gains the new shard. A stream cut before the split and
// resumed after it with its old vector (which lacks the new shard) also
// sees every grant once: the new shard joins it at the split.
func TestMergedWatchFollowsSplit(t *testing.T) {
	c, _ := sharded(t, 3)
	ids := c.IDs()
	live := watch(t, c, c.URL(ids[0])+"/api/v1/watch")
	// The stream cut before the split: its vector is resumed afterwards.
	cutCtx, cut := context.WithCancel(context.Background())
	defer cut()
	early := watchCtx(t, cutCtx, c.URL(ids[1])+"/api/v1/watch")

	var mu sync.Mutex
	var acked []string // name#token
	grant := func(name string, i int) {
		var a service.AcquireResponse
		if code := post(t, c, c.URL(ids[i%3])+"/api/v1/locks/"+name+"/acquire", map[string]any{"client_id": "w", "ttl_ms": 20000,
			"wait_timeout_ms": 30000, "request_id": fmt.Sprintf("fw-%s-%d", name, i)}, &a); code != 200 || !a.Acquired {
			t.Fatalf("acquire %s: %d %+v", name, code, a)
		}
		mu.Lock()
		acked = append(acked, fmt.Sprintf("%s#%d", name, a.FencingToken))
		mu.Unlock()
		var rel service.ReleaseResponse
		if code := post(t, c, c.URL(ids[(i+1)%3])+"/api/v1/locks/"+name+"/release", map[string]any{"client_id": "w",
			"fencing_token": a.FencingToken, "lease_id": a.LeaseID}, &rel); code != 200 {
			t.Fatalf("release %s: %d", name, code)
		}
	}
	names := []string{"romeo/a", "sierra/b", "oscar/c", "alpha/d"} // the first two move at q
	for i := range 8 {
		grant(names[i%len(names)], i)
	}
	// The early stream delivers the first grant; then it is cut and its
	// vector kept.
	var earlyID string
	next(t, early, func(r sse) bool { earlyID = r.id; return r.typ == "acquired" })
	cut()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 100; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			grant(names[i%len(names)], i)
		}
	}()
	var ci service.ClusterInfo
	if code := post(t, c, c.URL(ids[2])+"/api/v1/cluster/shards/split", map[string]any{"at": "q"}, &ci); code != 200 {
		t.Fatalf("split: %d %+v", code, ci)
	}
	for i := 200; i < 216; i++ {
		grant(names[i%len(names)], i)
	}
	close(stop)
	wg.Wait()
	mu.Lock()
	want := append([]string(nil), acked...)
	mu.Unlock()

	// check reads a stream until it has every acknowledged grant, and
	// checks none came twice and each name's shard changed at most once,
	// from its old shard to the new one (id 4).
	check := func(what string, ch <-chan sse, seen map[string]int, shardOf map[string][]int) {
		t.Helper()
		missing := func() int {
			n := 0
			for _, g := range want {
				if seen[g] == 0 {
					n++
				}
			}
			return n
		}
		var lastID string
		for missing() > 0 {
			select {
			case r, ok := <-ch:
				if !ok {
					t.Fatalf("%s: the stream ended with %d grants unseen", what, missing())
				}
				if r.typ != "acquired" && r.typ != "released" {
					continue
				}
				lastID = r.id
				if r.typ == "acquired" {
					seen[fmt.Sprintf("%s#%d", r.ev.Name, r.ev.FencingToken)]++
				}
				if r.ev.Shard == nil {
					t.Fatalf("%s: an event without its shard: %+v", what, r)
				}
				s := shardOf[r.ev.Name]
				if len(s) == 0 || s[len(s)-1] != *r.ev.Shard {
					shardOf[r.ev.Name] = append(s, *r.ev.Shard)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("%s: %d acknowledged grants never seen (last id %q)", what, missing(), lastID)
			}
		}
		for g, n := range seen {
			if n > 1 {
				t.Errorf("%s: grant %s seen %d times", what, g, n)
			}
		}
		for name, s := range shardOf {
			moved := strings.HasPrefix(name, "romeo/") || strings.HasPrefix(name, "sierra/")
			switch {
			case moved && !(len(s) == 2 && s[0] == 2 && s[1] == 4):
				t.Errorf("%s: %s's events came from shards %v, want 2 then 4", what, name, s)
			case !moved && len(s) != 1:
				t.Errorf("%s: %s's events came from shards %v", what, name, s)
			}
		}
		if !strings.Contains(lastID, "4:") {
			t.Errorf("%s: the resume vector %q lacks the new shard 4", what, lastID)
		}
	}
	check("the live stream", live, map[string]int{}, map[string][]int{})

	// The cut stream, resumed on another node with its pre-split vector:
	// each shard at its last delivered revision + 1.
	if strings.Contains(earlyID, "4:") {
		t.Fatalf("the vector cut before the split already names shard 4: %q", earlyID)
	}
	var from []string
	for _, p := range strings.Split(earlyID, ",") {
		id, rev, _ := strings.Cut(p, ":")
		n, _ := strconv.ParseUint(rev, 10, 64)
		from = append(from, fmt.Sprintf("%s:%d", id, n+1))
	}
	resumed := watch(t, c, c.URL(ids[2])+"/api/v1/watch?from_revisions="+url.QueryEscape(strings.Join(from, ",")))
	// The first grant (delivered before the cut) must not come again.
	seen := map[string]int{}
	for _, g := range want[:1] {
		seen[g] = 1
	}
	check("the resumed stream", resumed, seen, map[string][]int{"romeo/a": {2}})

	// A vector that resumes the source past the split without the new
	// shard would never see it: refused, not silently short.
	var ci2 service.ClusterInfo
	do(t, c, "GET", c.URL(ids[0])+"/api/v1/cluster", nil, &ci2)
	var past []string
	for _, sh := range ci2.Shards {
		if sh.ID != 4 {
			past = append(past, fmt.Sprintf("%d:%d", sh.ID, sh.Revision+1))
		}
	}
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	if code := do(t, c, "GET", c.URL(ids[0])+"/api/v1/watch?from_revisions="+url.QueryEscape(strings.Join(past, ",")), nil, &e); code != 400 || !strings.Contains(e.Error.Message, "lacks shard 4") {
		t.Fatalf("a vector past the split without shard 4: %d %+v", code, e)
	}
}

// Nodes restarted without --initial-cluster (it is for the first start
// only; the chaos suite restarts nodes so) still seed a range split off
// afterwards, with the voters of its source: the new shard runs on every
// node, gets a leader and serves its names through every node.
func TestSplitAfterRestartsWithoutInitialCluster(t *testing.T) {
	c, _ := sharded(t, 3)
	ids := c.IDs()
	c.Tune = func(rc *raftnode.Config) { rc.InitialCluster = nil }
	for _, id := range ids {
		c.Kill(id)
		c.Start(id)
	}
	splitAtQ(t, c, ids[0])
	for i, id := range ids {
		var a service.AcquireResponse
		name := fmt.Sprintf("romeo/after-restart-%d", i)
		if code := post(t, c, c.URL(id)+"/api/v1/locks/"+name+"/acquire", map[string]any{"client_id": "r", "ttl_ms": 10000, "request_id": "r-" + name}, &a); code != 200 || !a.Acquired {
			t.Fatalf("acquire %s through %s: %d %+v", name, id, code, a)
		}
	}
}
