package server

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/shard"
)

// Growing and shrinking a sharded cluster (docs/operations.md, "Growing
// and shrinking a sharded cluster"). Every node is a member of the meta
// group, which holds the shard map; a data group runs on the nodes its
// range's replica set names. A new node joins the meta group (non-voter,
// promoted once caught up, as a one-group node joins) and runs no data
// group until a move places a replica on it. A node leaves only once no
// range lists it as a replica or as leaving, and from the moment its
// removal begins the map lists it as being removed, which no move can
// place a replica on (RemoveMember).
//
// A range with no replica set (maps from before replica sets, or made
// without --shard-replicas) runs on the initial cluster's nodes. Before
// the first node joins, those ranges get their replica set written out
// (Map.Explicit), so a joined node is never read as one of them, and no
// node needs to know the initial cluster to route any more.

// startMode reads how this data dir first started (shard.ReadStart) and
// checks the flags against it: joined is true for a node that joined a
// running cluster (a fresh dir given --join), initial are the initial
// cluster's ids as recorded (nil: not recorded, or a joined node), which
// win over a later --initial-cluster.
func startMode(cfg Config) (joined bool, initial []string, err error) {
	dir := cfg.Raft.DataDir
	rec, recJoined, err := shard.ReadStart(dir)
	if err != nil {
		return false, nil, err
	}
	given := slices.Sorted(maps.Keys(cfg.Raft.InitialCluster))
	switch {
	case recJoined && len(given) > 0:
		return false, nil, fmt.Errorf("data dir %s belongs to a node that joined a running sharded cluster; restart it with --join (or with neither --join nor --initial-cluster), not --initial-cluster", dir)
	case recJoined:
		return true, nil, nil
	case len(rec) > 0 && len(given) > 0 && !slices.Equal(rec, given):
		// --initial-cluster counts on the first start only; a config that
		// lists the nodes that joined since must not make them initial.
		cfg.Logger.Warn("--initial-cluster differs from the nodes this data dir first started with; using those (it counts on the first start only)",
			"first_start", strings.Join(rec, ","), "given", strings.Join(given, ","))
		return false, rec, nil
	case len(rec) > 0:
		return false, rec, nil
	case len(given) == 0 && len(cfg.Join) > 0 && shard.Fresh(dir):
		return true, nil, nil
	}
	return false, nil, nil
}

// AddMember joins a node to the cluster (shard.Membership): it must run
// this cluster's meta group (the same --shards/--shard-bounds as the
// cluster's first start); every range gets an explicit replica set first;
// then the meta group adds it as a non-voter, and promotes it once it has
// caught up.
func (ss *shardSet) AddMember(ctx context.Context, req service.MemberRequest) error {
	if req.ID == "" || req.RaftAddr == "" {
		return apierror.New(apierror.InvalidArgument, "a new member needs id and raft_addr (its --id and --raft-advertise address); nothing was changed")
	}
	if len(req.ID) > command.MaxReplicaIDLen {
		return apierror.New(apierror.InvalidArgument, "id is %d bytes; a sharded cluster's node ids are at most %d; nothing was changed", len(req.ID), command.MaxReplicaIDLen)
	}
	if addr, ok := ss.members()[req.ID]; ok && addr == req.RaftAddr {
		// A member already (a restarted node keeps its --join): a no-op,
		// but for a removal of it that began and did not finish, which
		// this cancels.
		if err := ss.endRemoval(ctx, req.ID); err != nil {
			return err
		}
		_, err := ss.metaSvc.AddMember(ctx, req)
		return err
	}
	runs, err := ss.meta.RunsGroup(ctx, req.RaftAddr)
	if err != nil {
		var ae *apierror.Error
		if errors.As(err, &ae) {
			return ae
		}
		return apierror.Wrap(apierror.InvalidArgument, err, "could not reach %s at %s over the raft port (%v): start it first (dlock serve --id %s --join ... with this cluster's --shards or --shard-bounds and --raft-engine etcd), and check the address and the peer TLS settings; nothing was changed",
			req.ID, req.RaftAddr, err, req.ID)
	}
	if !runs {
		return apierror.New(apierror.InvalidArgument, "the node at %s does not run this cluster's meta group: it was started with other shard flags than this cluster's first start (%d shards, bounds %q); stop it, empty its data dir, and start it again with the same --shards or --shard-bounds and --join; nothing was changed",
			req.RaftAddr, ss.initial.N(), strings.Join(ss.initial.Bounds[1:], ","))
	}
	if err := ss.makeExplicit(ctx); err != nil {
		return err
	}
	if err := ss.endRemoval(ctx, req.ID); err != nil {
		return err
	}
	_, err = ss.metaSvc.AddMember(ctx, req)
	return err
}

// makeExplicit commits the map with every range that has no replica set
// given the initial cluster's nodes (Map.Explicit); nothing when every
// range has one.
func (ss *shardSet) makeExplicit(ctx context.Context) error {
	for try := 0; ; try++ {
		m, ok := ss.metaMap()
		if !ok {
			return &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Message: "the shard map is not committed yet (the cluster is starting); retry"}
		}
		next, changed, err := m.Explicit(ss.all)
		if err != nil {
			return apierror.New(apierror.Conflict, "%v; nothing was changed", err)
		}
		if !changed {
			return nil
		}
		if try >= 10 {
			return &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Message: "the shard map kept changing while the new member's replica sets were written out; retry"}
		}
		if err := ss.commitMap(ctx, next); err != nil {
			return &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Err: err,
				Message: "could not commit the shard map's replica sets before adding the member; retry"}
		}
		// Another change may have won the generation: look again.
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		err = ss.meta.LinearizableRead(rctx)
		cancel()
		if err != nil {
			return &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Err: err, Message: "this node's meta group is behind; retry"}
		}
	}
}

// RemoveMember removes a node from the cluster (shard.Membership): refused
// with conflict while any range lists it as a replica or as leaving. It
// first commits the next map with the node among the ones being removed
// (shard.Map.BeginRemoval): the meta group refuses any map that places a
// replica on such a node, and the generation compare-and-set orders this
// commit against every move, so a move onto the node either committed
// before it (and the check below sees it) or is refused after it. Then the
// node leaves the meta group (the meta leader hands leadership on first
// when it is the one removed). The node stays listed as being removed
// (docs/operations.md, "Growing and shrinking a sharded cluster"): a
// removal that failed half way is finished by sending it again, and
// adding the node again (AddMember) takes it off the list.
func (ss *shardSet) RemoveMember(ctx context.Context, id string) error {
	if id == "" {
		return apierror.New(apierror.InvalidArgument, "remove needs the member's id; nothing was changed")
	}
	if len(id) > command.MaxReplicaIDLen {
		return apierror.New(apierror.InvalidArgument, "id is %d bytes; a sharded cluster's node ids are at most %d; nothing was changed", len(id), command.MaxReplicaIDLen)
	}
	for try := 0; ; try++ {
		// The current map and members, not ones this node has yet to
		// catch up on: a move onto the node may have just committed.
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		err := ss.meta.LinearizableRead(rctx)
		cancel()
		if err != nil {
			return &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Err: err,
				Message: fmt.Sprintf("could not read the current shard map (%v); retry", err)}
		}
		m, ok := ss.metaMap()
		if !ok {
			return &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Message: "the shard map is not committed yet (the cluster is starting); retry"}
		}
		if held := m.Held(id, ss.all); len(held) > 0 {
			return apierror.New(apierror.Conflict, "node %s still holds shards %v%s; move each off it first (dlock shards move --shard %d --from %s --to NODE, one shard at a time; GET /api/v1/cluster lists every shard's replicas), then remove it; nothing was changed",
				id, held, leavingNote(m, id), held[0], id)
		}
		members := slices.Sorted(maps.Keys(ss.members()))
		if !slices.Contains(members, id) && !slices.Contains(m.Removing, id) {
			break // not a member: the meta group answers as it does
		}
		next, changed, err := m.BeginRemoval(id, members)
		if err != nil {
			return apierror.New(apierror.Conflict, "%v; nothing was changed", err)
		}
		if !changed {
			break // listed as being removed: no move can place it now
		}
		if try >= 10 {
			return &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Message: "the shard map kept changing while the removal was being recorded in it; retry"}
		}
		res, err := ss.commitMapResult(ctx, next)
		if err != nil {
			return &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Err: err,
				Message: "could not record the removal in the shard map; retry (nothing else was changed)"}
		}
		if res.Status != command.StatusOK {
			return apierror.New(apierror.Conflict, "the meta group refused to record the removal of %s: %s; nothing was changed", id, res.Message)
		}
		// Applied, or a concurrent change (a move onto the node, say) won
		// the generation: look again.
	}
	if _, err := ss.metaSvc.RemoveMember(ctx, id); err != nil {
		return err
	}
	if id == ss.rc.ID {
		ss.markRemoved()
	}
	return nil
}

// endRemoval takes id off the map's nodes being removed (it joins again),
// before it is added: once it is a member, a move may place it.
func (ss *shardSet) endRemoval(ctx context.Context, id string) error {
	for try := 0; ; try++ {
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		err := ss.meta.LinearizableRead(rctx)
		cancel()
		if err != nil {
			return &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Err: err, Message: "this node's meta group is behind; retry"}
		}
		m, ok := ss.metaMap()
		if !ok {
			return &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Message: "the shard map is not committed yet (the cluster is starting); retry"}
		}
		next, changed := m.EndRemoval(id)
		if !changed {
			return nil
		}
		if try >= 10 {
			return &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Message: "the shard map kept changing while the node was taken off the nodes being removed; retry"}
		}
		if err := ss.commitMap(ctx, next); err != nil {
			return &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Err: err,
				Message: "could not take the node off the shard map's nodes being removed; retry"}
		}
	}
}

// leavingNote names the shards whose move is taking a replica off id.
func leavingNote(m shard.Map, id string) string {
	var ks []int
	for k := range m.Bounds {
		if m.LeavingReplica(k) == id {
			ks = append(ks, m.IDs[k])
		}
	}
	if len(ks) == 0 {
		return ""
	}
	return fmt.Sprintf(" (a move is taking its replica of shards %v off it now: wait for it, GET /api/v1/cluster)", ks)
}

// removedChecks is how many rounds of reconcile in a row must find this
// node out of the meta group's configuration before it stops: a removal
// stays, a configuration read in passing (none known yet) does not.
const removedChecks = 3

// watchRemoval notes once this node has been a member of the meta group,
// and stops it (markRemoved) once it is no longer one: it was removed.
func (ss *shardSet) watchRemoval() {
	servers := ss.meta.Status().Servers
	in := false
	for _, s := range servers {
		if s.ID == ss.rc.ID {
			in = true
		}
	}
	ss.mu.Lock()
	switch {
	case in:
		ss.member, ss.absent = true, 0
	case ss.member && len(servers) > 0:
		ss.absent++
	}
	gone := ss.absent >= removedChecks
	ss.mu.Unlock()
	if gone {
		ss.markRemoved()
	}
}

// markRemoved closes removed (once): the node's process stops
// (Server.Stopped).
func (ss *shardSet) markRemoved() {
	ss.removeOnce.Do(func() {
		ss.logger.Warn("this node was removed from the cluster; stopping")
		close(ss.removed)
	})
}
