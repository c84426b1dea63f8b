package server_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	dlockv1 "github.com/dlock/dlock/api/dlock/v1"
	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/testcluster"
)

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
