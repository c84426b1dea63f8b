package raftnode

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dlock/dlock/internal/testutil"
)

// A node restarted before its snapshot timer fires still compacts: it takes
// the snapshot that is due soon after it starts. The timer here is an hour.
func TestRestartedNodeTakesTheSnapshotDue(t *testing.T) {
	d := newDiskNode(t, func(c *Config) {
		c.SnapshotThreshold, c.SnapshotInterval, c.TrailingLogs = 64, time.Hour, 16
	})
	n := d.start()
	for i := range 100 {
		register(t, n, fmt.Sprintf("m%d", i))
	}
	if err := n.Shutdown(); err != nil {
		t.Fatal(err)
	}
	n = d.start()
	r := n.raft.(*raft.Raft)
	testutil.Eventually(t, 15*time.Second, "the restarted node took no snapshot", func() bool {
		idx, _ := strconv.ParseUint(r.Stats()["last_snapshot_index"], 10, 64)
		return idx >= 100
	})
}

// Every cut of the log's tail starts a new raft-wal segment, allocated
// whole: each may take at most 16 MiB of disk, so that many cuts between
// two snapshots do not fill one (at raft-wal's default, 64 MiB, a follower
// filled 1 GiB in minutes).
func TestWALSegmentsAfterTailCutsStaySmall(t *testing.T) {
	dir := t.TempDir()
	store, closeFn, err := OpenLogStore(LogStoreWAL, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = closeFn() }()
	const cuts = 5
	next := uint64(1)
	for range cuts {
		var logs []*raft.Log
		for range 10 {
			logs = append(logs, &raft.Log{Index: next, Term: 1, Type: raft.LogCommand, Data: []byte("x")})
			next++
		}
		if err := store.StoreLogs(logs); err != nil {
			t.Fatal(err)
		}
		next -= 3
		if err := store.DeleteRange(next, next+2); err != nil {
			t.Fatal(err)
		}
	}
	var segments int
	var allocated int64
	walk := filepath.Join(dir, walDirName)
	ents, err := os.ReadDir(walk)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if filepath.Ext(e.Name()) != ".wal" {
			continue
		}
		fi, err := os.Stat(filepath.Join(walk, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		segments++
		allocated += fi.Sys().(*syscall.Stat_t).Blocks * 512
	}
	if segments < cuts {
		t.Fatalf("%d segments after %d cuts of the tail: raft-wal no longer starts one per cut, so this test no longer measures what it should", segments, cuts)
	}
	if limit := int64(segments) * 16 << 20; allocated > limit {
		t.Fatalf("%d segments take %d MiB, above 16 MiB each", segments, allocated>>20)
	}
	t.Logf("%d segments after %d cuts of the tail: %d MiB allocated", segments, cuts, allocated>>20)
}
