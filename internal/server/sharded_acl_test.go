package server_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dlockv1 "github.com/dlock/dlock/api/dlock/v1"
	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/shard"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
)

// aclDoRetried is aclDo that retries 503s (a shard without a leader yet).
func aclDoRetried(t *testing.T, c *testcluster.Cluster, node, token, method, path string, body any, out any) (int, string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		code, ec := aclDo(t, c, node, token, method, path, body, out)
		if code != http.StatusServiceUnavailable || time.Now().After(deadline) {
			return code, ec
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// On a sharded cluster run with --acl the tokens live in the meta group:
// a token created through one node authorizes, from every node's copy of
// the meta group, calls on names of every shard, over HTTP and gRPC; a
// revocation ends it on every node and shard.
func TestShardedACL(t *testing.T) {
	m, err := shard.NewMap(shard.DefaultBounds(4))
	if err != nil {
		t.Fatal(err)
	}
	c := testcluster.NewWith(t, 3, testcluster.Options{Shards: &m, ACL: true})
	ids := c.IDs()
	// billing/ and tango/ are allowed, on shards 0 and 3; golf/ and
	// payments/ are not, on shards 1 and 2.
	allowed, denied := []string{"billing/job", "tango/job"}, []string{"golf/job", "payments/job"}
	seen := map[int]bool{}
	for _, n := range append(append([]string{}, allowed...), denied...) {
		seen[m.Lookup(n)] = true
	}
	if len(seen) != 4 {
		t.Fatalf("the test's names should be on four shards: %v", seen)
	}

	if code, ec := aclDoRetried(t, c, ids[0], "", "POST", "/api/v1/locks/billing/job/acquire", map[string]any{"client_id": "worker-1", "ttl_ms": 30000}, nil); code != 401 || ec != "unauthenticated" {
		t.Fatalf("anonymous acquire: %d %s", code, ec)
	}
	var root service.ACLTokenView
	if code, ec := aclDoRetried(t, c, ids[1], "", "POST", "/api/v1/acl/bootstrap", nil, &root); code != 200 || root.SecretID == "" {
		t.Fatalf("bootstrap: %d %s %+v", code, ec, root)
	}
	for _, id := range ids {
		testutil.Eventually(t, 10*time.Second, "every node refuses a second bootstrap", func() error {
			if code, ec := aclDoRetried(t, c, id, "", "POST", "/api/v1/acl/bootstrap", nil, nil); code != 403 || ec != "permission_denied" {
				return fmt.Errorf("second bootstrap through %s: %d %s", id, code, ec)
			}
			return nil
		})
	}
	var worker service.ACLTokenView
	if code, ec := aclDoRetried(t, c, ids[2], root.SecretID, "POST", "/api/v1/acl/tokens", service.ACLTokenRequest{
		Description: "billing and tango workers",
		Rules:       []service.ACLRule{{Prefix: "billing/", Permissions: []string{"lock", "read"}}, {Prefix: "tango/", Permissions: []string{"lock", "read", "watch"}}},
		ClientIDs:   []string{"worker-*"},
	}, &worker); code != 200 || worker.SecretID == "" {
		t.Fatalf("create the worker token: %d %s %+v", code, ec, worker)
	}
	w := worker.SecretID
	var list service.ACLTokenList
	if code, ec := aclDoRetried(t, c, ids[0], root.SecretID, "GET", "/api/v1/acl/tokens", nil, &list); code != 200 || len(list.Tokens) != 2 {
		t.Fatalf("list tokens through another node: %d %s %+v", code, ec, list)
	}

	// Every node, every shard: the token's rules decide.
	for i, id := range ids {
		testutil.Eventually(t, 10*time.Second, "the token works through "+id, func() error {
			code, ec := aclDoRetried(t, c, id, w, "GET", "/api/v1/locks/tango/job", nil, nil)
			if code != 200 {
				return fmt.Errorf("read tango/job through %s: %d %s", id, code, ec)
			}
			return nil
		})
		for _, name := range allowed {
			n := fmt.Sprintf("%s-%d", name, i)
			if code, ec := aclDoRetried(t, c, id, w, "POST", "/api/v1/locks/"+n+"/acquire", map[string]any{"client_id": "worker-1", "ttl_ms": 30000}, nil); code != 200 {
				t.Errorf("acquire %s through %s: %d %s, want 200", n, id, code, ec)
			}
		}
		for _, name := range denied {
			n := fmt.Sprintf("%s-%d", name, i)
			if code, ec := aclDoRetried(t, c, id, w, "POST", "/api/v1/locks/"+n+"/acquire", map[string]any{"client_id": "worker-1", "ttl_ms": 30000}, nil); code != 403 || ec != "permission_denied" {
				t.Errorf("acquire %s through %s: %d %s, want 403 permission_denied", n, id, code, ec)
			}
			if code, ec := aclDoRetried(t, c, id, root.SecretID, "GET", "/api/v1/locks/"+n, nil, nil); code != 200 {
				t.Errorf("root reads %s through %s: %d %s", n, id, code, ec)
			}
		}
		if code, ec := aclDoRetried(t, c, id, w, "POST", "/api/v1/locks/billing/other/acquire", map[string]any{"client_id": "mallory", "ttl_ms": 30000}, nil); code != 403 || ec != "permission_denied" {
			t.Errorf("act as another client through %s: %d %s", id, code, ec)
		}
		if code, ec := aclDoRetried(t, c, id, w, "GET", "/api/v1/locks?prefix=billing/", nil, nil); code != 200 {
			t.Errorf("list its prefix through %s: %d %s", id, code, ec)
		}
		if code, ec := aclDoRetried(t, c, id, w, "GET", "/api/v1/locks", nil, nil); code != 403 || ec != "permission_denied" {
			t.Errorf("list every shard through %s: %d %s", id, code, ec)
		}
		if code, ec := aclDoRetried(t, c, id, w, "POST", "/api/v1/acl/tokens", service.ACLTokenRequest{Rules: []service.ACLRule{{Prefix: "", Permissions: []string{"all"}}}}, nil); code != 403 || ec != "permission_denied" {
			t.Errorf("create a token without admin through %s: %d %s", id, code, ec)
		}
		// A session has a lease on every shard; the token may hold one.
		if code, ec := aclDoRetried(t, c, id, w, "POST", "/api/v1/sessions", map[string]any{"client_id": "worker-7", "ttl_ms": 10000}, nil); code != 200 && code != 201 {
			t.Errorf("session through %s: %d %s", id, code, ec)
		}
		if code, ec := aclDoRetried(t, c, id, w, "POST", "/api/v1/cluster/shards/split", map[string]any{"at": "d"}, nil); code != 403 || ec != "permission_denied" {
			t.Errorf("split without admin through %s: %d %s", id, code, ec)
		}
		// Moves and membership changes, which the router carries out
		// itself, need admin too.
		if code, ec := aclDoRetried(t, c, id, w, "POST", "/api/v1/cluster/shards/move", map[string]any{"shard": 1, "from": "n1", "to": "n2"}, nil); code != 403 || ec != "permission_denied" {
			t.Errorf("move without admin through %s: %d %s", id, code, ec)
		}
		if code, ec := aclDoRetried(t, c, id, w, "POST", "/api/v1/cluster/members", map[string]any{"id": "n9", "raft_addr": "127.0.0.1:1"}, nil); code != 403 || ec != "permission_denied" {
			t.Errorf("add a member without admin through %s: %d %s", id, code, ec)
		}
		if code, ec := aclDoRetried(t, c, id, w, "DELETE", "/api/v1/cluster/members/n3", nil, nil); code != 403 || ec != "permission_denied" {
			t.Errorf("remove a member without admin through %s: %d %s", id, code, ec)
		}
	}

	// gRPC, through every node, by the same rules.
	for i, id := range ids {
		locks, with := aclGRPC(t, c, id)
		for _, name := range allowed {
			n := fmt.Sprintf("%s-grpc%d", name, i)
			testutil.Eventually(t, 30*time.Second, "gRPC acquire "+n, func() error {
				_, err := locks.Acquire(with(w), &dlockv1.AcquireRequest{Name: n, ClientId: "worker-3", TtlMs: 30000})
				if status.Code(err) == codes.Unavailable {
					return err
				}
				if err != nil {
					t.Fatalf("gRPC acquire %s through %s: %v", n, id, err)
				}
				return nil
			})
		}
		for _, name := range denied {
			n := fmt.Sprintf("%s-grpc%d", name, i)
			if _, err := locks.Acquire(with(w), &dlockv1.AcquireRequest{Name: n, ClientId: "worker-3", TtlMs: 30000}); status.Code(err) != codes.PermissionDenied {
				t.Errorf("gRPC acquire %s through %s: %v, want PermissionDenied", n, id, err)
			}
		}
		if _, err := locks.Acquire(with(""), &dlockv1.AcquireRequest{Name: "billing/anon", ClientId: "worker-3", TtlMs: 30000}); status.Code(err) != codes.Unauthenticated {
			t.Errorf("gRPC without a token through %s: %v", id, err)
		}
	}

	// A watch it opened on shard 3 through the third node ends when the
	// token is revoked in the meta group.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	code, events := sseWith(t, ctx, c.URL(ids[2])+"/api/v1/watch?prefix=tango/", bearerHeader(w))
	if code != 200 {
		t.Fatalf("watch tango/: %d", code)
	}

	// Revoked through one node: refused on every node, on every shard.
	if code, ec := aclDoRetried(t, c, ids[0], root.SecretID, "DELETE", "/api/v1/acl/tokens/"+worker.AccessorID, nil, nil); code != 200 {
		t.Fatalf("revoke: %d %s", code, ec)
	}
	for _, id := range ids {
		for _, name := range allowed {
			testutil.Eventually(t, 10*time.Second, "revocation applied on "+id, func() error {
				if code, ec := aclDoRetried(t, c, id, w, "GET", "/api/v1/locks/"+name, nil, nil); code != 401 {
					return fmt.Errorf("revoked token reads %s through %s: %d %s", name, id, code, ec)
				}
				return nil
			})
		}
	}
	locks, with := aclGRPC(t, c, ids[1])
	if _, err := locks.Acquire(with(w), &dlockv1.AcquireRequest{Name: "tango/revoked", ClientId: "worker-3", TtlMs: 30000}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("gRPC with a revoked token: %v", err)
	}
	sawErr := false
	for rec := range events {
		if rec.event == "error" {
			sawErr = strings.Contains(rec.data, "permission_denied")
		}
	}
	if !sawErr {
		t.Fatal("the watch of a revoked token ended without a permission_denied error record (or only at the test's deadline)")
	}
}

// With shards on some nodes only (--shard-replicas), a call through a node
// that does not run the name's shard is sent to one that does with the
// caller's token: allowed there as here, and refused as here.
func TestShardedACLForwarded(t *testing.T) {
	m0, err := shard.NewMap(shard.DefaultBounds(4))
	if err != nil {
		t.Fatal(err)
	}
	m, err := m0.Place([]string{"n1", "n2", "n3"}, 1) // shard k on one node
	if err != nil {
		t.Fatal(err)
	}
	c := testcluster.NewWith(t, 3, testcluster.Options{Shards: &m, ACL: true})
	var root service.ACLTokenView
	if code, ec := aclDoRetried(t, c, "n1", "", "POST", "/api/v1/acl/bootstrap", nil, &root); code != 200 || root.SecretID == "" {
		t.Fatalf("bootstrap: %d %s %+v", code, ec, root)
	}
	var worker service.ACLTokenView
	if code, ec := aclDoRetried(t, c, "n1", root.SecretID, "POST", "/api/v1/acl/tokens", service.ACLTokenRequest{
		Rules: []service.ACLRule{{Prefix: "golf/", Permissions: []string{"lock", "read"}}}, ClientIDs: []string{"worker-*"},
	}, &worker); code != 200 {
		t.Fatalf("create the worker token: %d %s", code, ec)
	}
	// golf/ is on shard 1, which runs on n2 only; payments/ on shard 2 (n3).
	if !slices.Equal(m.Hosts(1, nil), []string{"n2"}) || !slices.Equal(m.Hosts(2, nil), []string{"n3"}) {
		t.Fatalf("placement %v", m.Replicas)
	}
	for _, via := range []string{"n1", "n3"} {
		testutil.Eventually(t, 20*time.Second, "the token reaches "+via, func() error {
			var a service.AcquireResponse
			code, ec := aclDoRetried(t, c, via, worker.SecretID, "POST", "/api/v1/locks/golf/"+via+"/acquire", map[string]any{"client_id": "worker-1", "ttl_ms": 30000}, &a)
			if code != 200 || !a.Acquired {
				return fmt.Errorf("allowed acquire through %s: %d %s", via, code, ec)
			}
			return nil
		})
	}
	if code, ec := aclDoRetried(t, c, "n1", worker.SecretID, "POST", "/api/v1/locks/payments/x/acquire", map[string]any{"client_id": "worker-1", "ttl_ms": 30000}, nil); code != 403 || ec != "permission_denied" {
		t.Fatalf("denied acquire forwarded through n1: %d %s", code, ec)
	}
	if code, ec := aclDoRetried(t, c, "n1", "", "POST", "/api/v1/locks/golf/anon/acquire", map[string]any{"client_id": "worker-1", "ttl_ms": 30000}, nil); code != 401 || ec != "unauthenticated" {
		t.Fatalf("anonymous acquire forwarded through n1: %d %s", code, ec)
	}
}
