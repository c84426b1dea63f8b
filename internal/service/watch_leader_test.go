package service

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/raftnode"
	"github.com/dlock/dlock/internal/watch"
)

func watchedService(t *testing.T) (*memNode, *Service) {
	t.Helper()
	node := newMemNode()
	hub := watch.NewHub(0, 0)
	node.f.AddObserver(hub)
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
	case <-time.After(4 * watchLeaderCheck):
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
