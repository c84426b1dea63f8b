package service

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/raftnode"
	"github.com/dlock/dlock/internal/state"
	"github.com/dlock/dlock/internal/testutil"
	"github.com/dlock/dlock/internal/watch"
)

// watchedService is a service over a fakeNode, with an event hub.
func watchedService(t *testing.T) (*fakeNode, *Service) {
	t.Helper()
	node := newFakeNode(false)
	hub := watch.NewHub(0, 0)
	node.local.AddObserver(hub)
	s := New(node, hub, slog.New(slog.NewTextHandler(io.Discard, nil)))
	t.Cleanup(s.Close)
	return node, s
}

// A node that has known no leader for NoLeaderWait hears of no changes, so it
// ends its watches (no_leader: reconnect elsewhere) and refuses new ones; a
// shorter gap, as in a failover, ends nothing.
func TestWatchesEndWhileNodeKnowsNoLeader(t *testing.T) {
	ctx := context.Background()
	node, s := watchedService(t)
	w, err := s.Watch(ctx, WatchRequest{Prefix: "jobs/"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()

	node.leaderless.Store(int64(raftnode.NoLeaderWait / 2)) // a failover
	select {
	case _, ok := <-w.Events():
		t.Fatalf("the watch ended or got an event (open=%v, err=%v) during a short leaderless spell", ok, w.Err())
	case <-time.After(4 * leaderCheck):
	}

	node.leaderless.Store(int64(raftnode.NoLeaderWait)) // cut off
	select {
	case _, ok := <-w.Events():
		if ok {
			t.Fatal("an event on a node without a leader")
		}
	case <-time.After(10 * time.Second): // hang guard only
		t.Fatal("the watch stayed open on a node that has known no leader for NoLeaderWait")
	}
	if ae := apierror.From(w.Err()); ae.Code != apierror.NoLeader {
		t.Fatalf("the watch ended with %v (code %s); want no_leader", w.Err(), ae.Code)
	}
	if _, err := s.Watch(ctx, WatchRequest{Prefix: "jobs/"}); apierror.CodeOf(err) != apierror.NoLeader {
		t.Fatalf("a new watch on a node without a leader: %v; want no_leader", err)
	}
	if _, _, err := s.Observe(ctx, "boss", true); apierror.CodeOf(err) != apierror.NoLeader {
		t.Fatalf("a new stale observe on a node without a leader: %v; want no_leader", err)
	}

	node.leaderless.Store(0) // a leader again
	w2, err := s.Watch(ctx, WatchRequest{Prefix: "jobs/"})
	if err != nil {
		t.Fatalf("a watch once a leader is known: %v", err)
	}
	w2.Close()
}

// A queued acquire on a node that has known no leader for NoLeaderWait would
// never hear of its grant there: it is answered no_leader. With a request_id
// its place in line is kept for the client's retry through another node;
// without one it is withdrawn.
func TestQueuedAcquireEndsWhileNodeKnowsNoLeader(t *testing.T) {
	for _, tc := range placeInLineCases {
		t.Run("request_id="+tc.requestID, func(t *testing.T) {
			node, s, _ := heldByHolder(t)
			done := make(chan error, 1)
			go func() {
				_, err := s.Acquire(context.Background(), AcquireRequest{Name: "job", ClientID: "waiter", TTLms: 30_000,
					WaitTimeoutMs: 600_000, RequestID: tc.requestID})
				done <- err
			}()
			key, _ := command.NormalizeName("job")
			lock := func() (li state.LockInfo) {
				node.local.Read(func(st *state.State) { li = st.GetLock(key) })
				return li
			}
			testutil.Eventually(t, 10*time.Second, "the waiter never queued", func() bool { return lock().Waiters == 1 })
			node.leaderless.Store(int64(raftnode.NoLeaderWait / 2)) // a failover: nothing ends
			select {
			case err := <-done:
				t.Fatalf("the queued acquire ended (%v) during a short leaderless spell", err)
			case <-time.After(4 * leaderCheck):
			}
			node.leaderless.Store(int64(raftnode.NoLeaderWait))
			select {
			case err := <-done:
				if c := apierror.CodeOf(err); c != apierror.NoLeader {
					t.Fatalf("the queued acquire on a node without a leader: %v (code %s); want no_leader", err, c)
				}
			case <-time.After(10 * time.Second): // hang guard only
				t.Fatal("the queued acquire kept waiting on a node without a leader")
			}
			if got := lock().Waiters; got != tc.wantWaiters {
				t.Fatalf("waiters after the answer: %d, want %d", got, tc.wantWaiters)
			}
			// Once a leader is known again, waits wait again.
			node.leaderless.Store(0)
			time.Sleep(2 * leaderCheck)
			res, err := s.Acquire(context.Background(), AcquireRequest{Name: "job", ClientID: "other", TTLms: 30_000, WaitTimeoutMs: 50})
			if c := apierror.CodeOf(err); c != apierror.WaitTimeout {
				t.Fatalf("a queued acquire after the leader is back: %+v, %v; want wait_timeout", res, err)
			}
		})
	}
}

// As soon as a leader is known again, a queued acquire waits as usual: it is
// not sent away by the leaderless spell that just ended (followLeaderless
// notices only at its next tick; the wait must not depend on that).
func TestQueuedAcquireRightAfterLeaderReturnsWaits(t *testing.T) {
	node, s, _ := heldByHolder(t)
	node.leaderless.Store(int64(raftnode.NoLeaderWait)) // cut off for a while
	testutil.Eventually(t, 10*time.Second, "followLeaderless to notice the leaderless spell", func() bool {
		select {
		case <-s.noLeader():
			return true
		default:
			return false
		}
	})
	node.leaderless.Store(0) // a leader is known again (the partition healed)
	if d := node.LeaderlessFor(); d != 0 {
		t.Fatalf("LeaderlessFor %v", d)
	}
	// A queued acquire now, through the leader that is known again. It
	// should wait its 300 ms and be told wait_timeout (the holder keeps the
	// lock), its place in line being its own to lose.
	_, err := s.Acquire(context.Background(), AcquireRequest{Name: "job", ClientID: "waiter", TTLms: 30_000, WaitTimeoutMs: 300})
	if c := apierror.CodeOf(err); c != apierror.WaitTimeout {
		key, _ := command.NormalizeName("job")
		var li state.LockInfo
		node.local.Read(func(st *state.State) { li = st.GetLock(key) })
		t.Fatalf("a queued acquire on a node that knows a leader (LeaderlessFor=%v): %v (code %s), waiters now %d; want wait_timeout",
			node.LeaderlessFor(), err, c, li.Waiters)
	}
}

// placeInLineCases: a queued acquire sent away from a node that cannot follow
// keeps its place in line only if its client can come back for it with the
// same request_id.
var placeInLineCases = []struct {
	requestID   string
	wantWaiters int
}{
	{requestID: "w-1", wantWaiters: 1},
	{requestID: "", wantWaiters: 0},
}
