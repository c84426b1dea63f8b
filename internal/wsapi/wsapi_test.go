package wsapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/testutil"
)

// fake blocks every acquire until its context ends (or release is called on
// it) and records how each one ended.
type fake struct {
	Service
	mu      sync.Mutex
	waiting map[string]chan struct{}
	ended   chan string
	slow    chan struct{} // a release of "slow" waits for it
}

func newFake() *fake {
	return &fake{waiting: map[string]chan struct{}{}, ended: make(chan string, 100), slow: make(chan struct{})}
}

func (f *fake) Acquire(ctx context.Context, req service.AcquireRequest) (*service.AcquireResponse, error) {
	if req.Name == "free" {
		return &service.AcquireResponse{Acquired: true, FencingToken: 1, LeaseID: "l"}, nil
	}
	if req.WaitTimeoutMs == 0 {
		return &service.AcquireResponse{Holder: &service.Holder{ClientID: "alice"}}, apierror.New(apierror.LockHeld, "held by alice")
	}
	grant := make(chan struct{})
	f.mu.Lock()
	f.waiting[req.Name] = grant
	f.mu.Unlock()
	select {
	case <-grant:
		return &service.AcquireResponse{Acquired: true, FencingToken: 2, LeaseID: "l2"}, nil
	case <-ctx.Done():
		f.ended <- req.Name
		return nil, apierror.Wrap(apierror.Unavailable, ctx.Err(), "the request was cancelled before %q was granted; the wait was withdrawn", req.Name)
	}
}

func (f *fake) Release(ctx context.Context, req service.ReleaseRequest) (*service.ReleaseResponse, error) {
	if req.Name == "slow" {
		select {
		case <-f.slow:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f.mu.Lock()
	grant, ok := f.waiting[req.Name]
	delete(f.waiting, req.Name)
	f.mu.Unlock()
	if ok {
		close(grant)
	}
	return &service.ReleaseResponse{Released: true, Revision: 9}, nil
}

type client struct {
	t  *testing.T
	ws *websocket.Conn
}

func start(t *testing.T, svc Service, opts Options) (*Handler, string) {
	t.Helper()
	h := New(svc, nil, opts)
	srv := httptest.NewServer(h)
	t.Cleanup(func() {
		h.Close()
		srv.Close()
	})
	return h, "ws" + strings.TrimPrefix(srv.URL, "http")
}

func dial(t *testing.T, url string) *client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	ws.SetReadLimit(1 << 20)
	t.Cleanup(func() { ws.CloseNow() })
	return &client{t: t, ws: ws}
}

func (c *client) send(msg string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.ws.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
		c.t.Fatal(err)
	}
}

type reply struct {
	ID     string          `json:"id"`
	Op     string          `json:"op"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
	Holder *service.Holder `json:"holder"`
}

func (c *client) next() reply {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, b, err := c.ws.Read(ctx)
	if err != nil {
		c.t.Fatalf("read: %v", err)
	}
	var r reply
	if err := json.Unmarshal(b, &r); err != nil {
		c.t.Fatalf("bad answer %s: %v", b, err)
	}
	return r
}

func TestBadMessagesAreAnsweredNotGuessed(t *testing.T) {
	_, url := start(t, newFake(), Options{})
	c := dial(t, url)
	for _, tc := range []struct{ msg, id, want string }{
		{`not json`, "", "must be one JSON object"},
		{`[1]`, "", "must be one JSON object"},
		{`{"op":"acquire","name":"x"}`, "", "id is required"},
		{`{"id":"1","op":"grab"}`, "1", `unknown op "grab"`},
		{`{"id":"2","op":"release","prefix":"a"}`, "2", `does not take field "prefix"`},
		{`{"id":"3","op":"acquire","name":"x","name":"y"}`, "3", "more than once"},
		{`{"id":"4","op":"acquire","NAME":"x"}`, "4", `does not take field "NAME"`},
		{`{"id":"5","op":"acquire","colour":"red"}`, "5", "unknown field"},
		{`{"id":"6","op":"acquire","ttl_ms":"soon"}`, "6", `"ttl_ms" has the wrong type`},
		{`{"id":"7","op":"watch"} {}`, "7", "data after the object"},
	} {
		c.send(tc.msg)
		r := c.next()
		if r.ID != tc.id || r.Error == nil || r.Error.Code != "invalid_argument" || !strings.Contains(r.Error.Message, tc.want) {
			t.Errorf("%s: got %+v %+v, want id %q and %q", tc.msg, r, r.Error, tc.id, tc.want)
		}
	}
	// Binary messages too; the connection keeps working after all of them.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = c.ws.Write(ctx, websocket.MessageBinary, []byte(`{}`))
	if r := c.next(); r.Error == nil || !strings.Contains(r.Error.Message, "text") {
		t.Errorf("binary: %+v", r)
	}
	c.send(`{"id":"ok","op":"acquire","name":"free","client_id":"c","ttl_ms":5000}`)
	if r := c.next(); r.ID != "ok" || r.Error != nil || !strings.Contains(string(r.Result), `"acquired":true`) {
		t.Errorf("acquire after bad messages: %+v", r)
	}
}

// A waiting acquire does not hold up other messages; the grant is pushed
// later; a lock_held answer carries the holder.
func TestAcquireWaitsWhileOtherMessagesFlow(t *testing.T) {
	f := newFake()
	_, url := start(t, f, Options{})
	c := dial(t, url)
	c.send(`{"id":"w","op":"acquire","name":"busy","client_id":"c","ttl_ms":5000,"wait_timeout_ms":60000}`)
	c.send(`{"id":"h","op":"acquire","name":"other","client_id":"c","ttl_ms":5000}`)
	if r := c.next(); r.ID != "h" || r.Error == nil || r.Error.Code != "lock_held" || r.Holder == nil || r.Holder.ClientID != "alice" {
		t.Fatalf("lock_held answer: %+v", r)
	}
	testutil.Eventually(t, 5*time.Second, "condition", func() bool { f.mu.Lock(); defer f.mu.Unlock(); return f.waiting["busy"] != nil })
	c.send(`{"id":"r","op":"release","name":"busy","client_id":"c","fencing_token":1,"lease_id":"x"}`)
	// The release answer and the pushed grant come from different goroutines,
	// in either order.
	got := map[string]reply{}
	for range 2 {
		r := c.next()
		got[r.ID] = r
	}
	if got["r"].Error != nil || !strings.Contains(string(got["w"].Result), `"fencing_token":2`) {
		t.Fatalf("answers %+v", got)
	}
}

// A slow release (an election under way, say) holds up later serial ops but
// not acquires, and not the server's reading of control frames: a ping is
// still answered meanwhile.
func TestSlowReleaseBlocksNothingElse(t *testing.T) {
	f := newFake()
	_, url := start(t, f, Options{})
	c := dial(t, url)
	c.send(`{"id":"r","op":"release","name":"slow","client_id":"c","fencing_token":1,"lease_id":"x"}`)
	c.send(`{"id":"a","op":"acquire","name":"free","client_id":"c","ttl_ms":5000}`)
	if r := c.next(); r.ID != "a" || r.Error != nil {
		t.Fatalf("acquire behind a slow release: %+v", r)
	}
	// The client's own reader must run for its Ping to see the pong.
	read := make(chan []byte, 1)
	go func() {
		_, b, _ := c.ws.Read(context.Background())
		read <- b
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.ws.Ping(ctx); err != nil {
		t.Fatalf("ping while a release is slow: %v", err)
	}
	close(f.slow)
	select {
	case b := <-read:
		if !strings.Contains(string(b), `"id":"r"`) || !strings.Contains(string(b), `"released":true`) {
			t.Fatalf("slow release answered %s", b)
		}
	case <-ctx.Done():
		t.Fatal("no answer to the slow release")
	}
}

func TestLimitsAndCancel(t *testing.T) {
	f := newFake()
	_, url := start(t, f, Options{MaxPending: 2, MaxMessageBytes: 1024})
	c := dial(t, url)
	c.send(`{"id":"a","op":"acquire","name":"n1","client_id":"c","ttl_ms":5000,"wait_timeout_ms":60000}`)
	c.send(`{"id":"a","op":"acquire","name":"n2","client_id":"c","ttl_ms":5000,"wait_timeout_ms":60000}`)
	if r := c.next(); r.ID != "a" || r.Error == nil || !strings.Contains(r.Error.Message, "already used") {
		t.Fatalf("duplicate id: %+v", r)
	}
	c.send(`{"id":"b","op":"acquire","name":"n2","client_id":"c","ttl_ms":5000,"wait_timeout_ms":60000}`)
	c.send(`{"id":"c","op":"acquire","name":"n3","client_id":"c","ttl_ms":5000,"wait_timeout_ms":60000}`)
	if r := c.next(); r.ID != "c" || r.Error == nil || r.Error.Code != "rate_limited" {
		t.Fatalf("over the pending limit: %+v", r)
	}
	// cancel withdraws one wait: its own answer comes first, then cancel's.
	c.send(`{"id":"x","op":"cancel","target_id":"a"}`)
	if r := c.next(); r.ID != "a" || r.Error == nil || r.Error.Code != "unavailable" {
		t.Fatalf("cancelled acquire: %+v", r)
	}
	if r := c.next(); r.ID != "x" || string(r.Result) != `{"cancelled":true}` {
		t.Fatalf("cancel: %+v", r)
	}
	if got := <-f.ended; got != "n1" {
		t.Fatalf("ended %s", got)
	}
	c.send(`{"id":"y","op":"cancel","target_id":"nope"}`)
	if r := c.next(); r.Error == nil || r.Error.Code != "not_found" {
		t.Fatalf("cancel unknown: %+v", r)
	}
	// A message over the limit closes the connection with 1009.
	c.send(`{"id":"big","op":"acquire","name":"` + strings.Repeat("a", 2000) + `"}`)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, _, err := c.ws.Read(ctx); websocket.CloseStatus(err) != websocket.StatusMessageTooBig {
		t.Fatalf("oversized message: %v", err)
	}
	// ... which also withdrew the remaining wait.
	select {
	case got := <-f.ended:
		if got != "n2" {
			t.Fatalf("ended %s", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("closing the connection did not end its pending acquire")
	}
}

// Closing the handler (server shutdown) ends every connection with 1001 and
// every acquire goroutine before Close returns.
func TestCloseEndsConnectionsAndWaits(t *testing.T) {
	f := newFake()
	h, url := start(t, f, Options{})
	c := dial(t, url)
	c.send(`{"id":"a","op":"acquire","name":"n1","client_id":"c","ttl_ms":5000,"wait_timeout_ms":60000}`)
	testutil.Eventually(t, 5*time.Second, "condition", func() bool { f.mu.Lock(); defer f.mu.Unlock(); return len(f.waiting) == 1 })
	done := make(chan struct{})
	go func() { h.Close(); close(done) }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, _, err := c.ws.Read(ctx); websocket.CloseStatus(err) != websocket.StatusGoingAway {
		t.Fatalf("read after Close: %v", err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
	select {
	case <-f.ended:
	default:
		t.Fatal("Close returned before the pending acquire ended")
	}
	// New connections are refused.
	_, res, err := websocket.Dial(ctx, url, nil)
	if err == nil || res == nil || res.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("dial after Close: %v %v", res, err)
	}
	if res.Header.Get("Retry-After") == "" {
		t.Error("503 without Retry-After")
	}
}

func TestPlainHTTPGetsJSONErrors(t *testing.T) {
	_, url := start(t, newFake(), Options{})
	httpURL := strings.Replace(url, "ws", "http", 1)
	res, err := http.Get(httpURL)
	if err != nil {
		t.Fatal(err)
	}
	var ge struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	gerr := json.NewDecoder(res.Body).Decode(&ge)
	res.Body.Close()
	if res.StatusCode != http.StatusBadRequest || res.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("plain GET: %d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
	// The body is what carries the promise: the API's JSON error shape.
	if gerr != nil || ge.Error.Code != "invalid_argument" || !strings.Contains(ge.Error.Message, "WebSocket") {
		t.Fatalf("plain GET body: %+v (%v)", ge, gerr)
	}
	res, err = http.Post(httpURL, "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	_ = json.NewDecoder(res.Body).Decode(&e)
	res.Body.Close()
	if res.StatusCode != http.StatusMethodNotAllowed || e.Error.Code != "method_not_allowed" || res.Header.Get("Allow") != "GET" {
		t.Fatalf("POST: %d %+v", res.StatusCode, e)
	}
}

// TestRefusedHandshakesGetJSONErrors: the upgrade requests the WebSocket
// library itself refuses (it would answer in plain text) get the API's JSON
// error shape too.
func TestRefusedHandshakesGetJSONErrors(t *testing.T) {
	_, url := start(t, newFake(), Options{})
	httpURL := strings.Replace(url, "ws", "http", 1)
	const key = "dGhlIHNhbXBsZSBub25jZQ=="
	tests := []struct {
		name     string
		header   http.Header
		status   int
		code     string
		mentions string
	}{
		{"foreign origin", http.Header{"Upgrade": {"websocket"}, "Connection": {"Upgrade"}, "Sec-Websocket-Version": {"13"},
			"Sec-Websocket-Key": {key}, "Origin": {"https://evil.example"}}, http.StatusForbidden, "permission_denied", "evil.example"},
		{"no key", http.Header{"Upgrade": {"websocket"}, "Connection": {"Upgrade"}, "Sec-Websocket-Version": {"13"}},
			http.StatusBadRequest, "invalid_argument", "Sec-WebSocket-Key"},
		{"no connection header", http.Header{"Upgrade": {"websocket"}, "Sec-Websocket-Version": {"13"}, "Sec-Websocket-Key": {key}},
			http.StatusBadRequest, "invalid_argument", "Connection"},
		{"old version", http.Header{"Upgrade": {"websocket"}, "Connection": {"Upgrade"}, "Sec-Websocket-Version": {"8"}, "Sec-Websocket-Key": {key}},
			http.StatusBadRequest, "invalid_argument", "version"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodGet, httpURL, nil)
			req.Header = tt.header
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var e struct {
				Error struct{ Code, Message string } `json:"error"`
			}
			derr := json.NewDecoder(res.Body).Decode(&e)
			res.Body.Close()
			if res.StatusCode != tt.status || res.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("%d %s, want %d application/json", res.StatusCode, res.Header.Get("Content-Type"), tt.status)
			}
			if derr != nil || e.Error.Code != tt.code || !strings.Contains(e.Error.Message, tt.mentions) {
				t.Fatalf("body %+v (%v): want code %s mentioning %q", e, derr, tt.code, tt.mentions)
			}
		})
	}
}
