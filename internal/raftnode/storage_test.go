// Storage integrity with real data dirs: a node's files are damaged on disk
// while it is stopped (a flipped byte in a WAL entry, a truncated segment, a
// corrupt newest snapshot), and the node must refuse to start, naming the
// file and index, instead of serving a forked or shortened log.

package raftnode

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/testutil"
)

// diskNode is a one-node cluster on a data dir that outlives the node.
type diskNode struct {
	t    *testing.T
	dir  string
	addr string
	set  func(*Config)
}

func newDiskNode(t *testing.T, set func(*Config)) *diskNode {
	return &diskNode{t: t, dir: t.TempDir(), addr: freeRaftAddr(t), set: set}
}

// open starts the node on its dir; it does not wait for leadership. It runs
// the hashicorp engine, whose files most of these tests damage, unless set
// names another.
func (d *diskNode) open() (*Node, error) {
	cfg := Config{ID: "n1", DataDir: d.dir, RaftAddr: d.addr, InitialCluster: map[string]string{"n1": d.addr},
		Engine: EngineHashicorp, RaftLogLevel: "off", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if d.set != nil {
		d.set(&cfg)
	}
	n, err := Open(cfg)
	if err == nil {
		d.t.Cleanup(func() { _ = n.Shutdown() })
	}
	return n, err
}

// start opens the node and waits until it is the ready leader.
func (d *diskNode) start() *Node {
	d.t.Helper()
	n, err := d.open()
	if err != nil {
		d.t.Fatalf("open: %v", err)
	}
	testutil.Eventually(d.t, 10*time.Second, "the node did not become the ready leader", func() bool { return n.IsLeader() })
	return n
}

// register writes one entry naming member id and returns its index.
func register(t *testing.T, n *Node, id string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := n.Apply(ctx, &command.Envelope{ClientID: "c", RequestID: "r-" + id, Body: &command.RegisterMember{ID: id, RaftAddr: "x:1"}})
	if err != nil {
		t.Fatalf("apply %s: %v", id, err)
	}
	return resp.Index
}

// refused asserts that err is a refusal naming each of want.
func refused(t *testing.T, err error, want ...string) {
	t.Helper()
	var re *RefusedError
	if !errors.As(err, &re) {
		t.Fatalf("the node started (or failed otherwise: %v); want it to refuse its data dir", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("refusal %q does not name %q", err, w)
		}
	}
	if !strings.Contains(err.Error(), "A node refuses its data dir") {
		t.Errorf("refusal %q does not say where the recovery is documented", err)
	}
}

// walSegments are the node's raft-wal segment files, oldest first.
func walSegments(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, walDirName, "*.wal"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no wal segments in %s: %v", dir, err)
	}
	return files
}

// A flipped byte inside a stored entry (after the newest snapshot: there is
// none here) makes the node refuse to start, naming the file (the raft-wal
// segment) and the entry's index; restored, the same dir starts and holds
// the entry.
func TestFlippedByteInLogEntryRefusesStart(t *testing.T) {
	for _, kind := range logStoreKinds {
		t.Run(string(kind), func(t *testing.T) {
			d := newDiskNode(t, func(c *Config) { c.LogStore = kind })
			n := d.start()
			var target uint64
			for i := range 30 {
				idx := register(t, n, fmt.Sprintf("member-%04d", i))
				if i == 17 {
					target = idx
				}
			}
			if err := n.Shutdown(); err != nil {
				t.Fatal(err)
			}

			files := []string{filepath.Join(d.dir, boltFileName)}
			if kind == LogStoreWAL {
				files = walSegments(t, d.dir)
			}
			// member-0017 becomes member-0018: a silent fork. Every copy
			// (bbolt may keep old page versions in free pages).
			name := []byte("member-0017")
			orig := map[string][]byte{}
			var file string
			for _, f := range files {
				b, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Contains(b, name) {
					continue
				}
				orig[f], file = bytes.Clone(b), f
				if err := os.WriteFile(f, bytes.ReplaceAll(b, name, []byte("member-0018")), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if file == "" {
				t.Fatal("the entry is in no file")
			}
			_, err := d.open()
			refused(t, err, fmt.Sprintf("entry %d ", target), filepath.Base(file), "checksum mismatch")

			for f, b := range orig {
				if err := os.WriteFile(f, b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			n = d.start()
			if !hasMember(n, "member-0017") {
				t.Fatal("the restored entry was not applied")
			}
		})
	}
}

// dataEnd is the offset after the last non-zero byte: raft-wal preallocates
// its segment files with zeros.
func dataEnd(b []byte) int {
	end := len(b)
	for end > 0 && b[end-1] == 0 {
		end--
	}
	return end
}

// A segment truncated while the node was stopped loses entries the node had
// made durable (and acknowledged): the node refuses to start instead of
// voting with a shorter log.
func TestTruncatedWALRefusesStart(t *testing.T) {
	d := newDiskNode(t, nil)
	n := d.start()
	var last uint64
	for i := range 200 {
		last = register(t, n, fmt.Sprintf("member-%04d", i))
	}
	if err := n.Shutdown(); err != nil {
		t.Fatal(err)
	}
	segs := walSegments(t, d.dir)
	tail := segs[len(segs)-1]
	b, err := os.ReadFile(tail)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(tail, int64(dataEnd(b)*9/10)); err != nil {
		t.Fatal(err)
	}
	_, err = d.open()
	refused(t, err, "were lost", fmt.Sprintf("entries up to %d", last), markFileName)
}

// A torn final write — entries the log store never confirmed, so the mark
// never covered them — is the one loss a node starts from: raft-wal drops the
// torn batch and the node comes up with the entries before it.
func TestTornUnconfirmedTailStarts(t *testing.T) {
	d := newDiskNode(t, nil)
	n := d.start()
	var prev, last uint64
	for i := range 20 {
		prev, last = last, register(t, n, fmt.Sprintf("member-%04d", i))
	}
	if err := n.Shutdown(); err != nil {
		t.Fatal(err)
	}
	// As if the process died before the final batch's fsync returned: the
	// mark still says prev, and the batch's last bytes never reached disk.
	m, _, _, err := openMark(d.dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.set(prev); err != nil {
		t.Fatal(err)
	}
	_ = m.close(false)
	segs := walSegments(t, d.dir)
	tail := segs[len(segs)-1]
	b, err := os.ReadFile(tail)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(tail, int64(dataEnd(b)-3)); err != nil {
		t.Fatal(err)
	}
	n, err = d.open()
	if err != nil {
		t.Fatalf("a torn unconfirmed tail refused the start: %v", err)
	}
	if got := n.raft.(*raft.Raft).LastIndex(); got >= last {
		t.Fatalf("last index %d: the torn entry %d was kept", got, last)
	}
}

// A corrupt newest snapshot, with the log compacted past the older one, makes
// the node refuse naming the snapshot's file — not fall back to the older
// snapshot and panic with "log not found".
func TestCorruptNewestSnapshotRefusesStart(t *testing.T) {
	d := newDiskNode(t, func(c *Config) {
		c.TrailingLogs = 5
		c.SnapshotThreshold = 1 << 30 // only the snapshots taken below
		c.SnapshotInterval = time.Hour
	})
	n := d.start()
	for round := range 2 {
		for i := range 20 {
			register(t, n, fmt.Sprintf("member-%d-%04d", round, i))
		}
		if err := n.raft.Snapshot().Error(); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.Shutdown(); err != nil {
		t.Fatal(err)
	}
	dirs, err := filepath.Glob(filepath.Join(d.dir, "snapshots", "*", "state.bin"))
	if err != nil || len(dirs) != 2 {
		t.Fatalf("want 2 snapshots, found %v (%v)", dirs, err)
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(d.dir, 2, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	metas, err := snaps.List()
	if err != nil || len(metas) != 2 {
		t.Fatalf("list snapshots: %v %v", metas, err)
	}
	state := filepath.Join(d.dir, "snapshots", metas[0].ID, "state.bin")
	b, err := os.ReadFile(state)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x40
	if err := os.WriteFile(state, b, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = d.open()
	refused(t, err, state, "fails its check")
}

// faultyStore fails writes once armed: StoreLogs writes, then reports the
// failure, as a failed fsync does (the data may or may not be on disk).
type faultyStore struct {
	LogAndStableStore
	armed atomic.Bool
}

var errInjected = errors.New("injected: fsync: input/output error")

func (f *faultyStore) StoreLogs(logs []*raft.Log) error {
	err := f.LogAndStableStore.StoreLogs(logs)
	if f.armed.Load() {
		return errInjected
	}
	return err
}

func (f *faultyStore) StoreLog(l *raft.Log) error { return f.StoreLogs([]*raft.Log{l}) }

func (f *faultyStore) IsMonotonic() bool { return true }

// A failed log write stops the node — it answers no more requests and takes
// no part in Raft — and a restart on a healthy disk recovers everything it
// acknowledged.
func TestFailedLogWriteStopsNodeAndRestartRecovers(t *testing.T) {
	var faulty atomic.Pointer[faultyStore]
	d := newDiskNode(t, func(c *Config) {
		c.wrapLogStore = func(s LogAndStableStore) LogAndStableStore {
			f := &faultyStore{LogAndStableStore: s}
			faulty.Store(f)
			return f
		}
	})
	n := d.start()
	for i := range 10 {
		register(t, n, fmt.Sprintf("member-%04d", i))
	}
	faulty.Load().armed.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Its outcome is unknown (the entry may be on disk): a 503 that says to
	// retry elsewhere, never a 500.
	if _, err := n.Apply(ctx, &command.Envelope{ClientID: "c", RequestID: "r-doomed", Body: &command.RegisterMember{ID: "doomed", RaftAddr: "x:1"}}); apierror.CodeOf(err) != apierror.Unavailable {
		t.Fatalf("a write whose fsync failed answered %v, want unavailable", err)
	}
	select {
	case <-n.Failed():
	case <-time.After(10 * time.Second):
		t.Fatal("the node did not stop after a failed write")
	}
	if !errors.Is(n.Err(), errInjected) || !errors.Is(n.Err(), ErrStorageFailed) {
		t.Fatalf("Err() = %v, want the injected failure", n.Err())
	}
	if _, err := n.Apply(ctx, registerMemberEnvelope("after")); apierror.CodeOf(err) != apierror.Unavailable || !strings.Contains(err.Error(), "storage failed") {
		t.Fatalf("a write on the stopped node answered %v", err)
	}
	if err := n.Ready(); err == nil || !strings.Contains(err.Error(), "storage failed") {
		t.Fatalf("Ready() = %v on a stopped node", err)
	}
	if err := n.Shutdown(); err != nil {
		t.Logf("shutdown: %v", err)
	}

	// The disk is healthy again (the wrapper is not armed on reopen).
	n = d.start()
	for i := range 10 {
		if !hasMember(n, fmt.Sprintf("member-%04d", i)) {
			t.Fatalf("acknowledged entry member-%04d lost", i)
		}
	}
	register(t, n, "after-restart")
}

// Below the free-space reserve the leader refuses new writes with disk_full
// (reads and what keeps leases alive still work), and takes them again once
// space returns.
func TestDiskFullRefusesWritesUntilSpaceReturns(t *testing.T) {
	var free atomic.Uint64
	free.Store(1 << 40)
	d := newDiskNode(t, func(c *Config) {
		c.MinFreeDisk = 64 << 20
		c.FreeSpace = func(string) (uint64, error) { return free.Load(), nil }
	})
	n := d.start()
	register(t, n, "before")
	free.Store(10 << 20)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err error
	testutil.Eventually(t, 10*time.Second, "a write refused as disk_full", func() (bool, string) {
		_, err = n.Apply(ctx, registerMemberEnvelope(fmt.Sprint("full-", time.Now().UnixNano())))
		return apierror.CodeOf(err) == apierror.DiskFull, fmt.Sprint(err)
	})
	if !strings.Contains(err.Error(), "--min-free-disk") {
		t.Fatalf("a write on a full disk answered %v, want disk_full naming --min-free-disk", err)
	}
	if apierror.HTTPStatus(apierror.DiskFull) != 503 {
		t.Fatalf("disk_full is HTTP %d, want 503", apierror.HTTPStatus(apierror.DiskFull))
	}
	if err := n.LinearizableRead(ctx); err != nil {
		t.Fatalf("a read on a full disk failed: %v", err)
	}
	// What keeps holders' leases alive passes: a lease clock tick here.
	if _, err := n.Apply(ctx, &command.Envelope{ClientID: "dlock", Body: &command.Tick{}}); err != nil {
		t.Fatalf("a tick on a full disk failed: %v", err)
	}
	if !hasMember(n, "before") {
		t.Fatal("state lost")
	}
	free.Store(1 << 40)
	testutil.Eventually(t, 10*time.Second, "writes resume once space returned", func() (bool, string) {
		_, err = n.Apply(ctx, registerMemberEnvelope(fmt.Sprint("back-", time.Now().UnixNano())))
		return err == nil, fmt.Sprint(err)
	})
	if n.Err() != nil {
		t.Fatalf("the guard stopped the node: %v", n.Err())
	}
}

// A follower that was brought up to date by a snapshot install (Raft deletes
// or compacts its log first) restarts cleanly: the durable mark follows the
// deletions, so it raises no false alarm.
func TestRestartAfterSnapshotInstallStarts(t *testing.T) {
	for _, kind := range logStoreKinds {
		t.Run(string(kind), func(t *testing.T) { restartAfterSnapshotInstall(t, kind) })
	}
}

func restartAfterSnapshotInstall(t *testing.T, kind LogStoreKind) {
	ids := []string{"n1", "n2", "n3"}
	addrs := map[string]string{}
	dirs := map[string]string{}
	for _, id := range ids {
		addrs[id], dirs[id] = freeRaftAddr(t), t.TempDir()
	}
	open := func(id string) (*Node, error) {
		n, err := Open(Config{ID: id, DataDir: dirs[id], RaftAddr: addrs[id], InitialCluster: addrs,
			TrailingLogs: 5, SnapshotThreshold: 1 << 30, SnapshotInterval: time.Hour,
			Engine: EngineHashicorp, LogStore: kind, RaftLogLevel: "off", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err == nil {
			t.Cleanup(func() { _ = n.Shutdown() })
		}
		return n, err
	}
	nodes := map[string]*Node{}
	for _, id := range ids {
		n, err := open(id)
		if err != nil {
			t.Fatal(err)
		}
		nodes[id] = n
	}
	leaderOf := func() *Node {
		var leader *Node
		testutil.Eventually(t, 10*time.Second, "a ready leader", func() bool {
			for _, n := range nodes {
				if n != nil && n.IsLeader() {
					leader = n
					return true
				}
			}
			return false
		})
		return leader
	}
	leader := leaderOf()
	register(t, leader, "early")
	lag := ""
	for _, id := range ids {
		if id != leader.ID() {
			lag = id
		}
	}
	if err := nodes[lag].Shutdown(); err != nil {
		t.Fatal(err)
	}
	nodes[lag] = nil
	for i := range 50 {
		register(t, leader, fmt.Sprintf("member-%04d", i))
	}
	if err := leader.raft.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	n, err := open(lag)
	if err != nil {
		t.Fatalf("reopen the lagging follower: %v", err)
	}
	nodes[lag] = n
	testutil.Eventually(t, 10*time.Second, "the lagging follower did not catch up", func() bool { return hasMember(n, "member-0049") })
	register(t, leaderOf(), "after")
	testutil.Eventually(t, 10*time.Second, "the follower did not apply the write after the install", func() bool { return hasMember(n, "after") })
	// raft-wal serves entries it compacted logically while they are still
	// in its tail segment, so only the bolt store forces the install here.
	if got := n.raft.(*raft.Raft).Stats()["last_snapshot_index"]; got == "0" && kind == LogStoreBolt {
		t.Fatal("the follower caught up without a snapshot install; the test needs one")
	}
	if err := n.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if _, err := open(lag); err != nil {
		t.Fatalf("restart after a snapshot install refused: %v", err)
	}
}

// In a three-node cluster the leader's fsync fails: it stops, the other two
// elect a leader and go on, and the failed node, restarted on a healthy
// disk, rejoins with every acknowledged write.
func TestLeaderStorageFailureInCluster(t *testing.T) {
	if testEngine() != EngineHashicorp {
		t.Skip("injects faults under hashicorp/raft's log store; the etcd engine's is TestEtcdEngineLeaderWriteFailureStops")
	}
	var mu sync.Mutex
	faulty := map[string]*faultyStore{}
	nodes, leaderID := openTestClusterWith(t, []string{"n1", "n2", "n3"}, func(c *Config) {
		id := c.ID
		c.wrapLogStore = func(s LogAndStableStore) LogAndStableStore {
			f := &faultyStore{LogAndStableStore: s}
			mu.Lock()
			faulty[id] = f
			mu.Unlock()
			return f
		}
	})
	leader := nodes[leaderID]
	for i := range 10 {
		register(t, leader, fmt.Sprintf("before-%d", i))
	}
	mu.Lock()
	faulty[leaderID].armed.Store(true)
	mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, _ = leader.Apply(ctx, registerMemberEnvelope("doomed"))
	select {
	case <-leader.Failed():
	case <-time.After(10 * time.Second):
		t.Fatal("the leader did not stop after its fsync failed")
	}
	cfg := leader.cfg
	if err := leader.Shutdown(); err != nil {
		t.Logf("shutdown: %v", err)
	}

	// The others go on; a write through one of them commits.
	var other *Node
	for id, n := range nodes {
		if id != leaderID {
			other = n
		}
	}
	register(t, other, "after-failure")

	cfg.wrapLogStore = nil
	n, err := Open(cfg)
	if err != nil {
		t.Fatalf("restart on a healthy disk: %v", err)
	}
	t.Cleanup(func() { _ = n.Shutdown() })
	testutil.Eventually(t, 15*time.Second, "the restarted node did not catch up", func() bool { return hasMember(n, "after-failure") })
	for i := range 10 {
		for _, m := range []*Node{n, other} {
			if !hasMember(m, fmt.Sprintf("before-%d", i)) {
				t.Fatalf("acknowledged write before-%d lost on %s", i, m.ID())
			}
		}
	}
}

// A bolt log store truncated while the node was stopped is refused with the
// usual message. bbolt reads the missing pages as zeros: v1.3.6 looped on
// them for ever (the node hung at start, silent), v1.4 panics on its page
// check, which the start-up turns into the refusal.
func TestTruncatedBoltStoreRefusesStart(t *testing.T) {
	d := newDiskNode(t, func(c *Config) { c.LogStore = LogStoreBolt })
	n := d.start()
	for i := range 300 {
		register(t, n, fmt.Sprintf("member-%04d-%s", i, strings.Repeat("x", 100)))
	}
	if err := n.Shutdown(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(d.dir, boltFileName)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, fi.Size()/2); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := d.open()
		done <- err
	}()
	var openErr error
	testutil.Eventually(t, time.Minute, "the start on a truncated raft.db neither started nor refused (hung)", func() bool {
		select {
		case openErr = <-done:
			return true
		default:
			return false
		}
	})
	refused(t, openErr, boltFileName)
}

// After kill -9 the mark file must cover every entry StoreLogs returned:
// the process is gone but the page cache keeps what it wrote. The file is
// read here while the node still runs and before any periodic flush could
// have run (as if the process died right after the write), on a real data
// dir. Before, the mark was written only by a goroutine every 50 ms, so the
// last entries a node acknowledged before kill -9 could then be cut from
// its log unnoticed.
func TestDurableMarkCoversEveryAcknowledgedEntryAtOnce(t *testing.T) {
	for _, kind := range logStoreKinds {
		t.Run(string(kind), func(t *testing.T) {
			d := newDiskNode(t, func(c *Config) { c.LogStore = kind })
			n := d.start()
			for i := range 50 {
				idx := register(t, n, fmt.Sprintf("member-%04d", i))
				// What survives a kill -9 now: the file's contents.
				b, err := os.ReadFile(filepath.Join(d.dir, markFileName))
				if err != nil {
					t.Fatal(err)
				}
				if len(b) != 12 {
					t.Fatalf("mark file holds %d bytes", len(b))
				}
				if v := binary.BigEndian.Uint64(b[:8]); v < idx {
					t.Fatalf("entry %d was acknowledged but the mark file says %d: a kill -9 now and a cut log would go unnoticed", idx, v)
				}
			}
		})
	}
}

// A durable mark file that was deleted or emptied while the node was
// stopped is refused: before, the node took it for a data dir that never
// had one and started, which disarmed the check for a log that lost its
// tail (delete the mark, truncate the log, and the node voted on).
func TestDeletedDurableMarkRefusesStart(t *testing.T) {
	for _, kind := range []string{string(LogStoreWAL), string(LogStoreBolt), string(EngineEtcd)} {
		t.Run(kind, func(t *testing.T) {
			d := newDiskNode(t, func(c *Config) {
				if kind == string(EngineEtcd) {
					c.Engine = EngineEtcd
				} else {
					c.LogStore = LogStoreKind(kind)
				}
			})
			markPath := filepath.Join(d.dir, markFileName)
			if kind == string(EngineEtcd) {
				markPath = filepath.Join(d.dir, etcdStoreDir+"-mark", "1", markFileName)
			}
			n := d.start()
			register(t, n, "member-0001")
			if err := n.Shutdown(); err != nil {
				t.Fatal(err)
			}
			orig, err := os.ReadFile(markPath)
			if err != nil {
				t.Fatal(err)
			}
			for name, damage := range map[string]func() error{
				"deleted": func() error { return os.Remove(markPath) },
				"emptied": func() error { return os.Truncate(markPath, 0) },
			} {
				if err := damage(); err != nil {
					t.Fatal(err)
				}
				_, err := d.open()
				if re := (*RefusedError)(nil); !errors.As(err, &re) || !strings.Contains(err.Error(), "missing or empty") {
					t.Fatalf("%s mark: start gave %v; want a refusal saying the mark is missing", name, err)
				}
				if err := os.WriteFile(markPath, orig, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			n = d.start()
			if !hasMember(n, "member-0001") {
				t.Fatal("the restored dir lost its entry")
			}
		})
	}
}

// A flipped digit in the newest snapshot's meta.json — its Index, Term,
// Size, or a member's address — is refused. raft's CRC there covers
// state.bin only: a node whose meta.json said index 1849 for a state taken
// at 1749 started, believed its state 100 entries ahead and skipped them.
func TestDamagedSnapshotMetaRefusesStart(t *testing.T) {
	d := newDiskNode(t, func(c *Config) {
		c.TrailingLogs = 5
		c.SnapshotThreshold = 1 << 30 // only the snapshot taken below
		c.SnapshotInterval = time.Hour
	})
	n := d.start()
	for i := range 20 {
		register(t, n, fmt.Sprintf("member-%04d", i))
	}
	if err := n.raft.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	register(t, n, "member-after")
	if err := n.Shutdown(); err != nil {
		t.Fatal(err)
	}
	metas, err := filepath.Glob(filepath.Join(d.dir, "snapshots", "*", "meta.json"))
	if err != nil || len(metas) != 1 {
		t.Fatalf("want 1 snapshot, found %v (%v)", metas, err)
	}
	path := metas[0]
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Each rewrite changes one digit (or letter) of one field's value.
	bump := func(b []byte, field string) []byte {
		i := bytes.Index(b, []byte(field))
		if i < 0 {
			t.Fatalf("meta.json has no %s: %s", field, b)
		}
		b = bytes.Clone(b)
		b[i+len(field)] ^= 0x01
		return b
	}
	for name, b := range map[string][]byte{
		"index":   bump(orig, `"Index":`),
		"term":    bump(orig, `"Term":`),
		"size":    bump(orig, `"Size":`),
		"address": bump(orig, `"Address":"127.0.0.1:`),
		"confidx": bump(orig, `"ConfigurationIndex":`),
	} {
		t.Run(name, func(t *testing.T) {
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := d.open()
			refused(t, err, "meta.json")
		})
	}
	if err := os.WriteFile(path, orig, 0o600); err != nil {
		t.Fatal(err)
	}
	n = d.start()
	if !hasMember(n, "member-after") {
		t.Fatal("the restored dir lost its last entry")
	}
}

// An etcd-engine data dir whose pebble log lost one of pebble's own files
// (its manifest, its format marker) is refused with the usual message;
// before, the node exited with pebble's bare error and no word of recovery.
func TestMissingPebbleFileRefusesStart(t *testing.T) {
	d := newDiskNode(t, func(c *Config) { c.Engine = EngineEtcd })
	n := d.start()
	register(t, n, "member-0001")
	if err := n.Shutdown(); err != nil {
		t.Fatal(err)
	}
	for _, pattern := range []string{"MANIFEST-*", "marker.format-version.*"} {
		files, err := filepath.Glob(filepath.Join(d.dir, etcdStoreDir, pattern))
		if err != nil || len(files) == 0 {
			t.Fatalf("no %s in the pebble log: %v", pattern, err)
		}
		orig, err := os.ReadFile(files[0])
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(files[0]); err != nil {
			t.Fatal(err)
		}
		_, err = d.open()
		refused(t, err, etcdStoreDir)
		if err := os.WriteFile(files[0], orig, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	n = d.start()
	if !hasMember(n, "member-0001") {
		t.Fatal("the restored dir lost its entry")
	}
}
