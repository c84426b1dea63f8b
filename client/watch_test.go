package client_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock/client"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
)

// streamRecorder is an HTTP transport that records the node each stream
// (watch, observe) was opened on.
type streamRecorder struct {
	base  http.RoundTripper
	mu    sync.Mutex
	hosts []string
}

func newStreamRecorder() *streamRecorder {
	return &streamRecorder{base: http.DefaultTransport.(*http.Transport).Clone()}
}

func (s *streamRecorder) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Path == "/api/v1/watch" || r.URL.Query().Get("observe") == "true" {
		s.mu.Lock()
		s.hosts = append(s.hosts, r.URL.Host)
		s.mu.Unlock()
	}
	return s.base.RoundTrip(r)
}

func (s *streamRecorder) opened() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.hosts...)
}

// nodeAt is the id of the node serving host.
func (c *cluster) nodeAt(host string) string {
	c.t.Helper()
	for _, id := range c.IDs() {
		if hostOf(c.URL(id)) == host {
			return id
		}
	}
	c.t.Fatalf("no node at %s", host)
	return ""
}

// eventKey is what two watchers of the same history must agree on.
func eventKey(e client.WatchEvent) string {
	return fmt.Sprintf("%d %s %s %s %s %d %s %q", e.Revision, e.Kind, e.Type, e.Name, e.ClientID, e.FencingToken, e.Cause, e.Value)
}

// rawWatch reads a watch straight over HTTP from one node, independently of
// the client under test, until stop returns true.
func rawWatch(t *testing.T, url string, stop func(client.WatchEvent) bool) []client.WatchEvent {
	t.Helper()
	req, err := http.NewRequestWithContext(ctxTimeout(t, 20*time.Second), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, res.Status)
	}
	var out []client.WatchEvent
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var e client.WatchEvent
		if err := json.Unmarshal([]byte(data), &e); err != nil {
			t.Fatalf("raw watch: %q: %v", data, err)
		}
		out = append(out, e)
		if stop(e) {
			return out
		}
	}
	t.Fatalf("raw watch ended early: %v", sc.Err())
	return nil
}

// TestWatchAcrossNodeKill lists, then watches from the listed revision + 1
// while locks change, and kills the node the watch is connected to halfway:
// the watch must see every change after the listing exactly once, in the
// order a node that stayed up sends them.
func TestWatchAcrossNodeKill(t *testing.T) {
	c := startCluster(t)
	ctx := ctxTimeout(t, 60*time.Second)
	rec := newStreamRecorder()
	watcher := c.client("watcher", func(cfg *client.Config) { cfg.HTTPClient = &http.Client{Transport: rec} })
	writer := c.client("writer")
	other := c.client("writer-2")

	before := writer.NewMutex("w/before")
	if _, err := before.TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	locks, rev, err := watcher.ListWithRevision(ctx, "w/")
	if err != nil || len(locks) != 1 || rev == 0 {
		t.Fatalf("ListWithRevision = %d locks, revision %d, %v", len(locks), rev, err)
	}

	events := make(chan client.WatchEvent, 1000)
	watchErr := make(chan error, 1)
	go func() {
		defer close(events)
		for ev, err := range watcher.Watch(ctx, "w/", rev+1) {
			if err != nil {
				watchErr <- err
				return
			}
			events <- ev
		}
	}()

	// changes makes revisions with one event and with several: a session's
	// locks released together, and a release handed to the next in line.
	changes := func(round int) {
		t.Helper()
		s, err := writer.NewSession(ctx, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			if _, err := writer.NewMutex(fmt.Sprintf("w/%d/s%d", round, i), client.WithSession(s)).TryLock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Close(ctx); err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("w/%d/handoff", round)
		ma, mb := writer.NewMutex(name), other.NewMutex(name)
		if _, err := ma.TryLock(ctx); err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() { _, err := mb.Lock(ctx); got <- err }()
		testutil.Eventually(t, 10*time.Second, "b waits in line", func() (bool, string) { return c.get(name).Waiters == 1, "" })
		if err := ma.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		if err := mb.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var seen []client.WatchEvent
	// read takes events until one matches.
	read := func(what string, match func(client.WatchEvent) bool) {
		t.Helper()
		for {
			select {
			case ev, ok := <-events:
				if !ok {
					t.Fatalf("watch ended waiting for %s: %v", what, <-watchErr)
				}
				seen = append(seen, ev)
				if match(ev) {
					return
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("no %s within 20 s; saw %d events", what, len(seen))
			}
		}
	}
	changes(1)
	read("round 1's last release", func(e client.WatchEvent) bool {
		return e.Name == "w/1/handoff" && e.Type == "released" && e.ClientID == "writer-2"
	})

	hosts := rec.opened()
	victim := c.nodeAt(hosts[len(hosts)-1])
	t.Logf("killing %s, which serves the watch", victim)
	c.Kill(victim)
	changes(2)
	end := writer.NewMutex("w/zz-end")
	if _, err := end.TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	read("the end marker", func(e client.WatchEvent) bool { return e.Name == "w/zz-end" })
	if hosts := rec.opened(); len(hosts) < 2 || hosts[len(hosts)-1] == hostOf(c.URL(victim)) {
		t.Fatalf("watch streams opened on %v; want a reconnect to another node than %s", hosts, victim)
	}

	want := rawWatch(t, fmt.Sprintf("%s/api/v1/watch?prefix=w/&from_revision=%d", c.URL(c.Running()[0]), rev+1),
		func(e client.WatchEvent) bool { return e.Name == "w/zz-end" })
	multi := 0
	for i := range want {
		if i > 0 && want[i].Revision == want[i-1].Revision {
			multi++
		}
	}
	if multi < 4 {
		t.Fatalf("the history has %d events that share a revision with the one before; the test wants several", multi)
	}
	if len(seen) != len(want) {
		t.Fatalf("watch saw %d events, a node that stayed up sent %d:\nsaw:\n%s\nwant:\n%s", len(seen), len(want), keys(seen), keys(want))
	}
	for i := range want {
		if eventKey(seen[i]) != eventKey(want[i]) {
			t.Fatalf("event %d: saw %s, want %s:\nsaw:\n%s\nwant:\n%s", i, eventKey(seen[i]), eventKey(want[i]), keys(seen), keys(want))
		}
	}
	t.Logf("%d events, %d sharing a revision, exactly once across the reconnect", len(seen), multi)
}

func keys(evs []client.WatchEvent) string {
	var b strings.Builder
	for _, e := range evs {
		b.WriteString(eventKey(e) + "\n")
	}
	return b.String()
}

// TestWatchCompacted watches from a revision the nodes no longer keep: the
// watch ends with ErrCompacted carrying the current revision, and
// list-then-watch recovers.
func TestWatchCompacted(t *testing.T) {
	tc := testcluster.NewWith(t, 3, testcluster.Options{WatchHistory: 4})
	var eps []string
	for _, id := range tc.IDs() {
		eps = append(eps, tc.URL(id))
	}
	cl, err := client.New(client.Config{Endpoints: eps, ClientID: "compacted", RequestTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := ctxTimeout(t, 30*time.Second)
	_, rev, err := cl.ListWithRevision(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	m := cl.NewMutex("c/x")
	for range 4 {
		if _, err := m.TryLock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var ce *client.CompactedError
	for ev, err := range cl.Watch(ctx, "", rev+1) {
		if !errors.Is(err, client.ErrCompacted) || !errors.As(err, &ce) {
			t.Fatalf("watch from a compacted revision: %+v, %v; want ErrCompacted", ev, err)
		}
		if ce.Requested != rev+1 || ce.Current <= rev+4 {
			t.Fatalf("CompactedError %+v: want requested %d and the current revision, past the kept history", ce, rev+1)
		}
		t.Logf("%v", err)
		break
	}
	if ce == nil {
		t.Fatal("watch from a compacted revision ended without an error")
	}

	// List again and watch from there.
	_, rev, err = cl.ListWithRevision(ctx, "c/")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	gotEvent := false
	for ev, err := range cl.Watch(ctx, "c/", rev+1) {
		if err != nil || ev.Type != "acquired" || ev.Name != "c/x" || ev.Revision != rev+1 {
			t.Fatalf("watch after listing again: %+v, %v", ev, err)
		}
		gotEvent = true
		break
	}
	if !gotEvent {
		t.Fatal("watch after listing again ended without an event")
	}
}

// fakeStreams is a node whose streams follow a script, one function per
// connection, to check how the client resumes.
func fakeStreams(t *testing.T, conns ...func(w io.Writer, r *http.Request)) *client.Client {
	t.Helper()
	var mu sync.Mutex
	n := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/api/v1/cluster" {
			io.WriteString(w, `{"leader_id":"","members":[]}`)
			return
		}
		mu.Lock()
		i := n
		n++
		mu.Unlock()
		if i >= len(conns) {
			t.Errorf("connection %d: the script has only %d", i+1, len(conns))
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		conns[i](w, r)
	}))
	t.Cleanup(srv.Close)
	cl, err := client.New(client.Config{Endpoints: []string{srv.URL}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

func sseEvent(w io.Writer, rev uint64, typ, name string) {
	fmt.Fprintf(w, "id: %d\nevent: %s\ndata: {\"revision\":%d,\"type\":%q,\"kind\":\"lock\",\"name\":%q}\n\n", rev, typ, rev, typ, name)
}

func wantQuery(t *testing.T, conn int, q url.Values, key, want string) {
	t.Helper()
	if got := strings.Join(q[key], ","); got != want {
		t.Errorf("connection %d: %s=%q, want %q", conn, key, got, want)
	}
}

// TestWatchResumesMidRevision: a stream that breaks between two events of
// one revision resumes at that revision and skips what was delivered;
// heartbeats are ignored; an error record with code compacted ends the watch.
func TestWatchResumesMidRevision(t *testing.T) {
	cl := fakeStreams(t,
		func(w io.Writer, r *http.Request) {
			q := r.URL.Query()
			wantQuery(t, 1, q, "from_revision", "5")
			wantQuery(t, 1, q, "prefix", "p/")
			io.WriteString(w, ": dlock watch from revision 5\n\n")
			sseEvent(w, 5, "acquired", "p/a")
			io.WriteString(w, ": heartbeat\n\n")
			sseEvent(w, 6, "released", "p/b1") // revision 6 has two events; the stream breaks after the first
		},
		func(w io.Writer, r *http.Request) {
			q := r.URL.Query()
			wantQuery(t, 2, q, "from_revision", "6")
			sseEvent(w, 6, "released", "p/b1")
			sseEvent(w, 6, "acquired", "p/b2")
			sseEvent(w, 7, "acquired", "p/c")
			io.WriteString(w, "event: error\ndata: {\"error\":{\"code\":\"unavailable\",\"message\":\"cut off\"}}\n\n")
		},
		func(w io.Writer, r *http.Request) {
			q := r.URL.Query()
			wantQuery(t, 3, q, "from_revision", "7")
			sseEvent(w, 7, "acquired", "p/c")
			sseEvent(w, 8, "released", "p/d")
			io.WriteString(w, "event: error\ndata: {\"error\":{\"code\":\"compacted\",\"message\":\"revision 7 is compacted (oldest kept 9, current 42)\"}}\n\n")
		},
	)
	var got []string
	var final error
	for ev, err := range cl.Watch(ctxTimeout(t, 10*time.Second), "p/", 5) {
		if err != nil {
			final = err
			break
		}
		got = append(got, fmt.Sprintf("%d %s", ev.Revision, ev.Name))
	}
	if want := "5 p/a,6 p/b1,6 p/b2,7 p/c,8 p/d"; strings.Join(got, ",") != want {
		t.Fatalf("events %q, want %q", got, want)
	}
	var ce *client.CompactedError
	if !errors.As(final, &ce) || ce.Requested != 8 || ce.Current != 42 {
		t.Fatalf("final error %v, want a CompactedError for revision 8, current 42", final)
	}
}

// TestWatchFromNowResumesWhereItStarted: a from-now watch that breaks before
// its first event resumes at the revision its first stream started at, not
// at the next node's "now".
func TestWatchFromNowResumesWhereItStarted(t *testing.T) {
	cl := fakeStreams(t,
		func(w io.Writer, r *http.Request) {
			q := r.URL.Query()
			wantQuery(t, 1, q, "from_revision", "")
			io.WriteString(w, ": dlock watch from revision 11\n\n")
		},
		func(w io.Writer, r *http.Request) {
			q := r.URL.Query()
			wantQuery(t, 2, q, "from_revision", "11")
			sseEvent(w, 11, "acquired", "x")
			// Then a stream that stays up until the client leaves.
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		},
	)
	got := false
	for ev, err := range cl.Watch(ctxTimeout(t, 10*time.Second), "", 0) {
		if err != nil || ev.Revision != 11 || ev.Name != "x" {
			t.Fatalf("got %+v, %v", ev, err)
		}
		got = true
		break
	}
	if !got {
		t.Fatal("the watch ended without resuming: no event")
	}
}
