package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dlockv1 "github.com/dlock/dlock/api/dlock/v1"
	"github.com/dlock/dlock/internal/raftnode"
	"github.com/dlock/dlock/internal/server"
	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
)

// limitNode is a one-node cluster with the given limits.
type limitNode struct {
	t   *testing.T
	s   *server.Server
	url string
	hc  *http.Client
}

func startLimited(t *testing.T, l server.Limits) *limitNode {
	t.Helper()
	level := slog.LevelWarn
	if os.Getenv("DLOCK_TEST_LOG") != "" {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	raftAddr := testcluster.FreePort(t)
	rc := raftnode.Config{ID: "n1", DataDir: t.TempDir(), RaftAddr: raftAddr, InitialCluster: map[string]string{"n1": raftAddr},
		RaftLogLevel: "error", Logger: logger}
	s, err := server.Start(server.Config{Raft: rc, APIAddr: testcluster.FreePort(t), GRPCAddr: "127.0.0.1:0", Logger: logger, Limits: l})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
	})
	n := &limitNode{t: t, s: s, url: "http://" + s.APIAddr(), hc: &http.Client{Timeout: 30 * time.Second}}
	testutil.Eventually(t, 20*time.Second, "node ready", func() (bool, string) {
		res, err := n.hc.Get(n.url + "/readyz")
		if err != nil {
			return false, err.Error()
		}
		res.Body.Close()
		return res.StatusCode == 200, res.Status
	})
	return n
}

type apiAnswer struct {
	status int
	header http.Header
	body   map[string]any
	code   string
	msg    string
}

// call sends one API request; ctx may be cancelled to hang up.
func (n *limitNode) call(ctx context.Context, method, path string, body any) apiAnswer {
	n.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, n.url+"/api/v1"+path, rd)
	if err != nil {
		n.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := n.hc.Do(req)
	if err != nil {
		return apiAnswer{}
	}
	defer res.Body.Close()
	a := apiAnswer{status: res.StatusCode, header: res.Header, body: map[string]any{}}
	_ = json.NewDecoder(res.Body).Decode(&a.body)
	if e, ok := a.body["error"].(map[string]any); ok {
		a.code, _ = e["code"].(string)
		a.msg, _ = e["message"].(string)
	}
	return a
}

func (n *limitNode) do(method, path string, body any) apiAnswer {
	return n.call(context.Background(), method, path, body)
}

func (a apiAnswer) mustLimit(t *testing.T, what, flag string) {
	t.Helper()
	if a.status != http.StatusTooManyRequests || a.code != "rate_limited" || !strings.Contains(a.msg, flag) {
		t.Fatalf("%s: got %d %q %q, want 429 rate_limited naming %s", what, a.status, a.code, a.msg, flag)
	}
	if s, err := strconv.Atoi(a.header.Get("Retry-After")); err != nil || s < 1 {
		t.Fatalf("%s: Retry-After %q, want whole seconds >= 1", what, a.header.Get("Retry-After"))
	}
}

func (n *limitNode) metrics() string {
	res, err := n.hc.Get(n.url + "/metrics")
	if err != nil {
		n.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return string(b)
}

func (n *limitNode) grpc(t *testing.T) (dlockv1.LockServiceClient, dlockv1.WatchServiceClient) {
	cc := dialGRPC(t, n.s.GRPCAddr())
	return dlockv1.NewLockServiceClient(cc), dlockv1.NewWatchServiceClient(cc)
}

func mustExhausted(t *testing.T, err error, flag string) {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), flag) {
		t.Fatalf("got %v, want RESOURCE_EXHAUSTED naming %s", err, flag)
	}
	for _, d := range st.Details() {
		if ed, ok := d.(*dlockv1.ErrorDetail); ok && ed.Code == "rate_limited" && ed.RetryAfterMs >= 1000 {
			return
		}
	}
	t.Fatalf("no ErrorDetail with code rate_limited and retry_after_ms in %v", st.Details())
}

// One client over its rate is refused on HTTP and gRPC alike while other
// clients go on, and is let in again once its bucket refills.
func TestRateLimitPerClient(t *testing.T) {
	n := startLimited(t, server.Limits{Service: service.Limits{Rate: 1, Burst: 2}})
	acq := func(client, lock string) apiAnswer {
		return n.do("POST", "/locks/"+lock+"/acquire", map[string]any{"client_id": client, "ttl_ms": 10000})
	}
	for i := range 2 {
		if a := acq("greedy", "r/"+strconv.Itoa(i)); a.status != 200 {
			t.Fatalf("within the burst: %d %s", a.status, a.msg)
		}
	}
	a := acq("greedy", "r/2")
	a.mustLimit(t, "over the rate", "--rate-limit")
	if !strings.Contains(a.msg, `client_id "greedy"`) {
		t.Fatalf("the message does not name the client: %q", a.msg)
	}
	if b := acq("polite", "r/3"); b.status != 200 {
		t.Fatalf("another client was refused while one is limited: %d %s", b.status, b.msg)
	}
	locks, _ := n.grpc(t)
	_, err := locks.Acquire(context.Background(), &dlockv1.AcquireRequest{Name: "r/4", ClientId: "greedy", TtlMs: 10000})
	mustExhausted(t, err, "--rate-limit")

	// Requests without a client_id share their remote address's bucket.
	for range 2 {
		if g := n.do("GET", "/locks/r/0", nil); g.status != 200 {
			t.Fatalf("read within the burst: %d %s", g.status, g.msg)
		}
	}
	g := n.do("GET", "/locks/r/0", nil)
	g.mustLimit(t, "reads over the rate", "--rate-limit")
	if !strings.Contains(g.msg, "without a client_id") {
		t.Fatalf("the message does not say how the request was keyed: %q", g.msg)
	}

	// The bucket refills at the rate.
	wait, _ := strconv.Atoi(a.header.Get("Retry-After"))
	time.Sleep(time.Duration(wait)*time.Second + 100*time.Millisecond)
	if a := acq("greedy", "r/5"); a.status != 200 {
		t.Fatalf("after Retry-After: %d %s", a.status, a.msg)
	}
	m := n.metrics()
	for _, want := range []string{`dlock_limited_requests_total{limit="rate_client"} 2`, `dlock_limited_requests_total{limit="rate_remote"} 1`,
		`dlock_request_duration_seconds_count{code="rate_limited",op="acquire"} 2`} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// A full queue refuses more waiters, and a client at its lease cap gets no
// more leases, while other locks and clients are unaffected and retries of
// answered requests still get their answers.
func TestCapsOnWaitersAndLeases(t *testing.T) {
	n := startLimited(t, server.Limits{Service: service.Limits{MaxWaitersPerLock: 2, MaxLeasesPerClient: 2}})
	if a := n.do("POST", "/locks/q/acquire", map[string]any{"client_id": "holder", "ttl_ms": 30000}); a.status != 200 {
		t.Fatalf("holder: %d %s", a.status, a.msg)
	}
	ctx, hangUp := context.WithCancel(context.Background())
	defer hangUp()
	done := make(chan apiAnswer, 2)
	for _, w := range []string{"w1", "w2"} {
		go func() {
			done <- n.call(ctx, "POST", "/locks/q/acquire", map[string]any{"client_id": w, "ttl_ms": 30000, "wait_timeout_ms": 30000})
		}()
	}
	testutil.Eventually(t, 10*time.Second, "the two waiters queued", func() bool { return n.do("GET", "/locks/q", nil).body["waiters"] == 2.0 })
	a := n.do("POST", "/locks/q/acquire", map[string]any{"client_id": "w3", "ttl_ms": 30000, "wait_timeout_ms": 30000})
	a.mustLimit(t, "third waiter", "--max-waiters-per-lock")
	if !strings.Contains(a.msg, `lock "q" already has 2 waiters`) {
		t.Fatalf("message: %q", a.msg)
	}
	if a := n.do("POST", "/locks/q/acquire", map[string]any{"client_id": "w3", "ttl_ms": 30000}); a.status != 409 || a.code != "lock_held" {
		t.Fatalf("without a wait the full queue does not matter: %d %s", a.status, a.code)
	}
	if a := n.do("POST", "/locks/other/acquire", map[string]any{"client_id": "w3", "ttl_ms": 30000, "wait_timeout_ms": 1000}); a.status != 200 {
		t.Fatalf("another lock: %d %s", a.status, a.msg)
	}
	// A waiter's or the holder's own client_id under a new lease would add a
	// waiter unless it takes over: the cap applies to it like to anyone.
	n.do("POST", "/locks/q/acquire", map[string]any{"client_id": "w1", "ttl_ms": 30000, "wait_timeout_ms": 30000}).
		mustLimit(t, "a waiter's client_id queuing again without takeover", "--max-waiters-per-lock")
	n.do("POST", "/locks/q/acquire", map[string]any{"client_id": "holder", "ttl_ms": 30000, "wait_timeout_ms": 30000}).
		mustLimit(t, "the holder's client_id queuing without takeover", "--max-waiters-per-lock")
	// With takeover it adds none: it takes w1's place (and then times out) ...
	if a := n.do("POST", "/locks/q/acquire", map[string]any{"client_id": "w1", "ttl_ms": 30000, "wait_timeout_ms": 300, "takeover": true}); a.status != 409 || a.code != "wait_timeout" {
		t.Fatalf("a waiter's takeover of its place: %d %s %s", a.status, a.code, a.msg)
	}
	// ... or the lock itself.
	if a := n.do("POST", "/locks/q/acquire", map[string]any{"client_id": "holder", "ttl_ms": 30000, "wait_timeout_ms": 30000, "takeover": true}); a.status != 200 {
		t.Fatalf("the holder's takeover with a full queue: %d %s %s", a.status, a.code, a.msg)
	}
	hangUp()
	for range 2 {
		<-done
	}

	session := func(client, req string) apiAnswer {
		return n.do("POST", "/sessions", map[string]any{"client_id": client, "ttl_ms": 30000, "request_id": req})
	}
	first := session("c", "s-1")
	if first.status != 201 || session("c", "s-2").status != 201 {
		t.Fatalf("sessions within the cap: %d", first.status)
	}
	session("c", "s-3").mustLimit(t, "third session", "--max-leases-per-client")
	a = n.do("POST", "/locks/c-lock/acquire", map[string]any{"client_id": "c", "ttl_ms": 30000})
	a.mustLimit(t, "implicit lease over the cap", "--max-leases-per-client")
	if !strings.Contains(a.msg, `client_id "c" already owns 2 leases`) {
		t.Fatalf("message: %q", a.msg)
	}
	if again := session("c", "s-1"); again.status != 201 || again.body["session_id"] != first.body["session_id"] {
		t.Fatalf("a retry of an answered create must get its first answer: %d %v", again.status, again.body)
	}
	if a := n.do("POST", "/locks/c-lock/acquire", map[string]any{"client_id": "c", "session_id": first.body["session_id"]}); a.status != 200 {
		t.Fatalf("acquiring under an existing session makes no lease: %d %s", a.status, a.msg)
	}
	if d := session("d", "d-1"); d.status != 201 {
		t.Fatalf("another client: %d %s", d.status, d.msg)
	}
	if a := n.do("DELETE", "/sessions/"+first.body["session_id"].(string), map[string]any{"client_id": "c"}); a.status != 200 {
		t.Fatalf("delete: %d %s", a.status, a.msg)
	}
	if s := session("c", "s-4"); s.status != 201 {
		t.Fatalf("below the cap again: %d %s", s.status, s.msg)
	}
	m := n.metrics()
	for _, want := range []string{`dlock_limited_requests_total{limit="waiters_per_lock"} 3`, `dlock_limited_requests_total{limit="leases_per_client"} 2`} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// sse opens a watch stream; the answer's status is all a refused one has.
func (n *limitNode) sse(ctx context.Context, query string) (*http.Response, <-chan string) {
	n.t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", n.url+"/api/v1/watch"+query, nil)
	res, err := (&http.Client{}).Do(req)
	if err != nil {
		n.t.Fatal(err)
	}
	events := make(chan string, 64)
	go func() {
		defer close(events)
		defer res.Body.Close()
		sc := bufio.NewScanner(res.Body)
		for sc.Scan() {
			if ev, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
				events <- ev
			}
		}
	}()
	return res, events
}

// Watch streams are capped per connection and per node, on every protocol,
// and a closed stream frees its slot.
func TestWatcherLimits(t *testing.T) {
	n := startLimited(t, server.Limits{Service: service.Limits{MaxWatchers: 3, MaxWatchersPerConn: 2}})
	_, watches := n.grpc(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first, firstCancel := context.WithCancel(ctx)
	for i, c := range []context.Context{first, ctx} {
		w, err := watches.Watch(c, &dlockv1.WatchRequest{Prefix: "w/"})
		if err == nil {
			_, err = w.Header()
		}
		if err != nil {
			t.Fatalf("gRPC watch %d: %v", i, err)
		}
	}
	w, err := watches.Watch(ctx, &dlockv1.WatchRequest{Prefix: "w/"})
	if err == nil {
		_, err = w.Recv()
	}
	mustExhausted(t, err, "--max-watchers-per-conn")

	res, _ := n.sse(ctx, "?prefix=w/")
	if res.StatusCode != 200 {
		t.Fatalf("SSE watch within the node's limit: %d", res.StatusCode)
	}
	refused, _ := n.sse(ctx, "?prefix=w/")
	if refused.StatusCode != http.StatusTooManyRequests || refused.Header.Get("Retry-After") == "" {
		t.Fatalf("SSE watch over the node's limit: %d, want 429 with Retry-After", refused.StatusCode)
	}
	obs := n.do("GET", "/elections/e?observe=true", nil)
	obs.mustLimit(t, "observe over the node's limit", "--max-watchers")
	// "--max-watchers" is also a prefix of the per-connection flag: the
	// node's limit must be named, not the connection's.
	if strings.Contains(obs.msg, "--max-watchers-per-conn") {
		t.Fatalf("observe over the node's limit names the per-connection limit: %q", obs.msg)
	}

	firstCancel()
	polledRefusals := 0
	testutil.Eventually(t, 10*time.Second, "a closed stream to free its slot", func() (bool, string) {
		res, _ := n.sse(ctx, "?prefix=w/")
		if res.StatusCode == 200 {
			return true, ""
		}
		polledRefusals++
		return false, fmt.Sprintf("status %d", res.StatusCode)
	})
	m := n.metrics()
	for _, want := range []string{"dlock_limited_requests_total{limit=\"watchers_per_conn\"} 1\n",
		// The refused SSE watch, the refused observe, and the poll's refusals.
		fmt.Sprintf("dlock_limited_requests_total{limit=\"watchers\"} %d\n", 2+polledRefusals)} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// trickle writes b one byte every gap until it is done or stop closes; it
// owns no connection state beyond the writes.
func trickle(conn net.Conn, b []byte, gap time.Duration, stop <-chan struct{}) {
	for i := range b {
		select {
		case <-stop:
			return
		case <-time.After(gap):
		}
		if _, err := conn.Write(b[i : i+1]); err != nil {
			return
		}
	}
}

// closedByServer sends head, then trickles tail slowly (it would take far
// longer than the server's timeout), and reports what the server sent
// before it closed the connection. It fails if the server keeps the
// connection past guard.
func closedByServer(t *testing.T, addr, head, tail string, guard time.Duration) string {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(head)); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		trickle(conn, []byte(tail), 100*time.Millisecond, stop)
	}()
	defer func() { close(stop); <-done }()
	_ = conn.SetReadDeadline(time.Now().Add(guard))
	got, err := io.ReadAll(conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the server kept a slow connection open for %s (sent %q)", guard, got)
	}
	return string(got)
}

// A client that sends its headers or body a byte at a time is cut off at
// the read timeouts, on the HTTP API and in the gRPC handshake.
func TestSlowClientsAreCut(t *testing.T) {
	// The two timeouts are far apart, and each guard below lies between
	// them: net/http falls back to ReadTimeout when ReadHeaderTimeout is
	// unset, so a guard above ReadTimeout would not tell whether the
	// configured ReadHeaderTimeout is the one that cut the headers.
	n := startLimited(t, server.Limits{ReadHeaderTimeout: 500 * time.Millisecond, ReadTimeout: 5 * time.Second})
	// Each trickle below would take 10 s; the guard is well short of that.
	slowHeaders := strings.Repeat("X-Slow: a\r\n", 10)
	closedByServer(t, n.s.APIAddr(), "GET /healthz HTTP/1.1\r\nHost: dlock\r\n", slowHeaders, 3*time.Second)

	// Above ReadTimeout, well below the default (30 s).
	got := closedByServer(t, n.s.APIAddr(),
		"POST /api/v1/sessions HTTP/1.1\r\nHost: dlock\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n",
		strings.Repeat(" ", 100), 9*time.Second)
	if !strings.HasPrefix(got, "HTTP/1.1 400") || !strings.Contains(got, "could not read the request body") {
		t.Fatalf("slow body: the server answered %q, want a 400 saying the body could not be read", got)
	}

	// gRPC: a connection that sends its HTTP/2 preface a byte at a time
	// (2.4 s in all) is cut at the handshake timeout.
	closedByServer(t, n.s.GRPCAddr(), "", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 2*time.Second)

	if a := n.do("GET", "/locks/x", nil); a.status != 200 {
		t.Fatalf("a normal request after the slow ones: %d %s", a.status, a.msg)
	}
}

// Requests that rightly stay open — a blocking acquire, an SSE watch, a
// WebSocket — outlive the read and write timeouts meant for plain requests.
func TestLongRequestsOutlivePlainTimeouts(t *testing.T) {
	const plain = time.Second
	n := startLimited(t, server.Limits{ReadTimeout: plain, WriteTimeout: plain})
	h := n.do("POST", "/locks/long/acquire", map[string]any{"client_id": "holder", "ttl_ms": 30000})
	if h.status != 200 {
		t.Fatalf("holder: %d %s", h.status, h.msg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res, events := n.sse(ctx, "?prefix=long")
	if res.StatusCode != 200 {
		t.Fatalf("watch: %d", res.StatusCode)
	}
	ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(n.url, "http")+"/api/v1/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	waited := make(chan apiAnswer, 1)
	go func() {
		waited <- n.call(ctx, "POST", "/locks/long/acquire", map[string]any{"client_id": "waiter", "ttl_ms": 30000, "wait_timeout_ms": 20000})
	}()
	testutil.Eventually(t, 10*time.Second, "the waiter queued", func() bool { return n.do("GET", "/locks/long", nil).body["waiters"] == 1.0 })

	time.Sleep(plain*2 + plain/2)

	if a := n.do("POST", "/locks/long/release", map[string]any{"client_id": "holder", "fencing_token": h.body["fencing_token"], "lease_id": h.body["lease_id"]}); a.status != 200 {
		t.Fatalf("release: %d %s", a.status, a.msg)
	}
	select {
	case a := <-waited:
		if a.status != 200 || a.body["acquired"] != true {
			t.Fatalf("the blocking acquire was cut: %d %v", a.status, a.body)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the blocking acquire never answered")
	}
	seen := map[string]bool{}
	for deadline := time.After(10 * time.Second); !seen["acquired"] || !seen["released"]; {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatalf("the watch stream ended; saw %v", seen)
			}
			seen[ev] = true
		case <-deadline:
			t.Fatalf("the watch stream went quiet; saw %v", seen)
		}
	}
	msg := `{"id":"1","op":"acquire","name":"ws-lock","client_id":"ws","ttl_ms":30000}`
	if err := ws.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
		t.Fatalf("the WebSocket was cut: %v", err)
	}
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	defer rcancel()
	_, b, err := ws.Read(rctx)
	if err != nil || !strings.Contains(string(b), `"acquired":true`) {
		t.Fatalf("WebSocket answer: %s %v", b, err)
	}
}

// Many blocking acquires at once, through every node, cannot queue more
// waiters than --max-waiters-per-lock. Each node's early check reads its own
// state, where none of the racing waits is queued yet, so all of them used
// to pass it and queue; the state machine now refuses the ones past the cap,
// whichever node took them.
func TestWaiterCapHoldsUnderConcurrentWaits(t *testing.T) {
	const limit, waits = 5, 60
	c := testcluster.NewWith(t, 3, testcluster.Options{Limits: server.Limits{Service: service.Limits{MaxWaitersPerLock: limit}}})
	leader := c.WaitLeader(10 * time.Second)
	if code, _ := acquire(t, c, leader, "capped", map[string]any{"client_id": "holder", "ttl_ms": 120000}); code != 200 {
		t.Fatalf("holder: %d", code)
	}
	nodes := c.IDs()
	ctx, hangUp := context.WithCancel(context.Background())
	var (
		mu      sync.Mutex
		refused int
		other   []string
		wg      sync.WaitGroup
	)
	start := make(chan struct{})
	for i := range waits {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			var e errBody
			code, err := c.Do(ctx, http.MethodPost, c.URL(nodes[i%len(nodes)])+"/api/v1/locks/capped/acquire",
				map[string]any{"client_id": fmt.Sprintf("w%d", i), "ttl_ms": 60000, "wait_timeout_ms": 60000}, &e)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case ctx.Err() != nil:
				// Still waiting in line when the test hung up.
			case code == http.StatusTooManyRequests && e.Error.Code == "rate_limited":
				refused++
			default:
				other = append(other, fmt.Sprintf("%d %s %v", code, e.Error.Code, err))
			}
		}()
	}
	close(start)
	defer func() {
		hangUp()
		wg.Wait()
	}()
	// Every wait is either in line or refused: then count.
	testutil.Eventually(t, 30*time.Second, "every wait queued or refused", func() bool {
		mu.Lock()
		done := refused + len(other)
		mu.Unlock()
		v, err := staleLock(c, leader, "capped")
		return err == nil && v.Waiters+done >= waits
	})
	v := getLock(t, c, leader, "capped")
	mu.Lock()
	defer mu.Unlock()
	if len(other) > 0 {
		t.Fatalf("unexpected answers: %v", other)
	}
	if v.Waiters > limit {
		t.Fatalf("%d waiters queued with the cap at %d (%d refused)", v.Waiters, limit, refused)
	}
	if v.Waiters != limit || refused != waits-limit {
		t.Fatalf("%d waiters queued and %d refused of %d, want %d and %d", v.Waiters, refused, waits, limit, waits-limit)
	}
}
