package server_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	dlockv1 "github.com/dlock/dlock/api/dlock/v1"
	"github.com/dlock/dlock/internal/raftnode"
	"github.com/dlock/dlock/internal/server"
	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/state"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
	"github.com/dlock/dlock/internal/tlsconfig"
)

// aclDo sends one API call with a bearer token ("" for none) and returns the
// status code and the error code of the answer.
func aclDo(t *testing.T, c *testcluster.Cluster, node, token, method, path string, body any, out any) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, c.URL(node)+path, jsonBody(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := c.Client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	var e errBody
	raw := readAll(res.Body)
	_ = decodeInto(raw, &e)
	if out != nil && res.StatusCode == 200 {
		if err := decodeInto(raw, out); err != nil {
			t.Fatalf("%s %s: decode %s: %v", method, path, raw, err)
		}
	}
	return res.StatusCode, e.Error.Code
}

// Who may do what, over HTTP and gRPC, in a cluster run with --acl: the
// done-when of docs/security.md — a worker token for billing/ can lock
// billing/job but not payments/job, cannot act as another client, cannot
// administer; revocation takes effect at once.
func TestACLWhoMayDoWhat(t *testing.T) {
	c := testcluster.NewWith(t, 3, testcluster.Options{ACL: true})
	leader := c.WaitLeader(10 * time.Second)
	node := c.Follower()

	// Without a token nothing but the public endpoints answers.
	if code, ec := aclDo(t, c, node, "", "POST", "/api/v1/locks/billing/job/acquire", map[string]any{"client_id": "worker-1", "ttl_ms": 30000}, nil); code != 401 || ec != "unauthenticated" {
		t.Fatalf("anonymous acquire: %d %s", code, ec)
	}
	if code, _ := aclDo(t, c, node, "", "GET", "/api/v1/cluster/token-key", nil, nil); code != 200 {
		t.Fatalf("token keys are public, got %d", code)
	}
	if code, _ := aclDo(t, c, node, "", "GET", "/healthz", nil, nil); code != 200 {
		t.Fatalf("healthz: %d", code)
	}

	var root service.ACLTokenView
	if code, ec := aclDo(t, c, node, "", "POST", "/api/v1/acl/bootstrap", nil, &root); code != 200 || root.SecretID == "" {
		t.Fatalf("bootstrap: %d %s %+v", code, ec, root)
	}
	if code, ec := aclDo(t, c, leader, "", "POST", "/api/v1/acl/bootstrap", nil, nil); code != 403 || ec != "permission_denied" {
		t.Fatalf("second bootstrap: %d %s", code, ec)
	}
	var worker service.ACLTokenView
	code, ec := aclDo(t, c, node, root.SecretID, "POST", "/api/v1/acl/tokens", service.ACLTokenRequest{
		Description: "billing workers",
		Rules:       []service.ACLRule{{Prefix: "billing/", Permissions: []string{"lock", "read"}}},
		ClientIDs:   []string{"worker-*"},
	}, &worker)
	if code != 200 || worker.SecretID == "" || worker.SecretID == root.SecretID {
		t.Fatalf("create worker token: %d %s %+v", code, ec, worker)
	}
	w := worker.SecretID

	var held service.AcquireResponse
	if code, ec := aclDo(t, c, node, w, "POST", "/api/v1/locks/billing/job/acquire", map[string]any{"client_id": "worker-1", "ttl_ms": 30000}, &held); code != 200 {
		t.Fatalf("worker locks billing/job: %d %s", code, ec)
	}
	for _, tc := range []struct {
		what, token, method, path string
		body                      any
		code                      int
		ec                        string
	}{
		{"lock outside its prefix", w, "POST", "/api/v1/locks/payments/job/acquire", map[string]any{"client_id": "worker-1", "ttl_ms": 30000}, 403, "permission_denied"},
		{"act as a client id it may not", w, "POST", "/api/v1/locks/billing/other/acquire", map[string]any{"client_id": "mallory", "ttl_ms": 30000}, 403, "permission_denied"},
		// With worker-1's real token and lease: the token lets worker-2 act, and
		// only the lock's own check can refuse it.
		{"release another client's lock", w, "POST", "/api/v1/locks/billing/job/release", map[string]any{"client_id": "worker-2", "fencing_token": held.FencingToken, "lease_id": held.LeaseID}, 409, "not_holder"},
		{"read its prefix", w, "GET", "/api/v1/locks/billing/job", nil, 200, ""},
		{"read elsewhere", w, "GET", "/api/v1/locks/payments/job", nil, 403, "permission_denied"},
		{"list its prefix", w, "GET", "/api/v1/locks?prefix=billing/", nil, 200, ""},
		{"list everything", w, "GET", "/api/v1/locks", nil, 403, "permission_denied"},
		{"campaign without elect", w, "POST", "/api/v1/elections/billing/primary/campaign", map[string]any{"candidate_id": "worker-1", "ttl_ms": 30000}, 403, "permission_denied"},
		{"watch without watch", w, "GET", "/api/v1/watch?prefix=billing/", nil, 403, "permission_denied"},
		{"administer members", w, "DELETE", "/api/v1/cluster/members/n9", nil, 403, "permission_denied"},
		{"rotate the token key", w, "POST", "/api/v1/cluster/token-key/rotate", nil, 403, "permission_denied"},
		{"list tokens", w, "GET", "/api/v1/acl/tokens", nil, 403, "permission_denied"},
		{"create tokens", w, "POST", "/api/v1/acl/tokens", service.ACLTokenRequest{Rules: []service.ACLRule{{Prefix: "", Permissions: []string{"all"}}}}, 403, "permission_denied"},
		{"a made-up token", "0123456789abcdef0123456789abcdef", "GET", "/api/v1/locks/billing/job", nil, 401, "unauthenticated"},
		{"root reads anything", root.SecretID, "GET", "/api/v1/locks/payments/job", nil, 200, ""},
		{"root lists tokens", root.SecretID, "GET", "/api/v1/acl/tokens", nil, 200, ""},
		{"session as an allowed client", w, "POST", "/api/v1/sessions", map[string]any{"client_id": "worker-7", "ttl_ms": 10000}, 201, ""},
		{"session as another client", w, "POST", "/api/v1/sessions", map[string]any{"client_id": "mallory", "ttl_ms": 10000}, 403, "permission_denied"},
	} {
		code, ec := aclDo(t, c, node, tc.token, tc.method, tc.path, tc.body, nil)
		if code != tc.code && !(tc.code == 201 && code == 200) || ec != tc.ec {
			t.Errorf("%s: %d %q, want %d %q", tc.what, code, ec, tc.code, tc.ec)
		}
	}

	// gRPC enforces the same rules with the same token in metadata.
	locks, with := aclGRPC(t, c, node)
	if _, err := locks.Acquire(with(w), &dlockv1.AcquireRequest{Name: "billing/grpc", ClientId: "worker-3", TtlMs: 30000}); err != nil {
		t.Fatalf("gRPC acquire in its prefix: %v", err)
	}
	for what, c := range map[string]struct {
		token, name, client string
		want                codes.Code
	}{
		"gRPC outside its prefix": {w, "payments/grpc", "worker-3", codes.PermissionDenied},
		"gRPC other client id":    {w, "billing/grpc2", "mallory", codes.PermissionDenied},
		"gRPC without a token":    {"", "billing/grpc3", "worker-3", codes.Unauthenticated},
	} {
		_, err := locks.Acquire(with(c.token), &dlockv1.AcquireRequest{Name: c.name, ClientId: c.client, TtlMs: 30000})
		if status.Code(err) != c.want {
			t.Errorf("%s: %v, want %s", what, err, c.want)
		}
	}

	// An expiring token works until its TTL, then is refused everywhere.
	var brief service.ACLTokenView
	if code, ec := aclDo(t, c, node, root.SecretID, "POST", "/api/v1/acl/tokens", service.ACLTokenRequest{
		Rules: []service.ACLRule{{Prefix: "billing/", Permissions: []string{"read"}}}, TTLms: 1000}, &brief); code != 200 {
		t.Fatalf("create an expiring token: %d %s", code, ec)
	}
	if code, ec := aclDo(t, c, node, brief.SecretID, "GET", "/api/v1/locks/billing/job", nil, nil); code != 200 {
		t.Fatalf("expiring token before its TTL: %d %s", code, ec)
	}
	time.Sleep(1100 * time.Millisecond)
	for _, id := range c.Running() {
		if code, ec := aclDo(t, c, id, brief.SecretID, "GET", "/api/v1/locks/billing/job", nil, nil); code != 401 || ec != "unauthenticated" {
			t.Fatalf("expired token on %s: %d %s", id, code, ec)
		}
	}

	// Revocation: refused at once on the node that applied it, and on every
	// node within moments.
	if code, ec := aclDo(t, c, node, root.SecretID, "DELETE", "/api/v1/acl/tokens/"+worker.AccessorID, nil, nil); code != 200 {
		t.Fatalf("revoke: %d %s", code, ec)
	}
	if code, ec := aclDo(t, c, node, w, "GET", "/api/v1/locks/billing/job", nil, nil); code != 401 || ec != "unauthenticated" {
		t.Fatalf("revoked token on the revoking node: %d %s", code, ec)
	}
	for _, id := range c.Running() {
		testutil.Eventually(t, 5*time.Second, "revocation applied on "+id, func() bool {
			code, _ := aclDo(t, c, id, w, "GET", "/api/v1/locks/billing/job", nil, nil)
			return code == 401
		})
	}
	if _, err := locks.Acquire(with(w), &dlockv1.AcquireRequest{Name: "billing/grpc4", ClientId: "worker-3", TtlMs: 30000}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("gRPC with a revoked token: %v", err)
	}
}

func jsonBody(v any) io.Reader {
	if v == nil {
		return nil
	}
	b, _ := json.Marshal(v)
	return bytes.NewReader(b)
}

func readAll(r io.Reader) []byte {
	b, _ := io.ReadAll(io.LimitReader(r, 1<<20))
	return b
}

func decodeInto(b []byte, v any) error {
	if len(b) == 0 {
		return nil
	}
	return json.Unmarshal(b, v)
}

// With mutual TLS on the API, a client certificate bound to a token
// (cert_cns) authenticates without the secret, over HTTPS and gRPC alike,
// with exactly that token's rights.
func TestACLClientCertificateIdentity(t *testing.T) {
	x := testcluster.NewTLS(t, tlsconfig.ClientAuthOptional)
	c := testcluster.NewWith(t, 3, testcluster.Options{TLS: x, ACL: true})
	node := c.Follower()
	var root service.ACLTokenView
	if code, ec := aclDo(t, c, node, "", "POST", "/api/v1/acl/bootstrap", nil, &root); code != 200 {
		t.Fatalf("bootstrap: %d %s", code, ec)
	}
	// The dev client certificate's common name is "dlock dev client".
	var w service.ACLTokenView
	if code, ec := aclDo(t, c, node, root.SecretID, "POST", "/api/v1/acl/tokens", service.ACLTokenRequest{
		Rules:   []service.ACLRule{{Prefix: "billing/", Permissions: []string{"lock", "read"}}},
		CertCNs: []string{"dlock dev client"},
	}, &w); code != 200 {
		t.Fatalf("create a certificate-bound token: %d %s", code, ec)
	}
	// c.Client presents the client certificate: no bearer needed.
	if code, ec := aclDo(t, c, node, "", "POST", "/api/v1/locks/billing/cert/acquire", map[string]any{"client_id": "cert-worker", "ttl_ms": 30000}, nil); code != 200 {
		t.Fatalf("certificate-authenticated acquire: %d %s", code, ec)
	}
	if code, ec := aclDo(t, c, node, "", "POST", "/api/v1/locks/payments/cert/acquire", map[string]any{"client_id": "cert-worker", "ttl_ms": 30000}, nil); code != 403 || ec != "permission_denied" {
		t.Fatalf("certificate outside its prefix: %d %s", code, ec)
	}
	// Without the certificate (CA only), the same call is unauthenticated.
	noCert := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: testcluster.ClientTLS(t, x.Files, false)}}
	req, _ := http.NewRequest("GET", c.URL(node)+"/api/v1/locks/billing/cert", nil)
	res, err := noCert.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 401 {
		t.Fatalf("no certificate, no token: %d", res.StatusCode)
	}
	// gRPC sees the same identity.
	cc, err := grpc.NewClient(c.GRPCAddr(node), grpc.WithTransportCredentials(credentials.NewTLS(x.Client)))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	locks := dlockv1.NewLockServiceClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := locks.Acquire(ctx, &dlockv1.AcquireRequest{Name: "billing/cert-grpc", ClientId: "cert-worker", TtlMs: 30000}); err != nil {
		t.Fatalf("gRPC with a bound certificate: %v", err)
	}
	if _, err := locks.Acquire(ctx, &dlockv1.AcquireRequest{Name: "payments/cert-grpc", ClientId: "cert-worker", TtlMs: 30000}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("gRPC certificate outside its prefix: %v", err)
	}
	// Revoking the token revokes the certificate's access.
	if code, ec := aclDo(t, c, node, root.SecretID, "DELETE", "/api/v1/acl/tokens/"+w.AccessorID, nil, nil); code != 200 {
		t.Fatalf("revoke: %d %s", code, ec)
	}
	if _, err := locks.Acquire(ctx, &dlockv1.AcquireRequest{Name: "billing/cert-grpc2", ClientId: "cert-worker", TtlMs: 30000}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("gRPC certificate after revoke: %v", err)
	}
}

// The bootstrap endpoint is the one write anyone may send without a token:
// once bootstrapped, calls to it are refused before anything is proposed
// (the log does not grow), and they count against the rate limit.
func TestACLBootstrapRefusedWithoutProposing(t *testing.T) {
	// One request a second with a burst of 5: 60 calls are limited even
	// on a machine slow enough to take a second for ten of them.
	c := testcluster.NewWith(t, 3, testcluster.Options{ACL: true, Limits: server.Limits{Service: service.Limits{Rate: 1, Burst: 5}}})
	leader := c.WaitLeader(10 * time.Second)
	node := c.Follower()
	if code, ec := aclDo(t, c, node, "", "POST", "/api/v1/acl/bootstrap", nil, nil); code != 200 {
		t.Fatalf("bootstrap: %d %s", code, ec)
	}
	before := c.Server(leader).Node.Status().ProposedCommands
	limited := 0
	for i := 0; i < 60; i++ {
		code, ec := aclDo(t, c, node, "", "POST", "/api/v1/acl/bootstrap", nil, nil)
		switch {
		case code == 403 && ec == "permission_denied":
		case code == 429 && ec == "rate_limited":
			limited++
		default:
			t.Fatalf("bootstrap again: %d %s", code, ec)
		}
	}
	if after := c.Server(leader).Node.Status().ProposedCommands; after != before {
		t.Fatalf("60 refused bootstraps proposed %d commands", after-before)
	}
	if limited == 0 {
		t.Fatal("60 bootstraps in a burst of 5 at 1/s were never rate limited")
	}
}

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

// Under ACLs, knowing a holder's client_id (every lock_held answer names it)
// and holding a token for the lock's prefix that may act as any client_id
// must not be enough to take the lock: takeover needs a token whose
// client_ids name that client id (or a management token). Over HTTP and
// gRPC, for locks and elections.
func TestACLTakeoverNeedsATokenNamingTheClient(t *testing.T) {
	c := testcluster.NewWith(t, 3, testcluster.Options{ACL: true})
	c.WaitLeader(10 * time.Second)
	node := c.Follower()

	var root service.ACLTokenView
	if code, ec := aclDo(t, c, node, "", "POST", "/api/v1/acl/bootstrap", nil, &root); code != 200 {
		t.Fatalf("bootstrap: %d %s", code, ec)
	}
	token := func(desc string, clientIDs ...string) string {
		var v service.ACLTokenView
		code, ec := aclDo(t, c, node, root.SecretID, "POST", "/api/v1/acl/tokens", service.ACLTokenRequest{
			Description: desc,
			Rules:       []service.ACLRule{{Prefix: "jobs/", Permissions: []string{"lock", "elect", "read"}}},
			ClientIDs:   clientIDs,
		}, &v)
		if code != 200 || v.SecretID == "" {
			t.Fatalf("create token %s: %d %s", desc, code, ec)
		}
		return v.SecretID
	}
	anyClient := token("any client id")          // no client_ids: may act as anyone
	named := token("svc-a only", "svc-a")        // names svc-a
	pattern := token("svc-* pattern", "svc-*")   // a pattern that matches svc-a
	other := token("svc-b only", "svc-b", "x-*") // names others only

	acquire := func(tok, name string, body map[string]any) (int, string, service.AcquireResponse) {
		t.Helper()
		var out service.AcquireResponse
		code, ec := aclDo(t, c, node, tok, "POST", "/api/v1/locks/"+name+"/acquire", body, &out)
		return code, ec, out
	}
	renew := func(tok, name string, g service.AcquireResponse) (int, string) {
		t.Helper()
		return aclDo(t, c, node, tok, "POST", "/api/v1/locks/"+name+"/renew",
			map[string]any{"client_id": "svc-a", "fencing_token": g.FencingToken, "lease_id": g.LeaseID}, nil)
	}

	code, ec, first := acquire(named, "jobs/x", map[string]any{"client_id": "svc-a", "ttl_ms": 60000})
	if code != 200 {
		t.Fatalf("svc-a acquires: %d %s", code, ec)
	}
	// The attacker knows "svc-a" from a lock_held answer and holds a token
	// for jobs/ without client_ids.
	if code, ec, _ := acquire(anyClient, "jobs/x", map[string]any{"client_id": "svc-a", "ttl_ms": 60000}); code != 409 || ec != "lock_held" {
		t.Fatalf("same client_id without takeover: %d %s, want 409 lock_held", code, ec)
	}
	for what, tok := range map[string]string{"a token without client_ids": anyClient, "a token naming other ids": other} {
		if code, ec, _ := acquire(tok, "jobs/x", map[string]any{"client_id": "svc-a", "ttl_ms": 60000, "takeover": true}); code != 403 || ec != "permission_denied" {
			t.Fatalf("takeover with %s: %d %s, want 403 permission_denied", what, code, ec)
		}
	}
	if code, ec := renew(named, "jobs/x", first); code != 200 {
		t.Fatalf("the real holder's renew after the refused takeovers: %d %s", code, ec)
	}
	// A token naming the client id (exactly, or by a pattern) may take over.
	code, ec, second := acquire(named, "jobs/x", map[string]any{"client_id": "svc-a", "ttl_ms": 60000, "takeover": true})
	if code != 200 || second.FencingToken <= first.FencingToken {
		t.Fatalf("takeover with a token naming svc-a: %d %s %+v", code, ec, second)
	}
	if code, ec := renew(named, "jobs/x", first); code != 409 || ec != "not_holder" {
		t.Fatalf("the lease taken over renews: %d %s, want 409 not_holder", code, ec)
	}
	code, ec, third := acquire(pattern, "jobs/x", map[string]any{"client_id": "svc-a", "ttl_ms": 60000, "takeover": true})
	if code != 200 || third.FencingToken <= second.FencingToken {
		t.Fatalf("takeover with a token whose pattern matches svc-a: %d %s", code, ec)
	}
	// A management token could mint a token naming svc-a: it may take over.
	if code, ec, _ := acquire(root.SecretID, "jobs/x", map[string]any{"client_id": "svc-a", "ttl_ms": 60000, "takeover": true}); code != 200 {
		t.Fatalf("takeover with the management token: %d %s", code, ec)
	}

	// Elections: the same rule for campaign.
	camp := func(tok string, takeover bool) (int, string) {
		return aclDo(t, c, node, tok, "POST", "/api/v1/elections/jobs/primary/campaign",
			map[string]any{"candidate_id": "svc-a", "value": "v", "ttl_ms": 60000, "takeover": takeover}, nil)
	}
	if code, ec := camp(named, false); code != 200 {
		t.Fatalf("svc-a campaigns: %d %s", code, ec)
	}
	if code, ec := camp(anyClient, false); code != 409 || ec != "lock_held" {
		t.Fatalf("campaign by the same candidate id without takeover: %d %s", code, ec)
	}
	if code, ec := camp(anyClient, true); code != 403 || ec != "permission_denied" {
		t.Fatalf("campaign takeover with a token without client_ids: %d %s", code, ec)
	}
	if code, ec := camp(named, true); code != 200 {
		t.Fatalf("campaign takeover with a token naming svc-a: %d %s", code, ec)
	}

	// gRPC: the same answers.
	locks, with := aclGRPC(t, c, node)
	g1, err := locks.Acquire(with(named), &dlockv1.AcquireRequest{Name: "jobs/g", ClientId: "svc-a", TtlMs: 60000})
	if err != nil {
		t.Fatalf("gRPC acquire: %v", err)
	}
	_, err = locks.Acquire(with(anyClient), &dlockv1.AcquireRequest{Name: "jobs/g", ClientId: "svc-a", TtlMs: 60000})
	if o := grpcOutcome[*dlockv1.AcquireResponse](nil, err, nil, nil); o.code != "lock_held" {
		t.Fatalf("gRPC same client_id without takeover: %v, want lock_held", err)
	}
	if _, err := locks.Acquire(with(anyClient), &dlockv1.AcquireRequest{Name: "jobs/g", ClientId: "svc-a", TtlMs: 60000, Takeover: true}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("gRPC takeover with a token without client_ids: %v, want PermissionDenied", err)
	}
	if _, err := locks.Renew(with(named), &dlockv1.RenewRequest{Name: "jobs/g", ClientId: "svc-a", FencingToken: g1.FencingToken, LeaseId: g1.LeaseId}); err != nil {
		t.Fatalf("gRPC holder's renew after the refused takeover: %v", err)
	}
	g2, err := locks.Acquire(with(named), &dlockv1.AcquireRequest{Name: "jobs/g", ClientId: "svc-a", TtlMs: 60000, Takeover: true})
	if err != nil || g2.FencingToken <= g1.FencingToken {
		t.Fatalf("gRPC takeover with a token naming svc-a: %v %+v", err, g2)
	}
	_, err = locks.Renew(with(named), &dlockv1.RenewRequest{Name: "jobs/g", ClientId: "svc-a", FencingToken: g1.FencingToken, LeaseId: g1.LeaseId})
	if o := grpcOutcome[*dlockv1.RenewResponse](nil, err, nil, nil); o.code != "not_holder" {
		t.Fatalf("gRPC: the lease taken over renews: %v, want not_holder", err)
	}
}

// aclGRPC dials node's gRPC API (closed at the end of the test) and returns
// its lock service and a context maker that sends a bearer token ("" for
// none) in the metadata, bounded to 10 s.
func aclGRPC(t *testing.T, c *testcluster.Cluster, node string) (dlockv1.LockServiceClient, func(token string) context.Context) {
	t.Helper()
	cc, err := grpc.NewClient(c.GRPCAddr(node), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return dlockv1.NewLockServiceClient(cc), func(token string) context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		t.Cleanup(cancel)
		if token == "" {
			return ctx
		}
		return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
}

// Over the WebSocket API: the same client_id under a new lease is refused
// without takeover, and takes the lock with it.
func TestWebSocketTakeoverIsExplicit(t *testing.T) {
	c := testcluster.New(t, 3)
	c.WaitLeader(10 * time.Second)
	ws := wsDial(t, c, c.Follower())

	ws.send(map[string]any{"id": "1", "op": "acquire", "name": "jobs/w", "client_id": "A", "ttl_ms": 30000})
	var first service.AcquireResponse
	if a := ws.answer("1"); a.Error != nil || json.Unmarshal(a.Result, &first) != nil || !first.Acquired {
		t.Fatalf("acquire: %+v", a)
	}
	ws.send(map[string]any{"id": "2", "op": "acquire", "name": "jobs/w", "client_id": "A", "ttl_ms": 30000})
	if a := ws.answer("2"); a.Error == nil || a.Error.Code != "lock_held" || a.Holder == nil || a.Holder.FencingToken != first.FencingToken {
		t.Fatalf("same client_id without takeover: %+v", a)
	}
	ws.send(map[string]any{"id": "3", "op": "acquire", "name": "jobs/w", "client_id": "A", "ttl_ms": 30000, "takeover": true})
	var second service.AcquireResponse
	if a := ws.answer("3"); a.Error != nil || json.Unmarshal(a.Result, &second) != nil || second.FencingToken <= first.FencingToken {
		t.Fatalf("takeover: %+v", a)
	}
	ws.send(map[string]any{"id": "4", "op": "renew", "name": "jobs/w", "client_id": "A", "fencing_token": first.FencingToken, "lease_id": first.LeaseID})
	if a := ws.answer("4"); a.Error == nil || a.Error.Code != "not_holder" {
		t.Fatalf("renew of the lease taken over: %+v", a)
	}
}

// startLogged starts a one-node server and returns what it logged at start.
func startLogged(t *testing.T, acl bool, peer *tls.Config) string {
	t.Helper()
	// A file takes writes from every goroutine of the node safely.
	logFile, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	logger := slog.New(slog.NewTextHandler(logFile, &slog.HandlerOptions{Level: slog.LevelWarn}))
	raftAddr := testcluster.FreePort(t)
	s, err := server.Start(server.Config{
		Raft: raftnode.Config{ID: "n1", DataDir: t.TempDir(), RaftAddr: raftAddr, InitialCluster: map[string]string{"n1": raftAddr},
			PeerTLS: peer, Logger: logger},
		APIAddr: testcluster.FreePort(t), ACL: acl, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Logf("shutdown: %v", err)
	}
	out, err := os.ReadFile(logFile.Name())
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// ACLs do not cover the raft port: a node run with --acl and no peer TLS
// says so at start, naming the flags that fix it; with peer TLS, or without
// ACLs, it does not.
func TestACLWithoutPeerTLSWarnsAtStart(t *testing.T) {
	const marker = "ACLs are on but the raft port has no peer TLS"
	out := startLogged(t, true, nil)
	if !strings.Contains(out, marker) || !strings.Contains(out, "--peer-cert") || !strings.Contains(out, "level=WARN") {
		t.Fatalf("no start-up warning with --acl and plaintext peers; log:\n%s", out)
	}
	if out := startLogged(t, false, nil); strings.Contains(out, marker) {
		t.Fatalf("warned without --acl:\n%s", out)
	}
	x := testcluster.NewTLS(t, tlsconfig.ClientAuthOptional)
	if out := startLogged(t, true, x.Peer("n1")); strings.Contains(out, marker) {
		t.Fatalf("warned with peer TLS:\n%s", out)
	}
}

// applyGate holds a node's apply goroutine at the first entry applied once
// armed, until release: it stands in for a follower that lags.
type applyGate struct {
	armed   atomic.Bool
	held    chan struct{}
	release chan struct{}
	once    sync.Once
}

func (g *applyGate) Applied(uint64, []state.Event) {
	if g.armed.Load() {
		g.once.Do(func() {
			close(g.held)
			<-g.release
		})
	}
}

func (*applyGate) Restored(*state.State) {}

// A token created through the leader works at once through a follower that
// has not applied it yet: an unknown token waits for the follower to apply
// what was committed before the call, and only then is refused.
func TestACLNewTokenWorksOnALaggingFollower(t *testing.T) {
	c := testcluster.NewWith(t, 3, testcluster.Options{ACL: true})
	leader := c.WaitLeader(10 * time.Second)
	follower := c.Follower()
	var root service.ACLTokenView
	if code, ec := aclDo(t, c, leader, "", "POST", "/api/v1/acl/bootstrap", nil, &root); code != 200 {
		t.Fatalf("bootstrap: %d %s", code, ec)
	}
	testutil.Eventually(t, 10*time.Second, "the follower did not learn the management token", func() bool {
		code, _ := aclDo(t, c, follower, root.SecretID, "GET", "/api/v1/acl/tokens", nil, nil)
		return code == 200
	})

	gate := &applyGate{held: make(chan struct{}), release: make(chan struct{})}
	c.Server(follower).Node.FSM().AddObserver(gate)
	gate.armed.Store(true)
	// The follower stops after applying this acquire, before the token.
	if code, ec := aclDo(t, c, leader, root.SecretID, "POST", "/api/v1/locks/gate/acquire", map[string]any{"client_id": "op", "ttl_ms": 30000}, nil); code != 200 {
		t.Fatalf("acquire: %d %s", code, ec)
	}
	select {
	case <-gate.held:
	case <-time.After(20 * time.Second):
		t.Fatal("the follower never applied the acquire")
	}
	var worker service.ACLTokenView
	if code, ec := aclDo(t, c, leader, root.SecretID, "POST", "/api/v1/acl/tokens", service.ACLTokenRequest{
		Rules: []service.ACLRule{{Prefix: "billing/", Permissions: []string{"lock", "read"}}},
	}, &worker); code != 200 {
		t.Fatalf("create token: %d %s", code, ec)
	}
	time.AfterFunc(300*time.Millisecond, func() { close(gate.release) })
	if code, ec := aclDo(t, c, follower, worker.SecretID, "GET", "/api/v1/locks/billing/job", nil, nil); code != 200 {
		t.Fatalf("the new token through the lagging follower: %d %s", code, ec)
	}
	if code, ec := aclDo(t, c, follower, "not-a-token", "GET", "/api/v1/locks/billing/job", nil, nil); code != 401 || ec != "unauthenticated" {
		t.Fatalf("an unknown token: %d %s", code, ec)
	}
}
