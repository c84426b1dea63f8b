// A restarted node takes the snapshot its timer would have taken.

package raftnode

import (
	"errors"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/hashicorp/raft"
)

// startSnapshotDelay is how long after a start snapshotIfDue waits (up to
// twice it, drawn per node so a cluster restarted at once does not
// snapshot on every node together): long enough for a restarted node to
// have applied what it replays.
const startSnapshotDelay = 2 * time.Second

// snapshotIfDue takes one snapshot soon after the node starts if the log
// has grown by SnapshotThreshold entries since the last. hashicorp/raft
// checks only every SnapshotInterval to twice it, counted from the start,
// so a node restarted more often than that (a crash loop) never compacted
// its log: raft-wal begins a new segment at every cut of the log's tail,
// and a follower that kept restarting filled its disk with them
// (docs/reliability.md, "A node that kept restarting filled its disk").
func (n *Node) snapshotIfDue(r *raft.Raft) {
	select {
	case <-time.After(startSnapshotDelay + rand.N(startSnapshotDelay)):
	case <-n.ctx.Done():
		return
	}
	st := r.Stats()
	last, err1 := strconv.ParseUint(st["last_log_index"], 10, 64)
	snap, err2 := strconv.ParseUint(st["last_snapshot_index"], 10, 64)
	if err1 != nil || err2 != nil || last < snap+n.cfg.SnapshotThreshold {
		return
	}
	if err := r.Snapshot().Error(); err != nil && !errors.Is(err, raft.ErrNothingNewToSnapshot) {
		n.logger.Warn("the snapshot due at start failed; the snapshot timer will try again", "err", err)
		return
	}
	n.logger.Info("took the snapshot due at start", "log_entries_since_last", last-snap)
}
