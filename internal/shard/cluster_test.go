package shard_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	dlockv1 "github.com/dlock/dlock/api/dlock/v1"
	"github.com/dlock/dlock/fence"
	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/shard"
	"github.com/dlock/dlock/internal/state"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
)

// names has two names in every range of the default 4-shard map.
var names = []string{"alpha/job", "Zulu", "golf", "mike/x/y", "november", "oscar/a", "tango", "zebra/b"}

func sharded(t *testing.T, n int) (*testcluster.Cluster, shard.Map) {
	m, err := shard.NewMap(shard.DefaultBounds(4))
	if err != nil {
		t.Fatal(err)
	}
	c := testcluster.NewWith(t, n, testcluster.Options{Shards: &m})
	waitSpread(t, c, m)
	return c, m
}

// shardedOf starts n nodes with the default map of shards ranges and waits
// until every shard has a leader (anywhere: the leaders need not spread).
func shardedOf(t *testing.T, n, shards int) (*testcluster.Cluster, shard.Map) {
	t.Helper()
	m, err := shard.NewMap(shard.DefaultBounds(shards))
	if err != nil {
		t.Fatal(err)
	}
	c := testcluster.NewWith(t, n, testcluster.Options{Shards: &m})
	testutil.Eventually(t, 60*time.Second, "every shard has a leader", func() error {
		for _, l := range leaders(c, m) {
			if l == "" {
				return fmt.Errorf("leaders %v", leaders(c, m))
			}
		}
		return nil
	})
	return c, m
}

// joinVoter joins a new node and waits until it is a voter of the meta group.
func joinVoter(t *testing.T, c *testcluster.Cluster) string {
	t.Helper()
	id := c.Join()
	testutil.Eventually(t, 60*time.Second, id+" is a voter of the meta group", func() error {
		if ms, _ := memberIDs(t, c, "n2"); ms[id] != "voter" {
			return fmt.Errorf("members %v", ms)
		}
		return nil
	})
	return id
}

// leaders maps each shard to the node whose group leads it and is ready.
func leaders(c *testcluster.Cluster, m shard.Map) []string {
	out := make([]string, m.N())
	for _, id := range c.Running() {
		for k, n := range c.Server(id).Shards() {
			if n.IsLeader() {
				out[k] = id
			}
		}
	}
	return out
}

// waitSpread waits until every shard's leader is its preferred node among
// the running ones.
func waitSpread(t *testing.T, c *testcluster.Cluster, m shard.Map) {
	t.Helper()
	testutil.Eventually(t, 60*time.Second, "shard leaders spread", func() error {
		got := leaders(c, m)
		for k := range got {
			if want := shard.Preferred(k, c.Running()); got[k] != want {
				return fmt.Errorf("shard leaders %v; shard %d should be led by %s", got, k, want)
			}
		}
		return nil
	})
}

func do(t *testing.T, c *testcluster.Cluster, method, u string, body, out any) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code, err := c.Do(ctx, method, u, body, out)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	return code
}

type sse struct {
	id, typ string
	ev      service.WatchEvent
}

// watch opens an SSE stream and delivers its records until the test ends.
func watch(t *testing.T, c *testcluster.Cluster, u string) <-chan sse {
	t.Helper()
	return watchCtx(t, context.Background(), u)
}

// watchCtx is watch, ended early by ctx.
func watchCtx(t *testing.T, ctx context.Context, u string) <-chan sse {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != 200 {
		t.Fatalf("watch %s: status %d", u, res.StatusCode)
	}
	out := make(chan sse, 1024)
	go func() {
		defer res.Body.Close()
		defer close(out)
		sc := bufio.NewScanner(res.Body)
		var cur sse
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "id: "):
				cur.id = line[4:]
			case strings.HasPrefix(line, "event: "):
				cur.typ = line[7:]
			case strings.HasPrefix(line, "data: "):
				_ = json.Unmarshal([]byte(line[6:]), &cur.ev)
				select {
				case out <- cur:
				case <-ctx.Done():
					return
				}
				cur = sse{}
			}
		}
	}()
	return out
}

// next reads stream records until fn has seen enough (fn returns true).
func next(t *testing.T, ch <-chan sse, fn func(sse) bool) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case r, ok := <-ch:
			if !ok {
				t.Fatal("watch stream ended")
			}
			if fn(r) {
				return
			}
		case <-timeout:
			t.Fatal("watch: no such event within 30s")
		}
	}
}

func TestShardedClusterRoutesListsAndWatches(t *testing.T) {
	c, m := sharded(t, 3)
	ids := c.IDs()
	// Everything through the node that leads fewest shards, so most calls
	// are forwarded to another node's group.
	via := c.URL(ids[2])
	stream := watch(t, c, via+"/api/v1/watch")

	tokens, leases := map[string]uint64{}, map[string]string{}
	var grants []service.AcquireResponse
	for i, name := range names {
		var a service.AcquireResponse
		if code := do(t, c, "POST", via+"/api/v1/locks/"+name+"/acquire", map[string]any{"client_id": fmt.Sprintf("c%d", i), "ttl_ms": 60000}, &a); code != 200 || !a.Acquired {
			t.Fatalf("acquire %s: %d %+v", name, code, a)
		}
		tokens[name], leases[name] = a.FencingToken, a.LeaseID
		grants = append(grants, a)
	}
	// Each shard signs with its own key; the one key set verifies them all.
	res, err := http.Get(via + "/api/v1/cluster/token-key")
	if err != nil {
		t.Fatal(err)
	}
	var doc fence.KeySetDocument
	err = json.NewDecoder(res.Body).Decode(&doc)
	res.Body.Close()
	if err != nil || len(doc.Keys) != m.N() {
		t.Fatalf("token keys: %v, %d keys, want one per shard", err, len(doc.Keys))
	}
	ks, err := fence.NewKeySetFromDocument(doc)
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range grants {
		if err := ks.Verify(names[i], a.FencingToken, fmt.Sprintf("c%d", i), a.LeaseRef, a.TokenProof); err != nil {
			t.Fatalf("proof of %s (shard %d): %v", names[i], m.Lookup(names[i]), err)
		}
	}
	// Each name lives in its own shard's state, and only there.
	for _, id := range ids {
		for k, n := range c.Server(id).Shards() {
			testutil.Eventually(t, 20*time.Second, "every shard holds its names", func() error {
				var held []string
				n.FSM().Read(func(st *state.State) {
					infos, _ := st.ListLocks("", "", 100)
					for _, li := range infos {
						held = append(held, li.Name)
					}
				})
				var want []string
				for _, name := range names {
					if m.Lookup(name) == k {
						want = append(want, name)
					}
				}
				slices.Sort(want)
				if !slices.Equal(held, want) {
					return fmt.Errorf("node %s shard %d holds %v, want %v", id, k, held, want)
				}
				return nil
			})
		}
	}
	// Each shard counts its own tokens: the first grant of every shard is 1.
	for k := 0; k < m.N(); k++ {
		var first []uint64
		for _, name := range names {
			if m.Lookup(name) == k {
				first = append(first, tokens[name])
			}
		}
		if slices.Min(first) != 1 {
			t.Errorf("shard %d's tokens %v: each shard's counter should start at 1", k, first)
		}
	}

	// The list merges every shard in name order, with each shard's revision.
	var list service.ListResponse
	if code := do(t, c, "GET", via+"/api/v1/locks?prefix=", nil, &list); code != 200 {
		t.Fatalf("list: %d", code)
	}
	var got []string
	for _, l := range list.Locks {
		got = append(got, l.Name)
	}
	want := slices.Clone(names)
	slices.Sort(want)
	if !slices.Equal(got, want) || len(list.Revisions) != 4 {
		t.Fatalf("list = %v revisions %v, want %v and 4 revisions", got, list.Revisions, want)
	}
	// Paging across shards keeps name order.
	var page service.ListResponse
	do(t, c, "GET", via+"/api/v1/locks?limit=3&after="+url.QueryEscape(want[2]), nil, &page)
	if len(page.Locks) != 3 || page.Locks[0].Name != want[3] || page.Locks[2].Name != want[5] || !page.More {
		t.Fatalf("page after %s = %+v, want %v", want[2], page.Locks, want[3:6])
	}
	// One prefix inside one top-level segment is one shard's answer.
	var one service.ListResponse
	do(t, c, "GET", via+"/api/v1/locks?prefix=mike/", nil, &one)
	if len(one.Locks) != 1 || one.Revisions != nil || one.Revision == 0 {
		t.Fatalf("list prefix mike/ = %+v", one)
	}

	// The watch over everything sees every grant once, each with its shard.
	seen := map[string]int{}
	var lastID string
	next(t, stream, func(r sse) bool {
		if r.ev.Shard == nil || len(r.ev.Revisions) != 4 {
			t.Fatalf("merged event without shard or revision vector: %+v", r)
		}
		if r.ev.Kind == "lock" && r.ev.Type == "acquired" {
			seen[r.ev.Name]++
			if *r.ev.Shard != m.Lookup(r.ev.Name) {
				t.Fatalf("event %s says shard %d, map says %d", r.ev.Name, *r.ev.Shard, m.Lookup(r.ev.Name))
			}
		}
		lastID = r.id
		return len(seen) == len(names)
	})
	for name, n := range seen {
		if n != 1 {
			t.Fatalf("grant of %s seen %d times", name, n)
		}
	}

	// Resume from the vector: the next events, none of the earlier ones.
	// (on another node: every node has every shard's events).
	resume := bumpVector(t, lastID)
	for i, name := range names {
		if code := do(t, c, "POST", via+"/api/v1/locks/"+name+"/release", map[string]any{"client_id": fmt.Sprintf("c%d", i), "fencing_token": tokens[name], "lease_id": leases[name]}, nil); code != 200 {
			t.Fatalf("release %s: %d", name, code)
		}
	}
	resumed := watch(t, c, c.URL(ids[0])+"/api/v1/watch?from_revisions="+url.QueryEscape(resume))
	gone := map[string]int{}
	next(t, resumed, func(r sse) bool {
		if r.ev.Type != "released" {
			t.Fatalf("resumed stream delivered %s %s: the vector should start right after the grants", r.ev.Type, r.ev.Name)
		}
		gone[r.ev.Name]++
		return len(gone) == len(names)
	})
	for name, n := range gone {
		if n != 1 {
			t.Fatalf("release of %s seen %d times", name, n)
		}
	}
}

// bumpVector turns an SSE id "0:5,1:7" into the resume vector "0:6,1:8".
func bumpVector(t *testing.T, id string) string {
	var parts []string
	for _, p := range strings.Split(id, ",") {
		var k int
		var r uint64
		if _, err := fmt.Sscanf(p, "%d:%d", &k, &r); err != nil {
			t.Fatalf("bad vector id %q", id)
		}
		parts = append(parts, fmt.Sprintf("%d:%d", k, r+1))
	}
	return strings.Join(parts, ",")
}

// TestShardedFailoverKeepsHoldersAndWaiters kills the node that leads two
// shards: both fail over to the survivors with their holders (same tokens)
// and waiters, a session holds locks on every shard through it, and once
// the node returns the leaders spread back.
func TestShardedFailoverKeepsHoldersAndWaiters(t *testing.T) {
	c, m := sharded(t, 3)
	ids := c.IDs()
	victim := shard.Preferred(0, ids) // leads shards 0 and 3
	var via string
	for _, id := range ids {
		if id != victim {
			via = c.URL(id)
			break
		}
	}
	// One session, locks on every shard.
	var sess service.SessionResponse
	if code := do(t, c, "POST", via+"/api/v1/sessions", map[string]any{"client_id": "holder", "ttl_ms": 20000}, &sess); code != 201 {
		t.Fatalf("session create: %d", code)
	}
	tokens := map[string]uint64{}
	for _, name := range names {
		var a service.AcquireResponse
		if code := do(t, c, "POST", via+"/api/v1/locks/"+name+"/acquire", map[string]any{"client_id": "holder", "session_id": sess.SessionID}, &a); code != 200 || !a.Acquired {
			t.Fatalf("acquire %s with the session: %d %+v", name, code, a)
		}
		tokens[name] = a.FencingToken
	}
	// A waiter on a lock of a shard the victim leads, queued through a
	// survivor; its request stays open across the failover.
	waited := make(chan service.AcquireResponse, 1)
	go func() {
		var a service.AcquireResponse
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		_, _ = c.Do(ctx, "POST", via+"/api/v1/locks/alpha/job/acquire", map[string]any{"client_id": "waiter", "ttl_ms": 20000, "wait_timeout_ms": 50000}, &a)
		waited <- a
	}()
	testutil.Eventually(t, 20*time.Second, "the waiter is queued", func() error {
		var v service.LockView
		do(t, c, "GET", via+"/api/v1/locks/alpha/job", nil, &v)
		if len(v.Queue) != 1 {
			return fmt.Errorf("queue %+v", v.Queue)
		}
		return nil
	})

	c.Kill(victim)
	testutil.Eventually(t, 30*time.Second, "every shard the victim led has a new leader", func() error {
		got := leaders(c, m)
		for k, l := range got {
			if l == "" || l == victim {
				return fmt.Errorf("shard %d leader %q", k, l)
			}
		}
		return nil
	})
	// Holders keep their grants and tokens, the waiter its place; the
	// session's one keepalive renews it on every shard.
	var ka service.KeepAliveResponse
	if code := do(t, c, "POST", via+"/api/v1/sessions/"+sess.SessionID+"/keepalive", map[string]any{}, &ka); code != 200 {
		t.Fatalf("keepalive after failover: %d", code)
	}
	for _, name := range names {
		var v service.LockView
		do(t, c, "GET", via+"/api/v1/locks/"+name, nil, &v)
		if !v.Held || v.Holder == nil || v.Holder.FencingToken != tokens[name] {
			t.Fatalf("after failover %s = %+v, want held with token %d", name, v, tokens[name])
		}
	}
	// An operator revokes the session's grant on the last shard: the
	// session's one keepalive, through any node, names it as lost.
	var rv map[string]any
	if code := do(t, c, "POST", via+"/api/v1/locks/zebra/b/revoke", map[string]any{"reason": "stuck"}, &rv); code != 200 {
		t.Fatalf("revoke zebra/b: %d %v", code, rv)
	}
	var lost service.KeepAliveResponse
	if code := do(t, c, "POST", via+"/api/v1/sessions/"+sess.SessionID+"/keepalive", map[string]any{"lost_after": 1 << 40}, &lost); code != 200 {
		t.Fatalf("keepalive after revoke: %d", code)
	}
	if len(lost.Lost) != 1 || lost.Lost[0].Name != "zebra/b" || lost.Lost[0].FencingToken != tokens["zebra/b"] || lost.Lost[0].Cause != "revoked" || lost.Revision != 0 {
		t.Fatalf("keepalive after revoking zebra/b: %+v, want zebra/b token %d revoked, revision 0", lost, tokens["zebra/b"])
	}
	delete(tokens, "zebra/b")
	// Ending the session releases every shard's locks; the waiter is
	// granted with a higher token than the holder's.
	var del service.DeleteSessionResponse
	if code := do(t, c, "DELETE", via+"/api/v1/sessions/"+sess.SessionID, nil, &del); code != 200 || !del.Deleted {
		t.Fatalf("session delete: %d %+v", code, del)
	}
	select {
	case a := <-waited:
		if !a.Acquired || a.FencingToken <= tokens["alpha/job"] {
			t.Fatalf("waiter got %+v after the holder's token %d", a, tokens["alpha/job"])
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the waiter was not granted after the session ended")
	}
	var list service.ListResponse
	do(t, c, "GET", via+"/api/v1/locks", nil, &list)
	if len(list.Locks) != 1 || list.Locks[0].Name != "alpha/job" {
		t.Fatalf("after the session ended the locks are %+v, want only the waiter's", list.Locks)
	}

	// The victim returns: leaders spread back to it.
	c.Start(victim)
	waitSpread(t, c, m)
}

// TestShardedGRPC: the gRPC API routes through the same router: a session
// made over gRPC holds locks on two shards and the list merges them.
func TestShardedGRPC(t *testing.T) {
	c, m := sharded(t, 3)
	cc, err := grpc.NewClient(c.GRPCAddr(c.IDs()[1]), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	locks, sessions := dlockv1.NewLockServiceClient(cc), dlockv1.NewSessionServiceClient(cc)
	s, err := sessions.CreateSession(ctx, &dlockv1.CreateSessionRequest{ClientId: "g", TtlMs: 20000})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"zebra/z", "alpha/a"} {
		a, err := locks.Acquire(ctx, &dlockv1.AcquireRequest{Name: name, ClientId: "g", SessionId: s.SessionId})
		if err != nil || !a.Acquired {
			t.Fatalf("gRPC acquire %s: %v %v", name, a, err)
		}
	}
	if m.Lookup("zebra/z") == m.Lookup("alpha/a") {
		t.Fatal("the test's names should be on two shards")
	}
	if _, err := sessions.KeepAlive(ctx, &dlockv1.KeepAliveRequest{SessionId: s.SessionId}); err != nil {
		t.Fatalf("gRPC keepalive: %v", err)
	}
	l, err := locks.ListLocks(ctx, &dlockv1.ListLocksRequest{})
	if err != nil || len(l.Locks) != 2 || l.Locks[0].Name != "alpha/a" || l.Locks[1].Name != "zebra/z" {
		t.Fatalf("gRPC list: %v %v", l, err)
	}
	if _, err := sessions.DeleteSession(ctx, &dlockv1.DeleteSessionRequest{SessionId: s.SessionId}); err != nil {
		t.Fatalf("gRPC delete session: %v", err)
	}
	if l, err = locks.ListLocks(ctx, &dlockv1.ListLocksRequest{}); err != nil || len(l.Locks) != 0 {
		t.Fatalf("after the session ended, gRPC list: %v %v", l, err)
	}
}
