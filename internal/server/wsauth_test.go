package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/dlock/dlock/internal/server"
	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
)

// Under --acl a WebSocket is served only once authenticated: with a token on
// the upgrade (checked before upgrading), or with an auth message within the
// deadline; anything else is closed. One client IP may hold only a few
// connections that have not authenticated yet, so anonymous connections
// cannot pile up until the node runs out of file descriptors.
func TestWebSocketMustAuthenticate(t *testing.T) {
	const perIP = 4
	c := testcluster.NewWith(t, 1, testcluster.Options{ACL: true,
		Limits: server.Limits{WSAuthTimeout: time.Second, MaxUnauthenticatedPerIP: perIP}})
	node := c.WaitLeader(10 * time.Second)
	var root service.ACLTokenView
	if code, ec := aclDo(t, c, node, "", "POST", "/api/v1/acl/bootstrap", nil, &root); code != 200 {
		t.Fatalf("bootstrap: %d %s", code, ec)
	}
	url := "ws" + strings.TrimPrefix(c.URL(node), "http") + "/api/v1/ws"
	dial := func(token string) (*websocket.Conn, int) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		h := http.Header{}
		if token != "" {
			h.Set("Authorization", "Bearer "+token)
		}
		conn, res, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: h})
		if err != nil {
			if res == nil {
				t.Fatalf("dial: %v", err)
			}
			return nil, res.StatusCode
		}
		t.Cleanup(func() { conn.CloseNow() })
		return conn, 101
	}
	roundTrip := func(conn *websocket.Conn, msg map[string]any) wsAnswer {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		b, _ := json.Marshal(msg)
		if err := conn.Write(ctx, websocket.MessageText, b); err != nil {
			t.Fatalf("write: %v", err)
		}
		_, rb, err := conn.Read(ctx)
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		var a wsAnswer
		if err := json.Unmarshal(rb, &a); err != nil {
			t.Fatalf("answer %s: %v", rb, err)
		}
		return a
	}

	// A bad token on the upgrade is refused before upgrading.
	if _, st := dial("0123456789abcdef0123456789abcdef"); st != 401 {
		t.Fatalf("upgrade with an unknown token: %d, want 401", st)
	}
	// A good one is served at once.
	if conn, st := dial(root.SecretID); st != 101 {
		t.Fatalf("upgrade with a token: %d", st)
	} else if a := roundTrip(conn, map[string]any{"id": "1", "op": "acquire", "name": "ws/a", "client_id": "c", "ttl_ms": 30000}); a.Error != nil {
		t.Fatalf("acquire on a connection opened with a token: %+v", a.Error)
	}

	// Anonymous connections: only perIP at a time, each closed at its deadline.
	var anon []*websocket.Conn
	for i := 0; i < perIP; i++ {
		conn, st := dial("")
		if st != 101 {
			t.Fatalf("anonymous connection %d: %d", i, st)
		}
		anon = append(anon, conn)
	}
	if _, st := dial(""); st != 429 {
		t.Fatalf("anonymous connection %d from one IP: %d, want 429", perIP+1, st)
	}
	for i, conn := range anon {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		_, _, err := conn.Read(ctx)
		timedOut := ctx.Err() != nil
		cancel()
		if err == nil || timedOut {
			t.Fatalf("anonymous connection %d still open after its deadline: %v", i, err)
		}
	}
	// Their slots are free again; a browser-style client authenticates by
	// message, and a wrong token is answered and closed.
	testutil.Eventually(t, 10*time.Second, "the slots of the closed connections freed", func() bool {
		conn, st := dial("")
		if st == 101 {
			conn.CloseNow()
		}
		return st == 101
	})
	conn, _ := dial("")
	if a := roundTrip(conn, map[string]any{"id": "a", "op": "auth", "token": "0123456789abcdef0123456789abcdef"}); a.Error == nil || a.Error.Code != "unauthenticated" {
		t.Fatalf("auth with an unknown token: %+v", a)
	}
	conn, _ = dial("")
	if a := roundTrip(conn, map[string]any{"id": "x", "op": "acquire", "name": "ws/b", "client_id": "c", "ttl_ms": 30000}); a.Error == nil || a.Error.Code != "unauthenticated" {
		t.Fatalf("acquire before auth: %+v", a)
	}
	conn, _ = dial("")
	if a := roundTrip(conn, map[string]any{"id": "a", "op": "auth", "token": root.SecretID}); a.Error != nil {
		t.Fatalf("auth: %+v", a.Error)
	}
	if a := roundTrip(conn, map[string]any{"id": "2", "op": "acquire", "name": "ws/c", "client_id": "c", "ttl_ms": 30000}); a.Error != nil {
		t.Fatalf("acquire after auth: %+v", a.Error)
	}
}
