package server_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/testcluster"
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
	waitFor(t, 10*time.Second, "the waiter queued, as the follower knows", func() bool {
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
