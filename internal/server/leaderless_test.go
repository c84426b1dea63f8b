package server_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	dlockv1 "github.com/dlock/dlock/api/dlock/v1"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
)

// A client queued through a node that then loses the majority is told
// no_leader instead of waiting out its wait_timeout on a node that would never
// hear of its grant; its place in line is kept, and its retry with the same
// request_id through another node, once there is a leader, is granted when
// the holder lets go.
func TestQueuedAcquireOnNodeWithoutLeaderMovesOn(t *testing.T) {
	c := testcluster.New(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	follower := c.Follower()
	code, held := acquire(t, c, leader, "q", map[string]any{"client_id": "holder", "ttl_ms": 60000})
	if code != 200 {
		t.Fatalf("holder's acquire: %d %+v", code, held)
	}
	type answer struct {
		code int
		a    acquireAnswer
	}
	waiter := map[string]any{"client_id": "waiter", "ttl_ms": 30000, "wait_timeout_ms": 120000, "request_id": "waiter-1"}
	done := make(chan answer, 1)
	go func() {
		var a acquireAnswer
		var e errBody
		code, err := c.Do(context.Background(), http.MethodPost, c.URL(follower)+"/api/v1/locks/q/acquire", waiter, &e)
		a.Error.Code = e.Error.Code
		if err != nil {
			code = -1
		}
		done <- answer{code, a}
	}()
	testutil.Eventually(t, 10*time.Second, "the waiter queued, as the follower knows", func() bool {
		var v struct{ Waiters int }
		code, err := c.Do(context.Background(), http.MethodGet, c.URL(follower)+"/api/v1/locks/q?stale=true", nil, &v)
		return err == nil && code == 200 && v.Waiters == 1
	})

	var others []string
	for _, id := range c.IDs() {
		if id != follower {
			others = append(others, id)
			c.Kill(id)
		}
	}
	select {
	case ans := <-done:
		if ans.code != http.StatusServiceUnavailable || ans.a.Error.Code != "no_leader" {
			t.Fatalf("the queued acquire on a node without a majority: %d %+v; want 503 no_leader", ans.code, ans.a)
		}
	case <-time.After(60 * time.Second): // hang guard only; the wait itself is 120 s
		t.Fatal("the queued acquire kept waiting on a node without a majority")
	}

	for _, id := range others {
		c.Start(id)
	}
	leader = c.WaitLeader(20 * time.Second)
	if v := getLock(t, c, leader, "q"); !v.Held || v.Holder.ClientID != "holder" || v.Waiters != 1 {
		t.Fatalf("after the restart: %+v; want held by holder with the waiter still in line", v)
	}
	if code := release(t, c, leader, "q", "holder", held); code != 200 {
		t.Fatalf("holder's release: %d", code)
	}
	code, got := acquire(t, c, others[0], "q", waiter) // the same request, through another node
	if code != 200 || !got.Acquired || got.FencingToken <= held.FencingToken {
		t.Fatalf("the waiter's retry with its request_id: %d %+v; want the grant its place in line earned", code, got)
	}
}

// A ?stale=true answer says how fresh it is (as Consul's X-Consul-KnownLeader
// and X-Consul-LastContact do): whether the answering node knew a leader and
// how long ago it last heard from it, over HTTP as headers and over gRPC as
// header metadata. A node cut off from the majority keeps answering from its
// own, no longer moving, state, and says so. Linearizable answers carry none.
func TestStaleReadSaysHowFresh(t *testing.T) {
	c := testcluster.New(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	follower := c.Follower()
	if code, _ := acquire(t, c, leader, "fresh/x", map[string]any{"client_id": "c", "ttl_ms": 60000}); code != 200 {
		t.Fatalf("acquire: %d", code)
	}
	paths := []string{"/api/v1/locks/fresh/x?stale=true", "/api/v1/locks?prefix=fresh/&stale=true", "/api/v1/elections/fresh/e?stale=true"}
	get := func(id, path string) http.Header {
		t.Helper()
		res, err := http.Get(c.URL(id) + path)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Fatalf("GET %s on %s: %d", path, id, res.StatusCode)
		}
		return res.Header
	}
	lastContact := func(h http.Header) int64 {
		t.Helper()
		ms, err := strconv.ParseInt(h.Get("X-Dlock-Last-Contact"), 10, 64)
		if err != nil || ms < 0 {
			t.Fatalf("X-Dlock-Last-Contact %q: want milliseconds", h.Get("X-Dlock-Last-Contact"))
		}
		return ms
	}
	for _, p := range paths {
		if h := get(leader, p); h.Get("X-Dlock-Known-Leader") != "true" || lastContact(h) != 0 {
			t.Errorf("%s on the leader: headers %v; want known leader, last contact 0", p, h)
		}
		if h := get(follower, p); h.Get("X-Dlock-Known-Leader") != "true" || lastContact(h) > 5000 {
			t.Errorf("%s on a follower: headers %v; want known leader, recent contact", p, h)
		}
		linearizable := strings.Replace(strings.Replace(p, "&stale=true", "", 1), "?stale=true", "", 1)
		if h := get(follower, linearizable); h.Get("X-Dlock-Known-Leader") != "" || h.Get("X-Dlock-Last-Contact") != "" {
			t.Errorf("%s (linearizable): headers %v; want no staleness headers", linearizable, h)
		}
	}
	cc := dialGRPC(t, c.GRPCAddr(follower))
	var md metadata.MD
	if _, err := dlockv1.NewLockServiceClient(cc).GetLock(context.Background(), &dlockv1.GetLockRequest{Name: "fresh/x", Stale: true}, grpc.Header(&md)); err != nil {
		t.Fatal(err)
	}
	if k, lc := md.Get("x-dlock-known-leader"), md.Get("x-dlock-last-contact"); len(k) != 1 || k[0] != "true" || len(lc) != 1 {
		t.Errorf("gRPC stale GetLock on a follower: metadata %v; want x-dlock-known-leader true and x-dlock-last-contact", md)
	}

	for _, id := range c.IDs() {
		if id != follower {
			c.Kill(id)
		}
	}
	var h http.Header
	testutil.Eventually(t, 30*time.Second, "the cut-off node says it knows no leader", func() bool {
		h = get(follower, paths[0])
		return h.Get("X-Dlock-Known-Leader") == "false"
	})
	time.Sleep(300 * time.Millisecond)
	if h = get(follower, paths[0]); h.Get("X-Dlock-Known-Leader") != "false" || lastContact(h) < 300 {
		t.Fatalf("stale read on the cut-off node: headers %v; want no known leader and a last contact of at least 300 ms", h)
	}
}
