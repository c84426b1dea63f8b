package service

import (
	"fmt"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/state"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time        { return c.t }
func (c *fakeClock) add(d time.Duration)   { c.t = c.t.Add(d) }
func newClock() *fakeClock                 { return &fakeClock{t: time.Unix(1_000_000, 0)} }
func take(l *rateLimiter, key string) bool { ok, _ := l.allow(key); return ok }
func takeN(l *rateLimiter, key string, n int) int {
	got := 0
	for range n {
		if take(l, key) {
			got++
		}
	}
	return got
}

func TestRateLimiterBurstAndRefill(t *testing.T) {
	clk := newClock()
	l := newRateLimiter(2, 3, clk.now) // 2/s, bursts of 3
	if got := takeN(l, "a", 5); got != 3 {
		t.Fatalf("burst: %d of 5 allowed, want 3", got)
	}
	ok, wait := l.allow("a")
	if ok || wait != 500*time.Millisecond {
		t.Fatalf("empty bucket: ok=%v wait=%s, want refused with 500ms", ok, wait)
	}
	if !take(l, "b") {
		t.Fatal("another key was refused while one is limited")
	}
	clk.add(499 * time.Millisecond)
	if take(l, "a") {
		t.Fatal("allowed before a token refilled")
	}
	clk.add(time.Millisecond)
	if !take(l, "a") {
		t.Fatal("refused after a token refilled")
	}
	clk.add(time.Hour)
	if got := takeN(l, "a", 5); got != 3 {
		t.Fatalf("after a long idle: %d allowed, want the burst (3) and no more", got)
	}
}

func TestRateLimiterForgetsIdleBucketsAndStaysBounded(t *testing.T) {
	clk := newClock()
	l := newRateLimiter(1, 1, clk.now)
	l.maxKeys = 3
	for i := range 3 {
		take(l, fmt.Sprint(i))
	}
	// Full of busy buckets: a new key shares the overflow bucket.
	if !take(l, "new1") {
		t.Fatal("overflow bucket refused its first request")
	}
	if take(l, "new2") {
		t.Fatal("overflow bucket is not shared: a second new key got a token")
	}
	if l.size() != 3 {
		t.Fatalf("%d buckets kept, want 3", l.size())
	}
	// Once the buckets have refilled they are the same as new ones and are
	// forgotten, making room.
	clk.add(2 * time.Second)
	if !take(l, "new3") {
		t.Fatal("refused after the idle buckets refilled")
	}
	if l.size() != 1 {
		t.Fatalf("%d buckets kept after the sweep, want 1 (new3)", l.size())
	}
}

func TestWatchSlots(t *testing.T) {
	w := newWatchSlots(3, 2)
	r1, _, _ := w.take("c1")
	w.take("c1")
	if _, refused, n := w.take("c1"); refused != limitWatchersPerConn || n != 2 {
		t.Fatalf("third on one connection: refused=%q n=%d, want %s 2", refused, n, limitWatchersPerConn)
	}
	w.take("c2")
	if _, refused, n := w.take("c3"); refused != limitWatchers || n != 3 {
		t.Fatalf("fourth on the node: refused=%q n=%d, want %s 3", refused, n, limitWatchers)
	}
	r1()
	r1() // releasing twice frees one slot only
	if rel, refused, _ := w.take("c1"); refused != "" || rel == nil {
		t.Fatalf("refused after a release: %q", refused)
	}
	if _, refused, _ := w.take("c4"); refused != limitWatchers {
		t.Fatalf("a double release freed two slots (refused=%q)", refused)
	}
}

func sessionsState(t *testing.T, perClient map[string]int) *state.State {
	t.Helper()
	st := state.New()
	i := uint64(0)
	for c, n := range perClient {
		for range n {
			i++
			r := st.Apply(i, &command.Envelope{ClientID: c, RequestID: fmt.Sprint(i), TS: 1,
				Body: &command.CreateSession{LeaseID: command.NewLeaseID(), TTLms: 10_000}})
			if r.Status != command.StatusOK {
				t.Fatalf("create session: %v", r.Status)
			}
		}
	}
	return st
}

func TestLeaseCounts(t *testing.T) {
	st := sessionsState(t, map[string]int{"a": 3, "b": 1})
	read := func(fn func(*state.State)) { fn(st) }
	clk := newClock()
	c := newLeaseCounts(clk.now)
	// The whole table (4) is below the cap: no walk, and no client can be at it.
	if n := c.count(read, "a", 5); n >= 5 {
		t.Fatalf("below the cap: %d", n)
	}
	if c.counts != nil {
		t.Fatal("walked the table while it was smaller than the cap")
	}
	// At a cap of 3, client a is at it and b is not.
	if n := c.count(read, "a", 3); n != 3 {
		t.Fatalf("a: %d, want 3", n)
	}
	if n := c.count(read, "b", 3); n != 1 {
		t.Fatalf("b: %d, want 1", n)
	}
	// A lease this node creates counts at once, before the next walk.
	c.changed("b", 1)
	c.changed("b", 1)
	if n := c.count(read, "b", 3); n != 3 {
		t.Fatalf("b after two creations here: %d, want 3", n)
	}
	// The next walk replaces the local additions with the table's truth.
	clk.add(minLeaseWalk)
	if n := c.count(read, "b", 3); n != 1 {
		t.Fatalf("b after a new walk: %d, want 1 (the table has one)", n)
	}
}

// A walk keeps only the clients at an eighth of the cap or more, so a table
// with a client id per lease is not copied whole; the others are counted from
// what this node creates.
func TestLeaseCountsKeepOnlyClientsNearTheCap(t *testing.T) {
	st := sessionsState(t, map[string]int{"big": 20, "small": 1})
	read := func(fn func(*state.State)) { fn(st) }
	c := newLeaseCounts(newClock().now)
	if n := c.count(read, "big", 16); n != 20 {
		t.Fatalf("big: %d, want 20", n)
	}
	if _, kept := c.counts["small"]; kept || len(c.counts) != 1 {
		t.Fatalf("walk kept %v; want only the client near the cap", c.counts)
	}
	c.changed("small", 1)
	if n := c.count(read, "small", 16); n != 1 {
		t.Fatalf("small: %d, want what this node created since the walk (1)", n)
	}
}
