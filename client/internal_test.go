package client

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestLeaderBase(t *testing.T) {
	for _, tc := range []struct{ from, addr, want string }{
		{"http://127.0.0.1:7070", "127.0.0.1:7080", "http://127.0.0.1:7080"},
		{"https://10.0.0.1:7070", "10.0.0.2:7070", "https://10.0.0.2:7070"},
		{"http://localhost:7070", "127.0.0.1:7080", "http://127.0.0.1:7080"},
		{"http://10.0.0.1:7070", "127.0.0.1:7070", ""}, // the node's loopback, not ours
		{"http://10.0.0.1:7070", "0.0.0.0:7070", ""},
		{"http://10.0.0.1:7070", ":7070", ""},
		{"http://10.0.0.1:7070", "", ""},
	} {
		if got := leaderBase(tc.from, tc.addr); got != tc.want {
			t.Errorf("leaderBase(%q, %q) = %q, want %q", tc.from, tc.addr, got, tc.want)
		}
	}
}

func TestNormalizeEndpoint(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:7070":         "http://127.0.0.1:7070",
		"http://127.0.0.1:7070/": "http://127.0.0.1:7070",
		" https://n1:443 ":       "https://n1:443",
		"ftp://n1":               "",
		"http://n1/api/v1":       "",
		"http://":                "",
	} {
		got, err := normalizeEndpoint(in)
		if (err != nil) != (want == "") || got != want {
			t.Errorf("normalizeEndpoint(%q) = %q, %v; want %q", in, got, err, want)
		}
		if err != nil && !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("normalizeEndpoint(%q): %v is not ErrInvalidArgument", in, err)
		}
	}
}

func TestAPIErrorIs(t *testing.T) {
	for code, sentinels := range map[string][]error{
		CodeLockHeld:        {ErrLockHeld},
		CodeWaitTimeout:     {ErrWaitTimeout},
		CodeLockLost:        {ErrLockLost},
		CodeNotHolder:       {ErrNotHolder},
		CodeSessionNotFound: {ErrSessionExpired},
		CodeNoLeader:        {ErrNoLeader, ErrUnavailable},
		CodeUnavailable:     {ErrUnavailable},
		CodeInvalidArgument: {ErrInvalidArgument},
		CodeTooLarge:        {ErrInvalidArgument},
		CodeCompacted:       {ErrCompacted},
	} {
		e := &APIError{Code: code, HTTPStatus: 409}
		for _, s := range sentinels {
			if !errors.Is(e, s) {
				t.Errorf("%s is not %v", code, s)
			}
		}
		if errors.Is(e, ErrLeaseLost) || (code != CodeNoLeader && errors.Is(e, ErrNoLeader)) {
			t.Errorf("%s matches a sentinel it should not", code)
		}
	}
}

func TestWaitFor(t *testing.T) {
	if w := waitFor(context.Background()); w != maxWait {
		t.Fatalf("no deadline: wait %s, want the server's limit", w)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if w := waitFor(ctx); w > 4500*time.Millisecond || w < 4*time.Second {
		t.Fatalf("5 s deadline: wait %s; want the time left less a margin", w)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 3*time.Hour)
	defer cancel()
	if w := waitFor(ctx); w != maxWait {
		t.Fatalf("3 h deadline: wait %s, want the server's limit", w)
	}
}

// TestWaitAgain: after a wait_timeout, the caller's ctx decides whether to
// wait on, not the server's limit.
func TestWaitAgain(t *testing.T) {
	long, cancel := context.WithTimeout(context.Background(), 3*time.Hour)
	defer cancel()
	short, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	done, cancel := context.WithCancel(context.Background())
	cancel()
	hourAgo := time.Now().Add(-maxWait)
	for _, tc := range []struct {
		what  string
		ctx   context.Context
		sent  time.Time
		asked time.Duration
		want  bool
	}{
		{"no deadline, after the server's limit", context.Background(), hourAgo, maxWait, true},
		{"deadline 2 h beyond the server's limit", long, hourAgo, maxWait, true},
		{"only the margin left", short, time.Now().Add(-4500 * time.Millisecond), 4500 * time.Millisecond, false},
		{"wait dropped early", short, time.Now().Add(-time.Second), 4500 * time.Millisecond, true},
		{"ctx done", done, time.Now().Add(-time.Second), 4500 * time.Millisecond, false},
	} {
		if got := waitAgain(tc.ctx, tc.sent, tc.asked); got != tc.want {
			t.Errorf("%s: waitAgain = %v, want %v", tc.what, got, tc.want)
		}
	}
}

// A keepalive answer that lists a grant as lost ends that grant's lease
// only, also one the session adopts after the news (its Lock was answered
// after the keepalive that told of its loss), and moves lost_after on.
func TestSessionHearsLostGrants(t *testing.T) {
	c, err := New(Config{Endpoints: []string{"http://127.0.0.1:1"}, ClientID: "me"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := &Session{c: c, k: newKeeper(c, "session", time.Minute, time.Now()), held: map[uint64]*held{}, lost: map[uint64]error{}}
	hold := func(name string, token uint64) *held {
		h, err := c.keep("lock "+name, name, &Grant{FencingToken: token}, time.Time{}, 0, s, nil)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	a, b := hold("a", 7), hold("b", 8)
	s.heard(&keepAliveResponse{Revision: 20, Lost: []lostGrant{
		{Kind: "lock", Name: "b", FencingToken: 8, Cause: "revoked", Reason: "stuck", Revision: 15},
		{Kind: "lock", Name: "c", FencingToken: 9, Cause: "taken_over", Revision: 18},
		{Kind: "lock", Name: "x", FencingToken: 7, Cause: "revoked", Revision: 19}, // a's token, another name: not a's
	}})
	select {
	case <-b.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("b's Done did not close")
	}
	var ae *APIError
	if err := b.Err(); !errors.Is(err, ErrLeaseLost) || !errors.Is(err, ErrLockLost) || !errors.As(err, &ae) || ae.FencingToken != 8 {
		t.Fatalf("b.Err() = %v", err)
	}
	if a.Err() != nil {
		t.Fatalf("a ended: %v", a.Err())
	}
	if late := hold("c", 9); !errors.Is(late.Err(), ErrNotHolder) {
		t.Fatalf("a grant adopted after the news of its loss: Err() = %v", late.Err())
	}
	if s.lostAfter != 20 {
		t.Fatalf("lostAfter = %d, want 20", s.lostAfter)
	}
	s.heard(&keepAliveResponse{Revision: 25})
	if s.lostAfter != 25 || a.Err() != nil {
		t.Fatalf("lostAfter = %d, a.Err() = %v", s.lostAfter, a.Err())
	}
	s.k.end(ErrReleased)
	<-a.Done()
}

// A merged stream's place: a resumed connection asks each shard from the
// last revision it delivered and skips that revision's events it has; a
// shard that joins the stream (a split) is learnt and resumed by id.
func TestShardPlace(t *testing.T) {
	p := newShardPlace(map[int]uint64{0: 3, 1: 7})
	p.query()
	if !p.deliver(0, 5) {
		t.Fatal("a new event was not delivered")
	}
	if q := p.query(); q != "0:5,1:7" {
		t.Fatalf("resume from %q, want 0:5,1:7", q)
	}
	if p.deliver(0, 5) {
		t.Fatal("the event already delivered was delivered again after the resume")
	}
	if !p.deliver(0, 5) || !p.deliver(1, 7) || !p.deliver(0, 6) {
		t.Fatal("new events after the resume were not delivered")
	}
	if p.deliver(4, 9) {
		t.Fatal("an event of a shard the place does not carry was delivered")
	}
	p.learn(4, 9)
	p.learn(4, 2) // learnt once
	if !p.deliver(4, 9) {
		t.Fatal("the joined shard's first event was not delivered")
	}
	if q := p.query(); q != "0:6,1:7,4:9" {
		t.Fatalf("resume from %q, want 0:6,1:7,4:9", q)
	}
	if p.deliver(4, 9) || !p.deliver(4, 10) {
		t.Fatal("the joined shard's resume repeated or skipped")
	}
	if got := parseRevisions("0:3, 4:9"); len(got) != 2 || got[0] != 3 || got[4] != 9 {
		t.Fatalf("parseRevisions: %v", got)
	}
	for _, bad := range []string{"", "0", "a:1", "0:-1", "-1:2"} {
		if parseRevisions(bad) != nil {
			t.Fatalf("parseRevisions(%q) accepted", bad)
		}
	}
}
