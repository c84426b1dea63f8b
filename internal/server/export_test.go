package server

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/dlock/dlock/internal/raftnode"
	"github.com/dlock/dlock/internal/shard"
)

// SetOpenHook makes every sharded node in this test binary run f before it
// opens a data group; an error refuses the open (reconcile retries it).
// nil removes the hook.
func SetOpenHook(f func(node string, group uint64) error) {
	if f == nil {
		openHook.Store(nil)
		return
	}
	openHook.Store(&f)
}

// SetStopHook makes every sharded node in this test binary run f just
// before it stops a group a move took off it. nil removes the hook.
func SetStopHook(f func(node string, group uint64)) {
	if f == nil {
		stopHook.Store(nil)
		return
	}
	stopHook.Store(&f)
}

// GroupNode is s's node of Raft group g, or nil where s does not run it.
func GroupNode(s *Server, g uint64) *raftnode.Node {
	if s.shards == nil {
		return nil
	}
	s.shards.mu.Lock()
	defer s.shards.mu.Unlock()
	if run := s.shards.groups[g]; run != nil {
		return run.node
	}
	return nil
}

// SetGateHook makes every sharded node in this test binary run f before
// each try of its start-up gate's barrier; an error fails the try. nil
// removes the hook.
func SetGateHook(f func(node string) error) {
	if f == nil {
		gateHook.Store(nil)
		return
	}
	gateHook.Store(&f)
}

// InFlightMap is the map s's move of shard id from from to to would
// commit first (its replicas grown by to, from leaving), made from s's
// current map and members.
func InFlightMap(s *Server, id int, from, to string) (shard.Map, error) {
	m, ok := s.shards.metaMap()
	if !ok {
		return shard.Map{}, fmt.Errorf("no committed shard map yet")
	}
	nodes := slices.Sorted(maps.Keys(s.shards.members()))
	return m.BeginMove(id, from, to, nodes, s.shards.all)
}

// MoveStep runs one step of shard id's move on s with map m, as a
// reconcile round that read m would (s must lead the shard's group).
func MoveStep(ctx context.Context, s *Server, m shard.Map, id int) error {
	k := m.IndexOf(id)
	if k < 0 {
		return fmt.Errorf("no shard %d in the map", id)
	}
	s.shards.mu.Lock()
	run := s.shards.groups[m.Groups[k]]
	s.shards.mu.Unlock()
	if run == nil {
		return fmt.Errorf("shard %d does not run here", id)
	}
	return s.shards.moveStep(ctx, m, k, run)
}
