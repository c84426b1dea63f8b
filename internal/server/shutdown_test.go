package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	dlockv1 "github.com/dlock/dlock/api/dlock/v1"
	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A node shut down gracefully while a client waits in a lock's queue through
// it must withdraw that wait (design.md §5: a waiter whose request ends leaves
// the line) before Raft stops; a wait left behind would later be granted to
// nobody and hold the lock for a whole TTL. The client is told to go
// elsewhere: 503 with Retry-After.
func TestShutdownWithdrawsHTTPWait(t *testing.T) {
	c := testcluster.New(t, 3)
	leader := c.WaitLeader(20 * time.Second)
	follower := c.Follower()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var held service.AcquireResponse
	if code, err := c.Do(ctx, http.MethodPost, c.URL(leader)+"/api/v1/locks/shut/http/acquire",
		map[string]any{"client_id": "holder", "ttl_ms": 30000}, &held); err != nil || code != 200 {
		t.Fatalf("holder acquire: %d %v", code, err)
	}
	type answer struct {
		res *http.Response
		err error
	}
	got := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.URL(follower)+"/api/v1/locks/shut/http/acquire",
			strings.NewReader(`{"client_id":"waiter","ttl_ms":30000,"wait_timeout_ms":600000}`))
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err == nil {
			res.Body.Close()
		}
		got <- answer{res, err}
	}()
	testutil.Eventually(t, 5*time.Second, "waiter queued", func() bool { return getLock(t, c, leader, "shut/http").Waiters == 1 })
	start := time.Now()
	sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
	if err := c.Server(follower).Shutdown(sctx); err != nil {
		t.Errorf("shutdown: %v", err)
	}
	scancel()
	// The wait ended at once rather than holding the shutdown to its limit.
	if d := time.Since(start); d > 8*time.Second {
		t.Errorf("shutdown took %v: the queued acquire held it up", d)
	}
	a := <-got
	if a.err != nil || a.res.StatusCode != http.StatusServiceUnavailable || a.res.Header.Get("Retry-After") == "" {
		t.Fatalf("the waiter's answer: %+v %v, want 503 with Retry-After", a.res, a.err)
	}
	if v := getLock(t, c, leader, "shut/http"); v.Waiters != 0 {
		t.Fatalf("after its node shut down, the waiter is still queued: %+v", v)
	}
	// And the lock goes to nobody when the holder releases.
	if code, err := c.Do(ctx, http.MethodPost, c.URL(leader)+"/api/v1/locks/shut/http/release",
		map[string]any{"client_id": "holder", "fencing_token": held.FencingToken, "lease_id": held.LeaseID}, nil); err != nil || code != 200 {
		t.Fatalf("release: %d %v", code, err)
	}
	if v := getLock(t, c, leader, "shut/http"); v.Holder != nil {
		t.Fatalf("after the release, the lock is held by %+v", v.Holder)
	}
}

// The same over gRPC.
func TestShutdownWithdrawsGRPCWait(t *testing.T) {
	c := testcluster.New(t, 3)
	leader := c.WaitLeader(20 * time.Second)
	follower := c.Follower()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	locks := dlockv1.NewLockServiceClient(dialGRPC(t, c.GRPCAddr(follower)))
	if _, err := locks.Acquire(ctx, &dlockv1.AcquireRequest{Name: "shut/grpc", ClientId: "holder", TtlMs: 30000}); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := locks.Acquire(ctx, &dlockv1.AcquireRequest{Name: "shut/grpc", ClientId: "waiter", TtlMs: 30000, WaitTimeoutMs: 600000})
		got <- err
	}()
	testutil.Eventually(t, 5*time.Second, "waiter queued", func() bool { return getLock(t, c, leader, "shut/grpc").Waiters == 1 })
	sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
	_ = c.Server(follower).Shutdown(sctx)
	scancel()
	if err := <-got; status.Code(err) != codes.Unavailable {
		t.Fatalf("the waiter's answer: %v, want Unavailable", err)
	}
	if v := getLock(t, c, leader, "shut/grpc"); v.Waiters != 0 {
		t.Fatalf("after its node shut down, the waiter is still queued: %+v", v)
	}
}
