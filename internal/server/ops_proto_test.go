package server_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dlockv1 "github.com/dlock/dlock/api/dlock/v1"
	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/testcluster"
)

// grpcDetail is the ErrorDetail of a gRPC error.
func grpcDetail(t *testing.T, err error) (codes.Code, *dlockv1.ErrorDetail) {
	t.Helper()
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if ed, ok := d.(*dlockv1.ErrorDetail); ok {
			return st.Code(), ed
		}
	}
	t.Fatalf("error %v has no ErrorDetail", err)
	return 0, nil
}

// The history, revoke, value and lock-delay over gRPC: the same answers and
// error codes as HTTP (lock_lost with its token, lock_delayed with the time
// left), through a follower.
func TestHistoryAndRevokeOverGRPC(t *testing.T) {
	c := testcluster.New(t, 3)
	c.WaitLeader(10 * time.Second)
	locks := dlockv1.NewLockServiceClient(dialGRPC(t, c.GRPCAddr(c.Follower())))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, err := locks.Acquire(ctx, &dlockv1.AcquireRequest{Name: "g/job", ClientId: "w1", TtlMs: 30000, Value: "pid 7", LockDelayMs: 60000})
	if err != nil {
		t.Fatal(err)
	}
	v := "pid 7, step 2"
	if _, err := locks.Renew(ctx, &dlockv1.RenewRequest{Name: "g/job", ClientId: "w1", FencingToken: a.FencingToken, LeaseId: a.LeaseId, Value: &v}); err != nil {
		t.Fatal(err)
	}
	gl, err := locks.GetLock(ctx, &dlockv1.GetLockRequest{Name: "g/job"})
	if err != nil || gl.Lock.Value != v {
		t.Fatalf("GetLock: %v %+v", err, gl)
	}
	rv, err := locks.Revoke(ctx, &dlockv1.RevokeRequest{Name: "g/job", Reason: "stuck"})
	if err != nil || !rv.Revoked || len(rv.FencingTokens) != 1 || rv.FencingTokens[0] != a.FencingToken {
		t.Fatalf("Revoke: %v %+v", err, rv)
	}
	_, err = locks.Renew(ctx, &dlockv1.RenewRequest{Name: "g/job", ClientId: "w1", FencingToken: a.FencingToken, LeaseId: a.LeaseId})
	if code, d := grpcDetail(t, err); code != codes.Aborted || d.Code != "lock_lost" || d.FencingToken != a.FencingToken {
		t.Fatalf("renew of the revoked grant: %v %+v", code, d)
	}
	_, err = locks.Acquire(ctx, &dlockv1.AcquireRequest{Name: "g/job", ClientId: "w2", TtlMs: 30000})
	if code, d := grpcDetail(t, err); code != codes.FailedPrecondition || d.Code != "lock_delayed" || d.RetryAfterMs <= 0 || d.RetryAfterMs > 60000 {
		t.Fatalf("acquire in the lock-delay: %v %+v", code, d)
	}
	h, err := locks.GetHistory(ctx, &dlockv1.GetHistoryRequest{Name: "g/job"})
	if err != nil || len(h.Grants) != 1 {
		t.Fatalf("GetHistory: %v %+v", err, h)
	}
	if g := h.Grants[0]; g.EndCause != "revoked" || g.Reason != "stuck" || g.Value != v || g.FencingToken != a.FencingToken || g.LockDelayMs != 60000 || g.EndedAt == nil {
		t.Fatalf("the revoked grant: %+v", g)
	}
	_, err = locks.Revoke(ctx, &dlockv1.RevokeRequest{Name: "g/job", FencingToken: a.FencingToken, Reason: "again"})
	if code, d := grpcDetail(t, err); code != codes.NotFound || d.Code != "not_found" {
		t.Fatalf("revoke of an ended grant: %v %+v", code, d)
	}
}

// The same over one WebSocket connection: the history and revoke ops.
func TestHistoryAndRevokeOverWebSocket(t *testing.T) {
	c := testcluster.New(t, 3)
	c.WaitLeader(10 * time.Second)
	w := wsDial(t, c, c.Follower())
	w.send(map[string]any{"id": "1", "op": "acquire", "name": "ws/job", "client_id": "w1", "ttl_ms": 30000, "value": "pid 9"})
	a := w.answer("1")
	var g service.AcquireResponse
	if a.Error != nil || json.Unmarshal(a.Result, &g) != nil || !g.Acquired {
		t.Fatalf("acquire: %+v", a)
	}
	w.send(map[string]any{"id": "2", "op": "revoke", "name": "ws/job", "fencing_token": g.FencingToken, "reason": "stuck"})
	if a := w.answer("2"); a.Error != nil {
		t.Fatalf("revoke: %+v", a.Error)
	}
	w.send(map[string]any{"id": "3", "op": "history", "name": "ws/job", "limit": 5})
	a = w.answer("3")
	var h service.HistoryResponse
	if a.Error != nil || json.Unmarshal(a.Result, &h) != nil || len(h.Grants) != 1 || h.Grants[0].EndCause != "revoked" || h.Grants[0].Value != "pid 9" {
		t.Fatalf("history: %+v %s", a.Error, a.Result)
	}
	w.send(map[string]any{"id": "4", "op": "revoke", "name": "ws/job", "kind": "bogus", "reason": "x"})
	if a := w.answer("4"); a.Error == nil || a.Error.Code != "invalid_argument" {
		t.Fatalf("revoke with a bad kind: %+v", a)
	}
}
