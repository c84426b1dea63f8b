package server

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/raftnode"
	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/shard"
)

// Moving a shard's replica from one node to another, online
// (docs/architecture.md, Shards). The meta group's map carries each
// range's replica set and, while a move is in flight, the replica that is
// leaving. Every step reads where the move stands from the map and the
// group's own Raft configuration, so the steps are idempotent and any
// node can resume them after a crash:
//
//  1. Move (the API call, on any node) commits the next map: the range's
//     replicas grown by the target, the source marked leaving.
//  2. The target's reconcile starts the group empty (it is in the
//     replicas now); the group's leader adds it as a non-voter, and its
//     promoter makes it a voter once it has caught up (a snapshot, then
//     the log).
//  3. Once every replica is a voter, the leader hands leadership on if it
//     is the leaving node, then removes the leaving node from the group.
//  4. The leader commits the final map: the leaving node out of the
//     replicas, nothing leaving.
//  5. The leaving node's reconcile, seeing it no longer runs the range,
//     routes the range's calls to its replicas, hands its waiting
//     requests on to them (their places in line are in the replicated
//     queue, which the group keeps), stops the group and deletes its data.

// moveWait bounds how long the API call waits for a move to finish; the
// move goes on after it answers.
const moveWait = 2 * time.Minute

// moveStep bounds one step of a move on the group's leader.
const moveStep = 10 * time.Second

// Self is this node's id (shard.Remote).
func (ss *shardSet) Self() string { return ss.rc.ID }

// All are the initial cluster's node ids (shard.Remote).
func (ss *shardSet) All() []string { return ss.all }

// members are the cluster's nodes, as the meta group (on every node)
// knows them: id → raft address.
func (ss *shardSet) members() map[string]string {
	out := map[string]string{}
	for _, s := range ss.meta.Status().Servers {
		out[s.ID] = s.RaftAddr
	}
	return out
}

// Call sends a routed call to node (shard.Remote).
func (ss *shardSet) Call(ctx context.Context, node string, body []byte, accept time.Duration) ([]byte, error) {
	addr, ok := ss.members()[node]
	if !ok {
		return nil, fmt.Errorf("%w: no node %q in the cluster", raftnode.ErrNotSent, node)
	}
	b, status, err := ss.shared.Call(ctx, addr, raftnode.RoutePrefix+"call", body, accept)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", node, err)
	}
	if status != http.StatusOK {
		// The router answers 200 whenever it ran the call.
		return nil, fmt.Errorf("%w: node %s answered %d: %.200s", shard.ErrRefused, node, status, b)
	}
	return b, nil
}

// Move starts moving shard req.Shard's replica on req.From to req.To and
// waits, bounded, until it is done (shard.Mover). A retry of a move in
// flight waits for it; a move whose end already holds (to runs the shard,
// from does not, nothing in flight) answers as the first did, so a client
// may retry one whose answer it lost.
func (ss *shardSet) Move(ctx context.Context, req service.MoveRequest) error {
	// The current members, not the ones this node has yet to catch up
	// on: a node whose removal was answered before this move began must
	// not be taken for a target (the meta group's configuration is
	// applied here by the time a linearizable read returns).
	rctx, rcancel := context.WithTimeout(ctx, 3*time.Second)
	err := ss.meta.LinearizableRead(rctx)
	rcancel()
	if err != nil {
		return &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Err: err,
			Message: fmt.Sprintf("could not read the cluster's current members and shard map (%v); retry", err)}
	}
	for {
		m, committed := ss.metaMap()
		if !committed {
			m = ss.initial // to check the request against; the meta group commits it first
		}
		k := m.IndexOf(req.Shard)
		if k >= 0 && m.LeavingReplica(k) == req.From && m.Hosted(k, req.To, ss.all) {
			break // in flight: wait for it
		}
		if committed && k >= 0 && req.From != req.To && moved(m, k, req, ss.all) {
			break // done already (a retry after a lost answer): the same answer
		}
		nodes := slices.Sorted(maps.Keys(ss.members()))
		next, err := m.BeginMove(req.Shard, req.From, req.To, nodes, ss.all)
		if err != nil {
			var me *shard.MoveError
			if errors.As(err, &me) && me.Conflict {
				return apierror.New(apierror.Conflict, "%v; nothing was changed", err)
			}
			return apierror.New(apierror.InvalidArgument, "%v; nothing was changed", err)
		}
		if !committed {
			return &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Message: "the shard map is not committed yet (the cluster is starting); retry"}
		}
		res, err := ss.commitMapResult(ctx, next)
		if err != nil {
			return &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Err: err,
				Message: "could not commit the move to the shard map; retry (GET /api/v1/cluster shows whether it began)"}
		}
		if res.Status != command.StatusOK {
			// The meta group's own check (a node being removed, say).
			return apierror.New(apierror.Conflict, "the meta group refused the move: %s; nothing was changed", res.Message)
		}
		// Another change may have won the generation (a removal of the
		// target, say): look again at the map as committed.
		rctx, rcancel := context.WithTimeout(ctx, 3*time.Second)
		err = ss.meta.LinearizableRead(rctx)
		rcancel()
		if err != nil {
			return &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Err: err,
				Message: fmt.Sprintf("could not read the shard map after committing the move (%v); retry (GET /api/v1/cluster shows whether it began)", err)}
		}
	}
	ss.poke()
	ctx, cancel := context.WithTimeout(ctx, moveWait)
	defer cancel()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		if m, ok := ss.metaMap(); ok {
			if k := m.IndexOf(req.Shard); k >= 0 && moved(m, k, req, ss.all) {
				ss.awaitRouted(ctx, m.Generation)
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Message: fmt.Sprintf(
				"the move of shard %d from %s to %s is under way but not done yet; it goes on (GET /api/v1/cluster shows the shard's replicas and leaving); send the same move again to wait for it", req.Shard, req.From, req.To)}
		case <-t.C:
		}
	}
}

// awaitRouted waits, bounded by ctx, for this node's router to route by
// generation gen or later.
func (ss *shardSet) awaitRouted(ctx context.Context, gen uint64) {
	for ss.router.Map().Generation < gen && ctx.Err() == nil {
		ss.poke()
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// moved reports whether req is done in m: to runs range k, from does not,
// and no move is in flight.
func moved(m shard.Map, k int, req service.MoveRequest, all []string) bool {
	return m.LeavingReplica(k) == "" && m.Hosted(k, req.To, all) && !m.Hosted(k, req.From, all)
}

// driveMoves starts a step of every move in flight whose group this node
// leads (one at a time per group).
func (ss *shardSet) driveMoves(ctx context.Context, m shard.Map) {
	for k, g := range m.Groups {
		if m.LeavingReplica(k) == "" {
			continue
		}
		ss.mu.Lock()
		run := ss.groups[g]
		busy := ss.driving[g] || ss.stopped
		if run != nil && !busy && run.node.IsLeader() {
			ss.driving[g] = true
			ss.wg.Add(1)
			go func() {
				defer ss.wg.Done()
				defer func() { ss.mu.Lock(); delete(ss.driving, g); ss.mu.Unlock() }()
				sctx, cancel := context.WithTimeout(ctx, moveStep)
				defer cancel()
				if err := ss.moveStep(sctx, m, k, run); err != nil {
					ss.logger.Info("a shard move's step did not finish; will retry", "shard", m.IDs[k], "err", err)
				}
			}()
		}
		ss.mu.Unlock()
	}
}

// moveStep takes range k's move one step further, on its group's leader.
func (ss *shardSet) moveStep(ctx context.Context, m shard.Map, k int, run *groupRun) error {
	from := m.LeavingReplica(k)
	st := run.node.Status()
	suffrage := map[string]string{}
	for _, s := range st.Servers {
		suffrage[s.ID] = s.Suffrage
	}
	for _, id := range m.Hosts(k, ss.all) {
		if id == from {
			// Never added: it was a voter when the move began. A step run
			// with a map from before the move ended would otherwise add
			// the leaving replica back once it is removed, while its old
			// copy still runs and acknowledges its log.
			continue
		}
		switch suffrage[id] {
		case "":
			// Not a member yet: add it as a non-voter (it must have
			// started the group: its reconcile does so from the map).
			addr, ok := ss.members()[id]
			if !ok {
				return fmt.Errorf("no node %q in the cluster", id)
			}
			if cur, err := ss.stepCurrent(ctx, m, k); err != nil || !cur {
				return err
			}
			if err := run.node.Join(ctx, id, addr); err != nil {
				return fmt.Errorf("add %s to shard %d as a non-voter: %w", id, m.IDs[k], err)
			}
			ss.logger.Info("shard move: added the new replica as a non-voter", "shard", m.IDs[k], "to", id)
			return nil
		case "voter":
		default:
			return nil // a non-voter catching up: the leader promotes it
		}
	}
	if _, member := suffrage[from]; member {
		if cur, err := ss.stepCurrent(ctx, m, k); err != nil || !cur {
			return err
		}
		if from == ss.rc.ID {
			// The leaving node leads: hand leadership to another replica.
			to := ""
			for _, id := range m.Hosts(k, ss.all) {
				if id != from {
					to = id
					break
				}
			}
			if err := run.node.TransferLeadership(ctx, to); err != nil {
				return fmt.Errorf("hand shard %d's leadership from %s to %s: %w", m.IDs[k], from, to, err)
			}
			ss.logger.Info("shard move: handed leadership away from the leaving replica", "shard", m.IDs[k], "to", to)
			return nil
		}
		if err := run.node.Remove(ctx, from); err != nil {
			return fmt.Errorf("remove %s from shard %d: %w", from, m.IDs[k], err)
		}
		ss.logger.Info("shard move: removed the leaving replica", "shard", m.IDs[k], "from", from)
	}
	if err := ss.commitMap(ctx, m.EndMove(k)); err != nil {
		return err
	}
	ss.logger.Info("shard move done", "shard", m.IDs[k], "from", from, "replicas", m.EndMove(k).Hosts(k, ss.all))
	ss.poke()
	return nil
}

// stepCurrent reports whether range k of m still has the replicas and the
// leaving replica the meta group's map gives its group now: a step changes
// a group's members only by the current map (other ranges' changes, a move
// of another shard's say, do not matter to it). A step started
// with an older one (its reconcile round read the map just before a move
// ended, or this node's meta group is replaying its log after a restart)
// would add back a replica a later step removed; that node's old copy,
// still running until it sees the map, has the whole log and is promoted
// at once, and once it stops the group counts a voter that is gone — with
// three replicas, two of four voters left after one more failure. The map
// is read linearizably: this node's copy of the meta group may lag.
func (ss *shardSet) stepCurrent(ctx context.Context, m shard.Map, k int) (bool, error) {
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	err := ss.meta.LinearizableRead(rctx)
	cancel()
	if err != nil {
		return false, fmt.Errorf("read the current shard map: %w", err)
	}
	cur, ok := ss.metaMap()
	if !ok {
		return false, nil
	}
	kc := cur.IndexOfGroup(m.Groups[k])
	if kc < 0 || cur.LeavingReplica(kc) != m.LeavingReplica(k) ||
		!slices.Equal(slices.Sorted(slices.Values(cur.Hosts(kc, ss.all))), slices.Sorted(slices.Values(m.Hosts(k, ss.all)))) {
		ss.logger.Debug("shard move: a step with an older map did nothing", "shard", m.IDs[k], "generation", m.Generation, "current", cur.Generation)
		return false, nil
	}
	return true, nil
}

// stopMoved stops the groups m no longer runs on this node (a move took
// its replica away) and deletes their data. The router already sends
// their calls to the replicas (route ran first); each waiting request is
// handed on there with its place in line.
func (ss *shardSet) stopMoved(ctx context.Context, m shard.Map) {
	gone := ss.notHosted(m)
	if len(gone) == 0 {
		ss.cleanMoved(ctx)
		return
	}
	// Deleting a group's data is for good: first make sure the map is
	// the current one, not an older one a restarted node is replaying
	// (which could name this node out of a group it has since rejoined).
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	err := ss.meta.LinearizableRead(rctx)
	cancel()
	if err != nil {
		return
	}
	cur, ok := ss.metaMap()
	if !ok {
		return
	}
	gone = ss.notHosted(cur)
	// The router sends the groups' calls to their replicas from here on;
	// then the waits here are handed on to them.
	ss.mu.Lock()
	for _, run := range gone {
		delete(ss.groups, run.id)
		ss.order = slices.DeleteFunc(ss.order, func(g uint64) bool { return g == run.id })
	}
	ss.mu.Unlock()
	ss.route(cur)
	for _, run := range gone {
		if h := stopHook.Load(); h != nil {
			(*h)(ss.rc.ID, run.id)
		}
		run.svc.HandOff()
		_ = run.node.Shutdown()
		run.svc.Close()
		ss.mu.Lock()
		ss.unclean[run.id] = run.name
		ss.mu.Unlock()
		ss.logger.Info("stopped a shard's group moved off this node", "shard", run.name, "group", run.id)
	}
	ss.cleanMoved(ctx)
}

// cleanMoved deletes the data of the groups stopMoved stopped, once a read
// of the map made after they stopped still places them elsewhere. Until a
// copy stops it answers its group's leader — after a move back here, too —
// and a leader that counted its log must never meet an empty copy under
// the same id, which waits forever for entries the leader thinks it has.
// So a group placed here again keeps its data and is started from it.
func (ss *shardSet) cleanMoved(ctx context.Context) {
	ss.mu.Lock()
	n := len(ss.unclean)
	ss.mu.Unlock()
	if n == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	err := ss.meta.LinearizableRead(rctx)
	cancel()
	if err != nil {
		return // the next round tries again
	}
	cur, ok := ss.metaMap()
	if !ok {
		return
	}
	ss.mu.Lock()
	todo := map[uint64]string{}
	for g, name := range ss.unclean {
		k := cur.IndexOfGroup(g)
		switch {
		case ss.groups[g] != nil, k >= 0 && cur.Hosted(k, ss.rc.ID, ss.all):
			// Running, or to be started, here again: from its data.
			delete(ss.unclean, g)
		default:
			todo[g] = name
		}
	}
	ss.mu.Unlock()
	for _, g := range slices.Sorted(maps.Keys(todo)) {
		if err := shard.RecordMoved(ss.rc.DataDir, g); err != nil {
			ss.logger.Error("could not record a group moved off this node; its data stays", "group", g, "err", err)
			continue
		}
		if err := ss.shared.DeleteGroup(g); err != nil {
			ss.logger.Error("could not delete the data of a group moved off this node", "group", g, "err", err)
			continue
		}
		ss.mu.Lock()
		delete(ss.unclean, g)
		ss.mu.Unlock()
		ss.logger.Info("deleted the data of a shard's group moved off this node", "shard", todo[g], "group", g)
	}
}

// stopHook, set only by tests (export_test.go), runs as stopMoved is
// about to stop a group, which still answers its leader until then.
var stopHook atomic.Pointer[func(node string, group uint64)]

// notHosted are the running groups m places on other nodes only.
func (ss *shardSet) notHosted(m shard.Map) []*groupRun {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	var out []*groupRun
	for _, g := range ss.order {
		if k := m.IndexOfGroup(g); k >= 0 && !m.Hosted(k, ss.rc.ID, ss.all) {
			out = append(out, ss.groups[g])
		}
	}
	return out
}
