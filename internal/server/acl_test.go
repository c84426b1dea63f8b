package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	dlockv1 "github.com/dlock/dlock/api/dlock/v1"
	"github.com/dlock/dlock/internal/server"
	"github.com/dlock/dlock/internal/service"
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
