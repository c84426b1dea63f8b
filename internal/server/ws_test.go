package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
)

// wsAnswer is any server message on the WebSocket.
type wsAnswer struct {
	ID     string          `json:"id"`
	Op     string          `json:"op"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
	Holder *service.Holder     `json:"holder"`
	Event  *service.WatchEvent `json:"event"`
}

type wsClient struct {
	t    *testing.T
	conn *websocket.Conn
	in   chan wsAnswer
	// events are the watch events answer set aside.
	events []string
}

// wsDial connects to a node's /api/v1/ws and reads answers on a goroutine
// that ends when the connection does.
func wsDial(t *testing.T, c *testcluster.Cluster, node string) *wsClient {
	return wsDialWith(t, c, node, nil)
}

// wsDialWith is wsDial with headers on the upgrade request (a bearer token).
func wsDialWith(t *testing.T, c *testcluster.Cluster, node string, header http.Header) *wsClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(c.URL(node), "http")+"/api/v1/ws", &websocket.DialOptions{HTTPHeader: header})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	w := &wsClient{t: t, conn: conn, in: make(chan wsAnswer, 64)}
	go func() {
		defer close(w.in)
		for {
			_, b, err := conn.Read(context.Background())
			if err != nil {
				return
			}
			var a wsAnswer
			if err := json.Unmarshal(b, &a); err != nil {
				t.Errorf("bad message %s: %v", b, err)
				return
			}
			w.in <- a
		}
	}()
	t.Cleanup(func() { conn.CloseNow() })
	return w
}

func (w *wsClient) send(msg map[string]any) {
	w.t.Helper()
	b, _ := json.Marshal(msg)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := w.conn.Write(ctx, websocket.MessageText, b); err != nil {
		w.t.Fatalf("send: %v", err)
	}
}

func (w *wsClient) next(what string) wsAnswer {
	w.t.Helper()
	select {
	case a, ok := <-w.in:
		if !ok {
			w.t.Fatalf("%s: connection closed", what)
		}
		return a
	case <-time.After(10 * time.Second):
		w.t.Fatalf("%s: nothing within 10 s", what)
	}
	return wsAnswer{}
}

// answer waits for the answer to message id, setting aside the watch events
// that arrive meanwhile (they come from other goroutines of the connection,
// so their order relative to answers is not fixed).
func (w *wsClient) answer(id string) wsAnswer {
	w.t.Helper()
	for {
		a := w.next("answer to " + id)
		if a.Op == "event" {
			w.events = append(w.events, a.Event.Type+" "+a.Event.Name+" "+a.Event.ClientID)
			continue
		}
		if a.ID != id {
			w.t.Fatalf("waiting for the answer to %s, got %+v", id, a)
		}
		return a
	}
}

func TestWebSocketAcquireWaitGrantRelease(t *testing.T) {
	c := testcluster.New(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	a, b := wsDial(t, c, leader), wsDial(t, c, c.Follower())

	a.send(map[string]any{"id": "a1", "op": "acquire", "name": "jobs/x", "client_id": "A", "ttl_ms": 30000})
	ga := a.answer("a1")
	var grantA service.AcquireResponse
	if ga.Op != "acquire" || ga.Error != nil || json.Unmarshal(ga.Result, &grantA) != nil || !grantA.Acquired {
		t.Fatalf("A: %+v", ga)
	}

	// From the grant's revision on: "from now" on a follower could still be
	// before the grant.
	b.send(map[string]any{"id": "b0", "op": "watch", "prefix": "jobs/", "from_revision": grantA.Revision + 1})
	if w := b.answer("b0"); w.Error != nil || !strings.Contains(string(w.Result), `"watching":true`) {
		t.Fatalf("watch: %+v", w)
	}
	// B waits on its connection ...
	b.send(map[string]any{"id": "b1", "op": "acquire", "name": "jobs/x", "client_id": "B", "ttl_ms": 30000, "wait_timeout_ms": 30000})
	testutil.Eventually(t, 5*time.Second, "B queued", func() bool { return getLock(t, c, leader, "jobs/x").Waiters == 1 })
	// ... while its other messages are answered at once.
	b.send(map[string]any{"id": "b2", "op": "renew", "name": "jobs/x", "client_id": "B", "fencing_token": grantA.FencingToken, "lease_id": grantA.LeaseID})
	if r := b.answer("b2"); r.Error == nil || r.Error.Code != "not_holder" {
		t.Fatalf("renew by a non-holder: %+v", r)
	}
	b.send(map[string]any{"id": "b3", "op": "acquire", "name": "jobs/x", "client_id": "B2", "ttl_ms": 30000})
	if r := b.answer("b3"); r.Error == nil || r.Error.Code != "lock_held" || r.Holder == nil || r.Holder.ClientID != "A" {
		t.Fatalf("lock_held: %+v", r)
	}

	a.send(map[string]any{"id": "a2", "op": "release", "name": "jobs/x", "client_id": "A", "fencing_token": grantA.FencingToken, "lease_id": grantA.LeaseID})
	if r := a.answer("a2"); r.Error != nil || !strings.Contains(string(r.Result), `"released":true`) {
		t.Fatalf("release A: %+v", r)
	}
	// The grant is pushed to B when it happens.
	gb := b.answer("b1")
	var grantB service.AcquireResponse
	if gb.Error != nil || json.Unmarshal(gb.Result, &grantB) != nil || !grantB.Acquired || grantB.FencingToken <= grantA.FencingToken {
		t.Fatalf("B's grant %+v after A's token %d", gb, grantA.FencingToken)
	}
	for len(b.events) < 3 {
		if m := b.next("watch events"); m.Op == "event" && m.ID == "b0" {
			b.events = append(b.events, m.Event.Type+" "+m.Event.Name+" "+m.Event.ClientID)
		} else {
			t.Fatalf("expected an event, got %+v", m)
		}
	}
	if got, want := strings.Join(b.events, ", "), "queued jobs/x B, released jobs/x A, acquired jobs/x B"; got != want {
		t.Fatalf("events %q, want %q", got, want)
	}
	// Unwatching answers once the watch has ended: no event follows it.
	b.send(map[string]any{"id": "b4", "op": "unwatch", "watch_id": "b0"})
	if r := b.answer("b4"); string(r.Result) != `{"unwatched":true}` {
		t.Fatalf("unwatch: %+v", r)
	}
	b.send(map[string]any{"id": "b5", "op": "release", "name": "jobs/x", "client_id": "B", "fencing_token": grantB.FencingToken, "lease_id": grantB.LeaseID})
	if r := b.answer("b5"); r.Error != nil {
		t.Fatalf("release B: %+v", r)
	}
	select {
	case m := <-b.in:
		t.Fatalf("message after unwatch and release: %+v", m)
	case <-time.After(200 * time.Millisecond):
	}
	if v := getLock(t, c, leader, "jobs/x"); v.Held || v.Waiters != 0 {
		t.Fatalf("after both released: %+v", v)
	}
}

func TestWebSocketCloseWithdrawsWait(t *testing.T) {
	c := testcluster.New(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	code, held := acquire(t, c, leader, "busy", map[string]any{"client_id": "holder", "ttl_ms": 60000})
	if code != 200 {
		t.Fatalf("holder: %d", code)
	}
	w := wsDial(t, c, c.Follower())
	w.send(map[string]any{"id": "1", "op": "acquire", "name": "busy", "client_id": "waiter", "ttl_ms": 30000, "wait_timeout_ms": 60000})
	testutil.Eventually(t, 5*time.Second, "waiter queued", func() bool { return getLock(t, c, leader, "busy").Waiters == 1 })
	if err := w.conn.Close(websocket.StatusNormalClosure, "bye"); err != nil {
		t.Fatalf("close: %v", err)
	}
	testutil.Eventually(t, 5*time.Second, "the wait to be withdrawn", func() bool { return getLock(t, c, leader, "busy").Waiters == 0 })
	if v := getLock(t, c, leader, "busy"); !v.Held || v.Holder.FencingToken != held.FencingToken {
		t.Fatalf("holder disturbed: %+v", v)
	}
}
