package forensics_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dlock/dlock/internal/forensics"
	"github.com/dlock/dlock/internal/raftnode"
	"github.com/dlock/dlock/internal/testcluster"
)

// A real node's log replays from its first snapshot to exactly its second:
// the tool proves an agreement it can also refute (a wrong reference).
//
// It reads the hashicorp engine's files (snapshot directories, the WAL), so
// it runs on that engine whatever DLOCK_TEST_RAFT_ENGINE says; the etcd
// engine keeps its one snapshot in its log store, and reading its log offline
// is tested in raftnode (TestMoveToEtcdEngineAndRecover).
func TestReplayMatchesTheNodesOwnSnapshots(t *testing.T) {
	c := testcluster.NewWith(t, 3, testcluster.Options{Engine: raftnode.EngineHashicorp})
	leader := c.WaitLeader(10 * time.Second)
	node := c.Server(leader).Node
	acquire := func(i int) error {
		var out map[string]any
		code, err := c.Do(context.Background(), http.MethodPost, c.URL(leader)+"/api/v1/locks/f/"+string(rune('a'+i%26))+"/acquire",
			map[string]any{"client_id": "c" + string(rune('a'+i%7)), "ttl_ms": 60000}, &out)
		if err != nil || (code != 200 && code != 409) {
			return fmt.Errorf("acquire: %d %v", code, err)
		}
		return nil
	}
	for i := 0; i < 40; i++ {
		if err := acquire(i); err != nil {
			t.Fatal(err)
		}
	}
	if err := node.Raft().Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	// Then concurrent writes, until some share a log entry: the replay and
	// the dump must read packed entries as the nodes do.
	for round := 0; ; round++ {
		var wg sync.WaitGroup
		errs := make([]error, 30)
		for i := range errs {
			wg.Go(func() { errs[i] = acquire(40 + i) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		if st := node.Status(); st.ProposedCommands > st.ProposedEntries {
			break
		}
		if round == 20 {
			t.Fatal("21 rounds of 30 concurrent acquires never shared a log entry")
		}
	}
	// End the log on a barrier, as a leader's commit notice often does: the
	// state machine never sees it, so neither may the replay.
	if err := node.Raft().Barrier(5 * time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	if err := node.Raft().Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	dir := c.DataDir(leader)
	c.Kill(leader) // the tool reads a stopped node's files
	snaps, _ := filepath.Glob(filepath.Join(dir, "snapshots", "*", "state.bin"))
	if len(snaps) != 2 {
		t.Fatalf("want 2 snapshots, got %v", snaps)
	}
	meta := func(p string) uint64 {
		// <term>-<index>-<ms>
		parts := strings.Split(filepath.Base(filepath.Dir(p)), "-")
		var idx uint64
		for _, ch := range parts[1] {
			idx = idx*10 + uint64(ch-'0')
		}
		return idx
	}
	older, newer := snaps[0], snaps[1]
	if meta(older) > meta(newer) {
		older, newer = newer, older
	}
	res, err := forensics.Replay(older, dir, raftnode.LogStoreWAL, meta(newer), newer)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Compared || !res.Same || res.ToIndex != res.RefIndex {
		t.Fatalf("replay of the node's own log does not reproduce its snapshot: %+v", res)
	}
	// Stopping one applied entry short must not match. (The snapshot's own
	// index may name a later barrier, which the state machine never sees.)
	res, err = forensics.Replay(older, dir, raftnode.LogStoreWAL, res.RefIndex-1, newer)
	if err != nil {
		t.Fatal(err)
	}
	if res.Same {
		t.Fatalf("a replay one entry short matched: %+v", res)
	}
	var out bytes.Buffer
	if err := forensics.DumpLog(dir, raftnode.LogStoreWAL, 0, ^uint64(0), &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "*command.Acquire") || !strings.Contains(out.String(), "term=") || !strings.Contains(out.String(), "[1/") {
		t.Fatalf("dump lacks decoded entries:\n%s", out.String()[:min(500, out.Len())])
	}
}

// A damaged entry is reported with its index, file and what is wrong, and
// the dump goes on: raft-wal's decoder panicked on this one (an overlong
// varint), which took the tool down.
func TestDumpLogReportsCorruptEntry(t *testing.T) {
	dir := t.TempDir()
	st, closeFn, err := raftnode.OpenLogStore(raftnode.LogStoreWAL, dir)
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 5; i++ {
		if err := st.StoreLogs([]*raft.Log{{Index: i, Term: 1, Type: raft.LogNoop, Data: []byte(fmt.Sprintf("entry-%d-payload", i))}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := closeFn(); err != nil {
		t.Fatal(err)
	}
	segs, _ := filepath.Glob(filepath.Join(dir, "wal", "*.wal"))
	if len(segs) != 1 {
		t.Fatalf("segments: %v", segs)
	}
	b, err := os.ReadFile(segs[0])
	if err != nil {
		t.Fatal(err)
	}
	at := bytes.Index(b, []byte("entry-3-payload"))
	if at < 4 {
		t.Fatal("entry 3 not found")
	}
	copy(b[at-4:], bytes.Repeat([]byte{0xFF}, 11)) // from its index varint on
	if err := os.WriteFile(segs[0], b, 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := forensics.DumpLog(dir, raftnode.LogStoreWAL, 0, ^uint64(0), &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(out.String(), "\n")
	var bad string
	for _, l := range lines {
		if strings.HasPrefix(l, "3 ") {
			bad = l
		}
	}
	if !strings.Contains(bad, "entry 3 in "+segs[0]+" is corrupt") {
		t.Fatalf("entry 3 reported as %q; dump:\n%s", bad, out.String())
	}
	if !strings.Contains(out.String(), "\n5 term=1") {
		t.Fatalf("the dump stopped at the damaged entry:\n%s", out.String())
	}
}
