package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock/client"
	"github.com/dlock/dlock/internal/testutil"
)

// TestElection runs the election tests on one cluster; the last one kills
// a node.
func TestElection(t *testing.T) {
	c := startCluster(t)
	t.Run("HandOffOnResignAndExpiry", func(t *testing.T) { testHandOff(t, c) })
	t.Run("CampaignFailsWhenSessionEnds", func(t *testing.T) { testCampaignSession(t, c) })
	t.Run("CancelCampaignLeavesNothing", func(t *testing.T) { testCancelCampaign(t, c) })
	t.Run("CampaignsOfOneClientExclude", func(t *testing.T) { testLocalCampaigns(t, c) })
	t.Run("RetriedCampaignElectsOnce", func(t *testing.T) { testRetriedCampaign(t, c) })
	t.Run("ObserveSurvivesNodeKill", func(t *testing.T) { testObserveNodeKill(t, c) })
}

// pausable is an HTTP transport that, while paused, holds every new request,
// and every answer that arrives, until its context ends: a process that
// stopped talking to the cluster, which hears nothing from it either.
type pausable struct {
	base   http.RoundTripper
	paused atomic.Bool
}

func (p *pausable) RoundTrip(r *http.Request) (*http.Response, error) {
	if p.paused.Load() {
		<-r.Context().Done()
		return nil, r.Context().Err()
	}
	res, err := p.base.RoundTrip(r)
	if err == nil && p.paused.Load() {
		res.Body.Close()
		<-r.Context().Done()
		return nil, r.Context().Err()
	}
	return res, err
}

func newPausable() *pausable {
	return &pausable{base: http.DefaultTransport.(*http.Transport).Clone()}
}

// observer collects an election's views.
type observer struct {
	t     *testing.T
	views chan client.LeaderView
}

func observe(t *testing.T, ctx context.Context, e *client.Election) *observer {
	o := &observer{t: t, views: make(chan client.LeaderView, 1000)}
	go func() {
		defer close(o.views)
		for v, err := range e.Observe(ctx) {
			if err != nil {
				t.Errorf("Observe: %v", err)
				return
			}
			o.views <- v
		}
	}()
	return o
}

func showView(v client.LeaderView) string {
	if v.Leader == nil {
		return fmt.Sprintf("@%d vacant (%d waiting)", v.Revision, v.Campaigners)
	}
	return fmt.Sprintf("@%d %s=%q token %d (%d waiting)", v.Revision, v.Leader.CandidateID, v.Leader.Value, v.Leader.FencingToken, v.Campaigners)
}

// until reads views until one matches and returns them all.
func (o *observer) until(what string, match func(client.LeaderView) bool) []client.LeaderView {
	o.t.Helper()
	var got []client.LeaderView
	timeout := time.After(15 * time.Second)
	for {
		select {
		case v, ok := <-o.views:
			if !ok {
				o.t.Fatalf("Observe ended waiting for %s", what)
			}
			got = append(got, v)
			if match(v) {
				return got
			}
		case <-timeout:
			var s []string
			for _, v := range got {
				s = append(s, showView(v))
			}
			o.t.Fatalf("no view with %s within 15 s; saw %s", what, strings.Join(s, ", "))
		}
	}
}

func leaderIs(id string) func(client.LeaderView) bool {
	return func(v client.LeaderView) bool { return v.Leader != nil && v.Leader.CandidateID == id }
}

func vacant(v client.LeaderView) bool { return v.Leader == nil }

// vacancyBefore checks that the views report the seat empty before the
// last one, a new leader.
func vacancyBefore(t *testing.T, views []client.LeaderView) {
	t.Helper()
	for _, v := range views[:len(views)-1] {
		if v.Leader == nil {
			return
		}
	}
	t.Fatalf("views %v: no vacancy reported before the new leader", views)
}

type campaignResult struct {
	l   *client.Leadership
	err error
}

func campaignAsync(ctx context.Context, e *client.Election, value string) <-chan campaignResult {
	ch := make(chan campaignResult, 1)
	go func() {
		l, err := e.Campaign(ctx, value)
		ch <- campaignResult{l, err}
	}()
	return ch
}

func waitCampaign(t *testing.T, ch <-chan campaignResult, what string) *client.Leadership {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("%s: %v", what, r.err)
		}
		return r.l
	case <-time.After(15 * time.Second):
		t.Fatalf("%s: not elected within 15 s", what)
	}
	return nil
}

// election reads an election straight over HTTP.
func (c *cluster) election(name string) client.LeaderView {
	c.t.Helper()
	var v client.LeaderView
	for _, id := range c.Running() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		code, err := c.Do(ctx, http.MethodGet, c.URL(id)+"/api/v1/elections/"+name, nil, &v)
		cancel()
		if err == nil && code == http.StatusOK {
			return v
		}
	}
	c.t.Fatalf("read election %q: no node answered", name)
	return v
}

// testHandOff: two campaigners; leadership passes when the leader resigns,
// and when a leader stops renewing (its process "pauses"): the paused leader
// counts itself out before the next one is elected. Observe reports each
// vacancy and each new leader.
func testHandOff(t *testing.T, c *cluster) {
	const name = "elect/handoff"
	const ttl = 2 * time.Second
	ctx := ctxTimeout(t, 60*time.Second)
	obs := observe(t, ctx, c.client("observer").NewElection(name))
	obs.until("the initial vacancy", vacant)

	a := c.client("cand-a").NewElection(name, client.WithTTL(ttl))
	la, err := a.Campaign(ctx, "a-1")
	if err != nil {
		t.Fatal(err)
	}
	obs.until("a leading", func(v client.LeaderView) bool {
		return leaderIs("cand-a")(v) && v.Leader.Value == "a-1" && v.Leader.FencingToken == la.Token()
	})

	pb := newPausable()
	b := c.client("cand-b", func(cfg *client.Config) { cfg.HTTPClient = &http.Client{Transport: pb} }).NewElection(name, client.WithTTL(ttl))
	bres := campaignAsync(ctx, b, "b-1")
	obs.until("b in line", func(v client.LeaderView) bool { return v.Campaigners == 1 })
	select {
	case r := <-bres:
		t.Fatalf("b elected while a leads: %+v", r)
	case <-time.After(200 * time.Millisecond):
	}

	// Resign: b is elected in the same step.
	if err := la.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(la.Err(), client.ErrReleased) {
		t.Fatalf("a's Err after Resign = %v", la.Err())
	}
	lb := waitCampaign(t, bres, "b after a resigned")
	if lb.Token() <= la.Token() {
		t.Fatalf("b's token %d not above a's %d", lb.Token(), la.Token())
	}
	vacancyBefore(t, obs.until("b leading", leaderIs("cand-b")))
	if l, err := a.Leader(ctx); err != nil || l.CandidateID != "cand-b" || l.Value != "b-1" || l.FencingToken != lb.Token() {
		t.Fatalf("Leader = %+v, %v; want cand-b", l, err)
	}

	// b's process pauses: no more renewals. c is elected once b's lease
	// has expired on the server, by which time b has counted itself out.
	cres := campaignAsync(ctx, c.client("cand-c").NewElection(name, client.WithTTL(ttl)), "c-1")
	obs.until("c in line", func(v client.LeaderView) bool { return leaderIs("cand-b")(v) && v.Campaigners == 1 })
	paused := time.Now()
	pb.paused.Store(true)
	lc := waitCampaign(t, cres, "c after b paused")
	elected := time.Now()
	if bound := lb.ExpiresAt(); bound.After(elected) {
		t.Fatalf("c elected %s before b's bound, while b may still count itself leader", bound.Sub(elected))
	}
	select {
	case <-lb.Done():
	case <-time.After(250 * time.Millisecond): // scheduling slack
		t.Fatalf("b's Done still open %s after its bound", time.Since(lb.ExpiresAt()))
	}
	if !errors.Is(lb.Err(), client.ErrLeaseLost) {
		t.Fatalf("b's Err = %v, want ErrLeaseLost", lb.Err())
	}
	t.Logf("c elected %s after b paused", time.Since(paused).Round(time.Millisecond))
	vacancyBefore(t, obs.until("c leading", leaderIs("cand-c")))

	// Proclaim changes the value; observers see it.
	if err := lc.Proclaim(ctx, "c-2"); err != nil {
		t.Fatal(err)
	}
	obs.until("c's new value", func(v client.LeaderView) bool { return leaderIs("cand-c")(v) && v.Leader.Value == "c-2" })
	if lc.Value() != "c-2" {
		t.Fatalf("Value = %q", lc.Value())
	}
	// The last leader resigns with nobody in line: a vacancy.
	if err := lc.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := lc.Resign(ctx); err != nil {
		t.Fatalf("second Resign: %v", err)
	}
	obs.until("a vacancy after c resigned", func(v client.LeaderView) bool { return v.Leader == nil && v.Campaigners == 0 })
	if _, err := a.Leader(ctx); !errors.Is(err, client.ErrNoElectionLeader) {
		t.Fatalf("Leader of a vacant election: %v, want ErrNoElectionLeader", err)
	}

	// The paused leader comes back: it may not act as leader.
	pb.paused.Store(false)
	if err := lb.Proclaim(ctx, "b-2"); !errors.Is(err, client.ErrLeaseLost) {
		t.Fatalf("Proclaim by a lost leader: %v, want ErrLeaseLost", err)
	}
	if err := lb.Resign(ctx); !errors.Is(err, client.ErrNotHolder) || !errors.Is(err, client.ErrLeaseLost) {
		t.Fatalf("Resign by a lost leader: %v, want ErrNotHolder and ErrLeaseLost", err)
	}
}

// testCampaignSession: a campaign under a session that ends while it waits
// fails with ErrSessionExpired and leaves nothing in line, whether the
// server dropped the session or the client could not keep it alive.
func testCampaignSession(t *testing.T, c *cluster) {
	const name = "elect/session"
	ctx := ctxTimeout(t, 60*time.Second)
	lh, err := c.client("sess-holder").NewElection(name, client.WithTTL(10*time.Second)).Campaign(ctx, "h")
	if err != nil {
		t.Fatal(err)
	}
	inLine := func(n int) {
		t.Helper()
		testutil.Eventually(t, 10*time.Second, fmt.Sprintf("%d in line", n), func() (bool, string) {
			v := c.election(name)
			return v.Campaigners == n, showView(v)
		})
	}

	// The server drops the session (it is deleted behind the client's back).
	y := c.client("sess-y")
	s, err := y.NewSession(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	res := campaignAsync(ctx, y.NewElection(name, client.WithSession(s)), "y")
	inLine(1)
	if code, err := c.Do(ctx, http.MethodDelete, c.leaderURL()+"/api/v1/sessions/"+client.SessionID(s), nil, nil); err != nil || code != http.StatusOK {
		t.Fatalf("delete session: %d %v", code, err)
	}
	select {
	case r := <-res:
		if !errors.Is(r.err, client.ErrSessionExpired) || r.l != nil {
			t.Fatalf("Campaign after its session was deleted: %v, want ErrSessionExpired", r.err)
		}
		t.Logf("server dropped the session: %v", r.err)
	case <-time.After(10 * time.Second):
		t.Fatal("Campaign went on after its session was deleted")
	}
	inLine(0)

	// The client cannot keep its session alive.
	pz := newPausable()
	z := c.client("sess-z", func(cfg *client.Config) { cfg.HTTPClient = &http.Client{Transport: pz} })
	const ttl = time.Second
	s2, err := z.NewSession(ctx, ttl)
	if err != nil {
		t.Fatal(err)
	}
	res = campaignAsync(ctx, z.NewElection(name, client.WithSession(s2)), "z")
	inLine(1)
	paused := time.Now()
	pz.paused.Store(true)
	select {
	case r := <-res:
		if !errors.Is(r.err, client.ErrSessionExpired) || r.l != nil {
			t.Fatalf("Campaign after its session was lost: %v, want ErrSessionExpired", r.err)
		}
		t.Logf("session lost after %s: %v", time.Since(paused).Round(time.Millisecond), r.err)
	case <-time.After(10 * time.Second):
		t.Fatal("Campaign went on after its session was lost")
	}
	pz.paused.Store(false)
	inLine(0)

	// Nobody is left to take over.
	if err := lh.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if v := c.election(name); v.Leader != nil || v.Campaigners != 0 {
		t.Fatalf("after the holder resigned: %s; want vacant", showView(v))
	}

	// A seat held under a session: Resign gives up the seat and keeps the
	// session; closing the session ends the leadership.
	s3, err := y.NewSession(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	e3 := y.NewElection(name, client.WithSession(s3))
	l3, err := e3.Campaign(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	if !l3.ExpiresAt().Equal(s3.ExpiresAt()) {
		t.Fatalf("leadership under a session expires at %s, the session at %s", l3.ExpiresAt(), s3.ExpiresAt())
	}
	if err := l3.Resign(ctx); err != nil || s3.Err() != nil {
		t.Fatalf("Resign under a session: %v; session %v", err, s3.Err())
	}
	if l3, err = e3.Campaign(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	if err := s3.Close(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l3.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("leadership outlived its session")
	}
	if !errors.Is(l3.Err(), client.ErrLeaseLost) {
		t.Fatalf("leadership after its session closed: %v", l3.Err())
	}
	if v := c.election(name); v.Leader != nil {
		t.Fatalf("after the session closed: %s; want vacant", showView(v))
	}
}

func testCancelCampaign(t *testing.T, c *cluster) {
	const name = "elect/cancel"
	ctx := ctxTimeout(t, 30*time.Second)
	lh, err := c.client("cancel-holder").NewElection(name).Campaign(ctx, "h")
	if err != nil {
		t.Fatal(err)
	}
	defer lh.Resign(ctx)
	wctx, cancel := context.WithCancel(ctx)
	res := campaignAsync(wctx, c.client("cancel-w").NewElection(name), "w")
	testutil.Eventually(t, 10*time.Second, "in line", func() (bool, string) { return c.election(name).Campaigners == 1, "" })
	cancel()
	r := <-res
	if !errors.Is(r.err, context.Canceled) || r.l != nil {
		t.Fatalf("cancelled Campaign: %v, want context.Canceled", r.err)
	}
	if v := c.election(name); v.Campaigners != 0 || v.Leader == nil || v.Leader.CandidateID != "cancel-holder" {
		t.Fatalf("after a cancelled campaign returned: %s; want only the holder", showView(v))
	}
	// A deadline is a wait timeout.
	dctx, dcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer dcancel()
	if _, err := c.client("cancel-d").NewElection(name).Campaign(dctx, "d"); !errors.Is(err, client.ErrWaitTimeout) {
		t.Fatalf("Campaign past its deadline: %v, want ErrWaitTimeout", err)
	}
	if v := c.election(name); v.Campaigners != 0 {
		t.Fatalf("after a timed-out campaign: %s", showView(v))
	}
}

// testLocalCampaigns: at the server, two campaigns of one client are one
// candidate; locally, the second waits for the first leadership to end.
func testLocalCampaigns(t *testing.T, c *cluster) {
	const name = "elect/local"
	ctx := ctxTimeout(t, 30*time.Second)
	e := c.client("local").NewElection(name)
	l1, err := e.Campaign(ctx, "one")
	if err != nil {
		t.Fatal(err)
	}
	res := campaignAsync(ctx, e, "two")
	select {
	case r := <-res:
		t.Fatalf("second campaign of one client elected while the first leads: %+v", r)
	case <-time.After(300 * time.Millisecond):
	}
	if err := l1.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	l2 := waitCampaign(t, res, "second campaign")
	defer l2.Resign(ctx)
	if l2.Token() <= l1.Token() || l2.Value() != "two" || l1.Err() == nil || l2.Err() != nil {
		t.Fatalf("tokens %d then %d, value %q, errs %v %v", l1.Token(), l2.Token(), l2.Value(), l1.Err(), l2.Err())
	}
}

// testRetriedCampaign loses the answer to a campaign after the server acted
// on it: the retry carries the same request id, so one token is granted.
func testRetriedCampaign(t *testing.T, c *cluster) {
	rec := newRecorder()
	cl := c.client("retry-cand", func(cfg *client.Config) { cfg.HTTPClient = &http.Client{Transport: rec} })
	ctx := ctxTimeout(t, 30*time.Second)
	before := c.lastToken()
	rec.mu.Lock()
	rec.drop["campaign"] = 1
	rec.mu.Unlock()
	l, err := cl.NewElection("elect/retry").Campaign(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Resign(ctx)
	sameIDs(t, "campaign", rec.requestIDs("campaign"))
	if l.Token() != before+1 || c.lastToken() != before+1 {
		t.Fatalf("token %d, last token %d, before %d: the retried campaign elected more than once", l.Token(), c.lastToken(), before)
	}
}

// testObserveNodeKill kills the node an observer is connected to: Observe
// goes on from another node and reports the next leader and vacancy.
func testObserveNodeKill(t *testing.T, c *cluster) {
	const name = "elect/kill"
	ctx := ctxTimeout(t, 60*time.Second)
	rec := newStreamRecorder()
	obs := observe(t, ctx, c.client("kill-observer", func(cfg *client.Config) { cfg.HTTPClient = &http.Client{Transport: rec} }).NewElection(name))
	obs.until("the initial vacancy", vacant)
	hosts := rec.opened()
	victim := c.nodeAt(hosts[len(hosts)-1])
	c.Kill(victim)
	t.Logf("killed %s, which served the observer", victim)

	l, err := c.client("kill-cand").NewElection(name, client.WithTTL(5*time.Second)).Campaign(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	obs.until("the new leader", leaderIs("kill-cand"))
	if err := l.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	obs.until("the vacancy", vacant)
	if hosts := rec.opened(); hosts[len(hosts)-1] == hostOf(c.URL(victim)) {
		t.Fatalf("observe streams opened on %v; want the last on another node than %s", hosts, victim)
	}
}

func sseView(w io.Writer, rev uint64, leader, value string, token uint64) {
	l := "null"
	if leader != "" {
		l = fmt.Sprintf(`{"candidate_id":%q,"value":%q,"fencing_token":%d,"since":"2026-01-01T00:00:00Z"}`, leader, value, token)
	}
	fmt.Fprintf(w, "id: %d\nevent: leader\ndata: {\"name\":\"e\",\"leader\":%s,\"campaigners\":0,\"revision\":%d}\n\n", rev, l, rev)
}

// TestObserveResumesWithoutRepeats: after a reconnect, Observe skips a
// current view that says nothing new and views older than what it yielded,
// and keeps both views of a hand-off (the vacancy, then the new leader).
func TestObserveResumesWithoutRepeats(t *testing.T) {
	cl := fakeStreams(t,
		func(w io.Writer, r *http.Request) {
			wantQuery(t, 1, r.URL.Query(), "observe", "true")
			sseView(w, 5, "a", "x", 1)
			sseView(w, 7, "", "", 0)
			sseView(w, 7, "b", "y", 2)
		},
		func(w io.Writer, r *http.Request) {
			sseView(w, 9, "b", "y", 2) // the current view after the reconnect: nothing new
			io.WriteString(w, ": heartbeat\n\n")
			sseView(w, 10, "b", "y2", 2)
			io.WriteString(w, "event: error\ndata: {\"error\":{\"code\":\"unavailable\",\"message\":\"shutting down\"}}\n\n")
		},
		func(w io.Writer, r *http.Request) {
			sseView(w, 8, "b", "y", 2) // a node behind the last one: old news
			sseView(w, 11, "", "", 0)
		},
	)
	var got []string
	for v, err := range cl.NewElection("e").Observe(ctxTimeout(t, 10*time.Second)) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, showView(v))
		if v.Revision == 11 {
			break
		}
	}
	want := []string{`@5 a="x" token 1 (0 waiting)`, `@7 vacant (0 waiting)`, `@7 b="y" token 2 (0 waiting)`,
		`@10 b="y2" token 2 (0 waiting)`, `@11 vacant (0 waiting)`}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("views:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestCampaignWaitsPastServerLimit: as Lock, Campaign with a deadline
// further away than the server's limit on one wait queues again when the
// server's wait ends.
func TestCampaignWaitsPastServerLimit(t *testing.T) {
	client.SetMaxWait(t, 200*time.Millisecond)
	cl, asked := serverLimitNode(t, "campaign", "leader")
	lead, err := cl.NewElection("x").Campaign(ctxTimeout(t, 10*time.Second), "v")
	if err != nil {
		t.Fatalf("Campaign with 10 s left after the server's 200 ms limit = %v (waits asked %v); want it to wait on", err, asked())
	}
	defer lead.Resign(context.Background())
	if w := asked(); lead.Token() != 8 || len(w) != 3 || w[0] != 200*time.Millisecond {
		t.Fatalf("token %d after waits %v; want the grant of the third wait of the server's limit each", lead.Token(), w)
	}
}
