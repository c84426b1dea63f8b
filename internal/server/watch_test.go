package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
)

type sseRecord struct {
	id    string
	event string
	data  string
}

// sse opens an SSE stream and delivers its records until ctx ends.
func sse(t *testing.T, ctx context.Context, url string) (int, <-chan sseRecord) {
	return sseWith(t, ctx, url, nil)
}

// sseWith is sse with request headers (a bearer token).
func sseWith(t *testing.T, ctx context.Context, url string, header http.Header) (int, <-chan sseRecord) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	for k, v := range header {
		req.Header[k] = v
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
	out := make(chan sseRecord, 1024)
	if res.StatusCode != 200 {
		res.Body.Close()
		close(out)
		return res.StatusCode, out
	}
	go func() {
		defer close(out)
		defer res.Body.Close()
		sc := bufio.NewScanner(res.Body)
		var rec sseRecord
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if rec.event != "" {
					out <- rec
				}
				rec = sseRecord{}
			case strings.HasPrefix(line, "id: "):
				rec.id = line[4:]
			case strings.HasPrefix(line, "event: "):
				rec.event = line[7:]
			case strings.HasPrefix(line, "data: "):
				rec.data = line[6:]
			}
		}
	}()
	return res.StatusCode, out
}

func nextEvent(t *testing.T, ch <-chan sseRecord, timeout time.Duration) service.WatchEvent {
	t.Helper()
	select {
	case rec, ok := <-ch:
		if !ok {
			t.Fatalf("stream ended")
		}
		var e service.WatchEvent
		if err := json.Unmarshal([]byte(rec.data), &e); err != nil {
			t.Fatalf("bad event %q: %v", rec.data, err)
		}
		if rec.event != e.Type || rec.id != fmt.Sprint(e.Revision) {
			t.Fatalf("record header %q/%q does not match event %+v", rec.event, rec.id, e)
		}
		return e
	case <-time.After(timeout):
		t.Fatalf("no event within %s", timeout)
	}
	return service.WatchEvent{}
}

func TestWatchListThenWatchAcrossReconnectAndFollower(t *testing.T) {
	c := testcluster.New(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	follower := c.Follower()
	// Some history before the list.
	code, a := acquire(t, c, leader, "billing/a", map[string]any{"client_id": "c1", "ttl_ms": 30000})
	if code != 200 {
		t.Fatalf("acquire: %d", code)
	}
	var list service.ListResponse
	if code, err := c.Do(context.Background(), http.MethodGet, c.URL(leader)+"/api/v1/locks?prefix=billing/", nil, &list); err != nil || code != 200 {
		t.Fatalf("list: %d %v", code, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	from := fmt.Sprintf("/api/v1/watch?prefix=billing/&from_revision=%d", list.Revision+1)
	_, onLeader := sse(t, ctx, c.URL(leader)+from)
	_, onFollower := sse(t, ctx, c.URL(follower)+from)

	// Changes: release a (released), b acquired, c queued, b released → c handoff,
	// and something outside the prefix that must not show.
	release(t, c, leader, "billing/a", "c1", a)
	_, b := acquire(t, c, leader, "billing/b", map[string]any{"client_id": "c2", "ttl_ms": 30000})
	acquire(t, c, leader, "other/x", map[string]any{"client_id": "c9", "ttl_ms": 30000})
	w := startWaiter(t, c, leader, "billing/b", "c3", "c3-1")
	testutil.Eventually(t, 5*time.Second, "c3 queued", func() bool { return getLock(t, c, leader, "billing/b").Waiters == 1 })
	release(t, c, leader, "billing/b", "c2", b)
	expectGrant(t, w, "c3", 5*time.Second)

	want := []string{"released billing/a c1", "acquired billing/b c2", "queued billing/b c3", "released billing/b c2", "acquired billing/b c3"}
	var leaderEvents []service.WatchEvent
	for i, wnt := range want {
		e := nextEvent(t, onLeader, 5*time.Second)
		if got := e.Type + " " + e.Name + " " + e.ClientID; got != wnt {
			t.Fatalf("leader event %d: %q, want %q", i, got, wnt)
		}
		leaderEvents = append(leaderEvents, e)
	}
	for i := range want {
		if e := nextEvent(t, onFollower, 5*time.Second); !reflect.DeepEqual(e, leaderEvents[i]) {
			t.Fatalf("follower event %d = %+v, leader's = %+v", i, e, leaderEvents[i])
		}
	}
	cancel()

	// Reconnect after the third event: the rest arrives exactly once.
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	_, again := sse(t, ctx2, c.URL(follower)+fmt.Sprintf("/api/v1/watch?prefix=billing/&from_revision=%d", leaderEvents[2].Revision+1))
	for _, wantE := range leaderEvents[3:] {
		if e := nextEvent(t, again, 5*time.Second); !reflect.DeepEqual(e, wantE) {
			t.Fatalf("after reconnect got %+v, want %+v", e, wantE)
		}
	}
	select {
	case rec := <-again:
		t.Fatalf("unexpected extra record after reconnect: %+v", rec)
	case <-time.After(200 * time.Millisecond):
	}
}

func TestWatchCompacted(t *testing.T) {
	// A revision before the first kept event must be refused once history has
	// been evicted; a tiny history saves generating 10,000 events.
	c2 := testcluster.NewWith(t, 3, testcluster.Options{WatchHistory: 4})
	l2 := c2.WaitLeader(10 * time.Second)
	for i := 0; i < 6; i++ {
		code, a := acquire(t, c2, l2, fmt.Sprintf("k%d", i), map[string]any{"client_id": "c", "ttl_ms": 30000})
		if code != 200 {
			t.Fatalf("acquire: %d", code)
		}
		release(t, c2, l2, fmt.Sprintf("k%d", i), "c", a)
	}
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	code, err := c2.Do(context.Background(), http.MethodGet, c2.URL(l2)+"/api/v1/watch?from_revision=1", nil, &e)
	if err != nil || code != http.StatusGone || e.Error.Code != "compacted" || !strings.Contains(e.Error.Message, "current") {
		t.Fatalf("compacted watch: %d %v %+v", code, err, e)
	}
}

func TestElectionHandOffOnResignAndExpiry(t *testing.T) {
	c := testcluster.New(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	url := c.URL(leader) + "/api/v1/elections/scheduler"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, obs := sse(t, ctx, url+"?observe=true")
	views := func() service.ElectionView {
		select {
		case rec := <-obs:
			var v service.ElectionView
			if rec.event != "leader" || json.Unmarshal([]byte(rec.data), &v) != nil {
				t.Fatalf("bad observe record %+v", rec)
			}
			return v
		case <-time.After(10 * time.Second):
			t.Fatalf("no observe record")
		}
		return service.ElectionView{}
	}
	if v := views(); v.Leader != nil {
		t.Fatalf("initial view has a leader: %+v", v)
	}
	var a service.CampaignResponse
	if code, err := c.Do(context.Background(), http.MethodPost, url+"/campaign", map[string]any{"candidate_id": "A", "value": "a:1", "ttl_ms": 30000}, &a); err != nil || code != 200 || !a.Leader {
		t.Fatalf("campaign A: %d %v %+v", code, err, a)
	}
	if v := views(); v.Leader == nil || v.Leader.CandidateID != "A" || v.Leader.Value != "a:1" {
		t.Fatalf("view after A: %+v", v)
	}
	campaign := func(who, value string, ttl int) chan service.CampaignResponse {
		ch := make(chan service.CampaignResponse, 1)
		go func() {
			var r service.CampaignResponse
			_, _ = c.Do(context.Background(), http.MethodPost, url+"/campaign", map[string]any{"candidate_id": who, "value": value, "ttl_ms": ttl, "wait_timeout_ms": 30000}, &r)
			ch <- r
		}()
		return ch
	}
	bch := campaign("B", "b:1", 1000)
	testutil.Eventually(t, 5*time.Second, "B campaigning", func() bool {
		var v service.ElectionView
		c.Do(context.Background(), http.MethodGet, url, nil, &v)
		return v.Campaigners == 1
	})
	views() // queued
	var p service.ProclaimResponse
	if code, err := c.Do(context.Background(), http.MethodPost, url+"/proclaim", map[string]any{"candidate_id": "A", "fencing_token": a.FencingToken, "lease_id": a.LeaseID, "value": "a:2"}, &p); err != nil || code != 200 {
		t.Fatalf("proclaim: %d %v", code, err)
	}
	if v := views(); v.Leader == nil || v.Leader.Value != "a:2" {
		t.Fatalf("view after proclaim: %+v", v)
	}
	var rs service.ResignResponse
	if code, err := c.Do(context.Background(), http.MethodPost, url+"/resign", map[string]any{"candidate_id": "A", "fencing_token": a.FencingToken, "lease_id": a.LeaseID}, &rs); err != nil || code != 200 {
		t.Fatalf("resign: %d %v", code, err)
	}
	b := <-bch
	if !b.Leader || b.FencingToken <= a.FencingToken {
		t.Fatalf("B after resign: %+v", b)
	}
	if v := views(); v.Leader != nil {
		t.Fatalf("expected a vacancy record between leaders, got %+v", v)
	}
	if v := views(); v.Leader == nil || v.Leader.CandidateID != "B" {
		t.Fatalf("view after hand-off: %+v", v)
	}
	// C waits; B never renews its 1 s lease, so C is elected when it expires.
	cch := campaign("C", "c:1", 30000)
	cr := <-cch
	if !cr.Leader || cr.FencingToken <= b.FencingToken {
		t.Fatalf("C after B's lease expired: %+v", cr)
	}
	var g service.ElectionView
	if code, err := c.Do(context.Background(), http.MethodGet, url, nil, &g); err != nil || code != 200 || g.Leader == nil || g.Leader.CandidateID != "C" || g.Leader.Value != "c:1" {
		t.Fatalf("GET election: %d %v %+v", code, err, g)
	}
}

// A node left without a quorum hears of no changes: it ends its watch streams
// with no_leader (the client resumes elsewhere) and refuses new ones, rather
// than keep its watchers waiting in silence.
func TestWatchOnNodeWithoutLeaderEnds(t *testing.T) {
	c := testcluster.New(t, 3)
	c.WaitLeader(10 * time.Second)
	alone := c.Follower()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	code, stream := sse(t, ctx, c.URL(alone)+"/api/v1/watch?prefix=jobs/")
	if code != 200 {
		t.Fatalf("watch: %d", code)
	}
	for _, id := range c.IDs() {
		if id != alone {
			c.Kill(id)
		}
	}
	select {
	case rec, ok := <-stream:
		if !ok {
			t.Fatal("the stream ended without an error record")
		}
		var body struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if rec.event != "error" || json.Unmarshal([]byte(rec.data), &body) != nil || body.Error.Code != "no_leader" {
			t.Fatalf("the stream's last record: %+v; want an error record with code no_leader", rec)
		}
	case <-time.After(30 * time.Second): // hang guard only
		t.Fatal("the watch on a node without a quorum stayed open")
	}
	if code, _ := sse(t, ctx, c.URL(alone)+"/api/v1/watch?prefix=jobs/"); code != http.StatusServiceUnavailable {
		t.Fatalf("a new watch on a node without a quorum: %d; want 503", code)
	}
}
