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
