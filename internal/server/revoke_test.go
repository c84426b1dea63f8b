package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	dlockv1 "github.com/dlock/dlock/api/dlock/v1"
	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
)

func bearerHeader(token string) http.Header {
	return http.Header{"Authorization": {"Bearer " + token}}
}

// Revoking a token ends what it started: its open watch streams (SSE, gRPC,
// WebSocket) end with permission_denied, and its queued acquire is withdrawn
// through Raft and answered permission_denied — so releasing the holder
// grants nothing to it.
func TestRevokedTokenEndsItsStreamsAndWaits(t *testing.T) {
	c := testcluster.NewWith(t, 3, testcluster.Options{ACL: true})
	leader := c.WaitLeader(10 * time.Second)
	node := c.Follower()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	var root service.ACLTokenView
	if code, ec := aclDo(t, c, leader, "", "POST", "/api/v1/acl/bootstrap", nil, &root); code != 200 {
		t.Fatalf("bootstrap: %d %s", code, ec)
	}
	var tok service.ACLTokenView
	if code, ec := aclDo(t, c, leader, root.SecretID, "POST", "/api/v1/acl/tokens", service.ACLTokenRequest{
		Rules: []service.ACLRule{{Prefix: "jobs/", Permissions: []string{"lock", "watch", "read"}}}}, &tok); code != 200 {
		t.Fatalf("create token: %d %s", code, ec)
	}
	T := tok.SecretID
	// The holder uses the root token, which stays valid.
	var held service.AcquireResponse
	if code, ec := aclDo(t, c, leader, root.SecretID, "POST", "/api/v1/locks/jobs/x/acquire", map[string]any{"client_id": "holder", "ttl_ms": 60000}, &held); code != 200 {
		t.Fatalf("holder acquires: %d %s", code, ec)
	}
	// Let the follower know the token before it is used there.
	testutil.Eventually(t, 5*time.Second, "token applied on "+node, func() bool {
		code, _ := aclDo(t, c, node, T, "GET", "/api/v1/locks/jobs/x", nil, nil)
		return code == 200
	})

	code, sseEvents := sseWith(t, ctx, c.URL(node)+"/api/v1/watch?prefix=jobs/", bearerHeader(T))
	if code != 200 {
		t.Fatalf("SSE watch: %d", code)
	}
	gctx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+T)
	gw, err := dlockv1.NewWatchServiceClient(dialGRPC(t, c.GRPCAddr(node))).Watch(gctx, &dlockv1.WatchRequest{Prefix: "jobs/"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gw.Header(); err != nil {
		t.Fatalf("gRPC watch: %v", err)
	}
	ws := wsDialWith(t, c, node, bearerHeader(T))
	ws.send(map[string]any{"id": "w", "op": "watch", "prefix": "jobs/"})
	if a := ws.answer("w"); a.Error != nil {
		t.Fatalf("WebSocket watch: %+v", a.Error)
	}

	type result struct {
		code int
		ec   string
	}
	waited := make(chan result, 1)
	go func() {
		// Not aclDo: it may call t.Fatal, which only the test's goroutine may.
		req, _ := http.NewRequest("POST", c.URL(node)+"/api/v1/locks/jobs/x/acquire",
			strings.NewReader(`{"client_id":"waiter","ttl_ms":60000,"wait_timeout_ms":50000}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+T)
		res, err := c.Client.Do(req)
		if err != nil {
			waited <- result{0, err.Error()}
			return
		}
		defer res.Body.Close()
		var e errBody
		_ = decodeInto(readAll(res.Body), &e)
		waited <- result{res.StatusCode, e.Error.Code}
	}()
	testutil.Eventually(t, 10*time.Second, "the acquire queued", func() bool {
		var v service.LockView
		code, _ := aclDo(t, c, leader, root.SecretID, "GET", "/api/v1/locks/jobs/x", nil, &v)
		return code == 200 && v.Waiters == 1
	})
	// The queued event reached every stream.
	if rec := <-sseEvents; rec.event != "queued" {
		t.Fatalf("SSE: %+v", rec)
	}

	if code, ec := aclDo(t, c, leader, root.SecretID, "DELETE", "/api/v1/acl/tokens/"+tok.AccessorID, nil, nil); code != 200 {
		t.Fatalf("revoke: %d %s", code, ec)
	}

	select {
	case r := <-waited:
		if r.code != 403 || r.ec != "permission_denied" {
			t.Fatalf("queued acquire after revocation: %d %s, want 403 permission_denied", r.code, r.ec)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the queued acquire of a revoked token still waits")
	}
	sawErr := false
	for rec := range sseEvents {
		if rec.event == "error" {
			sawErr = strings.Contains(rec.data, "permission_denied")
		}
	}
	if !sawErr {
		t.Fatal("the SSE stream ended without a permission_denied error record")
	}
	for {
		_, err := gw.Recv()
		if err == nil {
			continue
		}
		if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("gRPC watch after revocation: %v", err)
		}
		break
	}
	// The WebSocket connection itself was opened with the token: its watch
	// may still report permission_denied, and then the server closes it.
	for open := true; open; {
		select {
		case a, ok := <-ws.in:
			switch {
			case !ok:
				open = false
			case a.Op == "event":
			case a.ID != "w" || a.Error == nil || a.Error.Code != "permission_denied":
				t.Fatalf("WebSocket after revocation: %+v", a)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the WebSocket connection of a revoked token is still open")
		}
	}

	// The wait is gone: releasing the holder leaves the lock free.
	var v service.LockView
	if code, _ := aclDo(t, c, leader, root.SecretID, "GET", "/api/v1/locks/jobs/x", nil, &v); code != 200 || v.Waiters != 0 {
		t.Fatalf("after revocation the lock still has %d waiters", v.Waiters)
	}
	if code, ec := aclDo(t, c, leader, root.SecretID, "POST", "/api/v1/locks/jobs/x/release", map[string]any{"client_id": "holder", "fencing_token": held.FencingToken, "lease_id": held.LeaseID}, nil); code != 200 {
		t.Fatalf("release: %d %s", code, ec)
	}
	if code, _ := aclDo(t, c, leader, root.SecretID, "GET", "/api/v1/locks/jobs/x", nil, &v); code != 200 || v.Held {
		t.Fatalf("after the release the withdrawn wait was granted: %+v", v)
	}
}

// A token that reaches its ttl_ms ends its streams as a revoked one does.
func TestExpiredTokenEndsItsStreams(t *testing.T) {
	c := testcluster.NewWith(t, 1, testcluster.Options{ACL: true})
	node := c.WaitLeader(10 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var root, brief service.ACLTokenView
	if code, ec := aclDo(t, c, node, "", "POST", "/api/v1/acl/bootstrap", nil, &root); code != 200 {
		t.Fatalf("bootstrap: %d %s", code, ec)
	}
	if code, ec := aclDo(t, c, node, root.SecretID, "POST", "/api/v1/acl/tokens", service.ACLTokenRequest{
		Rules: []service.ACLRule{{Prefix: "", Permissions: []string{"watch"}}}, TTLms: 3000}, &brief); code != 200 {
		t.Fatalf("create token: %d %s", code, ec)
	}
	code, events := sseWith(t, ctx, c.URL(node)+"/api/v1/watch", bearerHeader(brief.SecretID))
	if code != 200 {
		t.Fatalf("watch: %d", code)
	}
	var last sseRecord
	for rec := range events {
		last = rec
	}
	if ctx.Err() != nil {
		t.Fatal("the stream of an expired token is still open")
	}
	if last.event != "error" || !strings.Contains(last.data, "permission_denied") {
		t.Fatalf("last record of the stream: %+v", last)
	}
}
