// Free-space guard: the leader refuses new writes while its data dir's disk
// is nearly full, and accepts them again once space returns, so a full disk
// shows up as a clear 503 instead of a failed fsync that stops the node.

package raftnode

import (
	"fmt"
	"sync"
	"time"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/command"
)

// DefaultMinFreeDisk is the free space a node keeps in reserve below which
// it refuses new writes: room for Raft to finish what it has in flight, a
// snapshot, and the followers' copies of recent entries.
const DefaultMinFreeDisk = 64 << 20

// diskCheckEvery bounds how often the guard asks the file system: writes
// pass a cached answer in between.
const diskCheckEvery = 250 * time.Millisecond

// diskGuard answers whether the disk has room for another write.
type diskGuard struct {
	dir      string
	min      uint64
	free     func(dir string) (uint64, error)
	mu       sync.Mutex
	at       time.Time
	avail    uint64
	readErr  error
	disabled bool
}

func newDiskGuard(dir string, minFree int64, free func(string) (uint64, error)) *diskGuard {
	if free == nil {
		free = freeSpace
	}
	g := &diskGuard{dir: dir, free: free, disabled: minFree < 0}
	if minFree == 0 {
		minFree = DefaultMinFreeDisk
	}
	if minFree > 0 {
		g.min = uint64(minFree)
	}
	return g
}

// check returns a disk_full error while the disk has less than the reserve
// free. A file system that cannot say lets writes through: the write path
// still stops the node on a real failure.
func (g *diskGuard) check() error {
	if g == nil || g.disabled {
		return nil
	}
	g.mu.Lock()
	if time.Since(g.at) >= diskCheckEvery {
		g.avail, g.readErr = g.free(g.dir)
		g.at = time.Now()
	}
	avail, err := g.avail, g.readErr
	g.mu.Unlock()
	if err != nil || avail >= g.min {
		return nil
	}
	return &apierror.Error{Code: apierror.DiskFull, RetryAfter: 5 * time.Second,
		Message: fmt.Sprintf("the leader's disk is nearly full (%d MiB free, below the %d MiB reserve set by --min-free-disk): new locks, sessions and other writes are refused until space is freed on it; renewals, releases and reads still work, and writes resume on their own once there is room",
			avail>>20, g.min>>20)}
}

// guarded says whether the guard applies to e. Commands that keep what is
// held alive or give it back pass even on a nearly full disk: the reserve is
// there so that holders do not lose their locks and sessions (renewals,
// keep-alives, the reaper) while nothing new is taken, and they do not grow
// the state a snapshot keeps.
func guarded(e *command.Envelope) bool {
	switch e.Body.(type) {
	case *command.KeepAlive, *command.Renew, *command.Release, *command.DeleteSession,
		*command.ExpireLeases, *command.ExpireWaits, *command.CancelWait, *command.Tick,
		*command.DeleteACLToken:
		return false
	}
	return true
}
