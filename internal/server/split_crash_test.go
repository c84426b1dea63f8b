package server_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/raftnode"
	"github.com/dlock/dlock/internal/server"
	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/shard"
	"github.com/dlock/dlock/internal/state"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
)

var errHeld = errors.New("held by the test: the node crashes before the new group starts")

// shardedCluster starts n nodes of a 4-shard cluster and the map it
// starts from.
func shardedCluster(t *testing.T, n int) (*testcluster.Cluster, shard.Map) {
	t.Helper()
	m, err := shard.NewMap(shard.DefaultBounds(4))
	if err != nil {
		t.Fatal(err)
	}
	return testcluster.NewWith(t, n, testcluster.Options{Shards: &m}), m
}

// doRetried sends a request, retrying 503s (a shard without a leader yet,
// a map on its way) as a client does, and fails the test on anything but
// an answer.
func doRetried(t *testing.T, c *testcluster.Cluster, method, u string, body, out any) int {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		code, err := c.Do(ctx, method, u, body, out)
		cancel()
		if err != nil {
			t.Fatalf("%s %s: %v", method, u, err)
		}
		if code != http.StatusServiceUnavailable || time.Now().After(deadline) {
			return code
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func groupNode(s *server.Server, g uint64) *raftnode.Node { return server.GroupNode(s, g) }

// splitNoWait starts a split at at through node id and returns once the
// source shard applied it on every node (the call itself may still wait for
// a map the test holds back).
func splitNoWait(t *testing.T, c *testcluster.Cluster, id, at string, src, child uint64) {
	t.Helper()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, _ = c.Do(ctx, http.MethodPost, c.URL(id)+"/api/v1/cluster/shards/split", map[string]any{"at": at}, nil)
	}()
	for _, id := range c.IDs() {
		testutil.Eventually(t, 30*time.Second, "every node applied the split on the source shard", func() error {
			n := groupNode(c.Server(id), src)
			if n == nil {
				return fmt.Errorf("node %s does not run group %x", id, src)
			}
			var done bool
			n.FSM().Read(func(st *state.State) {
				for _, r := range st.Splits() {
					done = done || r.Group == child
				}
			})
			if !done {
				return fmt.Errorf("node %s has not applied the split yet", id)
			}
			return nil
		})
	}
}

// TestSplitSurvivesCrashBeforeNewGroupStarts crashes every node after the
// source shard applied a split and before any node started the new group,
// with the source asked to snapshot (and so compact past the split) first:
// the carved state was only in memory, so the source must have held its
// snapshot back. After a restart from disk every node runs the new shard,
// with the locks that moved to it.
func TestSplitSurvivesCrashBeforeNewGroupStarts(t *testing.T) {
	c, m := shardedCluster(t, 3)
	ids := c.IDs()
	src := m.Groups[m.Lookup("q")]
	child := shard.ChildGroup(src, "q")

	held := map[string]acquireAnswer{}
	for i, name := range []string{"quebec/held", "sierra/held", "papa/stays"} {
		var a acquireAnswer
		if code := doRetried(t, c, http.MethodPost, c.URL(ids[i])+"/api/v1/locks/"+name+"/acquire",
			map[string]any{"client_id": "h", "ttl_ms": 300000, "request_id": "crash-" + name}, &a); code != 200 || !a.Acquired {
			t.Fatalf("acquire %s: %d %+v", name, code, a)
		}
		held[name] = a
	}

	server.SetOpenHook(func(_ string, g uint64) error {
		if g == child {
			return errHeld
		}
		return nil
	})
	t.Cleanup(func() { server.SetOpenHook(nil) })
	splitNoWait(t, c, ids[0], "q", src, child)

	// In the window: the source refuses to snapshot past the split on every
	// node, and the map does not name a group no node has stored.
	for _, id := range ids {
		s := c.Server(id)
		err := groupNode(s, src).Raft().Snapshot().Error()
		if err == nil {
			t.Fatalf("node %s snapshotted the source shard past a split whose new group is stored nowhere", id)
		}
		if g := s.ShardMap().Generation; g != 1 {
			t.Fatalf("node %s routes by generation %d before any node stored the new group", id, g)
		}
	}
	for _, id := range ids {
		c.Kill(id)
	}
	server.SetOpenHook(nil)
	for _, id := range ids {
		c.Start(id)
	}

	for _, id := range ids {
		testutil.Eventually(t, 60*time.Second, "the new shard runs on every node with its locks", func() error {
			s := c.Server(id)
			if g := s.ShardMap().Generation; g != 2 {
				return fmt.Errorf("node %s at generation %d", id, g)
			}
			n := groupNode(s, child)
			if n == nil {
				return fmt.Errorf("node %s does not run the new group", id)
			}
			for _, name := range []string{"quebec/held", "sierra/held"} {
				var tok uint64
				n.FSM().Read(func(st *state.State) {
					if li := st.GetLock(name); li.Held {
						tok = li.Holders[0].Token
					}
				})
				if tok != held[name].FencingToken {
					return fmt.Errorf("node %s: %s token %d on the new shard, want %d", id, name, tok, held[name].FencingToken)
				}
			}
			return nil
		})
	}
	for name, a := range held {
		for _, id := range ids {
			var v service.LockView
			if code := doRetried(t, c, http.MethodGet, c.URL(id)+"/api/v1/locks/"+name, nil, &v); code != 200 || !v.Held || v.Holder.FencingToken != a.FencingToken {
				t.Fatalf("%s via %s after the restart: %d %+v, want held with token %d", name, id, code, v, a.FencingToken)
			}
		}
	}
	// The moved lock is still exclusive on the new shard, and its next
	// grant's token is above the one it had.
	a := held["sierra/held"]
	if code := doRetried(t, c, http.MethodPost, c.URL(ids[1])+"/api/v1/locks/sierra/held/release",
		map[string]any{"client_id": "h", "fencing_token": a.FencingToken, "lease_id": a.LeaseID}, nil); code != 200 {
		t.Fatalf("release sierra/held: %d", code)
	}
	var b acquireAnswer
	if code := doRetried(t, c, http.MethodPost, c.URL(ids[2])+"/api/v1/locks/sierra/held/acquire",
		map[string]any{"client_id": "h2", "ttl_ms": 30000}, &b); code != 200 || !b.Acquired || b.FencingToken <= a.FencingToken {
		t.Fatalf("acquire sierra/held after the restart: %d %+v (the old token was %d)", code, b, a.FencingToken)
	}
}

// TestKeepAliveWaitsForSplitOffGroup sends a session keepalive to a node
// that routes by a map naming a shard whose group it has not started yet:
// the call renews the shards it runs, waits for the new group and renews
// the session's lease there too, instead of answering 503.
func TestKeepAliveWaitsForSplitOffGroup(t *testing.T) {
	c, m := shardedCluster(t, 3)
	ids := c.IDs()
	slow := ids[2]
	src := m.Groups[m.Lookup("q")]
	child := shard.ChildGroup(src, "q")

	var sess service.SessionResponse
	if code := doRetried(t, c, http.MethodPost, c.URL(ids[0])+"/api/v1/sessions", map[string]any{"client_id": "s", "ttl_ms": 60000, "request_id": "ka-sess"}, &sess); code != 201 {
		t.Fatalf("create session: %d %+v", code, sess)
	}
	leaseID, err := command.ParseLeaseID(sess.SessionID)
	if err != nil {
		t.Fatal(err)
	}

	hold := make(chan struct{})
	server.SetOpenHook(func(node string, g uint64) error {
		select {
		case <-hold:
		default:
			if node == slow && g == child {
				return errHeld
			}
		}
		return nil
	})
	t.Cleanup(func() { server.SetOpenHook(nil) })
	var ci service.ClusterInfo
	if code := doRetried(t, c, http.MethodPost, c.URL(ids[0])+"/api/v1/cluster/shards/split", map[string]any{"at": "q"}, &ci); code != 200 {
		t.Fatalf("split: %d %+v", code, ci)
	}
	// The slow node routes by the new map but has no group for the new shard.
	testutil.Eventually(t, 30*time.Second, "the slow node has the new map without the new group", func() error {
		if g := c.Server(slow).ShardMap().Generation; g != 2 {
			return fmt.Errorf("generation %d", g)
		}
		return nil
	})
	if groupNode(c.Server(slow), child) != nil {
		t.Fatal("the slow node started the new group despite the hook")
	}
	// gen is the session's lease generation (it rises with every renewal)
	// in group g, as the first node sees it (0: no such lease there yet).
	gen := func(g uint64) uint64 {
		var out uint64
		if n := groupNode(c.Server(ids[0]), g); n != nil {
			n.FSM().Read(func(st *state.State) {
				if l, ok := st.Lease(leaseID); ok {
					out = l.Gen
				}
			})
		}
		return out
	}
	var before uint64
	testutil.Eventually(t, 30*time.Second, "the new shard has a copy of the session", func() error {
		if before = gen(child); before == 0 {
			return fmt.Errorf("no copy of the session on the new shard on %s yet", ids[0])
		}
		return nil
	})
	srcBefore := gen(src)

	type answer struct {
		code int
		ka   service.KeepAliveResponse
	}
	got := make(chan answer, 1)
	go func() {
		var a answer
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		a.code, _ = c.Do(ctx, http.MethodPost, c.URL(slow)+"/api/v1/sessions/"+sess.SessionID+"/keepalive", nil, &a.ka)
		got <- a
	}()
	// The call renews the shards the slow node runs, then waits for the
	// held group, and finishes once it starts.
	testutil.Eventually(t, 20*time.Second, "the keepalive renewed the running shards", func() error {
		if g := gen(src); g <= srcBefore {
			return fmt.Errorf("source shard's lease generation %d, was %d", g, srcBefore)
		}
		return nil
	})
	select {
	case a := <-got:
		t.Fatalf("the keepalive answered %d before the new group started", a.code)
	default:
	}
	close(hold)
	select {
	case a := <-got:
		if a.code != 200 {
			t.Fatalf("keepalive through the slow node: %d %+v", a.code, a.ka)
		}
	case <-time.After(40 * time.Second):
		t.Fatal("the keepalive never answered")
	}
	testutil.Eventually(t, 10*time.Second, "the keepalive renewed the new shard's copy of the session", func() error {
		if g := gen(child); g <= before {
			return fmt.Errorf("lease generation %d, was %d", g, before)
		}
		return nil
	})
}
