package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock/client"
	"github.com/dlock/dlock/internal/testutil"
)

// TestLocks runs the tests that leave the cluster whole on one cluster.
func TestLocks(t *testing.T) {
	c := startCluster(t)
	t.Run("AutoRenewKeepsLock", func(t *testing.T) { testAutoRenew(t, c) })
	t.Run("QueuedGrantRenewsAtOnce", func(t *testing.T) { testQueuedGrant(t, c) })
	t.Run("CancelWhileWaitingLeavesNothing", func(t *testing.T) { testCancelWaiting(t, c) })
	t.Run("CancelRacingGrantLeavesNothing", func(t *testing.T) { testCancelRacingGrant(t, c) })
	t.Run("TypedErrors", func(t *testing.T) { testTypedErrors(t, c) })
	t.Run("SessionHoldsManyLocks", func(t *testing.T) { testSession(t, c) })
	t.Run("SessionLostWhenServerDropsIt", func(t *testing.T) { testSessionGone(t, c) })
	t.Run("WithLock", func(t *testing.T) { testWithLock(t, c) })
	t.Run("MutexesOfOneClientExclude", func(t *testing.T) { testLocalExclusion(t, c) })
	t.Run("FIFOAcrossClients", func(t *testing.T) { testFIFO(t, c) })
	t.Run("TakeoverOnlyWhenAsked", func(t *testing.T) { testTakeover(t, c) })
}

// testTakeover: two Clients with one ClientID (a process that restarted
// while its old lease runs). The new one waits for the lock like anyone
// unless it asks to take over; then the old lease is lost.
func testTakeover(t *testing.T, c *cluster) {
	old, restarted := c.client("stable-id"), c.client("stable-id")
	mo := old.NewMutex("takeover/x", client.WithTTL(30*time.Second))
	lo, err := mo.Lock(ctxTimeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := restarted.NewMutex("takeover/x").TryLock(ctxTimeout(t, 5*time.Second)); !errors.Is(err, client.ErrLockHeld) {
		t.Fatalf("TryLock by the same ClientID without takeover = %v, want ErrLockHeld", err)
	}
	if _, err := restarted.NewMutex("takeover/x").Lock(ctxTimeout(t, 400*time.Millisecond)); !errors.Is(err, client.ErrWaitTimeout) {
		t.Fatalf("Lock by the same ClientID without takeover = %v, want ErrWaitTimeout", err)
	}
	checkHeld(t, c.get("takeover/x"), "stable-id", lo.Token())

	mn := restarted.NewMutex("takeover/x", client.WithTakeover())
	ln, err := mn.TryLock(ctxTimeout(t, 5*time.Second))
	if err != nil {
		t.Fatalf("TryLock with WithTakeover: %v", err)
	}
	if ln.Token() <= lo.Token() {
		t.Fatalf("takeover token %d, old %d", ln.Token(), lo.Token())
	}
	checkHeld(t, c.get("takeover/x"), "stable-id", ln.Token())
	if err := mo.Unlock(ctxTimeout(t, 5*time.Second)); !errors.Is(err, client.ErrNotHolder) {
		t.Fatalf("Unlock of the lease taken over = %v, want ErrNotHolder", err)
	}
	if err := mn.Unlock(ctxTimeout(t, 5*time.Second)); err != nil {
		t.Fatalf("Unlock after the takeover: %v", err)
	}
	checkFree(t, c.get("takeover/x"))

	// The low-level Acquire: the same, with AcquireOptions.Takeover.
	g1, err := old.Acquire(ctxTimeout(t, 5*time.Second), "takeover/y", client.AcquireOptions{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := restarted.Acquire(ctxTimeout(t, 5*time.Second), "takeover/y", client.AcquireOptions{TTL: 30 * time.Second}); !errors.Is(err, client.ErrLockHeld) {
		t.Fatalf("Acquire by the same ClientID without takeover = %v, want ErrLockHeld", err)
	}
	g2, err := restarted.Acquire(ctxTimeout(t, 5*time.Second), "takeover/y", client.AcquireOptions{TTL: 30 * time.Second, Takeover: true})
	if err != nil || g2.FencingToken <= g1.FencingToken {
		t.Fatalf("Acquire with Takeover: %v %+v", err, g2)
	}
	if err := restarted.Release(ctxTimeout(t, 5*time.Second), "takeover/y", g2.FencingToken, g2.LeaseID); err != nil {
		t.Fatal(err)
	}

	// An Election: the same candidate id waits behind its own old seat
	// unless it takes over.
	lead, err := old.NewElection("takeover/e").Campaign(ctxTimeout(t, 5*time.Second), "old")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := restarted.NewElection("takeover/e").Campaign(ctxTimeout(t, 400*time.Millisecond), "new"); !errors.Is(err, client.ErrWaitTimeout) {
		t.Fatalf("Campaign by the same candidate id without takeover = %v, want ErrWaitTimeout", err)
	}
	lead2, err := restarted.NewElection("takeover/e", client.WithTakeover()).Campaign(ctxTimeout(t, 5*time.Second), "new")
	if err != nil || lead2.Token() <= lead.Token() || lead2.Value() != "new" {
		t.Fatalf("Campaign with WithTakeover: %v", err)
	}
	if err := lead2.Resign(ctxTimeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	_ = lead.Resign(ctxTimeout(t, 5*time.Second))
}

func testAutoRenew(t *testing.T, c *cluster) {
	const ttl = time.Second
	cl := c.client("renewer")
	m := cl.NewMutex("renew/me", client.WithTTL(ttl))
	l, err := m.Lock(ctxTimeout(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	first := client.LastSent(l)
	// Hold for three and a half TTLs; the server must show the same grant
	// the whole time.
	until := time.Now().Add(3500 * time.Millisecond)
	for time.Now().Before(until) {
		checkHeld(t, c.get("renew/me"), "renewer", l.Token())
		select {
		case <-l.Done():
			t.Fatalf("lease ended while renewing: %v", l.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	if got := client.LastSent(l); got.Sub(first) < 2*ttl {
		t.Fatalf("last renewal sent %s after the grant; want renewals every TTL/3 for 3.5 TTLs", got.Sub(first))
	}
	if err := m.Unlock(ctxTimeout(t, 5*time.Second)); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	if !errors.Is(l.Err(), client.ErrReleased) {
		t.Fatalf("Err after Unlock = %v, want ErrReleased", l.Err())
	}
	checkFree(t, c.get("renew/me"))
}

// testQueuedGrant: a grant after a wait in line longer than the TTL comes
// with a fresh bound, from a renewal sent after the grant.
func testQueuedGrant(t *testing.T, c *cluster) {
	const ttl = time.Second
	a, b := c.client("queue-a"), c.client("queue-b")
	ma := a.NewMutex("queue/x", client.WithTTL(ttl))
	la, err := ma.Lock(ctxTimeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		l   *client.Lease
		err error
	}
	got := make(chan result, 1)
	mb := b.NewMutex("queue/x", client.WithTTL(ttl))
	go func() {
		l, err := mb.Lock(context.Background())
		got <- result{l, err}
	}()
	testutil.Eventually(t, 5*time.Second, "b waits in line", func() (bool, string) {
		st := c.get("queue/x")
		return st.Waiters == 1, fmt.Sprint(st.Waiters)
	})
	time.Sleep(ttl + ttl/2) // b waits longer than a TTL
	released := time.Now()
	if err := ma.Unlock(ctxTimeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("b was not granted the lock after a released it")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer mb.Unlock(context.Background())
	if r.l.Token() <= la.Token() {
		t.Fatalf("b's token %d not above a's %d", r.l.Token(), la.Token())
	}
	if sent := client.LastSent(r.l); sent.Before(released) {
		t.Fatalf("b's bound counts from %s before the grant; want a renewal sent after it", released.Sub(sent))
	}
	if r.l.Err() != nil {
		t.Fatalf("b's lease: %v", r.l.Err())
	}
	checkHeld(t, c.get("queue/x"), "queue-b", r.l.Token())
}

func testCancelWaiting(t *testing.T, c *cluster) {
	a, b := c.client("cancel-a"), c.client("cancel-b")
	ma := a.NewMutex("cancel/x")
	if _, err := ma.TryLock(ctxTimeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := b.NewMutex("cancel/x").Lock(ctx)
		done <- err
	}()
	testutil.Eventually(t, 5*time.Second, "b waits in line", func() (bool, string) {
		st := c.get("cancel/x")
		return st.Waiters == 1, fmt.Sprint(st.Waiters)
	})
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Lock after cancel = %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Lock did not return after its context was cancelled")
	}
	// Nothing is left in line once Lock has returned.
	if st := c.get("cancel/x"); st.Waiters != 0 || st.Holder == nil || st.Holder.ClientID != "cancel-a" {
		t.Fatalf("after the cancelled Lock returned: %+v, want held by cancel-a with 0 waiters", st)
	}
	if err := ma.Unlock(ctxTimeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	checkFree(t, c.get("cancel/x"))
}

// testCancelRacingGrant cancels waiters at about the moment the lock is
// handed to them: whatever the timing, a Lock that fails leaves the lock
// neither held nor waited for.
func testCancelRacingGrant(t *testing.T, c *cluster) {
	a, b := c.client("race-a"), c.client("race-b")
	for i := range 6 {
		name := fmt.Sprintf("race/%d", i)
		ma := a.NewMutex(name)
		if _, err := ma.TryLock(ctxTimeout(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		mb := b.NewMutex(name)
		done := make(chan error, 1)
		go func() {
			_, err := mb.Lock(ctx)
			done <- err
		}()
		testutil.Eventually(t, 5*time.Second, "b waits in line", func() (bool, string) {
			st := c.get(name)
			return st.Waiters == 1, fmt.Sprint(st.Waiters)
		})
		var wg sync.WaitGroup
		wg.Go(func() {
			if err := ma.Unlock(context.Background()); err != nil {
				t.Errorf("Unlock a: %v", err)
			}
		})
		time.Sleep(time.Duration(i) * 2 * time.Millisecond)
		cancel()
		wg.Wait()
		var err error
		select {
		case err = <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("Lock did not return after its context was cancelled")
		}
		if err == nil {
			t.Logf("%s: b won the race", name)
			if err := mb.Unlock(ctxTimeout(t, 5*time.Second)); err != nil {
				t.Fatal(err)
			}
		} else if !errors.Is(err, context.Canceled) {
			t.Fatalf("Lock = %v, want nil or context.Canceled", err)
		}
		checkFree(t, c.get(name))
	}
}

func testTypedErrors(t *testing.T, c *cluster) {
	a, b := c.client("typed-a"), c.client("typed-b")
	ma := a.NewMutex("typed/x")
	la, err := ma.TryLock(ctxTimeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer ma.Unlock(context.Background())

	_, err = b.NewMutex("typed/x").TryLock(ctxTimeout(t, 5*time.Second))
	var ae *client.APIError
	if !errors.Is(err, client.ErrLockHeld) || !errors.As(err, &ae) {
		t.Fatalf("TryLock of a held lock = %v, want ErrLockHeld and an *APIError", err)
	}
	if ae.Code != client.CodeLockHeld || ae.HTTPStatus != 409 || ae.Holder == nil || ae.Holder.ClientID != "typed-a" || ae.Holder.FencingToken != la.Token() {
		t.Fatalf("APIError = %+v holder %+v", ae, ae.Holder)
	}

	start := time.Now()
	_, err = b.NewMutex("typed/x").Lock(ctxTimeout(t, 400*time.Millisecond))
	if !errors.Is(err, client.ErrWaitTimeout) {
		t.Fatalf("Lock with a deadline on a held lock = %v, want ErrWaitTimeout", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("Lock with a 400 ms deadline returned after %s", el)
	}
	if st := c.get("typed/x"); st.Waiters != 0 {
		t.Fatalf("waiters after a wait timeout: %d", st.Waiters)
	}

	lowLevel, err := a.Acquire(ctxTimeout(t, 5*time.Second), "typed/y", client.AcquireOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = a.Release(ctxTimeout(t, 5*time.Second), "typed/y", lowLevel.FencingToken+1, lowLevel.LeaseID)
	if !errors.Is(err, client.ErrNotHolder) || !errors.As(err, &ae) || ae.Code != client.CodeNotHolder {
		t.Fatalf("Release with a wrong token = %v, want ErrNotHolder", err)
	}
	_, err = b.Renew(ctxTimeout(t, 5*time.Second), "typed/y", lowLevel.FencingToken, lowLevel.LeaseID, 0)
	if !errors.Is(err, client.ErrNotHolder) {
		t.Fatalf("Renew by another client id = %v, want ErrNotHolder", err)
	}
	if _, err := a.Renew(ctxTimeout(t, 5*time.Second), "typed/y", lowLevel.FencingToken, lowLevel.LeaseID, 2*time.Second); err != nil {
		t.Fatalf("Renew by the holder: %v", err)
	}
	if err := a.Release(ctxTimeout(t, 5*time.Second), "typed/y", lowLevel.FencingToken, lowLevel.LeaseID); err != nil {
		t.Fatalf("Release by the holder: %v", err)
	}

	_, err = a.NewMutex("typed//bad").TryLock(ctxTimeout(t, 5*time.Second))
	if !errors.Is(err, client.ErrInvalidArgument) || !errors.As(err, &ae) || ae.HTTPStatus != 400 {
		t.Fatalf("bad name = %v, want ErrInvalidArgument from a 400", err)
	}
	if _, err := a.NewMutex("typed/z", client.WithTTL(500*time.Millisecond)).TryLock(context.Background()); !errors.Is(err, client.ErrInvalidArgument) {
		t.Fatalf("TTL 500ms = %v, want ErrInvalidArgument", err)
	}

	// A session belongs to its client id; anyone else is told it does not
	// exist.
	s, err := a.NewSession(ctxTimeout(t, 5*time.Second), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	_, err = b.Acquire(ctxTimeout(t, 5*time.Second), "typed/s", client.AcquireOptions{Session: s})
	if !errors.Is(err, client.ErrSessionExpired) {
		t.Fatalf("acquire under another client's session = %v, want ErrSessionExpired", err)
	}

	if _, err := client.New(client.Config{}); !errors.Is(err, client.ErrInvalidArgument) {
		t.Fatalf("New without endpoints = %v", err)
	}
}

func testSession(t *testing.T, c *cluster) {
	const ttl = time.Second
	cl := c.client("sessions")
	s, err := cl.NewSession(ctxTimeout(t, 5*time.Second), ttl)
	if err != nil {
		t.Fatal(err)
	}
	m1 := cl.NewMutex("sess/one", client.WithSession(s))
	m2 := cl.NewMutex("sess/two", client.WithSession(s))
	l1, err := m1.Lock(ctxTimeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	l2, err := m2.Lock(ctxTimeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// One keepalive loop keeps both for more than two TTLs.
	until := time.Now().Add(2500 * time.Millisecond)
	for time.Now().Before(until) {
		checkHeld(t, c.get("sess/one"), "sessions", l1.Token())
		checkHeld(t, c.get("sess/two"), "sessions", l2.Token())
		time.Sleep(100 * time.Millisecond)
	}
	if s.Err() != nil || l1.Err() != nil || l2.Err() != nil {
		t.Fatalf("errors while held: session %v, leases %v %v", s.Err(), l1.Err(), l2.Err())
	}
	if time.Until(l1.ExpiresAt()) <= 0 || !l1.ExpiresAt().Equal(s.ExpiresAt()) {
		t.Fatalf("a session lock's ExpiresAt is the session's")
	}
	// Unlock one; closing the session releases the other.
	if err := m1.Unlock(ctxTimeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	checkFree(t, c.get("sess/one"))
	if err := s.Close(ctxTimeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	checkFree(t, c.get("sess/two"))
	select {
	case <-l2.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a lock's Done stayed open after its session was closed")
	}
	if !errors.Is(l2.Err(), client.ErrLeaseLost) || !errors.Is(s.Err(), client.ErrReleased) {
		t.Fatalf("after Close: lease %v, session %v", l2.Err(), s.Err())
	}
	if err := m2.Unlock(ctxTimeout(t, 5*time.Second)); !errors.Is(err, client.ErrNotHolder) {
		t.Fatalf("Unlock after the session closed = %v, want ErrNotHolder", err)
	}
}

func testSessionGone(t *testing.T, c *cluster) {
	cl := c.client("session-gone")
	s, err := cl.NewSession(ctxTimeout(t, 5*time.Second), 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	m := cl.NewMutex("sess/gone", client.WithSession(s))
	l, err := m.Lock(ctxTimeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// Delete the session behind the client's back: the next keepalive is
	// told session_not_found.
	code, err := c.Do(ctxTimeout(t, 5*time.Second), "DELETE", c.leaderURL()+"/api/v1/sessions/"+client.SessionID(s), nil, nil)
	if err != nil || code != 200 {
		t.Fatalf("DELETE session: %d %v", code, err)
	}
	select {
	case <-s.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("session Done stayed open after the server dropped it")
	}
	if !errors.Is(s.Err(), client.ErrSessionExpired) || !errors.Is(s.Err(), client.ErrLeaseLost) {
		t.Fatalf("session Err = %v, want ErrSessionExpired and ErrLeaseLost", s.Err())
	}
	<-l.Done()
	if !errors.Is(l.Err(), client.ErrLeaseLost) {
		t.Fatalf("lease Err = %v", l.Err())
	}
	m.Unlock(ctxTimeout(t, 5*time.Second))
	if _, err := m.Lock(ctxTimeout(t, 5*time.Second)); !errors.Is(err, client.ErrLeaseLost) {
		t.Fatalf("Lock under a lost session = %v", err)
	}
}

func testWithLock(t *testing.T, c *cluster) {
	cl := c.client("withlock")
	var token uint64
	err := cl.WithLock(ctxTimeout(t, 5*time.Second), "with/x", func(ctx context.Context, l *client.Lease) error {
		token = l.Token()
		checkHeld(t, c.get("with/x"), "withlock", l.Token())
		return nil
	}, client.WithTTL(5*time.Second))
	if err != nil || token == 0 {
		t.Fatalf("WithLock = %v, token %d", err, token)
	}
	checkFree(t, c.get("with/x"))

	errWork := errors.New("work failed")
	if err := cl.WithLock(ctxTimeout(t, 5*time.Second), "with/x", func(context.Context, *client.Lease) error { return errWork }); err != errWork {
		t.Fatalf("WithLock = %v, want fn's error", err)
	}
	checkFree(t, c.get("with/x"))

	func() {
		defer func() {
			if v := recover(); v != "boom" {
				t.Fatalf("recovered %v, want the panic to pass through", v)
			}
		}()
		cl.WithLock(ctxTimeout(t, 5*time.Second), "with/x", func(context.Context, *client.Lease) error { panic("boom") })
	}()
	checkFree(t, c.get("with/x"))
}

func testLocalExclusion(t *testing.T, c *cluster) {
	cl := c.client("local")
	var inside, entered atomic.Int32
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			err := cl.WithLock(ctxTimeout(t, 20*time.Second), "local/x", func(ctx context.Context, l *client.Lease) error {
				if n := inside.Add(1); n != 1 {
					t.Errorf("%d holders inside at once", n)
				}
				entered.Add(1)
				time.Sleep(50 * time.Millisecond)
				inside.Add(-1)
				return nil
			})
			if err != nil {
				t.Errorf("WithLock: %v", err)
			}
		})
	}
	wg.Wait()
	if entered.Load() != 3 {
		t.Fatalf("%d of 3 entered", entered.Load())
	}
	m := cl.NewMutex("local/y")
	if _, err := m.TryLock(ctxTimeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.NewMutex("local/y").TryLock(ctxTimeout(t, 5*time.Second)); !errors.Is(err, client.ErrLockHeld) {
		t.Fatalf("TryLock while another Mutex of the client holds = %v, want ErrLockHeld", err)
	}
	if err := m.Unlock(ctxTimeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := m.Unlock(ctxTimeout(t, 5*time.Second)); !errors.Is(err, client.ErrNotHolder) {
		t.Fatalf("second Unlock = %v, want ErrNotHolder", err)
	}
}

// testFIFO: waiters of different clients get the lock in the order they
// queued, with increasing tokens.
func testFIFO(t *testing.T, c *cluster) {
	holder := c.client("fifo-0")
	m0 := holder.NewMutex("fifo/x")
	if _, err := m0.TryLock(ctxTimeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var order []string
	var tokens []uint64
	var wg sync.WaitGroup
	for i := 1; i <= 3; i++ {
		id := fmt.Sprintf("fifo-%d", i)
		cl := c.client(id)
		wg.Go(func() {
			err := cl.WithLock(ctxTimeout(t, 20*time.Second), "fifo/x", func(ctx context.Context, l *client.Lease) error {
				mu.Lock()
				order = append(order, id)
				tokens = append(tokens, l.Token())
				mu.Unlock()
				return nil
			})
			if err != nil {
				t.Errorf("%s: %v", id, err)
			}
		})
		testutil.Eventually(t, 5*time.Second, id+" queued", func() (bool, string) {
			st := c.get("fifo/x")
			return st.Waiters == i, fmt.Sprint(st.Waiters)
		})
	}
	if err := m0.Unlock(ctxTimeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if fmt.Sprint(order) != "[fifo-1 fifo-2 fifo-3]" || !(tokens[0] < tokens[1] && tokens[1] < tokens[2]) {
		t.Fatalf("order %v tokens %v, want fifo-1..3 with increasing tokens", order, tokens)
	}
}

// The tests below use fake nodes.

// grantJSON is a grant as the server answers it: an acquire's (field
// "acquired") or a campaign's ("leader").
func grantJSON(field string, token uint64) string {
	return fmt.Sprintf(`{%q:true,"fencing_token":%d,"lease_id":"00112233445566778899aabbccddeeff","expires_at":%q,"revision":%d}`,
		field, token, time.Now().Add(30*time.Second).UTC().Format(time.RFC3339Nano), token)
}

// serverLimitNode is a node whose waits in line end at the server's limit:
// it answers the first two waits with wait_timeout after the wait asked
// for, and grants the third. It records the waits asked for.
func serverLimitNode(t *testing.T, action, granted string) (*client.Client, func() []time.Duration) {
	t.Helper()
	var mu sync.Mutex
	var asked []time.Duration
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if !strings.HasSuffix(r.URL.Path, "/"+action) {
			io.WriteString(w, `{}`) // release, resign, the leader question
			return
		}
		var body struct {
			WaitTimeoutMs int64 `json:"wait_timeout_ms"`
		}
		_ = json.NewDecoder(r.Body).Decode(&body)
		wait := time.Duration(body.WaitTimeoutMs) * time.Millisecond
		mu.Lock()
		asked = append(asked, wait)
		n := len(asked)
		mu.Unlock()
		if n <= 2 {
			select {
			case <-time.After(wait):
			case <-r.Context().Done():
				return
			}
			w.WriteHeader(http.StatusConflict)
			io.WriteString(w, `{"error":{"code":"wait_timeout","message":"not granted within wait_timeout_ms"}}`)
			return
		}
		io.WriteString(w, grantJSON(granted, 8))
	}))
	t.Cleanup(srv.Close)
	cl, err := client.New(client.Config{Endpoints: []string{srv.URL}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl, func() []time.Duration { mu.Lock(); defer mu.Unlock(); return append([]time.Duration(nil), asked...) }
}

// TestLockWaitsPastServerLimit: a deadline further away than the server's
// limit on one wait (an hour; here 200 ms) is the caller's bound, not the
// server's: Lock queues again when the server's wait ends.
func TestLockWaitsPastServerLimit(t *testing.T) {
	client.SetMaxWait(t, 200*time.Millisecond)
	cl, asked := serverLimitNode(t, "acquire", "acquired")
	m := cl.NewMutex("x", client.WithTTL(30*time.Second))
	l, err := m.Lock(ctxTimeout(t, 10*time.Second))
	if err != nil {
		t.Fatalf("Lock with 10 s left after the server's 200 ms limit = %v (waits asked %v); want it to wait on", err, asked())
	}
	defer m.Unlock(context.Background())
	if w := asked(); l.Token() != 8 || len(w) != 3 || w[0] != 200*time.Millisecond {
		t.Fatalf("token %d after waits %v; want the grant of the third wait of the server's limit each", l.Token(), w)
	}
}

// TestLockUnderLostSessionFails: a session that ends while Lock waits ends
// the wait; Lock does not hand out a lease the session no longer backs (the
// server would hold its lock until the session expired there).
func TestLockUnderLostSessionFails(t *testing.T) {
	var mu sync.Mutex
	var releases, grants int
	lost := make(chan struct{})
	var lostOnce sync.Once
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.URL.Path == "/api/v1/sessions":
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"session_id":"s1","ttl_ms":1000,"expires_at":%q}`, time.Now().Add(time.Second).UTC().Format(time.RFC3339Nano))
		case strings.HasSuffix(r.URL.Path, "/keepalive"):
			// The server dropped the session (deleted behind the client's
			// back, say), while it still grants the queued acquire below.
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, `{"error":{"code":"session_not_found","message":"no such session"}}`)
			lostOnce.Do(func() { close(lost) })
		case strings.HasSuffix(r.URL.Path, "/acquire"):
			var body struct {
				WaitTimeoutMs int64 `json:"wait_timeout_ms"`
			}
			_ = json.NewDecoder(r.Body).Decode(&body)
			if body.WaitTimeoutMs > 0 {
				// Grant a moment after the client learnt the session is gone.
				<-lost
				select {
				case <-time.After(200 * time.Millisecond):
				case <-r.Context().Done():
					return
				}
			}
			mu.Lock()
			grants++
			mu.Unlock()
			io.WriteString(w, grantJSON("acquired", 8))
		case strings.HasSuffix(r.URL.Path, "/release"):
			mu.Lock()
			releases++
			mu.Unlock()
			io.WriteString(w, `{"released":true}`)
		default:
			io.WriteString(w, `{}`)
		}
	}))
	defer srv.Close()
	cl, err := client.New(client.Config{Endpoints: []string{srv.URL}})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	s, err := cl.NewSession(ctxTimeout(t, 5*time.Second), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	m := cl.NewMutex("x", client.WithSession(s))
	l, err := m.Lock(ctxTimeout(t, 10*time.Second))
	if err == nil {
		t.Fatalf("Lock under a session lost while it waited succeeded (lease Err %v, session Err %v)", l.Err(), s.Err())
	}
	if !errors.Is(err, client.ErrLeaseLost) || !errors.Is(err, client.ErrSessionExpired) {
		t.Fatalf("Lock under a lost session = %v; want the session's error (ErrLeaseLost, ErrSessionExpired)", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if grants > 0 && releases == 0 {
		t.Fatalf("the lock was granted %d times and never released: the server holds it until the session expires there", grants)
	}
}

// TestLockGivesBackAnUnconfirmedGrant: a grant that came too late to trust
// its bound is confirmed by a renewal; when that fails, Lock gives the grant
// back before it queues again. A new acquire of the same ClientID takes
// nothing over unless asked to, so without the give-back the next attempt
// would wait behind its own grant until the TTL ran out.
func TestLockGivesBackAnUnconfirmedGrant(t *testing.T) {
	cl, calls := unconfirmedGrantNode(t, "acquire", "acquired")
	m := cl.NewMutex("x", client.WithTTL(time.Second))
	l, err := m.Lock(ctxTimeout(t, 10*time.Second))
	if err != nil {
		t.Fatalf("Lock: %v", err)
	}
	defer m.Unlock(context.Background())
	checkGaveBack(t, l.Token(), calls(), "acquire", "release")
}

// TestCampaignGivesBackAnUnconfirmedSeat: the same for Campaign.
func TestCampaignGivesBackAnUnconfirmedSeat(t *testing.T) {
	cl, calls := unconfirmedGrantNode(t, "campaign", "leader")
	l, err := cl.NewElection("x", client.WithTTL(time.Second)).Campaign(ctxTimeout(t, 10*time.Second), "v")
	if err != nil {
		t.Fatalf("Campaign: %v", err)
	}
	defer l.Resign(context.Background())
	checkGaveBack(t, l.Token(), calls(), "campaign", "resign")
}

// unconfirmedGrantNode is a node that answers the first acquire (or
// campaign) after more than TTL/3 of a 1 s TTL with token 1, refuses to
// renew that grant, and grants token 2 at once to the next one. It records
// every write with its token and takeover flag.
func unconfirmedGrantNode(t *testing.T, action, granted string) (*client.Client, func() []string) {
	t.Helper()
	var mu sync.Mutex
	var calls []string
	acquires := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.Method != http.MethodPost {
			io.WriteString(w, `{}`) // the leader question
			return
		}
		var body struct {
			FencingToken uint64 `json:"fencing_token"`
			Takeover     bool   `json:"takeover"`
		}
		_ = json.NewDecoder(r.Body).Decode(&body)
		verb := r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]
		mu.Lock()
		calls = append(calls, fmt.Sprintf("%s token=%d takeover=%v", verb, body.FencingToken, body.Takeover))
		if verb == action {
			acquires++
		}
		n := acquires
		mu.Unlock()
		switch {
		case verb == action && n == 1:
			time.Sleep(time.Second/3 + 150*time.Millisecond) // past TTL/3: confirm first
			io.WriteString(w, grantJSON(granted, 1))
		case verb == action:
			io.WriteString(w, grantJSON(granted, 2))
		case verb == "renew" && body.FencingToken == 1:
			w.WriteHeader(http.StatusInternalServerError)
			io.WriteString(w, `{"error":{"code":"internal","message":"confirming failed"}}`)
		case verb == "renew":
			fmt.Fprintf(w, `{"renewed":true,"ttl_ms":1000,"expires_at":%q}`, time.Now().Add(time.Second).UTC().Format(time.RFC3339Nano))
		default:
			io.WriteString(w, `{}`) // release, resign
		}
	}))
	t.Cleanup(srv.Close)
	cl, err := client.New(client.Config{Endpoints: []string{srv.URL}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl, func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), calls...) }
}

// checkGaveBack wants the unconfirmed grant given back before the next
// attempt, which asks for no takeover and is the grant handed out.
func checkGaveBack(t *testing.T, token uint64, seq []string, action, giveBack string) {
	t.Helper()
	want := []string{action + " token=0 takeover=false", "renew token=1 takeover=false", giveBack + " token=1 takeover=false", action + " token=0 takeover=false"}
	if token != 2 || len(seq) < len(want) || fmt.Sprint(seq[:len(want)]) != fmt.Sprint(want) {
		t.Fatalf("token %d after calls %q; want the unconfirmed grant given back before the next %s: %q", token, seq, action, want)
	}
}

// TestWithdrawNeverTakesOver: with WithTakeover, the acquire asks to take
// over, but its withdrawal (the same request again, without waiting, after
// the caller gave up) does not: should the cluster have forgotten the
// request, the withdrawal must not take the lock from anyone.
func TestWithdrawNeverTakesOver(t *testing.T) {
	var mu sync.Mutex
	var calls []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if !strings.HasSuffix(r.URL.Path, "/acquire") {
			io.WriteString(w, `{}`)
			return
		}
		var body struct {
			WaitTimeoutMs int64 `json:"wait_timeout_ms"`
			Takeover      bool  `json:"takeover"`
		}
		_ = json.NewDecoder(r.Body).Decode(&body)
		mu.Lock()
		calls = append(calls, fmt.Sprintf("wait=%v takeover=%v", body.WaitTimeoutMs > 0, body.Takeover))
		mu.Unlock()
		if body.WaitTimeoutMs > 0 {
			<-r.Context().Done() // waits until the caller gives up
			return
		}
		w.WriteHeader(http.StatusConflict)
		io.WriteString(w, `{"error":{"code":"lock_held","message":"held"},"holder":{"client_id":"other","fencing_token":1}}`)
	}))
	t.Cleanup(srv.Close)
	cl, err := client.New(client.Config{Endpoints: []string{srv.URL}, ClientID: "stable"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	if _, err := cl.NewMutex("x", client.WithTakeover()).Lock(ctxTimeout(t, 300*time.Millisecond)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock = %v, want the deadline", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(calls) != "[wait=true takeover=true wait=false takeover=false]" {
		t.Fatalf("acquires sent: %q; want the wait with takeover, then its withdrawal without", calls)
	}
}
