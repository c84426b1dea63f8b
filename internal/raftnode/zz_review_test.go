package raftnode

import (
	"context"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/state"
)

// A node keeps its lease-clock base (leaseClock) after it loses leadership:
// demote does not clear it, and nothing ties a stamp to the term it was
// taken for. Any entry this node stamps with it after another leader took
// over counts the uncounted gap between its own last entry and the
// successor's takeover — the very gap the design leaves out so that the
// clock never runs ahead of real time. Once such an entry is committed (a
// request that passed applyLocal's ready check in the old term and reaches
// raft.Apply after the node has been re-elected, before becomeReady stores a
// new base), every lease renewed under the successor loses that gap at the
// next failover.
//
// The interleaving is emulated: the stale stamp is taken from the deposed
// node, and committed through the current leader's raft.
func TestReviewStaleLeaseClockAfterDemotion(t *testing.T) {
	nodes, a := openTestCluster(t, []string{"n1", "n2", "n3"}, 0, nil)
	var b string
	for id := range nodes {
		if id != a {
			b = id
			break
		}
	}
	// A quiet log under a: no leases, so no ticks. The gap between a's last
	// entry and b's takeover is what b's lease clock does not count.
	const gap = 1500 * time.Millisecond
	time.Sleep(gap)
	transferLeadership(t, nodes, a, b)

	const ttl = 4_000
	resp, err := nodes[b].Apply(context.Background(), &command.Envelope{ClientID: "holder", RequestID: "s1",
		Body: &command.CreateSession{TTLms: ttl}})
	if err != nil || resp.Result.Status != command.StatusOK {
		t.Fatalf("create session: %v %+v", err, resp)
	}
	created := time.Now()
	lease := resp.Result.LeaseID

	if nodes[a].IsLeader() {
		t.Fatal("a still leads")
	}
	if nodes[a].leaseClock.Load() == nil {
		t.Skip("leaseClock cleared on demotion: fixed")
	}
	stale := nodes[a].stamped(&command.Envelope{ClientID: "dlock", Body: &command.Tick{}})
	if err := nodes[b].raft.Apply(command.Encode(stale), 5*time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	var left int64 = -1
	nodes[b].fsm.Read(func(s *state.State) {
		ls, _ := s.Timers()
		for _, l := range ls {
			if l.LeaseID == lease {
				left = l.RemainingMs
			}
		}
	})
	real := time.Since(created).Milliseconds()
	t.Logf("session created %d ms ago; a new leader now would count %d ms left (TTL %d)", real, left, ttl)
	if left < ttl-real-50 {
		t.Fatalf("lease clock ran %d ms ahead of real time: a successor would expire the session %d ms early",
			ttl-real-left, ttl-real-left)
	}
}
