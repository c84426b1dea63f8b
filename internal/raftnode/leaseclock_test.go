package raftnode

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/state"
	"github.com/dlock/dlock/internal/testutil"
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
	testutil.Eventually(t, 10*time.Second, to+" is the ready leader", nodes[to].IsLeader)
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

// A proposal stamped while this node led in one term and appended only in a
// later one (a request that passed the ready check, stalled, and reached
// raft.Apply after the node lost leadership and won it back) must not move
// the lease clock: its reading counts the time between the terms that no
// leader measured, and every lease renewed in between would then be expired
// early at the next failover. The interleaving is emulated: the stale stamp is
// taken from the old leader's term and committed through the new leader.
func TestStaleTermLeaseClockIsIgnored(t *testing.T) {
	nodes, a := openTestCluster(t, []string{"n1", "n2", "n3"}, 0, nil)
	b := followerKnowingLeader(t, nodes, a)
	old := nodes[a].leaseClock.Load()
	if old == nil || old.term == 0 {
		t.Fatalf("the leader has no lease-clock base: %+v", old)
	}
	// A quiet log under a: no leases, so no ticks. The gap between a's last
	// entry and b's takeover is what b's lease clock does not count.
	const gap = 1500 * time.Millisecond
	time.Sleep(gap)
	transferLeadership(t, nodes, a, b)
	// a learns of its deposition on its own goroutine (LeaderCh or the
	// 100 ms leadership tick), not before b wins: give it a bounded while.
	testutil.Eventually(t, 2*time.Second, "a deposed leader kept its lease-clock base", func() bool { return nodes[a].leaseClock.Load() == nil })

	const ttl = 4_000
	resp, err := nodes[b].Apply(context.Background(), &command.Envelope{ClientID: "holder", RequestID: "s1",
		Body: &command.CreateSession{TTLms: ttl}})
	if err != nil || resp.Result.Status != command.StatusOK {
		t.Fatalf("create session: %v %+v", err, resp)
	}
	created := time.Now()
	lease := resp.Result.LeaseID

	stale := &command.Envelope{TS: time.Now().UnixMilli(), ClientID: "dlock", Body: &command.Tick{},
		Clock: old.base + time.Since(old.start).Milliseconds(), ClockTerm: old.term}
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
	elapsed := time.Since(created).Milliseconds()
	if left < ttl-elapsed-50 {
		t.Fatalf("session created %d ms ago: a new leader would count %d ms left of %d; the stale stamp moved the lease clock %d ms ahead of real time",
			elapsed, left, ttl, ttl-elapsed-left)
	}
}
