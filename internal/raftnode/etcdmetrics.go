// The etcd engine's Raft timings and role changes, reported under the
// go-metrics keys hashicorp/raft uses, so the node's /metrics (commit,
// replication and snapshot histograms, the transitions counter) and the
// alerts on them read the same on both engines.

package raftnode

import (
	"time"

	gometrics "github.com/hashicorp/go-metrics/compat"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

var (
	keyCommitTime   = []string{"raft", "commitTime"}
	keyReplication  = []string{"raft", "replication", "appendEntries", "rpc"}
	keyFSMSnapshot  = []string{"raft", "fsm", "snapshot"}
	keySnapCreate   = []string{"raft", "snapshot", "create"}
	keySnapPersist  = []string{"raft", "snapshot", "persist"}
	keyFSMRestore   = []string{"raft", "fsm", "restore"}
	keyStateLeader  = []string{"raft", "state", "leader"}
	keyStateFollow  = []string{"raft", "state", "follower"}
	keyStateCandid  = []string{"raft", "state", "candidate"}
	keyHeartbeatOut = []string{"raft", "transition", "heartbeat_timeout"}
	keyLeaseOut     = []string{"raft", "transition", "leader_lease_timeout"}
)

// maxTimed bounds each queue of timings waiting for their end: entries a
// follower never acknowledges (it is down) must not pile up.
const maxTimed = 1024

// sentAt is the moment a log batch ending at index was written or sent.
type sentAt struct {
	index uint64
	at    time.Time
}

// raftTimings is the Raft goroutine's bookkeeping for the timings: the
// leader's log batches not yet committed, and per follower the appends not
// yet acknowledged.
type raftTimings struct {
	role      raft.StateType
	leadTerm  uint64
	batches   []sentAt
	peers     map[uint64][]sentAt
	peerNames func(id uint64) string
}

func pushTimed(q []sentAt, s sentAt) []sentAt {
	if len(q) >= maxTimed {
		q = append(q[:0], q[1:]...)
	}
	return append(q, s)
}

// popTimed observes (under key, with labels) every queued batch at or below
// index and returns what is left.
func popTimed(q []sentAt, index uint64, key []string, labels []gometrics.Label) []sentAt {
	i := 0
	for ; i < len(q) && q[i].index <= index; i++ {
		if labels == nil {
			gometrics.MeasureSince(key, q[i].at)
		} else {
			gometrics.MeasureSinceWithLabels(key, q[i].at, labels)
		}
	}
	return append(q[:0], q[i:]...)
}

// written: the leader handed entries up to index to its log (dispatch).
func (t *raftTimings) written(index uint64, now time.Time) {
	if t.role == raft.StateLeader {
		t.batches = pushTimed(t.batches, sentAt{index, now})
	}
}

// committed: the commit index reached index; each batch up to it is timed
// from its dispatch (Raft's commitTime).
func (t *raftTimings) committed(index uint64) {
	if len(t.batches) > 0 && t.batches[0].index <= index {
		t.batches = popTimed(t.batches, index, keyCommitTime, nil)
	}
}

// sent: an append with entries left for a follower.
func (t *raftTimings) sent(m raftpb.Message) {
	if t.role != raft.StateLeader || m.Type != raftpb.MsgApp || len(m.Entries) == 0 {
		return
	}
	now := time.Now()
	if t.peers == nil {
		t.peers = map[uint64][]sentAt{}
	}
	t.peers[m.To] = pushTimed(t.peers[m.To], sentAt{m.Entries[len(m.Entries)-1].Index, now})
}

// answered: a follower acknowledged its log up to m.Index: each append up
// to it is timed as one round trip, the follower's fsync included. A
// rejection starts that follower's timings over (Raft probes and resends).
func (t *raftTimings) answered(m raftpb.Message) {
	q := t.peers[m.From]
	if len(q) == 0 {
		return
	}
	if m.Reject {
		t.peers[m.From] = q[:0]
		return
	}
	if q[0].index <= m.Index {
		t.peers[m.From] = popTimed(q, m.Index, keyReplication, []gometrics.Label{{Name: "peer_id", Value: t.peerNames(m.From)}})
	}
}

// roleChanged counts a change of role as hashicorp/raft does: the state
// entered, and why a leader or follower gave up its role (a follower that
// heard from no leader in its election timeout; a leader that lost touch
// with a quorum, check-quorum, stepping down in its own term).
func (t *raftTimings) roleChanged(to raft.StateType, term uint64) {
	from := t.role
	if to == from {
		return
	}
	t.role = to
	switch to {
	case raft.StateLeader:
		t.leadTerm = term
		gometrics.IncrCounter(keyStateLeader, 1)
	case raft.StateFollower:
		gometrics.IncrCounter(keyStateFollow, 1)
		if from == raft.StateLeader && term == t.leadTerm {
			gometrics.IncrCounter(keyLeaseOut, 1)
		}
	case raft.StateCandidate:
		gometrics.IncrCounter(keyStateCandid, 1)
	}
	if from == raft.StateFollower && (to == raft.StatePreCandidate || to == raft.StateCandidate) {
		gometrics.IncrCounter(keyHeartbeatOut, 1)
	}
	if from == raft.StateLeader {
		t.batches, t.peers = t.batches[:0], nil
	}
}
