package server_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dlock/dlock/internal/shard"
	"github.com/dlock/dlock/internal/state"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
)

// TestMoveBackWhileTheOldCopyStillAnswers moves shard 1's replica off a
// node and, before that node has stopped its copy, back onto it: the old
// copy, still running, answers the group's leader as that node again and
// even becomes a voter. Once it stops, the node must start the group from
// its data: the leader counts the log the old copy acknowledged, and an
// empty copy under the same id would wait forever for entries the leader
// believes it holds.
func TestMoveBackWhileTheOldCopyStillAnswers(t *testing.T) {
	m0, err := shard.NewMap(shard.DefaultBounds(4))
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{"n1", "n2", "n3", "n4"}
	m, err := m0.Place(ids, 3)
	if err != nil {
		t.Fatal(err)
	}
	c := testcluster.NewWith(t, 4, testcluster.Options{Shards: &m})
	g := m.Groups[1] // shard 1, [g, n), on n2, n3, n4
	from := "n2"

	for i := range 20 {
		var a acquireAnswer
		name := fmt.Sprintf("hotel/before-%d", i)
		if code := doRetried(t, c, http.MethodPost, c.URL("n3")+"/api/v1/locks/"+name+"/acquire",
			map[string]any{"client_id": "h", "ttl_ms": 300000, "request_id": "mb-" + name}, &a); code != 200 || !a.Acquired {
			t.Fatalf("acquire %s: %d %+v", name, code, a)
		}
	}

	reached, free := holdStop(t, from, g)

	// A move's call waits for it (up to 2 minutes), longer than
	// doRetried's per-call bound on a loaded machine.
	move := func(src, dst string) error {
		deadline := time.Now().Add(3 * time.Minute)
		for {
			var out map[string]any
			ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
			code, err := c.Do(ctx, http.MethodPost, c.URL("n3")+"/api/v1/cluster/shards/move",
				map[string]any{"shard": 1, "from": src, "to": dst}, &out)
			cancel()
			if err == nil && code == 200 {
				return nil
			}
			if (err != nil || code != http.StatusServiceUnavailable) || time.Now().After(deadline) {
				return fmt.Errorf("move shard 1 from %s to %s: %d %v %v", src, dst, code, out, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if err := move(from, "n1"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-reached:
	case <-time.After(60 * time.Second):
		t.Fatalf("%s never began to stop shard 1's group", from)
	}
	// Held just before stopping, the old copy still runs and answers: the
	// move back adds it again and promotes it once it has caught up, which
	// only the old copy can have done. (The rest of the move may need this
	// node's reconcile, which the hook holds, so it finishes after.)
	back := make(chan error, 1)
	go func() { back <- move("n1", from) }()
	testutil.Eventually(t, 60*time.Second, "the move back promoted "+from+"'s old copy", func() error {
		n := groupNode(c.Server("n3"), g)
		if n == nil {
			return fmt.Errorf("n3 does not run group %x", g)
		}
		f := n.Raft().GetConfiguration()
		if err := f.Error(); err != nil {
			return err
		}
		for _, sv := range f.Configuration().Servers {
			if string(sv.ID) == from && sv.Suffrage == raft.Voter {
				return nil
			}
		}
		return fmt.Errorf("shard 1's members: %+v", f.Configuration().Servers)
	})
	free()
	select {
	case err := <-back:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(4 * time.Minute):
		t.Fatal("the move back did not return")
	}

	var want uint64
	testutil.Eventually(t, 60*time.Second, from+" runs shard 1 again, caught up", func() error {
		n := groupNode(c.Server(from), g)
		if n == nil {
			return fmt.Errorf("%s does not run group %x", from, g)
		}
		var lead uint64
		for _, id := range []string{"n3", "n4"} {
			if l := groupNode(c.Server(id), g); l != nil && l.IsLeader() {
				l.FSM().Read(func(st *state.State) { lead = st.Index() })
			}
		}
		if lead == 0 {
			return fmt.Errorf("shard 1 has no leader on n3 or n4")
		}
		var idx uint64
		n.FSM().Read(func(st *state.State) { idx = st.Index() })
		if idx < lead {
			return fmt.Errorf("%s applied %d of shard 1's %d", from, idx, lead)
		}
		want = lead
		return nil
	})
	// And it goes on following: a new grant reaches it.
	var a acquireAnswer
	if code := doRetried(t, c, http.MethodPost, c.URL("n4")+"/api/v1/locks/hotel/after/acquire",
		map[string]any{"client_id": "h", "ttl_ms": 300000, "request_id": "mb-after"}, &a); code != 200 || !a.Acquired {
		t.Fatalf("acquire after: %d %+v", code, a)
	}
	testutil.Eventually(t, 30*time.Second, from+" applies the new grant", func() error {
		n := groupNode(c.Server(from), g)
		if n == nil {
			return fmt.Errorf("%s does not run group %x", from, g)
		}
		var idx uint64
		var held bool
		n.FSM().Read(func(st *state.State) { idx = st.Index(); held = st.GetLock("hotel/after").Held })
		if idx <= want || !held {
			return fmt.Errorf("%s applied %d (was %d), hotel/after held: %v", from, idx, want, held)
		}
		return nil
	})
	if ok, err := c.Server(from).GroupStored(g); err != nil || !ok {
		t.Fatalf("%s does not store group %x: %v %v", from, g, ok, err)
	}
}
