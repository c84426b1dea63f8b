package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock/client"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
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
	testutil.Eventually(t, 2*ttl, "a renewal after the kill", func() (bool, string) {
		return client.LastSent(l).After(killedAt), ""
	})
	after := client.LastSent(l)
	testutil.Eventually(t, 2*ttl, "a second renewal after the kill", func() (bool, string) {
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
	testutil.Eventually(t, 2*ttl, "a renewal", func() (bool, string) { return client.LastSent(l).After(granted), "" })
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
		testutil.Eventually(t, 10*time.Second, "every node names the leader", func() (bool, string) {
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
		testutil.Eventually(t, 5*time.Second, "queued", func() (bool, string) { return c.get("retry/q").Waiters == 1, "" })
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
	testutil.Eventually(t, 10*time.Second, "queued again under a new request id", func() (bool, string) {
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
	dead := testcluster.FreePort(t) // nothing listens there
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
	dead := "http://" + testcluster.FreePort(t) // nothing listens there
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

// lostReplyNode is a fake node that acts on every request to path but drops
// the reply to the first one: it closes the connection after reading the
// request, as happens when a node or a forward times out after the leader
// applied it. The answers to later requests come from answer (n counts the
// requests, from 1; the first is never passed). It returns a client of the
// node and the number of requests it received so far.
func lostReplyNode(t *testing.T, path string, answer func(w http.ResponseWriter, n int)) (*client.Client, func() int) {
	t.Helper()
	return fakeNode(t, path, func(w http.ResponseWriter, n int) {
		if n > 1 {
			answer(w, n)
			return
		}
		hj, ok := w.(http.Hijacker)
		if !ok {
			t.Error("cannot hijack the connection")
			return
		}
		if conn, _, err := hj.Hijack(); err == nil {
			conn.Close()
		}
	})
}

// fakeNode is a node that answers requests to path with answer (n counts
// them, from 1) and knows no leader.
func fakeNode(t *testing.T, path string, answer func(w http.ResponseWriter, n int)) (*client.Client, func() int) {
	t.Helper()
	var mu sync.Mutex
	n := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/api/v1/cluster" && r.Method == http.MethodGet {
			io.WriteString(w, `{"leader_id":"","members":[]}`)
			return
		}
		if r.URL.Path != path {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		n++
		i := n
		mu.Unlock()
		answer(w, i)
	}))
	t.Cleanup(srv.Close)
	cl, err := client.New(client.Config{Endpoints: []string{srv.URL}, RequestTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl, func() int { mu.Lock(); defer mu.Unlock(); return n }
}

func answerJSON(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	io.WriteString(w, body)
}

// wantOutcomeUnknown checks that err is the error of a request that was
// sent once and may have taken effect: it wraps ErrOutcomeUnknown, says what
// to check, and does not invite a blind retry by matching ErrUnavailable.
func wantOutcomeUnknown(t *testing.T, what string, err error, sent int, check string) {
	t.Helper()
	if sent != 1 {
		t.Errorf("%s was sent %d times after a lost reply; the cluster acts on every one", what, sent)
	}
	if !errors.Is(err, client.ErrOutcomeUnknown) || errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("%s after a lost reply = %v; want ErrOutcomeUnknown, not ErrUnavailable", what, err)
	}
	if !strings.Contains(err.Error(), check) {
		t.Fatalf("%s: error %q does not say what to check (%q)", what, err, check)
	}
}

// CreateACLToken mints a new token on every request, and the server keeps no
// request id for it: a resend after a lost reply would mint a second token,
// and the first one's secret would be lost.
func TestCreateACLTokenIsNotResentAfterLostReply(t *testing.T) {
	cl, sent := lostReplyNode(t, "/api/v1/acl/tokens", func(w http.ResponseWriter, n int) {
		answerJSON(w, 200, `{"accessor_id":"acc-2","secret_id":"secret-2","rules":[]}`)
	})
	tok, err := cl.CreateACLToken(ctxTimeout(t, 10*time.Second), client.NewACLToken{Rules: []client.ACLRule{{Prefix: "", Permissions: []string{"read"}}}})
	if tok != nil {
		t.Fatalf("CreateACLToken returned %+v after a lost reply", tok)
	}
	wantOutcomeUnknown(t, "CreateACLToken", err, sent(), "ListACLTokens")
}

// ACLBootstrap works once: a resend after a lost reply is refused as already
// bootstrapped, and the caller would never learn the secret was lost.
func TestACLBootstrapIsNotResentAfterLostReply(t *testing.T) {
	cl, sent := lostReplyNode(t, "/api/v1/acl/bootstrap", func(w http.ResponseWriter, n int) {
		answerJSON(w, 403, `{"error":{"code":"permission_denied","message":"ACLs are already bootstrapped: use a management token to create more tokens"}}`)
	})
	_, err := cl.ACLBootstrap(ctxTimeout(t, 10*time.Second))
	wantOutcomeUnknown(t, "ACLBootstrap", err, sent(), "call ACLBootstrap again")
}

// A transfer to any other voter, resent after a lost reply, moves leadership
// a second time.
func TestTransferLeadershipToAnyIsNotResentAfterLostReply(t *testing.T) {
	cl, sent := lostReplyNode(t, "/api/v1/cluster/leadership-transfer", func(w http.ResponseWriter, n int) {
		answerJSON(w, 200, `{"leader_id":"n3","members":[]}`)
	})
	_, err := cl.TransferLeadership(ctxTimeout(t, 10*time.Second), "")
	wantOutcomeUnknown(t, "TransferLeadership", err, sent(), "Cluster")
}

// A transfer to a named voter finds that voter leading when repeated, and
// does nothing: it is retried like any request.
func TestTransferLeadershipToVoterIsRetried(t *testing.T) {
	cl, sent := lostReplyNode(t, "/api/v1/cluster/leadership-transfer", func(w http.ResponseWriter, n int) {
		answerJSON(w, 200, `{"leader_id":"n3","members":[]}`)
	})
	ci, err := cl.TransferLeadership(ctxTimeout(t, 10*time.Second), "n3")
	if err != nil || ci.LeaderID != "n3" || sent() != 2 {
		t.Fatalf("TransferLeadership(n3) after a lost reply = %+v, %v after %d requests; want n3 leading after a retry", ci, err, sent())
	}
}

// A once request is resent after answers that certainly mean nothing was
// done (429, 503 no_leader), and not after those that leave it open (502,
// 504, 503 unavailable, which is also the server's "outcome unknown").
func TestOnceRequestResentOnlyAfterRefusals(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		body   string
		resent bool
	}{
		{"RateLimited", 429, `{"error":{"code":"rate_limited","message":"slow down"}}`, true},
		{"NoLeader", 503, `{"error":{"code":"no_leader","message":"election under way"}}`, true},
		{"Unavailable", 503, `{"error":{"code":"unavailable","message":"leadership changed while the request was in flight and its outcome is unknown"}}`, false},
		{"BadGateway", 502, `bad gateway`, false},
		{"GatewayTimeout", 504, `gateway timeout`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl, sent := fakeNode(t, "/api/v1/acl/tokens", func(w http.ResponseWriter, n int) {
				if n == 1 {
					w.Header().Set("Retry-After", "0")
					answerJSON(w, tc.status, tc.body)
					return
				}
				answerJSON(w, 200, `{"accessor_id":"acc-2","secret_id":"secret-2","rules":[]}`)
			})
			tok, err := cl.CreateACLToken(ctxTimeout(t, 10*time.Second), client.NewACLToken{Rules: []client.ACLRule{{Permissions: []string{"read"}}}})
			if tc.resent {
				if err != nil || tok.SecretID != "secret-2" || sent() != 2 {
					t.Fatalf("after %d: token %+v, %v after %d requests; want it resent", tc.status, tok, err, sent())
				}
				return
			}
			wantOutcomeUnknown(t, "CreateACLToken", err, sent(), "ListACLTokens")
		})
	}
}

// A once request whose context ends while an attempt is out has an unknown
// outcome too; the error says so and wraps the context's error.
func TestOnceRequestCancelledInFlight(t *testing.T) {
	cl, sent := fakeNode(t, "/api/v1/cluster/leadership-transfer", func(w http.ResponseWriter, n int) {
		time.Sleep(500 * time.Millisecond)
		answerJSON(w, 200, `{"leader_id":"n3","members":[]}`)
	})
	_, err := cl.TransferLeadership(ctxTimeout(t, 200*time.Millisecond), "")
	wantOutcomeUnknown(t, "TransferLeadership", err, sent(), "Cluster")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("TransferLeadership past its deadline = %v; want DeadlineExceeded too", err)
	}
}

// A removal repeated after a lost reply is told the member does not exist:
// the lost attempt removed it, which is what the caller asked for.
func TestRemoveMemberAfterLostReplySucceeds(t *testing.T) {
	cl, sent := lostReplyNode(t, "/api/v1/cluster/members/n2", func(w http.ResponseWriter, n int) {
		answerJSON(w, 404, `{"error":{"code":"not_found","message":"no member \"n2\""}}`)
	})
	ci, err := cl.RemoveMember(ctxTimeout(t, 10*time.Second), "n2")
	if err != nil || ci == nil || sent() != 2 {
		t.Fatalf("RemoveMember after a lost reply = %+v, %v after %d requests; want success", ci, err, sent())
	}

	// Without a lost attempt, not_found is the answer.
	cl, _ = fakeNode(t, "/api/v1/cluster/members/n2", func(w http.ResponseWriter, n int) {
		answerJSON(w, 404, `{"error":{"code":"not_found","message":"no member \"n2\""}}`)
	})
	if _, err := cl.RemoveMember(ctxTimeout(t, 10*time.Second), "n2"); err == nil {
		t.Fatal("RemoveMember of a node that is no member succeeded")
	}
}

// As RemoveMember: a revocation repeated after a lost reply is told the
// token does not exist, because the lost attempt revoked it.
func TestDeleteACLTokenAfterLostReplySucceeds(t *testing.T) {
	cl, sent := lostReplyNode(t, "/api/v1/acl/tokens/acc-1", func(w http.ResponseWriter, n int) {
		answerJSON(w, 404, `{"error":{"code":"not_found","message":"no ACL token with accessor id acc-1"}}`)
	})
	if err := cl.DeleteACLToken(ctxTimeout(t, 10*time.Second), "acc-1"); err != nil || sent() != 2 {
		t.Fatalf("DeleteACLToken after a lost reply = %v after %d requests; want success", err, sent())
	}
	cl, _ = fakeNode(t, "/api/v1/acl/tokens/acc-1", func(w http.ResponseWriter, n int) {
		answerJSON(w, 404, `{"error":{"code":"not_found","message":"no ACL token with accessor id acc-1"}}`)
	})
	if err := cl.DeleteACLToken(ctxTimeout(t, 10*time.Second), "acc-1"); err == nil {
		t.Fatal("DeleteACLToken of a token that does not exist succeeded")
	}
}
