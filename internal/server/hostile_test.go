package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dlockv1 "github.com/dlock/dlock/api/dlock/v1"
	"github.com/dlock/dlock/internal/server"
	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
)

// A web page a developer visits must not take locks on a cluster it can
// reach through the developer's browser: a cross-origin form-like POST (no
// JSON Content-Type) changes nothing, whatever its Origin; a page served by
// another member of the cluster may call the API (HTTP and WebSocket), and a
// foreign one may not.
func TestCrossOriginBrowserRequests(t *testing.T) {
	c := testcluster.New(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	node := c.Follower()
	memberOrigin := c.URL(leader) // http://127.0.0.1:port, the leader's API address

	post := func(name string, header map[string]string) int {
		req, _ := http.NewRequest("POST", c.URL(node)+"/api/v1/locks/"+name+"/acquire", strings.NewReader(`{"client_id":"page","ttl_ms":30000}`))
		for k, v := range header {
			req.Header.Set(k, v)
		}
		res, err := c.Client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	held := func(name string) bool {
		var v service.LockView
		if st, err := c.Do(context.Background(), "GET", c.URL(leader)+"/api/v1/locks/"+name, nil, &v); err != nil || st != 200 {
			t.Fatalf("read %s: %d %v", name, st, err)
		}
		return v.Held
	}

	// What a cross-site form sends: text/plain, from a foreign Origin.
	if st := post("web/a", map[string]string{"Origin": "http://evil.example", "Content-Type": "text/plain"}); st != 403 {
		t.Fatalf("cross-origin text/plain POST: %d, want 403", st)
	}
	// No Content-Type at all, from a foreign page (the reported request).
	if st := post("web/b", map[string]string{"Origin": "http://evil.example"}); st != 403 {
		t.Fatalf("cross-origin POST without Content-Type: %d, want 403", st)
	}
	// The JSON rule on its own, for a request without Origin.
	if st := post("web/c", map[string]string{"Content-Type": "text/plain"}); st != 415 {
		t.Fatalf("text/plain POST: %d, want 415", st)
	}
	for _, n := range []string{"web/a", "web/b", "web/c"} {
		if held(n) {
			t.Fatalf("a refused request took %s", n)
		}
	}

	// A page served by another member passes.
	if st := post("web/d", map[string]string{"Origin": memberOrigin, "Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"}); st != 200 || !held("web/d") {
		t.Fatalf("POST from a member's origin: %d", st)
	}

	wsURL := "ws" + strings.TrimPrefix(c.URL(node), "http") + "/api/v1/ws"
	dial := func(origin string) (int, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		h := http.Header{}
		h.Set("Origin", origin)
		conn, res, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPHeader: h})
		if err == nil {
			conn.CloseNow()
			return 101, nil
		}
		if res != nil {
			return res.StatusCode, err
		}
		return 0, err
	}
	if st, err := dial(memberOrigin); st != 101 {
		t.Fatalf("WebSocket from a member's origin: %d %v", st, err)
	}
	if st, _ := dial("http://evil.example"); st != 403 {
		t.Fatalf("WebSocket from a foreign origin: %d, want 403", st)
	}
}

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

// A watch from a revision the cluster has not reached would stay silent
// until it got there — for a huge from_revision, for ever. Every protocol
// refuses it with invalid_argument naming the current revision, while a
// from_revision up to the cluster's revision + 1 is served even by a node
// that has not applied that revision yet.
func TestWatchFromFutureRevisionRefused(t *testing.T) {
	c := testcluster.New(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	node := c.Follower()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	const huge = "18446744073709551615"
	code, _ := sse(t, ctx, c.URL(node)+"/api/v1/watch?from_revision="+huge)
	if code != 400 {
		t.Fatalf("SSE watch from %s: status %d, want 400", huge, code)
	}
	var e errBody
	if st, err := c.Do(ctx, "GET", c.URL(node)+"/api/v1/watch?from_revision="+huge, nil, &e); err != nil || st != 400 ||
		e.Error.Code != "invalid_argument" || !strings.Contains(e.Error.Message, "current revision is") {
		t.Fatalf("SSE watch from %s: %d %+v %v", huge, st, e, err)
	}

	// A server stream reports its refusal on the first Recv.
	ws, err := dlockv1.NewWatchServiceClient(dialGRPC(t, c.GRPCAddr(node))).Watch(ctx, &dlockv1.WatchRequest{FromRevision: 1 << 62})
	if err == nil {
		_, err = ws.Recv()
	}
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "current revision is") {
		t.Fatalf("gRPC watch from 2^62: %v", err)
	}

	w := wsDial(t, c, node)
	w.send(map[string]any{"id": "w1", "op": "watch", "from_revision": uint64(1 << 62)})
	if a := w.answer("w1"); a.Error == nil || a.Error.Code != "invalid_argument" || !strings.Contains(a.Error.Message, "current revision is") {
		t.Fatalf("WebSocket watch from 2^62: %+v", a)
	}

	// A client that saw revision R on the leader may watch from R+1 on a
	// follower at once, whether or not the follower has applied R yet.
	for i := 0; i < 10; i++ {
		var got service.AcquireResponse
		name := fmt.Sprintf("future/%d", i)
		if st, err := c.Do(ctx, "POST", c.URL(leader)+"/api/v1/locks/"+name+"/acquire", map[string]any{"client_id": "a", "ttl_ms": 30000}, &got); err != nil || st != 200 {
			t.Fatalf("acquire %s: %d %v", name, st, err)
		}
		wctx, wcancel := context.WithCancel(ctx)
		code, events := sse(t, wctx, fmt.Sprintf("%s/api/v1/watch?prefix=future/&from_revision=%d", c.URL(node), got.Revision+1))
		if code != 200 {
			wcancel()
			t.Fatalf("watch from revision %d (one past the leader's answer) on a follower: %d", got.Revision+1, code)
		}
		if st, err := c.Do(ctx, "POST", c.URL(leader)+"/api/v1/locks/"+name+"/release",
			map[string]any{"client_id": "a", "fencing_token": got.FencingToken, "lease_id": got.LeaseID}, nil); err != nil || st != 200 {
			t.Fatalf("release: %d %v", st, err)
		}
		select {
		case rec := <-events:
			// Nothing before from_revision (the acquire) is sent.
			if id, _ := strconv.ParseUint(rec.id, 10, 64); rec.event != "released" || id < got.Revision+1 {
				t.Fatalf("first event from %d: %+v", got.Revision+1, rec)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no event after the release")
		}
		wcancel()
	}
}

// DNS rebinding: a page on a name its author controls, rebound to a node's
// address after it loaded, calls the node as its own origin — Host and
// Origin both name rebind.example — so the origin rule passes it. The node
// refuses browser requests under names that are not an IP address,
// localhost, a member's API address or one given in --browser-hosts; before,
// such a page took a lock on a cluster without ACLs.
func TestDNSRebindingRefused(t *testing.T) {
	c := testcluster.NewWith(t, 1, testcluster.Options{BrowserHosts: []string{"proxy.example"}})
	node := c.WaitLeader(10 * time.Second)
	base := c.URL(node)
	port := base[strings.LastIndex(base, ":")+1:]
	do := func(method, path, host string, header map[string]string, body string) int {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		req.Host = host
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		for k, v := range header {
			req.Header.Set(k, v)
		}
		res, err := c.Client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	rebound := "rebind.example:" + port
	acquire := `{"client_id":"page","ttl_ms":30000}`
	for _, tc := range []struct {
		name, method, path, host string
		header                   map[string]string
		body                     string
		want                     int
	}{
		{"rebound POST", "POST", "/api/v1/locks/rb/a/acquire", rebound, map[string]string{"Origin": "http://" + rebound, "Sec-Fetch-Site": "same-origin"}, acquire, 403},
		{"rebound GET", "GET", "/api/v1/locks?prefix=rb", rebound, map[string]string{"Sec-Fetch-Site": "same-origin"}, "", 403},
		{"rebound watch", "GET", "/api/v1/watch", rebound, map[string]string{"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors"}, "", 403},
		{"rebound WebSocket", "GET", "/api/v1/ws", rebound, map[string]string{"Origin": "http://" + rebound, "Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}, "", 403},
		{"navigation to the console", "GET", "/ui/", rebound, map[string]string{"Sec-Fetch-Site": "none", "Sec-Fetch-Mode": "navigate"}, "", 200},
		{"not a browser", "POST", "/api/v1/locks/rb/b/acquire", rebound, nil, acquire, 200},
		{"localhost", "POST", "/api/v1/locks/rb/c/acquire", "localhost:" + port, map[string]string{"Origin": "http://localhost:" + port}, acquire, 200},
		{"--browser-hosts", "POST", "/api/v1/locks/rb/d/acquire", "proxy.example", map[string]string{"Origin": "https://proxy.example"}, acquire, 200},
	} {
		if got := do(tc.method, tc.path, tc.host, tc.header, tc.body); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
	var v service.LockView
	if st, err := c.Do(context.Background(), "GET", base+"/api/v1/locks/rb/a", nil, &v); err != nil || st != 200 || v.Held {
		t.Fatalf("the rebound page's acquire took the lock (%d, %v, held %v)", st, err, v.Held)
	}
}
