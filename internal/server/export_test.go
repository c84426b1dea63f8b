package server

import "github.com/dlock/dlock/internal/raftnode"

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
