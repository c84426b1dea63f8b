// Status and readiness of a node, for GET /cluster, /readyz and metrics.

package raftnode

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dlock/dlock/internal/state"
)

// ServerStatus is one member of the Raft configuration.
type ServerStatus struct {
	ID       string
	RaftAddr string
	APIAddr  string
	Version  string // as the member registered it
	Suffrage string
	State    string
}

// Status is a snapshot of the node's view of the cluster.
type Status struct {
	ID           string
	State        string
	LeaderID     string
	LeaderAddr   string
	LeaderAPI    string
	Term         uint64
	CommitIndex  uint64
	AppliedIndex uint64
	LastContact  time.Duration
	Servers      []ServerStatus
	Revision     uint64
	LastToken    uint64
	// Forwarded counts writes this node forwarded to a leader; LeaderChanges
	// counts how often this node gained or lost leadership.
	Forwarded     uint64
	LeaderChanges uint64
	// ProposedEntries counts the log entries this node proposed as leader,
	// ProposedCommands the writes they carried (more than one per entry
	// when the packer packs them).
	ProposedEntries  uint64
	ProposedCommands uint64
	// CommitNotices counts the barriers this node appended as leader to tell
	// the followers of a commit no later entry was carrying (packer.notice).
	CommitNotices uint64
	// PackLingers counts the lone writes this node held back as leader for
	// a second to share their log entry (packer.linger).
	PackLingers uint64
	// CommitsBy counts, on the etcd engine, the commit-index advances this
	// node made as leader, by what completed them; nil on the hashicorp
	// engine, whose leader always writes before it replicates.
	CommitsBy *CommitsBy
	// CheckpointIndex and CheckpointDigest are the newest FSM checkpoint
	// (fsm.LastCheckpoint; 0 before the first): the whole-state digest after
	// that index, the same on every replica that applied the same log.
	CheckpointIndex  uint64
	CheckpointDigest uint64
}

// CommitsBy sorts a leader's commits by what came last: its own durable
// write (LeaderWrite), a follower's acknowledgement after the leader's write
// (FollowerAck), or enough followers' acknowledgements before the leader's
// write was durable (FollowersAlone). A commit waited for the leader's disk in
// the first and last cases.
type CommitsBy struct{ LeaderWrite, FollowerAck, FollowersAlone uint64 }

// Status reports the node's current view of the cluster.
func (n *Node) Status() Status {
	addr, id := n.raft.LeaderWithID()
	st := Status{
		ID:            n.cfg.ID,
		State:         n.raft.State().String(),
		LeaderID:      string(id),
		LeaderAddr:    string(addr),
		Term:          n.raft.CurrentTerm(),
		CommitIndex:   n.raft.CommitIndex(),
		AppliedIndex:  n.fsm.AppliedIndex(),
		LastContact:   time.Since(n.raft.LastContact()),
		Forwarded:     n.forwarded.Load(),
		LeaderChanges: n.leaderChanges.Load(),

		ProposedEntries:  n.packer.entries.Load(),
		ProposedCommands: n.packer.commands.Load(),
		CommitNotices:    n.packer.notices.Load(),
		PackLingers:      n.packer.lingers.Load(),
	}
	if c, ok := n.raft.(interface{ CommitsBy() CommitsBy }); ok {
		by := c.CommitsBy()
		st.CommitsBy = &by
	}
	if cp, ok := n.fsm.LastCheckpoint(); ok {
		st.CheckpointIndex, st.CheckpointDigest = cp.Index, cp.Digest
	}
	members := map[string]state.Member{}
	n.fsm.Read(func(s *state.State) {
		for _, m := range s.Members() {
			members[m.ID] = m
		}
		st.Revision = s.Revision()
		st.LastToken = s.LastToken()
	})
	if m, ok := members[st.LeaderID]; ok {
		st.LeaderAPI = m.APIAddr
	}
	if f := n.raft.GetConfiguration(); f.Error() == nil {
		for _, s := range f.Configuration().Servers {
			ss := ServerStatus{ID: string(s.ID), RaftAddr: string(s.Address), APIAddr: members[string(s.ID)].APIAddr, Version: members[string(s.ID)].Version, Suffrage: suffrage(s.Suffrage)}
			switch {
			case string(s.ID) == st.LeaderID:
				ss.State = "leader"
			case st.State == raft.Leader.String() && n.peers.unreachable(string(s.ID)):
				ss.State = "unreachable"
			case s.Suffrage == raft.Voter:
				ss.State = "follower"
			default:
				ss.State = "learner"
			}
			st.Servers = append(st.Servers, ss)
		}
	}
	return st
}

func suffrage(s raft.ServerSuffrage) string {
	switch s {
	case raft.Voter:
		return "voter"
	case raft.Nonvoter:
		return "nonvoter"
	}
	return "staging"
}

// MaxReadyLag is how far the applied index may trail the commit index for the
// node to count as ready.
const MaxReadyLag = 1000

// Ready reports whether the node can serve: a leader is known (and, on the
// leader, its barrier is applied), and this node has applied nearly all it knows
// to be committed.
func (n *Node) Ready() error {
	if err := n.Err(); err != nil {
		return fmt.Errorf("this node stopped because its storage failed: %w", err)
	}
	if n.closed.Load() {
		return errors.New("node is shutting down")
	}
	leader, _ := n.raft.LeaderWithID()
	if leader == "" {
		return n.noLeaderReason()
	}
	if n.raft.State() == raft.Leader && !n.ready.Load() {
		return errors.New("leader is still applying earlier terms' entries")
	}
	commit, applied := n.raft.CommitIndex(), n.fsm.AppliedIndex()
	if commit > applied+MaxReadyLag {
		return fmt.Errorf("applied index %d trails commit index %d by more than %d", applied, commit, MaxReadyLag)
	}
	// Clients find nodes through GET /cluster: a node is ready once its own
	// API address is there for them to find.
	if n.cfg.APIAddr != "" && !n.registered(n.selfMember()) {
		return errors.New("this node's API address is not in the replicated member list yet (it registers once a leader is known)")
	}
	return nil
}

// noLeaderReason says why no leader is known, and what to do about it.
func (n *Node) noLeaderReason() error {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return errors.New("no leader known, and the member list could not be read")
	}
	servers := f.Configuration().Servers
	if len(servers) == 0 {
		return errors.New("this node is not part of a cluster yet: start it with --initial-cluster to form one or --join to join one, or add it from a member with dlock members add")
	}
	for _, s := range servers {
		if string(s.ID) == n.cfg.ID {
			return errors.New("no leader known: an election is under way, or this node cannot reach a majority of the members")
		}
	}
	return errors.New("this node is not in the cluster's member list (it was removed): stop it, or add it back from a member with dlock members add")
}

// Healthy reports whether the process is alive and Raft is running.
func (n *Node) Healthy() error {
	if err := n.Err(); err != nil {
		return fmt.Errorf("this node stopped because its storage failed: %w", err)
	}
	if n.closed.Load() || n.raft.State() == raft.Shutdown {
		return errors.New("raft is shut down")
	}
	return nil
}

// MemberHealth is what a probe of one member found.
type MemberHealth struct {
	Reachable bool
	// Applied is the member's applied index (0 when unreachable).
	Applied uint64
	// LastContact is the probe's round trip, or for this node as a follower
	// the time since it last heard from the leader.
	LastContact time.Duration
}

// ProbeMembers asks every member of the configuration for its applied index,
// in parallel, each bounded by timeout.
func (n *Node) ProbeMembers(ctx context.Context, timeout time.Duration) map[string]MemberHealth {
	out := map[string]MemberHealth{}
	cfg, err := n.configuration()
	if err != nil {
		return out
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, s := range cfg.Servers {
		id, addr := string(s.ID), string(s.Address)
		if id == n.cfg.ID {
			h := MemberHealth{Reachable: true, Applied: n.fsm.AppliedIndex()}
			if n.raft.State() != raft.Leader {
				h.LastContact = time.Since(n.raft.LastContact())
			}
			mu.Lock()
			out[id] = h
			mu.Unlock()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			pctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			start := time.Now()
			applied, err := n.remoteApplied(pctx, addr)
			h := MemberHealth{Reachable: err == nil, Applied: applied}
			if err == nil {
				h.LastContact = time.Since(start)
			}
			mu.Lock()
			out[id] = h
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}
