package server

import (
	"context"
	"sync/atomic"
	"time"
)

// gateTry bounds one try of the start-up gate's read barrier on the meta
// group; a try that finds no leader or no quorum is made again.
const gateTry = 3 * time.Second

// gateHook, set only by tests (export_test.go), runs before each try of a
// node's start-up gate barrier; an error fails the try (a node cut off from
// the meta group's quorum, held).
var gateHook atomic.Pointer[func(node string) error]

// openGate opens gate (the router's: calls that span shards) once this
// node's copy of the meta group has caught up since start: a read barrier
// at the meta group's quorum-confirmed commit index, then the router
// routing by the map the meta group holds there. Until then a map replayed
// from before the start may lack ranges split off since. It returns when
// ctx ends, leaving the gate shut.
func (ss *shardSet) openGate(ctx context.Context, gate chan<- struct{}) {
	start := time.Now()
	for {
		err := ss.gateBarrier(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		ss.logger.Debug("the meta group has not confirmed this node's shard map yet; retrying", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
	// No map committed at the barrier: a new cluster, which routes by its
	// initial map already.
	if m, ok := ss.metaMap(); ok {
		ss.awaitRouted(ctx, m.Generation)
		if ctx.Err() != nil {
			return
		}
	}
	close(gate)
	ss.logger.Info("caught up with the cluster's shard map since start; serving calls over several shards",
		"generation", ss.router.Map().Generation, "took", time.Since(start).Round(time.Millisecond))
}

// gateBarrier is one try of the meta group's linearizable read barrier.
func (ss *shardSet) gateBarrier(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, gateTry)
	defer cancel()
	if h := gateHook.Load(); h != nil {
		if err := (*h)(ss.rc.ID); err != nil {
			return err
		}
	}
	return ss.meta.LinearizableRead(ctx)
}
