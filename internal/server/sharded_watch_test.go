package server_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/shard"
	"github.com/dlock/dlock/internal/testcluster"
)

// A watch through a node that does not run the shard is relayed from a
// replica as the caller: the replica checks the caller's token, so a
// watch the token allows is served, one it does not or a bad token is
// refused as through a replica, and revoking the token ends the relayed
// stream with permission_denied.
func TestShardedWatchForwardedACL(t *testing.T) {
	m0, err := shard.NewMap(shard.DefaultBounds(4))
	if err != nil {
		t.Fatal(err)
	}
	m, err := m0.Place([]string{"n1", "n2", "n3"}, 1) // shard k on one node
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(m.Hosts(1, nil), []string{"n2"}) || !slices.Equal(m.Hosts(2, nil), []string{"n3"}) {
		t.Fatalf("placement %v", m.Replicas)
	}
	c := testcluster.NewWith(t, 3, testcluster.Options{Shards: &m, ACL: true})
	var root service.ACLTokenView
	if code, ec := aclDoRetried(t, c, "n1", "", "POST", "/api/v1/acl/bootstrap", nil, &root); code != 200 || root.SecretID == "" {
		t.Fatalf("bootstrap: %d %s %+v", code, ec, root)
	}
	var worker service.ACLTokenView
	if code, ec := aclDoRetried(t, c, "n1", root.SecretID, "POST", "/api/v1/acl/tokens", service.ACLTokenRequest{
		Rules: []service.ACLRule{{Prefix: "golf/", Permissions: []string{"lock", "read", "watch"}}}, ClientIDs: []string{"worker-*"},
	}, &worker); code != 200 {
		t.Fatalf("create the worker token: %d %s", code, ec)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// golf/ runs on n2 only, payments/ on n3 only: n1 relays both.
	refused := func(prefix, token string, want int) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			code, _ := sseWith(t, ctx, c.URL("n1")+"/api/v1/watch?prefix="+prefix, bearerHeader(token))
			if code == 503 && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond) // the meta group's tokens not here yet
				continue
			}
			if code != want {
				t.Fatalf("watch %s through n1 with token %.8s: %d, want %d", prefix, token, code, want)
			}
			return
		}
	}
	refused("payments/", worker.SecretID, 403)
	refused("golf/", "not-a-token", 401)

	var code int
	var events <-chan sseRecord
	for deadline := time.Now().Add(30 * time.Second); ; {
		if code, events = sseWith(t, ctx, c.URL("n1")+"/api/v1/watch?prefix=golf/", bearerHeader(worker.SecretID)); code != 503 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code != 200 {
		t.Fatalf("allowed watch of golf/ through n1: %d", code)
	}
	// The same over a WebSocket through n1.
	ws := wsDialWith(t, c, "n1", bearerHeader(worker.SecretID))
	ws.send(map[string]any{"id": "w0", "op": "watch", "prefix": "golf/"})
	if a := ws.answer("w0"); a.Error != nil || !strings.Contains(string(a.Result), `"watching":true`) {
		t.Fatalf("WebSocket watch of golf/ through n1: %+v", a)
	}
	ws.send(map[string]any{"id": "w1", "op": "watch", "prefix": "payments/"})
	if a := ws.answer("w1"); a.Error == nil || a.Error.Code != "permission_denied" {
		t.Fatalf("WebSocket watch of payments/ through n1: %+v", a)
	}
	if code, ec := aclDoRetried(t, c, "n2", worker.SecretID, "POST", "/api/v1/locks/golf/a/acquire", map[string]any{"client_id": "worker-1", "ttl_ms": 30000}, nil); code != 200 {
		t.Fatalf("acquire golf/a: %d %s", code, ec)
	}
	for {
		m := ws.next("the WebSocket watch's grant")
		if m.Op == "event" && m.ID == "w0" && m.Event != nil && m.Event.Type == "acquired" && m.Event.Name == "golf/a" {
			break
		}
	}
	for r := range events {
		if r.event == "error" {
			t.Fatalf("the allowed watch ended: %s", r.data)
		}
		if strings.Contains(r.data, `"acquired"`) && strings.Contains(r.data, "golf/a") {
			break
		}
	}
	if code, ec := aclDoRetried(t, c, "n3", root.SecretID, "DELETE", "/api/v1/acl/tokens/"+worker.AccessorID, nil, nil); code != 200 {
		t.Fatalf("revoke: %d %s", code, ec)
	}
	sawErr := false
	for r := range events {
		if r.event == "error" {
			sawErr = strings.Contains(r.data, "permission_denied")
		}
	}
	if !sawErr {
		t.Fatal("the relayed watch of a revoked token ended without a permission_denied error record (or only at the test's deadline)")
	}
}
