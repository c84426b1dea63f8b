package service

import (
	"context"

	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/state"
)

// AddMember adds a node to the cluster through the leader.
func (s *Service) AddMember(ctx context.Context, req MemberRequest) (*ClusterInfo, error) {
	if err := s.admit(ctx, ""); err != nil {
		return nil, err
	}
	if err := s.authorize(ctx, command.PermAdmin, "", ""); err != nil {
		return nil, err
	}
	if err := checkID("id", req.ID, true); err != nil {
		return nil, err
	}
	if req.RaftAddr == "" {
		return nil, invalid("raft_addr is required (the new node's --raft-advertise address)")
	}
	if err := s.node.Join(ctx, req.ID, req.RaftAddr); err != nil {
		return nil, err
	}
	return s.Cluster(ctx)
}

// RemoveMember removes a node through the leader, refusing to lose quorum.
func (s *Service) RemoveMember(ctx context.Context, id string) (*ClusterInfo, error) {
	if err := s.admit(ctx, ""); err != nil {
		return nil, err
	}
	if err := s.authorize(ctx, command.PermAdmin, "", ""); err != nil {
		return nil, err
	}
	if err := checkID("id", id, true); err != nil {
		return nil, err
	}
	if err := s.node.Remove(ctx, id); err != nil {
		return nil, err
	}
	return s.Cluster(ctx)
}

// TransferLeadership hands leadership to another voter.
func (s *Service) TransferLeadership(ctx context.Context, req TransferRequest) (*ClusterInfo, error) {
	if err := s.admit(ctx, ""); err != nil {
		return nil, err
	}
	if err := s.authorize(ctx, command.PermAdmin, "", ""); err != nil {
		return nil, err
	}
	if err := checkID("id", req.ID, false); err != nil {
		return nil, err
	}
	if err := s.node.TransferLeadership(ctx, req.ID); err != nil {
		return nil, err
	}
	return s.Cluster(ctx)
}

// Snapshot returns a consistent copy of the whole replicated state, as of a
// linearizable read, in the snapshot format (for `dlock snapshot save`).
func (s *Service) Snapshot(ctx context.Context) ([]byte, uint64, error) {
	if err := s.admit(ctx, ""); err != nil {
		return nil, 0, err
	}
	if err := s.authorize(ctx, command.PermAdmin, "", ""); err != nil {
		return nil, 0, err
	}
	if err := s.node.LinearizableRead(ctx); err != nil {
		return nil, 0, err
	}
	var b []byte
	var rev uint64
	s.fsm.Read(func(st *state.State) { b, rev = st.Snapshot(), st.Revision() })
	return b, rev, nil
}

// SplitShard is for sharded clusters (the router splits); one group has
// no ranges to split.
func (s *Service) SplitShard(ctx context.Context, _ SplitRequest) (*ClusterInfo, error) {
	if err := s.admit(ctx, ""); err != nil {
		return nil, err
	}
	if err := s.authorize(ctx, command.PermAdmin, "", ""); err != nil {
		return nil, err
	}
	return nil, invalid("this cluster is not sharded (--shards 1): there is no range to split; nothing was changed")
}

// MoveShard is for sharded clusters (the router moves replicas); one
// group has no shards to move.
func (s *Service) MoveShard(ctx context.Context, _ MoveRequest) (*ClusterInfo, error) {
	if err := s.admit(ctx, ""); err != nil {
		return nil, err
	}
	if err := s.authorize(ctx, command.PermAdmin, "", ""); err != nil {
		return nil, err
	}
	return nil, invalid("this cluster is not sharded (--shards 1): there is no shard replica to move; nothing was changed")
}

// ProposeSplit commits a split of this shard (command.Split): the node's
// shard router calls it on the source shard's service, after checking the
// split point against the map.
func (s *Service) ProposeSplit(ctx context.Context, b *command.Split) error {
	if err := s.admit(ctx, ""); err != nil {
		return err
	}
	if err := s.authorize(ctx, command.PermAdmin, "", ""); err != nil {
		return err
	}
	_, err := s.applyOK(ctx, envelope("", "", b), "split")
	return err
}

// LocalSplits lists the Raft groups split off this shard as this node has
// applied so far (no read through the leader): a merged watch on this node
// follows this node's history.
func (s *Service) LocalSplits() []uint64 {
	var out []uint64
	s.fsm.Read(func(st *state.State) {
		for _, r := range st.Splits() {
			out = append(out, r.Group)
		}
	})
	return out
}

// SplitRevision is the revision of this shard's split that made group g,
// if this node's watch history still holds it.
func (s *Service) SplitRevision(g uint64) (uint64, bool) { return s.hub.SplitRevision(g) }

// SplitBehind reports whether a watch of this shard from revision from
// would start after the split that made group g (watch.Hub.SplitBehind).
func (s *Service) SplitBehind(g, from uint64) bool { return s.hub.SplitBehind(g, from) }

// SplitChildren lists the Raft groups split off this shard, as of a
// linearizable read: the router checks that a session it just created
// reached every one of them.
func (s *Service) SplitChildren(ctx context.Context) ([]uint64, error) {
	if err := s.node.LinearizableRead(ctx); err != nil {
		return nil, err
	}
	var out []uint64
	s.fsm.Read(func(st *state.State) {
		for _, r := range st.Splits() {
			out = append(out, r.Group)
		}
	})
	return out, nil
}

// AuthorizeAdmin admits an admin call that the shard router carries out
// itself (adding or removing a node of a sharded cluster, moving a
// replica): the same checks as this service's own admin calls.
func (s *Service) AuthorizeAdmin(ctx context.Context) error {
	if err := s.admit(ctx, ""); err != nil {
		return err
	}
	return s.authorize(ctx, command.PermAdmin, "", "")
}
