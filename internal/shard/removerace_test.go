package shard_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/state"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
)

// TestRemoveRacesMove sends a move of a replica onto a joined node and that
// node's removal at once, through different nodes: exactly one of them
// succeeds, the other is refused, and no shard ends up with a replica on a
// node that is no member (the removal records the node as being removed in
// the map first, and the map's generation orders that against the move).
func TestRemoveRacesMove(t *testing.T) {
	c, _ := shardedOf(t, 3, 2)
	n4 := joinVoter(t, c)

	type answer struct {
		code int
		e    apiErr
		err  error
	}
	// send retries 503s (a leader change) as a client would.
	send := func(method, u string, body any) answer {
		deadline := time.Now().Add(90 * time.Second)
		for {
			var a answer
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			a.code, a.err = c.Do(ctx, method, u, body, &a.e)
			cancel()
			if a.err != nil || a.code != http.StatusServiceUnavailable || time.Now().After(deadline) {
				return a
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	var mv, rm answer
	var wg sync.WaitGroup
	start := make(chan struct{})
	wg.Add(2)
	go func() {
		defer wg.Done()
		<-start
		mv = send("POST", c.URL("n1")+"/api/v1/cluster/shards/move", map[string]any{"shard": 1, "from": "n1", "to": n4})
	}()
	go func() {
		defer wg.Done()
		<-start
		rm = send("DELETE", c.URL("n2")+"/api/v1/cluster/members/"+n4, nil)
	}()
	close(start)
	wg.Wait()
	if mv.err != nil || rm.err != nil {
		t.Fatalf("move: %v; remove: %v", mv.err, rm.err)
	}
	t.Logf("move answered %d %q; remove answered %d %q", mv.code, mv.e.Error.Message, rm.code, rm.e.Error.Message)
	switch {
	case mv.code == 200 && rm.code == 409:
		// The move won: the removal saw the node hold (or be joining) shard 1.
		if rm.e.Error.Code != "conflict" || !strings.Contains(rm.e.Error.Message, "still holds shards") {
			t.Fatalf("the removal's refusal: %+v", rm.e)
		}
	case rm.code == 200 && (mv.code == 409 || mv.code == 400):
		// The removal won: the move was refused as onto a node being
		// removed, or, once the node had left, as onto no node.
		if !strings.Contains(mv.e.Error.Message, "being removed") && !strings.Contains(mv.e.Error.Message, "no node") {
			t.Fatalf("the move's refusal: %d %+v", mv.code, mv.e)
		}
	default:
		t.Fatalf("not exactly one of them succeeded: move %d %+v, remove %d %+v", mv.code, mv.e, rm.code, rm.e)
	}
	// Whichever won, every replica every shard lists is a member, on
	// every initial node's view.
	testutil.Eventually(t, 60*time.Second, "every shard's replicas are members", func() error {
		for _, id := range []string{"n1", "n2", "n3"} {
			ms, ci := memberIDs(t, c, id)
			for _, s := range ci.Shards {
				for _, r := range s.Replicas {
					if _, ok := ms[r]; !ok {
						return fmt.Errorf("via %s shard %d lists %s, no member (members %v)", id, s.ID, r, ms)
					}
				}
				if s.Leaving != "" {
					return fmt.Errorf("via %s shard %d is still moving", id, s.ID)
				}
			}
			if _, in := ms[n4]; in != (mv.code == 200) {
				return fmt.Errorf("via %s members %v (move won %v)", id, ms, mv.code == 200)
			}
		}
		return nil
	})
	target := n4
	if rm.code == 200 {
		// A removal sent again answers as the first did (n4 is no member).
		if a := send("DELETE", c.URL("n3")+"/api/v1/cluster/members/"+n4, nil); a.err != nil || a.code != 404 {
			t.Fatalf("remove again: %d %+v %v", a.code, a.e, a.err)
		}
		target = c.Join()
		testutil.Eventually(t, 60*time.Second, target+" is a voter of the meta group", func() error {
			if ms, _ := memberIDs(t, c, "n2"); ms[target] != "voter" {
				return fmt.Errorf("members %v", ms)
			}
			return nil
		})
	} else {
		// The move won: the replica moves back first.
		if a := send("POST", c.URL("n3")+"/api/v1/cluster/shards/move", map[string]any{"shard": 1, "from": n4, "to": "n1"}); a.err != nil || a.code != 200 {
			t.Fatalf("move back: %d %+v %v", a.code, a.e, a.err)
		}
	}

	// A removal that recorded the node as being removed and went no
	// further (its member change failed): a move onto the node is refused
	// with conflict, naming the pending removal; adding the node again
	// takes it off the list, and the move goes through.
	beginRemoval(t, c, target)
	a := send("POST", c.URL("n2")+"/api/v1/cluster/shards/move", map[string]any{"shard": 0, "from": "n1", "to": target})
	if a.err != nil || a.code != 409 || a.e.Error.Code != "conflict" || !strings.Contains(a.e.Error.Message, "being removed") ||
		!strings.Contains(a.e.Error.Message, "DELETE /api/v1/cluster/members/"+target) {
		t.Fatalf("a move onto a node whose removal is pending: %d %+v %v", a.code, a.e, a.err)
	}
	if a := send("POST", c.URL("n3")+"/api/v1/cluster/members", map[string]any{"id": target, "raft_addr": c.RaftAddr(target)}); a.err != nil || a.code != 200 {
		t.Fatalf("add %s again: %d %+v %v", target, a.code, a.e, a.err)
	}
	if a := send("POST", c.URL("n2")+"/api/v1/cluster/shards/move", map[string]any{"shard": 0, "from": "n1", "to": target}); a.err != nil || a.code != 200 {
		t.Fatalf("a move onto %s added again: %d %+v %v", target, a.code, a.e, a.err)
	}
	// Off and onto it again: a node whose every group moved away opens one
	// again (its metrics are registered once, not per first group).
	for _, mv := range [][2]string{{target, "n1"}, {"n1", target}, {target, "n1"}} {
		if a := send("POST", c.URL("n2")+"/api/v1/cluster/shards/move", map[string]any{"shard": 0, "from": mv[0], "to": mv[1]}); a.err != nil || a.code != 200 {
			t.Fatalf("move shard 0 %s → %s: %d %+v %v", mv[0], mv[1], a.code, a.e, a.err)
		}
	}
	select {
	case <-c.Server(target).Stopped():
		t.Fatalf("%s stopped after its replicas came and went", target)
	default:
	}
	// Half removed again: sending the removal again finishes it.
	beginRemoval(t, c, target)
	if a := send("DELETE", c.URL("n3")+"/api/v1/cluster/members/"+target, nil); a.err != nil || a.code != 200 {
		t.Fatalf("remove %s, pending: %d %+v %v", target, a.code, a.e, a.err)
	}
	testutil.Eventually(t, 30*time.Second, target+" is no member", func() error {
		ms, ci := memberIDs(t, c, "n1")
		if _, in := ms[target]; in {
			return fmt.Errorf("members %v", ms)
		}
		for _, s := range ci.Shards {
			if slices.Contains(s.Replicas, target) {
				return fmt.Errorf("shard %d lists the removed %s", s.ID, target)
			}
		}
		return nil
	})
}

// beginRemoval does a removal's first step only: it commits the next shard
// map with id listed as being removed, as RemoveMember does before the
// member change, and leaves the node a member of the meta group.
func beginRemoval(t *testing.T, c *testcluster.Cluster, id string) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, "the map records "+id+" as being removed", func() error {
		meta := c.Server("n1").MembersNode()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := meta.LinearizableRead(ctx); err != nil {
			return err
		}
		var gen uint64
		var rs []command.ShardRange
		var removing []string
		meta.FSM().Read(func(st *state.State) { gen, rs = st.ShardMap(); removing = st.Removing() })
		if slices.Contains(removing, id) {
			return nil
		}
		resp, err := meta.Apply(ctx, &command.Envelope{Body: &command.SetShardMap{Generation: gen + 1, Ranges: rs, Removing: append(removing, id)}})
		if err != nil {
			return err
		}
		return fmt.Errorf("applied %+v; looking again", resp.Result)
	})
}

// TestClusterShowsRemoving: while the shard map lists a node as being
// removed, GET /cluster (and the router's view behind it) marks that
// member removing=true on every node, and no other; once the removal
// finishes the node is no longer listed at all.
func TestClusterShowsRemoving(t *testing.T) {
	c, _ := shardedOf(t, 3, 2)
	n4 := joinVoter(t, c)
	// removing reads which members a cluster view marks, and whether it
	// lists n4.
	removing := func(ci *service.ClusterInfo) (marked []string, listed bool) {
		for _, mb := range ci.Members {
			listed = listed || mb.ID == n4
			if mb.Removing {
				marked = append(marked, mb.ID)
			}
		}
		return marked, listed
	}
	// viewOf is GET /cluster through a node; a node still starting may
	// answer 503 for a moment.
	viewOf := func(via string) (*service.ClusterInfo, error) {
		var ci service.ClusterInfo
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		code, err := c.Do(ctx, "GET", c.URL(via)+"/api/v1/cluster", nil, &ci)
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("GET /cluster via %s: %d", via, code)
		}
		return &ci, err
	}
	testutil.Eventually(t, 30*time.Second, "every node lists "+n4+", none as being removed", func() error {
		for _, via := range []string{"n1", "n2", "n3", n4} {
			ci, err := viewOf(via)
			if err != nil {
				return err
			}
			if marked, listed := removing(ci); !listed || len(marked) != 0 {
				return fmt.Errorf("via %s: marked %v before any removal began, %s listed %v", via, marked, n4, listed)
			}
		}
		return nil
	})

	beginRemoval(t, c, n4)
	testutil.Eventually(t, 30*time.Second, "every node shows "+n4+" as being removed", func() error {
		for _, via := range []string{"n1", "n2", "n3", n4} {
			ci, err := viewOf(via)
			if err != nil {
				return err
			}
			if marked, listed := removing(ci); !listed || !slices.Equal(marked, []string{n4}) {
				return fmt.Errorf("via %s: marked %v, %s listed %v (members %+v)", via, marked, n4, listed, ci.Members)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ci, err := c.Server("n3").Router().ClusterHealth(ctx)
		if err != nil {
			return err
		}
		if marked, _ := removing(ci); !slices.Equal(marked, []string{n4}) {
			return fmt.Errorf("the router's health view marks %v", marked)
		}
		return nil
	})

	// Sending the removal finishes it: the node leaves and is listed no more.
	if code := do(t, c, "DELETE", c.URL("n2")+"/api/v1/cluster/members/"+n4, nil, nil); code != 200 {
		t.Fatalf("remove %s: %d", n4, code)
	}
	testutil.Eventually(t, 60*time.Second, n4+" is listed by no node", func() error {
		for _, via := range []string{"n1", "n2", "n3"} {
			ci, err := viewOf(via)
			if err != nil {
				return err
			}
			if marked, listed := removing(ci); listed || len(marked) != 0 {
				return fmt.Errorf("via %s: marked %v, %s listed %v", via, marked, n4, listed)
			}
		}
		return nil
	})
}
