package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock/client"
)

// TestLeaderKillDoesNotLoseLock kills the leader while a lock is held: the
// client renews through the new leader and never loses the lease.
func TestLeaderKillDoesNotLoseLock(t *testing.T) {
	const ttl = 3 * time.Second
	c := startCluster(t)
	cl := c.client("survivor")
	m := cl.NewMutex("failover/x", client.WithTTL(ttl))
	l, err := m.Lock(ctxTimeout(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	leader := c.WaitLeader(10 * time.Second)
	killedAt := time.Now()
	c.Kill(leader)
	newLeader := c.WaitLeader(10 * time.Second)
	t.Logf("killed leader %s; %s leads after %s", leader, newLeader, time.Since(killedAt).Round(time.Millisecond))

	// Two renewals sent after the kill are answered.
	eventually(t, 2*ttl, "a renewal after the kill", func() (bool, string) {
		return client.LastSent(l).After(killedAt), ""
	})
	after := client.LastSent(l)
	eventually(t, 2*ttl, "a second renewal after the kill", func() (bool, string) {
		return client.LastSent(l).After(after), ""
	})
	if l.Err() != nil {
		t.Fatalf("lease lost across the failover: %v", l.Err())
	}
	checkHeld(t, c.get("failover/x"), "survivor", l.Token())
	if err := m.Unlock(ctxTimeout(t, 10*time.Second)); err != nil {
		t.Fatalf("Unlock through the new leader: %v", err)
	}
	checkFree(t, c.get("failover/x"))
}

// TestLeaseLostNoLaterThanBound stops every node while locks are held: the
// client must declare the leases lost no later than the send time of the
// last answered renewal plus the TTL, on its own clock, and WithLock must
// cancel fn's context by then.
func TestLeaseLostNoLaterThanBound(t *testing.T) {
	const ttl = 2 * time.Second
	const slack = 250 * time.Millisecond // scheduling, not performance
	c := startCluster(t)
	cl := c.client("doomed", func(cfg *client.Config) { cfg.RequestTimeout = time.Second })

	m := cl.NewMutex("doom/x", client.WithTTL(ttl))
	l, err := m.Lock(ctxTimeout(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	granted := client.LastSent(l)

	type fnEnd struct {
		at    time.Time
		bound time.Time
		cause error
	}
	inFn := make(chan *client.Lease, 1)
	fnEnded := make(chan fnEnd, 1)
	withLockErr := make(chan error, 1)
	go func() {
		withLockErr <- cl.WithLock(ctxTimeout(t, 30*time.Second), "doom/y", func(ctx context.Context, l2 *client.Lease) error {
			inFn <- l2
			<-ctx.Done()
			fnEnded <- fnEnd{time.Now(), client.LastSent(l2).Add(ttl), context.Cause(ctx)}
			return context.Cause(ctx)
		}, client.WithTTL(ttl))
	}()
	var l2 *client.Lease
	select {
	case l2 = <-inFn:
	case err := <-withLockErr:
		t.Fatalf("WithLock: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("WithLock did not run fn")
	}

	// Let the bound come from a renewal, not the grant.
	eventually(t, 2*ttl, "a renewal", func() (bool, string) { return client.LastSent(l).After(granted), "" })
	closed := make(chan time.Time, 1)
	go func() {
		<-l.Done()
		closed <- time.Now()
	}()
	c.killAll()

	var closedAt time.Time
	select {
	case closedAt = <-closed:
	case <-time.After(ttl + 5*time.Second):
		t.Fatal("Done stayed open with every node stopped")
	}
	bound := client.LastSent(l).Add(ttl)
	t.Logf("Done closed %s after the bound (last answered renewal sent %s before)", closedAt.Sub(bound), closedAt.Sub(client.LastSent(l)))
	if closedAt.After(bound.Add(slack)) {
		t.Fatalf("Done closed %s after send time of the last answered renewal + TTL; the server may have given the lock away by then", closedAt.Sub(bound))
	}
	if closedAt.Before(bound) {
		t.Fatalf("Done closed %s before the bound although only renewals failed", bound.Sub(closedAt))
	}
	if !l.ExpiresAt().Equal(bound) {
		t.Fatalf("ExpiresAt %v, want the bound %v", l.ExpiresAt(), bound)
	}
	if !errors.Is(l.Err(), client.ErrLeaseLost) {
		t.Fatalf("Err = %v, want ErrLeaseLost", l.Err())
	}

	var fe fnEnd
	select {
	case fe = <-fnEnded:
	case <-time.After(ttl + 5*time.Second):
		t.Fatal("WithLock's fn context was not cancelled")
	}
	if fe.at.After(fe.bound.Add(slack)) {
		t.Fatalf("fn's context cancelled %s after its lease's bound", fe.at.Sub(fe.bound))
	}
	if !errors.Is(fe.cause, client.ErrLeaseLost) || l2.Err() == nil {
		t.Fatalf("fn's context cause = %v, want ErrLeaseLost", fe.cause)
	}
	select {
	case err := <-withLockErr:
		if !errors.Is(err, client.ErrLeaseLost) {
			t.Fatalf("WithLock = %v, want ErrLeaseLost", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WithLock did not return after the lease was lost")
	}
	// Unlock still ends cleanly and in bounded time with nobody to talk to.
	if err := m.Unlock(ctxTimeout(t, 500*time.Millisecond)); err == nil {
		t.Fatal("Unlock with every node stopped succeeded")
	}
}

// recorder is an HTTP transport that records requests and can lose the
// answer to the first few that match, after the server has acted on them.
type recorder struct {
	base http.RoundTripper

	mu    sync.Mutex
	drop  map[string]int           // action -> answers still to lose
	cut   map[string]time.Duration // action -> hang up on the next request after this long
	ids   map[string][]string
	hosts map[string][]string
}

func newRecorder() *recorder {
	return &recorder{base: http.DefaultTransport.(*http.Transport).Clone(),
		drop: map[string]int{}, cut: map[string]time.Duration{}, ids: map[string][]string{}, hosts: map[string][]string{}}
}

func (r *recorder) action(req *http.Request) string {
	p := req.URL.Path
	return p[strings.LastIndexByte(p, '/')+1:]
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		body, _ = io.ReadAll(req.Body)
		req = req.Clone(req.Context())
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	var fields struct {
		RequestID string `json:"request_id"`
	}
	_ = json.Unmarshal(body, &fields)
	act := r.action(req)
	r.mu.Lock()
	r.ids[act] = append(r.ids[act], fields.RequestID)
	r.hosts[act] = append(r.hosts[act], req.URL.Host)
	cut := r.cut[act]
	delete(r.cut, act)
	r.mu.Unlock()

	if cut > 0 {
		// Hang up mid-request, as a broken connection would: the server
		// sees the client go away.
		ctx, cancel := context.WithTimeout(req.Context(), cut)
		defer cancel()
		res, err := r.base.RoundTrip(req.WithContext(ctx))
		if err == nil {
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}
		return nil, errors.New("test: connection cut")
	}
	res, err := r.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	lose := r.drop[act] > 0
	if lose {
		r.drop[act]--
	}
	r.mu.Unlock()
	if lose {
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return nil, errors.New("test: connection lost after the server answered")
	}
	return res, nil
}

func (r *recorder) requestIDs(act string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.ids[act]...)
}

func (r *recorder) hostsOf(act string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.hosts[act]...)
}

func sameIDs(t *testing.T, what string, ids []string) {
	t.Helper()
	if len(ids) < 2 || ids[0] == "" {
		t.Fatalf("%s: want a retry, got request ids %q", what, ids)
	}
	for _, id := range ids {
		if id != ids[0] {
			t.Fatalf("%s: a retry changed the request id: %q", what, ids)
		}
	}
}

// TestRetriesKeepRequestID loses the answers to an acquire, a queued
// acquire and a release after the server acted on them: the retries carry
// the same request id, so each acted once.
func TestRetriesKeepRequestID(t *testing.T) {
	c := startCluster(t)
	rec := newRecorder()
	cl := c.client("retrier", func(cfg *client.Config) { cfg.HTTPClient = &http.Client{Transport: rec} })

	t.Run("Acquire", func(t *testing.T) {
		// Every node can name the leader's API address once it has applied
		// the leader's registration; only then can discovery succeed at once.
		eventually(t, 10*time.Second, "every node names the leader", func() (bool, string) {
			for _, id := range c.Running() {
				var ci client.ClusterInfo
				if code, err := c.Do(context.Background(), http.MethodGet, c.URL(id)+"/api/v1/cluster", nil, &ci); err != nil || code != 200 || ci.LeaderAPIAddr == "" {
					return false, id
				}
			}
			return true, ""
		})
		before := c.lastToken()
		rec.mu.Lock()
		rec.drop["acquire"] = 1
		rec.mu.Unlock()
		m := cl.NewMutex("retry/x")
		l, err := m.TryLock(ctxTimeout(t, 10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		sameIDs(t, "acquire", rec.requestIDs("acquire"))
		if l.Token() != before+1 || c.lastToken() != before+1 {
			t.Fatalf("token %d, last token %d, before %d: the retried acquire granted more than once", l.Token(), c.lastToken(), before)
		}
		checkHeld(t, c.get("retry/x"), "retrier", l.Token())
		// The first request went to the leader: the client found it.
		if hosts, leader := rec.hostsOf("acquire"), hostOf(c.leaderURL()); hosts[0] != leader {
			t.Fatalf("acquire sent to %s, leader is %s", hosts[0], leader)
		}

		rec.mu.Lock()
		rec.drop["release"] = 1
		rec.mu.Unlock()
		if err := m.Unlock(ctxTimeout(t, 10*time.Second)); err != nil {
			t.Fatalf("Unlock with a lost answer: %v (a retry with a new request id would be not_holder)", err)
		}
		sameIDs(t, "release", rec.requestIDs("release"))
		checkFree(t, c.get("retry/x"))
	})

	t.Run("QueuedAcquire", func(t *testing.T) {
		other := c.client("retry-holder")
		mo := other.NewMutex("retry/q")
		lo, err := mo.TryLock(ctxTimeout(t, 10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := len(rec.requestIDs("acquire"))
		rec.mu.Lock()
		rec.drop["acquire"] = 1
		rec.mu.Unlock()
		got := make(chan error, 1)
		m := cl.NewMutex("retry/q")
		var l *client.Lease
		go func() {
			var err error
			l, err = m.Lock(ctxTimeout(t, 20*time.Second))
			got <- err
		}()
		eventually(t, 5*time.Second, "queued", func() (bool, string) { return c.get("retry/q").Waiters == 1, "" })
		if err := mo.Unlock(ctxTimeout(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		defer m.Unlock(context.Background())
		sameIDs(t, "queued acquire", rec.requestIDs("acquire")[n:])
		if l.Token() != lo.Token()+1 || c.lastToken() != l.Token() {
			t.Fatalf("token %d after %d, last token %d: the retried wait was granted more than once", l.Token(), lo.Token(), c.lastToken())
		}
		checkHeld(t, c.get("retry/q"), "retrier", l.Token())
	})

	t.Run("DroppedWaitQueuesAgain", func(t *testing.T) { testDroppedWait(t, c, rec, cl) })
}

// testDroppedWait cuts a waiting acquire's connection: the node
// withdraws the wait, so the retry under the same request id is answered
// wait_timeout long before the wait asked for. The client must queue again
// under a new request id rather than give up.
func testDroppedWait(t *testing.T, c *cluster, rec *recorder, cl *client.Client) {
	holder := c.client("cut-holder")
	mh := holder.NewMutex("retry/cut")
	lh, err := mh.TryLock(ctxTimeout(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	n := len(rec.requestIDs("acquire"))
	rec.mu.Lock()
	rec.cut["acquire"] = 300 * time.Millisecond
	rec.mu.Unlock()
	m := cl.NewMutex("retry/cut")
	got := make(chan error, 1)
	var l *client.Lease
	go func() {
		var err error
		l, err = m.Lock(ctxTimeout(t, 30*time.Second))
		got <- err
	}()
	eventually(t, 10*time.Second, "queued again under a new request id", func() (bool, string) {
		ids := rec.requestIDs("acquire")[n:]
		return len(ids) >= 3 && c.get("retry/cut").Waiters == 1, fmt.Sprint(ids)
	})
	if err := mh.Unlock(ctxTimeout(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("Lock after its wait was dropped: %v", err)
	}
	defer m.Unlock(context.Background())
	ids := rec.requestIDs("acquire")[n:]
	t.Logf("acquire request ids: %q", ids)
	if ids[0] != ids[1] || ids[2] == ids[0] {
		t.Fatalf("request ids %q: want a retry under the first id, then a new one", ids)
	}
	if l.Token() != lh.Token()+1 {
		t.Fatalf("token %d after the holder's %d", l.Token(), lh.Token())
	}
	checkHeld(t, c.get("retry/cut"), cl.ClientID(), l.Token())
}

// The tests below use fake nodes: they check the retry rules without a
// cluster.

func noLeader(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "1")
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusServiceUnavailable)
	io.WriteString(w, `{"error":{"code":"no_leader","message":"election under way"}}`)
}

func TestRetryAfterIsHonoured(t *testing.T) {
	var mu sync.Mutex
	var arrivals []time.Time
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/locks/x" {
			noLeader(w)
			return
		}
		mu.Lock()
		arrivals = append(arrivals, time.Now())
		n := len(arrivals)
		mu.Unlock()
		if n == 1 {
			noLeader(w)
			return
		}
		io.WriteString(w, `{"name":"x","held":false,"waiters":0,"revision":3}`)
	}))
	defer srv.Close()
	cl, err := client.New(client.Config{Endpoints: []string{srv.URL}})
	if err != nil {
		t.Fatal(err)
	}
	st, err := cl.Status(ctxTimeout(t, 5*time.Second), "x")
	if err != nil || st.Held || st.Revision != 3 {
		t.Fatalf("Status = %+v, %v", st, err)
	}
	if gap := arrivals[1].Sub(arrivals[0]); gap < time.Second {
		t.Fatalf("retried %s after a 503 with Retry-After: 1", gap)
	}
}

func TestUnavailableErrors(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { noLeader(w) }))
	defer srv.Close()
	cl, err := client.New(client.Config{Endpoints: []string{srv.URL}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = cl.Status(ctxTimeout(t, 300*time.Millisecond), "x")
	var ae *client.APIError
	if !errors.Is(err, client.ErrNoLeader) || !errors.Is(err, client.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) ||
		!errors.As(err, &ae) || ae.Code != client.CodeNoLeader || ae.HTTPStatus != 503 {
		t.Fatalf("Status against a leaderless node = %v, want ErrNoLeader, ErrUnavailable, DeadlineExceeded and an APIError", err)
	}

	// A node that is down: connection errors until the context ends.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	cl, err = client.New(client.Config{Endpoints: []string{dead}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = cl.NewMutex("x").TryLock(ctxTimeout(t, 300*time.Millisecond))
	if !errors.Is(err, client.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("TryLock against a dead node = %v, want ErrUnavailable and DeadlineExceeded", err)
	}
}

// TestFailsOverToAnotherEndpoint: with the first endpoint down, requests
// go to the next.
func TestFailsOverToAnotherEndpoint(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/api/v1/cluster" {
			io.WriteString(w, `{"leader_id":"","members":[]}`)
			return
		}
		io.WriteString(w, `{"name":"x","held":false,"waiters":0,"revision":1}`)
	}))
	defer srv.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	cl, err := client.New(client.Config{Endpoints: []string{dead, srv.URL}})
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if _, err := cl.Status(ctxTimeout(t, 5*time.Second), "x"); err != nil {
			t.Fatal(err)
		}
	}
}

// A retried acquire can learn that its grant came and went before the
// answer arrived (409 lock_lost). Lock must not give up, nor reuse the
// request id (it would be told the same again): it acquires anew.
func TestLockLostIsTriedAgain(t *testing.T) {
	var mu sync.Mutex
	var ids []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case strings.HasSuffix(r.URL.Path, "/acquire"):
			var body struct {
				RequestID string `json:"request_id"`
			}
			_ = json.NewDecoder(r.Body).Decode(&body)
			mu.Lock()
			ids = append(ids, body.RequestID)
			n := len(ids)
			mu.Unlock()
			if n == 1 {
				w.WriteHeader(http.StatusConflict)
				io.WriteString(w, `{"acquired":false,"error":{"code":"lock_lost","message":"granted (token 7), then lost"},"fencing_token":7}`)
				return
			}
			fmt.Fprintf(w, `{"acquired":true,"fencing_token":8,"lease_id":"00112233445566778899aabbccddeeff","expires_at":%q,"revision":9}`,
				time.Now().Add(30*time.Second).UTC().Format(time.RFC3339Nano))
		case strings.HasSuffix(r.URL.Path, "/release"):
			io.WriteString(w, `{"released":true,"revision":10}`)
		default:
			noLeader(w)
		}
	}))
	defer srv.Close()
	cl, err := client.New(client.Config{Endpoints: []string{srv.URL}})
	if err != nil {
		t.Fatal(err)
	}
	m := cl.NewMutex("x", client.WithTTL(30*time.Second))
	l, err := m.Lock(ctxTimeout(t, 10*time.Second))
	if err != nil {
		t.Fatalf("Lock after lock_lost: %v", err)
	}
	defer m.Unlock(context.Background())
	mu.Lock()
	defer mu.Unlock()
	if l.Token() != 8 || len(ids) != 2 || ids[0] == ids[1] {
		t.Fatalf("token %d after request ids %q: want token 8 from a second acquire under a new request id", l.Token(), ids)
	}
}
