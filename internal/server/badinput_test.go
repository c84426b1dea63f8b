package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/testcluster"
)

// Bad input against the real stack: a clear error and no state change.
func TestBadInputChangesNothing(t *testing.T) {
	c := testcluster.New(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	base := c.URL(leader) + "/api/v1"
	// Something to aim at.
	code, a := acquire(t, c, leader, "held", map[string]any{"client_id": "owner", "ttl_ms": 60000})
	if code != 200 {
		t.Fatalf("setup acquire: %d", code)
	}
	revision := func() uint64 {
		var v service.ListResponse
		if code, err := c.Do(context.Background(), http.MethodGet, base+"/locks", nil, &v); err != nil || code != 200 {
			t.Fatalf("list: %d %v", code, err)
		}
		return v.Revision
	}
	rev := revision()
	long := strings.Repeat("a", 257)
	cases := []struct {
		name, method, path string
		body               any
		status             int
		code               string
	}{
		{"ttl too small", "POST", "/locks/x/acquire", map[string]any{"client_id": "c", "ttl_ms": 999}, 400, "invalid_argument"},
		{"ttl too large", "POST", "/locks/x/acquire", map[string]any{"client_id": "c", "ttl_ms": 600001}, 400, "invalid_argument"},
		{"no ttl no session", "POST", "/locks/x/acquire", map[string]any{"client_id": "c"}, 400, "invalid_argument"},
		{"ttl and session", "POST", "/locks/x/acquire", map[string]any{"client_id": "c", "ttl_ms": 5000, "session_id": strings.Repeat("0", 32)}, 400, "invalid_argument"},
		{"bad session id", "POST", "/locks/x/acquire", map[string]any{"client_id": "c", "session_id": "zz"}, 400, "invalid_argument"},
		{"unknown session", "POST", "/locks/x/acquire", map[string]any{"client_id": "c", "session_id": strings.Repeat("ab", 16)}, 404, "session_not_found"},
		{"no client id", "POST", "/locks/x/acquire", map[string]any{"ttl_ms": 5000}, 400, "invalid_argument"},
		{"client id with space", "POST", "/locks/x/acquire", map[string]any{"client_id": "a b", "ttl_ms": 5000}, 400, "invalid_argument"},
		{"negative wait", "POST", "/locks/x/acquire", map[string]any{"client_id": "c", "ttl_ms": 5000, "wait_timeout_ms": -1}, 400, "invalid_argument"},
		{"wait too long", "POST", "/locks/x/acquire", map[string]any{"client_id": "c", "ttl_ms": 5000, "wait_timeout_ms": 3600001}, 400, "invalid_argument"},
		{"name too long", "POST", "/locks/" + long + "/acquire", map[string]any{"client_id": "c", "ttl_ms": 5000}, 400, "invalid_argument"},
		{"dot segment", "POST", "/locks/a/./b/acquire", map[string]any{"client_id": "c", "ttl_ms": 5000}, 400, "invalid_argument"},
		{"unknown field", "POST", "/locks/x/acquire", map[string]any{"client_id": "c", "ttl_ms": 5000, "colour": "red"}, 400, "invalid_argument"},
		{"release wrong token", "POST", "/locks/held/release", map[string]any{"client_id": "owner", "fencing_token": a.FencingToken + 1, "lease_id": a.LeaseID}, 409, "not_holder"},
		{"release wrong lease", "POST", "/locks/held/release", map[string]any{"client_id": "owner", "fencing_token": a.FencingToken, "lease_id": strings.Repeat("0", 32)}, 409, "not_holder"},
		{"release other client", "POST", "/locks/held/release", map[string]any{"client_id": "thief", "fencing_token": a.FencingToken, "lease_id": a.LeaseID}, 409, "not_holder"},
		{"release no token", "POST", "/locks/held/release", map[string]any{"client_id": "owner", "lease_id": a.LeaseID}, 400, "invalid_argument"},
		{"renew bad ttl", "POST", "/locks/held/renew", map[string]any{"client_id": "owner", "fencing_token": a.FencingToken, "lease_id": a.LeaseID, "ttl_ms": 10}, 400, "invalid_argument"},
		{"renew free lock", "POST", "/locks/free/renew", map[string]any{"client_id": "owner", "fencing_token": 1, "lease_id": a.LeaseID}, 409, "not_holder"},
		{"session bad ttl", "POST", "/sessions", map[string]any{"client_id": "c", "ttl_ms": 0}, 400, "invalid_argument"},
		{"keepalive unknown", "POST", "/sessions/" + strings.Repeat("cd", 16) + "/keepalive", nil, 404, "session_not_found"},
		{"keepalive bad id", "POST", "/sessions/nope/keepalive", nil, 400, "invalid_argument"},
		{"delete unknown", "DELETE", "/sessions/" + strings.Repeat("cd", 16), nil, 404, "session_not_found"},
		{"list bad limit", "GET", "/locks?limit=100000", nil, 400, "invalid_argument"},
		{"list bad prefix", "GET", "/locks?prefix=a%20b", nil, 400, "invalid_argument"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var e struct {
				Error struct{ Code, Message string } `json:"error"`
			}
			code, err := c.Do(context.Background(), tc.method, base+tc.path, tc.body, &e)
			if err != nil {
				t.Fatal(err)
			}
			if code != tc.status || e.Error.Code != tc.code || e.Error.Message == "" {
				t.Fatalf("got %d %+v, want %d %s with a message", code, e, tc.status, tc.code)
			}
		})
	}
	if got := revision(); got != rev {
		t.Fatalf("bad input changed the state: revision %d → %d", rev, got)
	}
	if v := getLock(t, c, leader, "held"); !v.Held || v.Holder.FencingToken != a.FencingToken {
		t.Fatalf("held lock disturbed: %+v", v)
	}
}
