package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/testcluster"
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
