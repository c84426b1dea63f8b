package bench

import (
	"context"
	"errors"
	"fmt"
	"github.com/dlock/dlock/internal/testutil"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// connCountingServer is an httptest server that counts the connections it
// accepted and closed.
type connCountingServer struct {
	*httptest.Server
	opened, closed atomic.Int64
}

func newConnCountingServer(t *testing.T, h http.HandlerFunc) *connCountingServer {
	t.Helper()
	s := &connCountingServer{}
	s.Server = httptest.NewUnstartedServer(h)
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			s.opened.Add(1)
		case http.StateClosed, http.StateHijacked:
			s.closed.Add(1)
		}
	}
	s.Start()
	t.Cleanup(s.Close)
	return s
}

// echoStatus answers 200 with the request's method, path and body, or the
// status named by ?status=.
func echoStatus(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	if st := r.URL.Query().Get("status"); st != "" {
		var code int
		fmt.Sscan(st, &code)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		fmt.Fprintf(w, `{"error":{"code":"lock_held","message":"held by %x"}}`, b)
		return
	}
	if r.URL.Query().Get("close") != "" {
		w.Header().Set("Connection", "close")
	}
	if r.URL.Query().Get("chunked") != "" {
		for i := range 3 {
			fmt.Fprintf(w, "part%d;", i)
			w.(http.Flusher).Flush()
		}
		return
	}
	fmt.Fprintf(w, "%s %s %s %s", r.Method, r.RequestURI, r.Header.Get("Content-Type"), b)
}

func callText(t *testing.T, h *httpCaller, ctx context.Context, method, url string, body []byte) (int, string, error) {
	t.Helper()
	var status int
	var text string
	err := h.call(ctx, method, url, body, func(st int, b []byte) error {
		status, text = st, string(b)
		return nil
	})
	return status, text, err
}

func TestHTTPCallerSendsAndKeepsTheConnection(t *testing.T) {
	s := newConnCountingServer(t, echoStatus)
	h := newHTTPCaller(4, 5*time.Second)
	defer h.close()
	for i := range 20 {
		st, text, err := callText(t, h, context.Background(), http.MethodPost, s.URL+"/api/v1/locks/a/b%2Fc/acquire", []byte(fmt.Sprintf(`{"n":%d}`, i)))
		if err != nil || st != 200 {
			t.Fatalf("call %d: %d %q %v", i, st, text, err)
		}
		if want := fmt.Sprintf(`POST /api/v1/locks/a/b%%2Fc/acquire application/json {"n":%d}`, i); text != want {
			t.Fatalf("call %d: the server saw %q, want %q", i, text, want)
		}
	}
	st, text, err := callText(t, h, context.Background(), http.MethodGet, s.URL+"/x", nil)
	if err != nil || st != 200 || text != "GET /x  " {
		t.Fatalf("GET: %d %q %v", st, text, err)
	}
	if n := s.opened.Load(); n != 1 {
		t.Fatalf("21 calls one after another opened %d connections, want 1 kept alive", n)
	}
}

func TestHTTPCallerAnswers(t *testing.T) {
	s := newConnCountingServer(t, echoStatus)
	c := &dlockClient{calls: newHTTPCaller(4, 5*time.Second)}
	defer c.calls.close()

	err := c.do(context.Background(), http.MethodPost, s.URL+"/?status=409", map[string]string{"x": "y"}, nil)
	var ae *apiError
	if !errors.As(err, &ae) || ae.Status != 409 || ae.Code != "lock_held" || ae.Message != fmt.Sprintf("held by %x", `{"x":"y"}`) {
		t.Fatalf("a 409 answer: %v", err)
	}
	// A chunked answer is read whole, and the connection is kept.
	if st, text, err := callText(t, c.calls, context.Background(), http.MethodGet, s.URL+"/?chunked=1", nil); err != nil || st != 200 || text != "part0;part1;part2;" {
		t.Fatalf("chunked: %d %q %v", st, text, err)
	}
	// Connection: close is honoured: the next call opens a new connection.
	if _, _, err := callText(t, c.calls, context.Background(), http.MethodGet, s.URL+"/?close=1", nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := callText(t, c.calls, context.Background(), http.MethodGet, s.URL+"/", nil); err != nil {
		t.Fatal(err)
	}
	if n := s.opened.Load(); n != 2 {
		t.Fatalf("%d connections opened, want 2 (one closed by the server's Connection: close)", n)
	}
	if _, _, err := callText(t, c.calls, context.Background(), http.MethodGet, strings.Replace(s.URL, "http://", "https://", 1), nil); err == nil {
		t.Fatal("an https URL was accepted by a plain-HTTP caller")
	}
}

// A call whose context is cancelled, or whose deadline passes, ends at once
// although the server has not answered; its connection is closed (never
// reused with an answer still owed on it) and other calls go on.
func TestHTTPCallerEndsWithItsContext(t *testing.T) {
	release := make(chan struct{})
	s := newConnCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		if r.URL.Path == "/block" {
			// The body read, net/http watches the connection: until the client goes away (the server then sees its
			// connection closed) or the test ends.
			select {
			case <-r.Context().Done():
			case <-release:
			case <-time.After(10 * time.Second):
			}
		}
		fmt.Fprint(w, "ok")
	})
	defer close(release)
	h := newHTTPCaller(4, time.Minute)
	defer h.close()

	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	_, _, err := callText(t, h, ctx, http.MethodPost, s.URL+"/block", []byte(`{}`))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call: %v, want context.Canceled", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("a cancelled call took %v to end", d)
	}

	dctx, dcancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer dcancel()
	_, _, err = callText(t, h, dctx, http.MethodPost, s.URL+"/block", []byte(`{}`))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("call past its deadline: %v, want context.DeadlineExceeded", err)
	}

	// The caller's own timeout bounds a call without a deadline.
	short := newHTTPCaller(4, 100*time.Millisecond)
	defer short.close()
	if _, _, err = callText(t, short, context.Background(), http.MethodPost, s.URL+"/block", []byte(`{}`)); err == nil {
		t.Fatal("a call the server never answered succeeded")
	}

	if st, text, err := callText(t, h, context.Background(), http.MethodGet, s.URL+"/", nil); err != nil || st != 200 || text != "ok" {
		t.Fatalf("a call after the cancelled ones: %d %q %v", st, text, err)
	}
	testutil.Eventually(t, 5*time.Second, "the server sees the 3 abandoned connections closed", func() bool { return s.closed.Load() >= 3 })
}

// At most maxIdle connections per host are kept between calls.
func TestHTTPCallerKeepsAtMostMaxIdle(t *testing.T) {
	var inFlight sync.WaitGroup
	inFlight.Add(8)
	s := newConnCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		inFlight.Done()
		inFlight.Wait() // all 8 calls are open at once
		fmt.Fprint(w, "ok")
	})
	h := newHTTPCaller(2, 10*time.Second)
	defer h.close()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			if _, _, err := callText(t, h, context.Background(), http.MethodGet, s.URL+"/", nil); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	host := strings.TrimPrefix(s.URL, "http://")
	h.mu.Lock()
	kept := len(h.idle[host])
	h.mu.Unlock()
	if s.opened.Load() != 8 || kept != 2 {
		t.Fatalf("8 concurrent calls opened %d connections and kept %d, want 8 and 2", s.opened.Load(), kept)
	}
}
