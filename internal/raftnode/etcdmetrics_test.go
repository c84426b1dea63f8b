package raftnode

import (
	"testing"
	"time"

	gometrics "github.com/hashicorp/go-metrics/compat"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// inmemMetrics routes go-metrics to an in-memory sink for the test.
func inmemMetrics(t *testing.T) *gometrics.InmemSink {
	t.Helper()
	sink := gometrics.NewInmemSink(time.Hour, time.Hour)
	cfg := gometrics.DefaultConfig("dlock")
	cfg.EnableHostname, cfg.EnableRuntimeMetrics = false, false
	if _, err := gometrics.NewGlobal(cfg, sink); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = gometrics.NewGlobal(cfg, &gometrics.BlackholeSink{}) })
	return sink
}

func sampled(sink *gometrics.InmemSink, key string) int {
	n := 0
	for _, iv := range sink.Data() {
		iv.RLock()
		if s, ok := iv.Samples[key]; ok {
			n += s.Count
		}
		if c, ok := iv.Counters[key]; ok {
			n += int(c.Sum)
		}
		iv.RUnlock()
	}
	return n
}

func app(to, last uint64) raftpb.Message {
	return raftpb.Message{Type: raftpb.MsgApp, To: to, Entries: []raftpb.Entry{{Index: last - 1}, {Index: last}}}
}

// TestRaftTimings: the etcd engine's bookkeeping for hashicorp/raft's
// timings — each batch is timed once, when its end is reached; a rejection
// or a lost leadership forgets what can no longer end; role changes are
// counted with their causes.
func TestRaftTimings(t *testing.T) {
	sink := inmemMetrics(t)
	tm := raftTimings{peerNames: func(id uint64) string { return map[uint64]string{2: "n2", 3: "n3"}[id] }}
	const repl2 = "dlock.raft.replication.appendEntries.rpc;peer_id=n2"
	const repl3 = "dlock.raft.replication.appendEntries.rpc;peer_id=n3"

	// A follower times nothing of the leader's.
	tm.written(5, time.Now())
	tm.sent(app(2, 5))
	if len(tm.batches) != 0 || len(tm.peers) != 0 {
		t.Fatalf("a follower queued timings: %+v %+v", tm.batches, tm.peers)
	}

	tm.roleChanged(raft.StatePreCandidate, 1)
	tm.roleChanged(raft.StateCandidate, 2)
	tm.roleChanged(raft.StateLeader, 2)
	now := time.Now()
	tm.written(10, now)
	tm.written(12, now)
	tm.written(15, now)
	tm.sent(app(2, 10))
	tm.sent(app(2, 12))
	tm.sent(app(3, 12))
	tm.sent(raftpb.Message{Type: raftpb.MsgApp, To: 3}) // a commit notice: no entries, not timed
	tm.sent(raftpb.Message{Type: raftpb.MsgHeartbeat, To: 2})

	tm.committed(9)
	if n := sampled(sink, "dlock.raft.commitTime"); n != 0 {
		t.Fatalf("commit below every batch timed %d batches", n)
	}
	tm.committed(12)
	if n := sampled(sink, "dlock.raft.commitTime"); n != 2 {
		t.Fatalf("commit at 12 timed %d batches, want the 2 ending at 10 and 12", n)
	}
	tm.committed(12) // no batch twice
	if n := sampled(sink, "dlock.raft.commitTime"); n != 2 {
		t.Fatalf("a repeated commit index timed again: %d", n)
	}

	tm.answered(raftpb.Message{Type: raftpb.MsgAppResp, From: 2, Index: 11})
	if n := sampled(sink, repl2); n != 1 {
		t.Fatalf("n2's acknowledgement of 11 timed %d appends, want 1", n)
	}
	tm.answered(raftpb.Message{Type: raftpb.MsgAppResp, From: 3, Index: 12, Reject: true})
	tm.answered(raftpb.Message{Type: raftpb.MsgAppResp, From: 3, Index: 12})
	if n := sampled(sink, repl3); n != 0 {
		t.Fatalf("appends n3 rejected were timed: %d", n)
	}

	// Bounded: a follower that never answers keeps at most maxTimed.
	for i := range uint64(3 * maxTimed) {
		tm.sent(app(3, 100+i))
	}
	if len(tm.peers[3]) != maxTimed {
		t.Fatalf("%d appends queued for a silent follower, want %d", len(tm.peers[3]), maxTimed)
	}

	// Check-quorum: the leader steps down in its own term.
	tm.roleChanged(raft.StateFollower, 2)
	if len(tm.batches) != 0 || tm.peers != nil {
		t.Fatal("a former leader kept its timings")
	}
	// A higher term's leader: no lease timeout.
	tm.roleChanged(raft.StateCandidate, 3)
	tm.roleChanged(raft.StateLeader, 3)
	tm.roleChanged(raft.StateFollower, 4)

	for key, want := range map[string]int{
		"dlock.raft.state.leader":                    2,
		"dlock.raft.state.follower":                  2,
		"dlock.raft.state.candidate":                 2,
		"dlock.raft.transition.heartbeat_timeout":    2,
		"dlock.raft.transition.leader_lease_timeout": 1,
		"dlock.raft.replication.appendEntries.rpc":   0,
	} {
		if n := sampled(sink, key); n != want {
			t.Errorf("%s = %d, want %d", key, n, want)
		}
	}
}
