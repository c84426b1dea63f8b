package server_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dlockv1 "github.com/dlock/dlock/api/dlock/v1"
	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
)

// lostAnswer is an acquire's answer when its grant was lost before the
// caller heard of it.
type lostAnswer struct {
	acquireAnswer
	FencingToken uint64 `json:"fencing_token"`
}

// proposeLostAcquire commits an acquire as if its reply had been lost on the
// way back: the cluster acted on it, the caller never heard.
func proposeLostAcquire(t *testing.T, c *testcluster.Cluster, node, name, client, requestID string, ttlMs, waitMs int64) command.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.Server(node).Node.Apply(ctx, &command.Envelope{ClientID: client, RequestID: requestID,
		Body: &command.Acquire{Name: name, TTLms: ttlMs, WaitMs: waitMs}})
	if err != nil {
		t.Fatalf("propose acquire %s: %v", requestID, err)
	}
	return resp.Result
}

// A retried acquire (same request_id) must learn the true fate of its first
// attempt. The 30-minute soak (seed 20261124) caught the service answering
// wait_timeout to the retry of a blocking acquire whose wait had been granted
// (others were told "held by c1, token 590") and whose unclaimed implicit
// lease had lapsed since: the wait was gone, so it looked like a timeout.
func TestRetriedAcquireLearnsItsGrant(t *testing.T) {
	c := testcluster.New(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	follower := c.Follower()
	hold := func(name string) acquireAnswer {
		code, a := acquire(t, c, leader, name, map[string]any{"client_id": "a", "ttl_ms": 30000})
		if code != 200 || !a.Acquired {
			t.Fatalf("a acquires %s: %d %+v", name, code, a)
		}
		return a
	}
	retry := func(name, requestID string, waitMs int64) (int, lostAnswer) {
		var ans lostAnswer
		code, err := c.Do(context.Background(), http.MethodPost, c.URL(follower)+"/api/v1/locks/"+name+"/acquire",
			map[string]any{"client_id": "c1", "ttl_ms": 1000, "wait_timeout_ms": waitMs, "request_id": requestID}, &ans)
		if err != nil {
			t.Fatalf("retry %s: %v", requestID, err)
		}
		return code, ans
	}

	t.Run("waited grant still held", func(t *testing.T) {
		a := hold("retry/live")
		if r := proposeLostAcquire(t, c, leader, "retry/live", "c1", "live-1", 30000, 60000); r.Status != command.StatusQueued {
			t.Fatalf("first attempt: %s, want queued", r.Status)
		}
		if code := release(t, c, leader, "retry/live", "a", a); code != 200 {
			t.Fatalf("release a: %d", code)
		}
		code, ans := retry("retry/live", "live-1", 500)
		if code != 200 || !ans.Acquired || ans.FencingToken != a.FencingToken+1 {
			t.Fatalf("retry of a granted wait: %d %+v, want the grant with token %d", code, ans, a.FencingToken+1)
		}
	})

	t.Run("waited grant lapsed", func(t *testing.T) {
		a := hold("retry/lapsed")
		if r := proposeLostAcquire(t, c, leader, "retry/lapsed", "c1", "lapsed-1", 1000, 60000); r.Status != command.StatusQueued {
			t.Fatalf("first attempt: %s, want queued", r.Status)
		}
		if code := release(t, c, leader, "retry/lapsed", "a", a); code != 200 {
			t.Fatalf("release a: %d", code)
		}
		v := getLock(t, c, leader, "retry/lapsed")
		if !v.Held || v.Holder.ClientID != "c1" || v.Holder.FencingToken != a.FencingToken+1 {
			t.Fatalf("after hand-off: %+v, want c1 with token %d", v, a.FencingToken+1)
		}
		// Nobody claims c1's grant, so its 1 s lease lapses.
		testutil.Eventually(t, 10*time.Second, "c1's unclaimed grant to lapse", func() bool { return !getLock(t, c, leader, "retry/lapsed").Held })
		code, ans := retry("retry/lapsed", "lapsed-1", 500)
		if code != http.StatusConflict || ans.Error.Code != "lock_lost" || ans.FencingToken != a.FencingToken+1 {
			t.Fatalf("retry of a granted, lapsed wait: %d %+v, want 409 lock_lost with token %d", code, ans, a.FencingToken+1)
		}
	})

	t.Run("immediate grant lapsed", func(t *testing.T) {
		r := proposeLostAcquire(t, c, leader, "retry/now", "c1", "now-1", 1000, 0)
		if r.Status != command.StatusOK {
			t.Fatalf("first attempt: %s, want ok", r.Status)
		}
		testutil.Eventually(t, 10*time.Second, "c1's unclaimed grant to lapse", func() bool { return !getLock(t, c, leader, "retry/now").Held })
		code, ans := retry("retry/now", "now-1", 0)
		if code != http.StatusConflict || ans.Error.Code != "lock_lost" || ans.FencingToken != r.Token {
			t.Fatalf("retry of a lapsed grant: %d %+v, want 409 lock_lost with token %d", code, ans, r.Token)
		}
	})

	t.Run("immediate grant lapsed, retried over gRPC", func(t *testing.T) {
		r := proposeLostAcquire(t, c, leader, "retry/grpc", "c1", "grpc-1", 1000, 0)
		if r.Status != command.StatusOK {
			t.Fatalf("first attempt: %s, want ok", r.Status)
		}
		testutil.Eventually(t, 10*time.Second, "c1's unclaimed grant to lapse", func() bool { return !getLock(t, c, leader, "retry/grpc").Held })
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := dlockv1.NewLockServiceClient(dialGRPC(t, c.GRPCAddr(follower))).Acquire(ctx,
			&dlockv1.AcquireRequest{Name: "retry/grpc", ClientId: "c1", TtlMs: 1000, RequestId: "grpc-1"})
		st := status.Convert(err)
		var d *dlockv1.ErrorDetail
		for _, x := range st.Details() {
			if ed, ok := x.(*dlockv1.ErrorDetail); ok {
				d = ed
			}
		}
		if st.Code() != codes.Aborted || d == nil || d.Code != "lock_lost" || d.FencingToken != r.Token {
			t.Fatalf("gRPC retry of a lapsed grant: %v %+v, want ABORTED lock_lost with token %d", st, d, r.Token)
		}
	})

	t.Run("wait that timed out", func(t *testing.T) {
		a := hold("retry/timeout")
		if r := proposeLostAcquire(t, c, leader, "retry/timeout", "c1", "timeout-1", 1000, 300); r.Status != command.StatusQueued {
			t.Fatalf("first attempt: %s, want queued", r.Status)
		}
		testutil.Eventually(t, 10*time.Second, "c1's wait to time out", func() bool { return getLock(t, c, leader, "retry/timeout").Waiters == 0 })
		// Free the lock first: a retry that acted again instead of learning
		// the first attempt's fate would now be granted, where one that
		// waited again behind a would time out just the same.
		if code := release(t, c, leader, "retry/timeout", "a", a); code != 200 {
			t.Fatalf("release a: %d", code)
		}
		code, ans := retry("retry/timeout", "timeout-1", 300)
		if code != http.StatusConflict || ans.Error.Code != "wait_timeout" {
			t.Fatalf("retry of a wait that timed out: %d %+v, want 409 wait_timeout", code, ans)
		}
		if v := getLock(t, c, leader, "retry/timeout"); v.Held || v.Waiters != 0 {
			t.Fatalf("the retry of a timed-out wait acted again: %+v", v)
		}
	})
}
