package raftnode

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/state"
)

// transferLeadership moves leadership from one node to another and waits until
// the target is the ready leader.
func transferLeadership(t *testing.T, nodes map[string]*Node, from, to string) {
	t.Helper()
	var addr raft.ServerAddress
	f := nodes[from].raft.GetConfiguration()
	if err := f.Error(); err != nil {
		t.Fatal(err)
	}
	for _, s := range f.Configuration().Servers {
		if string(s.ID) == to {
			addr = s.Address
		}
	}
	if err := nodes[from].raft.LeadershipTransferToServer(raft.ServerID(to), addr).Error(); err != nil {
		t.Fatalf("transfer %s -> %s: %v", from, to, err)
	}
	for deadline := time.Now().Add(10 * time.Second); !nodes[to].IsLeader(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not become the ready leader", to)
		}
	}
}

// A lease renewed under leader A, then an entry by leader B whose wall clock
// runs ahead of A's, then leader C: C must not expire the lease early by B's
// skew (the time left is on the lease clock, which each leader counts on its
// monotonic clock from where the log stood; wall-clock timestamps are for
// display only). Two quick leader changes are what a rolling restart with
// hand-off does. B's fast clock is simulated through lastTS, which stamp()
// treats exactly as a wall clock that is ahead: max(now, lastTS).
func TestLeaseSurvivesTwoFailoversWithClockSkew(t *testing.T) {
	begin := time.Now()
	nodes, a := openTestCluster(t, []string{"n1", "n2", "n3"}, 0, nil)
	var others []string
	for id := range nodes {
		if id != a {
			others = append(others, id)
		}
	}
	b, c := others[0], others[1]
	const ttl = 4_000
	t0 := time.Now()
	resp, err := nodes[a].Apply(context.Background(), &command.Envelope{ClientID: "holder", RequestID: "s1",
		Body: &command.CreateSession{TTLms: ttl}})
	if err != nil || resp.Result.Status != command.StatusOK {
		t.Fatalf("create session: %v %+v", err, resp)
	}
	lease := resp.Result.LeaseID

	transferLeadership(t, nodes, a, b)
	nodes[b].lastTS.Store(time.Now().Add(3 * time.Second).UnixMilli())
	if _, err := nodes[b].Apply(context.Background(), &command.Envelope{ClientID: "other", RequestID: "s2",
		Body: &command.CreateSession{TTLms: ttl}}); err != nil {
		t.Fatal(err)
	}
	transferLeadership(t, nodes, b, c)

	for time.Since(t0) < ttl*time.Millisecond {
		alive := false
		nodes[c].fsm.Read(func(s *state.State) { _, alive = s.Lease(lease) })
		if !alive {
			t.Fatalf("a session with TTL %d ms, never renewed, expired %v after it was created: before its holder's TTL ran out",
				ttl, time.Since(t0).Round(time.Millisecond))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Each leader counted on from where the log stood, on its monotonic
	// clock: the lease clock has not run ahead of real time, although the
	// wall-clock timestamps jumped 3 s.
	var clock int64
	nodes[c].fsm.Read(func(s *state.State) { clock = s.LeaseClock() })
	if clock <= 0 || clock > time.Since(begin).Milliseconds() {
		t.Fatalf("lease clock %d ms, %d ms after the cluster started", clock, time.Since(begin).Milliseconds())
	}
}
