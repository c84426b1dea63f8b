package raftnode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	hraft "github.com/hashicorp/raft"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/state"
	"github.com/dlock/dlock/internal/testutil"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// openEtcdCluster starts an etcd-engine cluster in dirs it returns (for
// restarts), with each Config adjusted by set.
func openEtcdCluster(t *testing.T, ids []string, set func(*Config)) (map[string]*Node, map[string]Config) {
	t.Helper()
	addrs := map[string]string{}
	for _, id := range ids {
		addrs[id] = freeRaftAddr(t)
	}
	nodes, cfgs := map[string]*Node{}, map[string]Config{}
	for _, id := range ids {
		cfg := Config{ID: id, DataDir: t.TempDir(), RaftAddr: addrs[id], InitialCluster: addrs, Engine: EngineEtcd,
			RaftLogLevel: "off", Logger: quietLogger()}
		if set != nil {
			set(&cfg)
		}
		n, err := Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		nodes[id], cfgs[id] = n, cfg
		t.Cleanup(func() { _ = n.Shutdown() })
	}
	waitLeader(t, nodes)
	return nodes, cfgs
}

// waitLeader waits for a ready leader among the running nodes.
func waitLeader(t *testing.T, nodes map[string]*Node) string {
	t.Helper()
	var leader string
	testutil.Eventually(t, 20*time.Second, "no ready leader", func() bool {
		for id, n := range nodes {
			if n.Err() == nil && n.IsLeader() {
				leader = id
				return true
			}
		}
		return false
	})
	return leader
}

func acquire(t *testing.T, n *Node, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := n.Apply(ctx, &command.Envelope{ClientID: "c", RequestID: "r-" + name, Body: &command.Acquire{Name: name, TTLms: 60000}})
	if err != nil {
		t.Fatalf("acquire %s via %s: %v", name, n.ID(), err)
	}
	if resp.Result.Status != command.StatusOK {
		t.Fatalf("acquire %s: status %v", name, resp.Result.Status)
	}
}

func digest(n *Node) (idx, d uint64) {
	n.FSM().Read(func(s *state.State) { idx, d = s.Index(), s.Digest() })
	return
}

// sameState waits until every node has applied the same index with the same
// state digest.
func sameState(t *testing.T, nodes map[string]*Node) {
	t.Helper()
	defer func() {
		if t.Failed() {
			for id, n := range nodes {
				i, d := digest(n)
				t.Logf("%s: applied %d digest %x status %+v", id, i, d, n.Status())
			}
		}
	}()
	testutil.Eventually(t, 20*time.Second, "replicas did not converge on one state", func() bool {
		var first *[2]uint64
		for _, n := range nodes {
			i, d := digest(n)
			if first == nil {
				first = &[2]uint64{i, d}
			} else if first[0] != i || first[1] != d {
				return false
			}
		}
		return true
	})
}

func TestEtcdEngineReplicatesAndFailsOver(t *testing.T) {
	nodes, _ := openEtcdCluster(t, []string{"a", "b", "c"}, nil)
	leader := waitLeader(t, nodes)
	for i := range 20 {
		// Through the leader and through a follower (forwarded).
		via := nodes[leader]
		if i%2 == 1 {
			for id, n := range nodes {
				if id != leader {
					via = n
				}
			}
		}
		acquire(t, via, fmt.Sprintf("lock-%d", i))
	}
	sameState(t, nodes)
	for _, n := range nodes {
		if err := n.LinearizableRead(context.Background()); err != nil {
			t.Fatalf("read on %s: %v", n.ID(), err)
		}
	}
	// The leader goes; the others elect one and go on.
	_ = nodes[leader].Shutdown()
	delete(nodes, leader)
	next := waitLeader(t, nodes)
	if next == leader {
		t.Fatal("the stopped node still leads")
	}
	acquire(t, nodes[next], "after-failover")
	sameState(t, nodes)
}

func TestEtcdEngineRestartKeepsState(t *testing.T) {
	nodes, cfgs := openEtcdCluster(t, []string{"a"}, nil)
	for i := range 10 {
		acquire(t, nodes["a"], fmt.Sprintf("l%d", i))
	}
	wantIdx, want := digest(nodes["a"])
	if err := nodes["a"].Shutdown(); err != nil {
		t.Fatal(err)
	}
	n, err := Open(cfgs["a"])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Shutdown() })
	waitLeader(t, map[string]*Node{"a": n})
	testutil.Eventually(t, 10*time.Second, "log not replayed", func() bool { i, _ := digest(n); return i >= wantIdx })
	n.FSM().Read(func(s *state.State) {
		if !s.GetLock("l9").Held {
			t.Fatal("lock l9 lost over a restart")
		}
	})
	_ = want
	// A data dir keeps its engine.
	_ = n.Shutdown()
	c := cfgs["a"]
	c.Engine = EngineHashicorp
	if _, err := Open(c); err == nil {
		t.Fatal("an etcd data dir opened with the hashicorp engine")
	}
}

// TestEtcdEngineLeaderWriteFailureStops: a leader whose own log write fails
// stops at once and never writes again (not the same index, not any other);
// the others elect a leader and keep every acknowledged write.
func TestEtcdEngineLeaderWriteFailureStops(t *testing.T) {
	var failNode atomic.Value // id of the node whose writes fail
	failNode.Store("")
	var mu sync.Mutex
	after := map[string]int{} // writes attempted after the failure
	nodes, _ := openEtcdCluster(t, []string{"a", "b", "c"}, func(c *Config) {
		id := c.ID
		failed := false
		c.etcdWriteHook = func(uint64, bool) error {
			mu.Lock()
			defer mu.Unlock()
			if failed {
				after[id]++
				return errors.New("injected: written again after a failure")
			}
			if failNode.Load() == id {
				failed = true
				return errors.New("injected fsync failure")
			}
			return nil
		}
	})
	leader := waitLeader(t, nodes)
	acquire(t, nodes[leader], "before")
	failNode.Store(leader)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_, err := nodes[leader].Apply(ctx, &command.Envelope{ClientID: "c", RequestID: "during", Body: &command.Acquire{Name: "during", TTLms: 60000}})
	cancel()
	if err == nil {
		t.Log("the write during the failure was answered (it committed on the followers)")
	}
	select {
	case <-nodes[leader].Failed():
	case <-time.After(20 * time.Second):
		t.Fatal("the leader whose write failed did not stop")
	}
	if !errors.Is(nodes[leader].Err(), nodes[leader].Err()) || nodes[leader].Err() == nil {
		t.Fatal("no storage error recorded")
	}
	rest := map[string]*Node{}
	for id, n := range nodes {
		if id != leader {
			rest[id] = n
		}
	}
	next := waitLeader(t, rest)
	acquire(t, rest[next], "after")
	sameState(t, rest)
	rest[next].FSM().Read(func(s *state.State) {
		if !s.GetLock("before").Held {
			t.Fatal("an acknowledged write was lost")
		}
	})
	mu.Lock()
	defer mu.Unlock()
	if after[leader] != 0 {
		t.Fatalf("the failed leader wrote its log %d more times after the failure", after[leader])
	}
}

// TestEtcdStoreDetectsCorruption: an entry whose bytes changed on disk is
// refused on read, and the node refuses to start from the dir.
func TestEtcdStoreDetectsCorruption(t *testing.T) {
	nodes, cfgs := openEtcdCluster(t, []string{"a"}, nil)
	for i := range 5 {
		acquire(t, nodes["a"], fmt.Sprintf("l%d", i))
	}
	_ = nodes["a"].Shutdown()
	dir := filepath.Join(cfgs["a"].DataDir, etcdStoreDir)
	db, err := pebble.Open(dir, &pebble.Options{Logger: quietPebbleLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	k := groupKey(defaultGroup, keyEntry, 3)
	v, closer, err := db.Get(k)
	if err != nil {
		t.Fatal(err)
	}
	bad := append([]byte(nil), v...)
	closer.Close()
	bad[len(bad)-1] ^= 0x40
	if err := db.Set(k, bad, pebble.Sync); err != nil {
		t.Fatal(err)
	}
	_ = db.Close()

	s, err := openMultiStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Load(defaultGroup)
	_ = s.Close()
	var ce *CorruptError
	if !errors.As(err, &ce) || ce.Index != 3 {
		t.Fatalf("Load = %v, want corruption at index 3", err)
	}
	_, err = Open(cfgs["a"])
	var re *RefusedError
	if !errors.As(err, &re) {
		t.Fatalf("Open = %v, want the data dir refused", err)
	}
}

// tearNewestWAL cuts the newest pebble WAL of the store at dir by cut bytes
// of what was written (a WAL file is allocated ahead, zero-filled: see
// walFS).
func tearNewestWAL(t *testing.T, dir string, cut int64) {
	t.Helper()
	logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	sort.Strings(logs)
	for i := len(logs) - 1; i >= 0; i-- {
		b, err := os.ReadFile(logs[i])
		if err != nil {
			t.Fatal(err)
		}
		end := int64(len(bytes.TrimRight(b, "\x00")))
		if end > cut+16 {
			if err := os.Truncate(logs[i], end-cut); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatalf("no WAL in %s long enough to tear", dir)
}

// TestEtcdStoreTornTail: a crash in the middle of a write leaves the newest
// WAL record half written. That write was never acknowledged (nothing is
// before its fsync returns): the node opens without it, with everything
// before. A torn tail that takes acknowledged entries with it is caught by
// the durable mark, and the node refuses its data dir.
func TestEtcdStoreTornTail(t *testing.T) {
	nodes, cfgs := openEtcdCluster(t, []string{"a"}, nil)
	for i := range 5 {
		acquire(t, nodes["a"], fmt.Sprintf("l%d", i))
	}
	_ = nodes["a"].Shutdown()
	dir := filepath.Join(cfgs["a"].DataDir, etcdStoreDir)

	// The write in flight at the crash: appended, never acknowledged.
	s, err := openMultiStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	gs, err := s.Load(defaultGroup)
	if err != nil {
		t.Fatal(err)
	}
	last := gs.Entries[len(gs.Entries)-1]
	next := raftpb.Entry{Term: last.Term, Index: last.Index + 1, Data: bytes.Repeat([]byte{7}, 300)}
	if err := s.Save(defaultGroup, raftpb.HardState{}, []raftpb.Entry{next}, raftpb.Snapshot{}, true); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	tearNewestWAL(t, dir, 100)

	n, err := Open(cfgs["a"])
	if err != nil {
		t.Fatalf("open after a torn tail: %v", err)
	}
	waitLeader(t, map[string]*Node{"a": n})
	acquire(t, n, "after-tear")
	n.FSM().Read(func(s *state.State) {
		if !s.GetLock("l4").Held {
			t.Fatal("entries before the torn record were lost")
		}
	})
	_ = n.Shutdown()

	// Now lose acknowledged entries, with a hard state that agrees (as a
	// disk that dropped the tail's pages could leave it): only the durable
	// mark knows the log held more.
	s, err = openMultiStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	gs, err = s.Load(defaultGroup)
	if err != nil {
		t.Fatal(err)
	}
	lastIdx := gs.Entries[len(gs.Entries)-1].Index
	if err := s.db.DeleteRange(groupKey(defaultGroup, keyEntry, lastIdx-1), groupKey(defaultGroup, keyEntry, lastIdx+1), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	hs := gs.HardState
	hs.Commit = lastIdx - 2
	if err := s.Save(defaultGroup, hs, nil, raftpb.Snapshot{}, true); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	_, err = Open(cfgs["a"])
	var re *RefusedError
	if !errors.As(err, &re) {
		t.Fatalf("Open after losing acknowledged entries = %v, want the data dir refused", err)
	}
}

// TestEtcdEngineMembershipAndSnapshots: a new member joins as a learner,
// catches up from a snapshot (the log behind it is compacted), is promoted,
// and leadership moves to it; a member is removed.
func TestEtcdEngineMembershipAndSnapshots(t *testing.T) {
	small := func(c *Config) {
		c.SnapshotThreshold, c.TrailingLogs = 8, 4
		c.SnapshotInterval = time.Millisecond
		if os.Getenv("DLOCK_TEST_LOG") != "" {
			c.RaftLogLevel, c.Logger = "debug", slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
		}
	}
	sink := inmemMetrics(t)
	nodes, _ := openEtcdCluster(t, []string{"a", "b", "c"}, small)
	leader := waitLeader(t, nodes)
	for i := range 40 {
		acquire(t, nodes[leader], fmt.Sprintf("l%d", i))
	}
	addr := freeRaftAddr(t)
	cfg := Config{ID: "d", DataDir: t.TempDir(), RaftAddr: addr, Engine: EngineEtcd, RaftLogLevel: "off", Logger: quietLogger()}
	small(&cfg)
	d, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Shutdown() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := nodes[leader].Join(ctx, "d", addr); err != nil {
		t.Fatalf("join: %v", err)
	}
	nodes["d"] = d
	testutil.Eventually(t, 30*time.Second, "the new member was not promoted", func() bool {
		cfg, err := nodes[waitLeader(t, nodes)].configuration()
		if err != nil {
			return false
		}
		for _, s := range cfg.Servers {
			if s.ID == "d" && s.Suffrage == hraft.Voter {
				return true
			}
		}
		return false
	})
	sameState(t, nodes)
	// The log behind the snapshots was compacted: d started from one.
	if n := sampled(sink, "dlock.raft.fsm.restore"); n == 0 {
		t.Error("the new member installed a snapshot, and its restore was not timed")
	}
	// A transfer times out (a retryable 503) when the new voter is not
	// caught up within an election timeout — say the leader is sending it
	// the snapshot its promotion triggered — and is retried, as a client
	// would.
	testutil.Eventually(t, 20*time.Second, "leadership did not move to d", func() error {
		if d.IsLeader() {
			return nil
		}
		err := nodes[waitLeader(t, nodes)].TransferLeadership(ctx, "d")
		if err != nil && apierror.CodeOf(err) != apierror.Unavailable {
			t.Fatalf("transfer: %v", err)
		}
		if err != nil {
			return err
		}
		if !d.IsLeader() {
			return errors.New("the transfer answered but d does not lead yet")
		}
		return nil
	})
	acquire(t, nodes["b"], "after-transfer")
	if err := d.Remove(ctx, "a"); err != nil {
		t.Fatalf("remove: %v", err)
	}
	_ = nodes["a"].Shutdown()
	delete(nodes, "a")
	acquire(t, nodes["c"], "after-remove")
	sameState(t, nodes)
	cfgNow, _ := d.configuration()
	if len(cfgNow.Servers) != 3 {
		t.Fatalf("configuration after remove: %+v", cfgNow.Servers)
	}
}

// TestMoveToEtcdEngineAndRecover: a hashicorp cluster's state, saved as a
// snapshot, seeds an etcd-engine cluster (the migration path), which keeps
// every lock; after a quorum loss, recover forces a new member list onto an
// etcd-engine dir and the survivor serves alone with its state.
func TestMoveToEtcdEngineAndRecover(t *testing.T) {
	old, oldLeader := openTestClusterWith(t, []string{"h"}, func(c *Config) { c.Engine = EngineHashicorp })
	acquire(t, old[oldLeader], "kept")
	var saved []byte
	old[oldLeader].FSM().Read(func(s *state.State) { saved = s.Snapshot() })
	_ = old[oldLeader].Shutdown()

	dir, addr := t.TempDir(), freeRaftAddr(t)
	if _, err := RestoreSnapshotOn(EngineEtcd, dir, "", saved, map[string]string{"x": addr}); err != nil {
		t.Fatal(err)
	}
	if k, _ := DataDirEngine(dir); k != EngineEtcd {
		t.Fatalf("restored dir's engine = %q", k)
	}
	// No engine given: the dir's own is used.
	cfg := Config{ID: "x", DataDir: dir, RaftAddr: addr, RaftLogLevel: "off", Logger: quietLogger()}
	n, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	waitLeader(t, map[string]*Node{"x": n})
	n.FSM().Read(func(s *state.State) {
		if !s.GetLock("kept").Held {
			t.Fatal("the restored cluster lost a lock")
		}
	})
	acquire(t, n, "new")
	_ = n.Shutdown()

	// Its (imagined) peers are gone: force a one-member list at a new address.
	addr2 := freeRaftAddr(t)
	if err := Recover(dir, map[string]string{"x": addr2}); err != nil {
		t.Fatal(err)
	}
	cfg.RaftAddr = addr2
	n, err = Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Shutdown() })
	waitLeader(t, map[string]*Node{"x": n})
	n.FSM().Read(func(s *state.State) {
		if !s.GetLock("kept").Held || !s.GetLock("new").Held {
			t.Fatal("recover lost state")
		}
	})
	var buf bytes.Buffer
	_ = n.Shutdown()
	if err := dumpForTest(dir, &buf); err != nil {
		t.Fatal(err)
	}
}

func dumpForTest(dir string, w io.Writer) error {
	st, closeFn, err := OpenLogStore("", dir)
	if err != nil {
		return err
	}
	defer closeFn()
	_, err = st.LastIndex()
	return err
}

// raftStatus reads an etcd engine's Raft status on its Raft goroutine.
func raftStatus(t *testing.T, n *Node) raft.Status {
	t.Helper()
	e := n.raft.(*etcdEngine)
	ch := make(chan raft.Status, 1)
	select {
	case e.reportc <- func(rn *raft.RawNode) { ch <- rn.Status() }:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: raft goroutine not answering", n.ID())
	}
	select {
	case st := <-ch:
		return st
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: raft goroutine not answering", n.ID())
	}
	return raft.Status{}
}

// openHoldableEtcdCluster is a 3-node etcd-engine cluster whose nodes' log
// writes a test can hold: hold(id) stalls id's writes until the returned
// release is called (at the latest when the test ends).
func openHoldableEtcdCluster(t *testing.T) (map[string]*Node, func(id string) (release func())) {
	t.Helper()
	var stuck sync.Map // node id → chan struct{} its writes wait on
	nodes, _ := openEtcdCluster(t, []string{"a", "b", "c"}, func(c *Config) {
		id := c.ID
		c.etcdWriteHook = func(uint64, bool) error {
			if ch, ok := stuck.Load(id); ok {
				<-ch.(chan struct{})
			}
			return nil
		}
	})
	return nodes, func(id string) func() {
		ch := make(chan struct{})
		stuck.Store(id, ch)
		var once sync.Once
		release := func() { once.Do(func() { stuck.Delete(id); close(ch) }) }
		t.Cleanup(release)
		return release
	}
}

// TestEtcdEngineLeaderCountsItselfOnlyWhenDurable: the leader sends its
// entries while it writes them, but its own copy counts toward a majority
// only once its write is durable. With one of three members down and the
// leader's disk stuck, the remaining follower's acknowledgement alone must
// not commit anything; once the leader's write completes, it commits.
func TestEtcdEngineLeaderCountsItselfOnlyWhenDurable(t *testing.T) {
	nodes, holdWrites := openHoldableEtcdCluster(t)
	leader := waitLeader(t, nodes)
	acquire(t, nodes[leader], "warm-up")
	var follower, down string
	for id := range nodes {
		if id == leader {
			continue
		}
		if follower == "" {
			follower = id
		} else {
			down = id
		}
	}
	_ = nodes[down].Shutdown()
	ln := nodes[leader]
	before := raftStatus(t, ln)
	unstick := holdWrites(leader)

	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		_, err := ln.Apply(ctx, &command.Envelope{ClientID: "c", RequestID: "stuck", Body: &command.Acquire{Name: "stuck", TTLms: 60000}})
		done <- err
	}()
	fid := raftID(follower)
	// The follower stores the entry and the leader hears so.
	testutil.Eventually(t, 20*time.Second, "the follower never acknowledged the new entry", func() bool {
		return raftStatus(t, ln).Progress[fid].Match > before.Commit
	})
	st := raftStatus(t, ln)
	if st.Commit != before.Commit {
		t.Fatalf("commit moved from %d to %d on one follower's acknowledgement while the leader's own write was not durable",
			before.Commit, st.Commit)
	}
	if self := st.Progress[raftID(leader)].Match; self > before.Commit {
		t.Fatalf("the leader counted its own copy up to %d before its write was durable (commit %d)", self, before.Commit)
	}
	select {
	case err := <-done:
		t.Fatalf("the write was answered (%v) before it was on a majority of disks", err)
	default:
	}
	unstick()
	if err := <-done; err != nil {
		t.Fatalf("the write failed once the leader's disk recovered: %v", err)
	}
	if st := raftStatus(t, ln); st.Commit <= before.Commit {
		t.Fatalf("commit %d did not move past %d", st.Commit, before.Commit)
	}
}

// TestEtcdEngineCountsWhatCompletedACommit: the leader counts each commit
// under what came last, and holding one member's disk back decides it: the
// leader's with both followers up (the followers commit alone), the leader's
// with one follower down (its own write completes the commit), the
// follower's with one follower down (its acknowledgement does).
func TestEtcdEngineCountsWhatCompletedACommit(t *testing.T) {
	nodes, holdWrites := openHoldableEtcdCluster(t)
	leader := waitLeader(t, nodes)
	acquire(t, nodes[leader], "warm-up")
	ln := nodes[leader]
	var followers []string
	for id := range nodes {
		if id != leader {
			followers = append(followers, id)
			if st := nodes[id].Status(); st.CommitsBy == nil || *st.CommitsBy != (CommitsBy{}) {
				t.Fatalf("follower %s counted commits it did not make: %+v", id, st.CommitsBy)
			}
		}
	}
	if by := ln.Status().CommitsBy; by == nil || by.LeaderWrite+by.FollowerAck+by.FollowersAlone == 0 {
		t.Fatalf("the leader reports no commits by what completed them: %+v", by)
	}
	// write holds held's disk until the others have stored the entry, then
	// lets it go and returns how the commit was counted.
	write := func(name, held string, others ...string) CommitsBy {
		t.Helper()
		before := *ln.Status().CommitsBy
		commit := raftStatus(t, ln).Commit
		release := holdWrites(held)
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			_, err := ln.Apply(ctx, &command.Envelope{ClientID: "c", RequestID: name, Body: &command.Acquire{Name: name, TTLms: 60000}})
			done <- err
		}()
		testutil.Eventually(t, 20*time.Second, "the unheld members never stored the entry", func() bool {
			pr := raftStatus(t, ln).Progress
			for _, o := range others {
				if pr[raftID(o)].Match <= commit {
					return false
				}
			}
			return true
		})
		release()
		if err := <-done; err != nil {
			t.Fatalf("write %s with %s's disk held: %v", name, held, err)
		}
		after := *ln.Status().CommitsBy
		return CommitsBy{LeaderWrite: after.LeaderWrite - before.LeaderWrite, FollowerAck: after.FollowerAck - before.FollowerAck,
			FollowersAlone: after.FollowersAlone - before.FollowersAlone}
	}
	if by := write("leader-slow", leader, followers...); by.FollowersAlone == 0 || by.LeaderWrite != 0 || by.FollowerAck != 0 {
		t.Fatalf("the leader's disk held, both followers up: counted %+v; want it as followers alone", by)
	}
	_ = nodes[followers[1]].Shutdown()
	if by := write("leader-last", leader, followers[0]); by.LeaderWrite == 0 || by.FollowerAck != 0 || by.FollowersAlone != 0 {
		t.Fatalf("the leader's disk held, one follower down: counted %+v; want it by the leader's write", by)
	}
	if by := write("follower-last", followers[0], leader); by.FollowerAck == 0 || by.LeaderWrite != 0 || by.FollowersAlone != 0 {
		t.Fatalf("the follower's disk held: counted %+v; want it by the follower's acknowledgement", by)
	}
}

// TestEtcdEngineMemoryLogBoundedInBytes: the in-memory log is compacted by
// bytes as well as by entries, so large entries cannot pile up in memory
// before the entry-count snapshot threshold is reached.
func TestEtcdEngineMemoryLogBoundedInBytes(t *testing.T) {
	const limit = 8 << 10
	nodes, _ := openEtcdCluster(t, []string{"a"}, func(c *Config) { c.etcdLogBytes = limit })
	n := nodes["a"]
	long := string(bytes.Repeat([]byte("x"), 200))
	for i := range 300 {
		acquire(t, n, fmt.Sprintf("%s-%d", long, i))
	}
	e := n.raft.(*etcdEngine)
	// The apply goroutine compacts after it answers; wait for it to settle.
	testutil.Eventually(t, 10*time.Second, "the memory log was never compacted", func() bool {
		first, _ := e.mem.FirstIndex()
		return first > 100
	})
	first, _ := e.mem.FirstIndex()
	last, _ := e.mem.LastIndex()
	ents, err := e.mem.Entries(first, last+1, math.MaxUint64)
	if err != nil {
		t.Fatal(err)
	}
	var held int
	for _, ent := range ents {
		held += len(ent.Data)
	}
	// TrailingBytes behind the snapshot, SnapshotBytes since it, and one
	// batch of slack on each.
	if held > 3*limit {
		t.Fatalf("the memory log holds %d bytes in %d entries (%d..%d), want at most %d", held, len(ents), first, last, 3*limit)
	}
	if threshold := uint64(16384); last >= threshold {
		t.Fatalf("the log reached the entry threshold (%d entries): the byte bound was not what compacted it", last)
	}
}

// TestEtcdEngineDropsAHeartbeatForAnEarlierLife: a member removed and added
// back with an empty dir keeps its Raft id, so a heartbeat the leader queued
// for its earlier life — carrying the commit index that life had
// acknowledged — can reach the new one. go.etcd.io/raft panics on a commit
// index past its log; the engine must drop it and join as usual.
func TestEtcdEngineDropsAHeartbeatForAnEarlierLife(t *testing.T) {
	nodes, _ := openEtcdCluster(t, []string{"a", "b", "c"}, nil)
	leader := waitLeader(t, nodes)
	if leader == "c" {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		if err := nodes["c"].TransferLeadership(ctx, "a"); err != nil {
			t.Fatalf("transfer: %v", err)
		}
		cancel()
		leader = waitLeader(t, map[string]*Node{"a": nodes["a"], "b": nodes["b"]})
	}
	for i := range 20 {
		acquire(t, nodes[leader], fmt.Sprintf("l%d", i))
	}
	sameState(t, nodes)
	_ = nodes["c"].Shutdown()
	delete(nodes, "c")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := nodes[leader].Remove(ctx, "c"); err != nil {
		t.Fatalf("remove: %v", err)
	}
	st := nodes[leader].Status()
	if st.CommitIndex == 0 {
		t.Fatal("the leader reports no commit index")
	}

	addr := freeRaftAddr(t)
	c, err := Open(Config{ID: "c", DataDir: t.TempDir(), RaftAddr: addr, Engine: EngineEtcd, RaftLogLevel: "off", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Shutdown() })
	c.raft.(*etcdEngine).receive(raftpb.Message{Type: raftpb.MsgHeartbeat, To: raftID("c"), From: raftID(leader),
		Term: st.Term, Commit: st.CommitIndex})
	if err := nodes[leader].Join(ctx, "c", addr); err != nil {
		t.Fatalf("join: %v", err)
	}
	nodes["c"] = c
	acquire(t, nodes[leader], "after-rejoin")
	sameState(t, nodes)
	if err := c.Err(); err != nil {
		t.Fatalf("the re-added member stopped: %v", err)
	}
}

// TestEtcdEngineSnapshotHold: while SnapshotHold answers an error the group
// takes no snapshot (so its log keeps every entry for a restart to replay),
// a requested one fails with the reason, and once the hold ends the
// snapshot that was due is taken after the next batch.
func TestEtcdEngineSnapshotHold(t *testing.T) {
	var held atomic.Bool
	held.Store(true)
	nodes, _ := openEtcdCluster(t, []string{"a"}, func(c *Config) {
		c.SnapshotThreshold = 4
		c.SnapshotInterval = time.Millisecond
		c.SnapshotHold = func() error {
			if held.Load() {
				return errors.New("a split's new group is not stored yet")
			}
			return nil
		}
	})
	n := nodes["a"]
	e := n.raft.(*etcdEngine)
	snapIndex := func() uint64 { return memSnapIndex(t, e) }
	for i := range 12 {
		acquire(t, n, fmt.Sprintf("h%d", i))
	}
	if i := snapIndex(); i != 0 {
		t.Fatalf("a snapshot at %d was taken while held", i)
	}
	if err := n.Raft().Snapshot().Error(); err == nil || !strings.Contains(err.Error(), "not stored yet") {
		t.Fatalf("a requested snapshot while held: %v", err)
	}
	held.Store(false)
	acquire(t, n, "after")
	applied, _ := digest(n)
	testutil.Eventually(t, 10*time.Second, "the due snapshot is taken once the hold ends", func() error {
		if i := snapIndex(); i < applied {
			return fmt.Errorf("snapshot at %d, applied %d", i, applied)
		}
		return nil
	})
}

// memSnapIndex is the index of the snapshot e's in-memory log starts from.
func memSnapIndex(t *testing.T, e *etcdEngine) uint64 {
	t.Helper()
	s, err := e.mem.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	return s.Metadata.Index
}

// A snapshot for --snapshot-threshold waits for the node's snapshot wait,
// drawn from [SnapshotInterval, twice it) so nodes snapshot at different
// times; one asked for (dlock snapshot save) does not wait.
func TestEtcdEngineSnapshotWaitsItsInterval(t *testing.T) {
	nodes, _ := openEtcdCluster(t, []string{"a"}, func(c *Config) {
		c.SnapshotThreshold = 4
		c.SnapshotInterval = time.Hour
	})
	n := nodes["a"]
	e := n.raft.(*etcdEngine)
	snapIndex := func() uint64 { return memSnapIndex(t, e) }
	acquire(t, n, "first")
	start := snapIndex() // the configuration's, taken at once
	for i := range 12 {
		acquire(t, n, fmt.Sprintf("w%d", i))
	}
	if i := snapIndex(); i != start {
		t.Fatalf("a snapshot at %d was taken before the wait passed (the configuration's is at %d)", i, start)
	}
	if err := n.Raft().Snapshot().Error(); err != nil {
		t.Fatalf("a requested snapshot: %v", err)
	}
	if applied, _ := digest(n); snapIndex() != applied {
		t.Fatalf("the requested snapshot is at %d, applied %d", snapIndex(), applied)
	}
	seen := map[time.Duration]bool{}
	for range 50 {
		before := time.Now()
		d := e.nextSnapAt().Sub(before)
		if d < time.Hour || d >= 2*time.Hour+time.Second {
			t.Fatalf("a snapshot wait of %v, want [1h, 2h)", d)
		}
		seen[d.Truncate(time.Second)] = true
	}
	if len(seen) < 10 {
		t.Fatalf("50 waits took %d distinct values: not drawn per snapshot", len(seen))
	}
}

// Every replica answers ConfigurationAt for an applied entry with the
// configuration that entry saw, whatever changed since; an entry from
// before the last snapshot, or not applied yet, is refused.
func TestEtcdEngineConfigurationAt(t *testing.T) {
	// Held snapshots (as a split's source group holds them until the new
	// group is stored) keep the history; the configuration change would
	// otherwise be snapshotted at once.
	var hold atomic.Bool
	hold.Store(true)
	nodes, _ := openEtcdCluster(t, []string{"a", "b", "c"}, func(c *Config) {
		c.SnapshotThreshold, c.TrailingLogs = 1000, 4
		c.SnapshotInterval = time.Millisecond
		c.SnapshotHold = func() error {
			if hold.Load() {
				return errors.New("held")
			}
			return nil
		}
	})
	leader := waitLeader(t, nodes)
	acquire(t, nodes[leader], "before")
	before, _ := digest(nodes[leader])
	victim := "c"
	if leader == victim {
		victim = "b"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := nodes[leader].Remove(ctx, victim); err != nil {
		t.Fatalf("remove: %v", err)
	}
	_ = nodes[victim].Shutdown()
	delete(nodes, victim)
	acquire(t, nodes[leader], "after")
	after, _ := digest(nodes[leader])
	sameState(t, nodes)
	ids := func(cfg hraft.Configuration) string {
		var out []string
		for _, s := range cfg.Servers {
			out = append(out, string(s.ID)+":"+s.Suffrage.String())
		}
		return strings.Join(out, ",")
	}
	for id, n := range nodes {
		cb, err := n.ConfigurationAt(before)
		if err != nil || ids(cb) != "a:Voter,b:Voter,c:Voter" {
			t.Errorf("%s: configuration at %d: %s %v, want all three", id, before, ids(cb), err)
		}
		ca, err := n.ConfigurationAt(after)
		if err != nil || strings.Contains(ids(ca), victim+":") || len(ca.Servers) != 2 {
			t.Errorf("%s: configuration at %d: %s %v, want %s gone", id, after, ids(ca), err, victim)
		}
		if _, err := n.ConfigurationAt(after + 1000); err == nil {
			t.Errorf("%s: a configuration for an entry not applied yet", id)
		}
	}
	// A snapshot past the removal leaves nothing to say about entries
	// before it.
	hold.Store(false)
	if err := nodes[leader].Raft().Snapshot().Error(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	if cfg, err := nodes[leader].ConfigurationAt(before); err == nil {
		t.Errorf("configuration at %d after a snapshot at %d: %s, want an error", before, after, ids(cfg))
	}
	if _, err := nodes[leader].ConfigurationAt(after); err != nil {
		t.Errorf("configuration at the snapshot's own index: %v", err)
	}
}

// A node killed after it snapshotted an applied entry but before it wrote
// the hard state recording that entry's commit (asynchronous storage
// writes allow that order) starts again from its snapshot: the stored
// commit below the snapshot is taken up to it, not refused by Raft (which
// panicked, "state.commit … is out of range", and the node could not
// start any more: seen in a chaos soak after restart-all).
func TestEtcdEngineCommitBehindSnapshotStarts(t *testing.T) {
	nodes, cfgs := openEtcdCluster(t, []string{"a"}, nil)
	n := nodes["a"]
	for i := range 6 {
		acquire(t, n, fmt.Sprintf("c%d", i))
	}
	if err := n.Raft().Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	_ = n.Shutdown()
	dir := filepath.Join(cfgs["a"].DataDir, etcdStoreDir)
	s, err := openMultiStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	gs, err := s.Load(defaultGroup)
	if err != nil {
		t.Fatal(err)
	}
	snap := gs.Snapshot.Metadata.Index
	if snap < 2 || gs.HardState.Commit < snap {
		t.Fatalf("snapshot at %d, commit %d: not the setup", snap, gs.HardState.Commit)
	}
	hs := gs.HardState
	hs.Commit = snap - 1
	if err := s.Save(defaultGroup, hs, nil, raftpb.Snapshot{}, true); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()

	n2, err := Open(cfgs["a"])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n2.Shutdown() })
	waitLeader(t, map[string]*Node{"a": n2})
	acquire(t, n2, "after")
	n2.FSM().Read(func(st *state.State) {
		if !st.GetLock("c5").Held || !st.GetLock("after").Held {
			t.Fatal("a lock granted before the restart, or the one after, is not held")
		}
	})
}

// TestEtcdEngineLinearizableReadCoversWhatAFollowerApplied: a follower
// applies an entry as soon as it learns the commit, which on this engine can
// be before the leader applies it (the leader applies only what is durable
// on its own disk). A linearizable read that begins after that — a watch
// resumed from the revision the follower's stream delivered — must see the
// entry: it waits for the leader to apply up to its commit index, or answers
// a retryable unavailable, never the older state.
func TestEtcdEngineLinearizableReadCoversWhatAFollowerApplied(t *testing.T) {
	nodes, holdWrites := openHoldableEtcdCluster(t)
	leader := waitLeader(t, nodes)
	acquire(t, nodes[leader], "warm-up")
	ln := nodes[leader]
	var follower *Node
	for id, n := range nodes {
		if id != leader {
			follower = n
			break
		}
	}
	unstick := holdWrites(leader)

	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		_, err := ln.Apply(ctx, &command.Envelope{ClientID: "c", RequestID: "ahead", Body: &command.Acquire{Name: "ahead", TTLms: 60000}})
		done <- err
	}()
	held := func(n *Node) (h bool, rev uint64) {
		n.FSM().Read(func(s *state.State) { h, rev = s.GetLock("ahead").Held, s.Revision() })
		return
	}
	// Both followers store the entry, it commits, and a follower applies
	// it while the leader, its own write not yet durable, cannot.
	testutil.Eventually(t, 20*time.Second, "no follower applied the new entry", func() bool {
		h, _ := held(follower)
		return h
	})
	_, seen := held(follower)
	if h, _ := held(ln); h {
		t.Fatal("the leader applied the entry before its own write was durable: the premise of this test changed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	err := ln.LinearizableRead(ctx)
	cancel()
	if err == nil {
		if h, rev := held(ln); !h || rev < seen {
			t.Fatalf("a linearizable read on the leader answered at revision %d, behind revision %d a follower had already applied (and could have streamed to a watcher)", rev, seen)
		}
	} else if apierror.From(err).Code != apierror.Unavailable {
		t.Fatalf("the read while the leader is behind its own commit: %v; want a retryable unavailable", err)
	}
	unstick()
	if err := <-done; err != nil {
		t.Fatalf("the write failed once the leader's disk recovered: %v", err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := ln.LinearizableRead(ctx); err != nil {
		t.Fatalf("a read once the leader caught up: %v", err)
	}
	if h, rev := held(ln); !h || rev < seen {
		t.Fatalf("after the read the leader is at revision %d (lock held %v), behind the follower's %d", rev, h, seen)
	}
}

// A follower refuses a pre-vote while it hears from its leader
// (check-quorum); once the leader's stream has ended, it grants it, so the
// survivors of a killed leader elect a new one without waiting out the
// election timeout. The end of another peer's stream changes nothing.
func TestEtcdEngineLeaderGoneEndsItsLease(t *testing.T) {
	const leaderAddr, otherAddr = "127.0.0.1:7002", "127.0.0.1:7003"
	cases := []struct {
		name  string
		gone  string // whose stream ended ("" none)
		grant bool
	}{
		{name: "the leader is heard from", grant: false},
		{name: "another peer's stream ended", gone: otherAddr, grant: false},
		{name: "the leader's stream ended", gone: leaderAddr, grant: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mem := raft.NewMemoryStorage()
			if err := mem.ApplySnapshot(raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{
				Index: 1, Term: 1, ConfState: raftpb.ConfState{Voters: []uint64{1, 2, 3}}}}); err != nil {
				t.Fatal(err)
			}
			rn, err := raft.NewRawNode(&raft.Config{ID: 1, ElectionTick: 10, HeartbeatTick: 2, Storage: mem,
				MaxSizePerMsg: 1 << 20, MaxInflightMsgs: 16, CheckQuorum: true, PreVote: true,
				Logger: newEtcdRaftLogger(slog.New(slog.DiscardHandler), "error")})
			if err != nil {
				t.Fatal(err)
			}
			e := &etcdEngine{electionTick: 10, book: map[uint64]etcdMember{
				1: {ID: "n1", Addr: "127.0.0.1:7001"}, 2: {ID: "n2", Addr: leaderAddr}, 3: {ID: "n3", Addr: otherAddr}}}
			drain := func() []raftpb.Message {
				var out []raftpb.Message
				for rn.HasReady() {
					rd := rn.Ready()
					if err := mem.Append(rd.Entries); err != nil {
						t.Fatal(err)
					}
					out = append(out, rd.Messages...)
					rn.Advance(rd)
				}
				return out
			}
			if err := rn.Step(raftpb.Message{Type: raftpb.MsgHeartbeat, From: 2, To: 1, Term: 2}); err != nil {
				t.Fatal(err)
			}
			drain()
			if st := rn.BasicStatus(); st.Lead != 2 || st.RaftState != raft.StateFollower {
				t.Fatalf("node 1 is %v led by %d, want a follower of 2", st.RaftState, st.Lead)
			}
			if tc.gone != "" {
				e.leaderGone(rn, tc.gone)
			}
			if err := rn.Step(raftpb.Message{Type: raftpb.MsgPreVote, From: 3, To: 1, Term: 3, LogTerm: 1, Index: 1}); err != nil {
				t.Fatal(err)
			}
			granted := false
			for _, m := range drain() {
				if m.Type == raftpb.MsgPreVoteResp && m.To == 3 && !m.Reject {
					granted = true
				}
			}
			if granted != tc.grant {
				t.Fatalf("pre-vote granted %v, want %v", granted, tc.grant)
			}
		})
	}
}

// A snapshot's write runs beside the applies: while the log store holds it,
// commands are still applied and answered, a requested snapshot waits for
// it, and once it is durable the log is compacted behind it and its phases
// are timed.
func TestEtcdEngineAppliesWhileASnapshotIsWritten(t *testing.T) {
	sink := inmemMetrics(t)
	var armed atomic.Bool
	entered := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	nodes, _ := openEtcdCluster(t, []string{"a"}, func(c *Config) {
		c.SnapshotThreshold = 8
		c.SnapshotInterval = time.Millisecond
		c.TrailingLogs = 1
		c.etcdWriteHook = func(_ uint64, snapshot bool) error {
			if snapshot && armed.Load() {
				once.Do(func() { close(entered) })
				<-release
			}
			return nil
		}
	})
	n := nodes["a"]
	e := n.raft.(*etcdEngine)
	armed.Store(true)
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	for i := 0; ; i++ {
		acquire(t, n, fmt.Sprintf("before-%d", i))
		select {
		case <-entered:
		default:
			if i > 100 {
				t.Fatal("no snapshot write after 100 commands")
			}
			continue
		}
		break
	}
	held := memSnapIndex(t, e)
	first, _ := e.mem.FirstIndex()

	asked := make(chan error, 1)
	go func() { asked <- n.Raft().Snapshot().Error() }()
	for i := range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := n.Apply(ctx, &command.Envelope{ClientID: "c", RequestID: fmt.Sprintf("during-%d", i),
			Body: &command.Acquire{Name: fmt.Sprintf("during-%d", i), TTLms: 60000}})
		cancel()
		if err != nil || resp.Result.Status != command.StatusOK {
			t.Fatalf("a command while a snapshot is written: %v %+v", err, resp)
		}
	}
	select {
	case err := <-asked:
		t.Fatalf("a requested snapshot finished (%v) while the one before it was still being written", err)
	default:
	}
	if f, _ := e.mem.FirstIndex(); f != first {
		t.Fatalf("the log was compacted to %d before the snapshot at %d was durable", f, held)
	}

	close(release)
	released = true
	if err := <-asked; err != nil {
		t.Fatalf("the requested snapshot: %v", err)
	}
	applied, _ := digest(n)
	if got := memSnapIndex(t, e); got < applied {
		t.Fatalf("the requested snapshot is at %d, applied %d", got, applied)
	}
	testutil.Eventually(t, 10*time.Second, "the log was not compacted behind the written snapshot", func() error {
		if f, _ := e.mem.FirstIndex(); f <= held {
			return fmt.Errorf("first index %d, snapshot at %d", f, held)
		}
		return nil
	})
	for _, key := range []string{"dlock.raft.fsm.snapshot", "dlock.raft.snapshot.persist", "dlock.raft.snapshot.create"} {
		if sampled(sink, key) == 0 {
			t.Errorf("no %s timing was reported", key)
		}
	}
}

// A snapshot write that fails, now off the apply goroutine, still stops the
// node, and the dir reopens from the snapshot before it with every
// acknowledged write.
func TestEtcdEngineSnapshotWriteFailureStops(t *testing.T) {
	var armed atomic.Bool
	nodes, cfgs := openEtcdCluster(t, []string{"a"}, func(c *Config) {
		c.SnapshotThreshold = 8
		c.SnapshotInterval = time.Millisecond
		c.etcdWriteHook = func(_ uint64, snapshot bool) error {
			if snapshot && armed.Load() {
				return errors.New("injected snapshot fsync failure")
			}
			return nil
		}
	})
	n := nodes["a"]
	armed.Store(true)
	acked := 0
	for i := 0; i < 100; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := n.Apply(ctx, &command.Envelope{ClientID: "c", RequestID: fmt.Sprintf("r%d", i),
			Body: &command.Acquire{Name: fmt.Sprintf("l%d", i), TTLms: 60000}})
		cancel()
		if err != nil {
			break
		}
		if resp.Result.Status == command.StatusOK {
			acked = i + 1
		}
	}
	select {
	case <-n.Failed():
	case <-time.After(20 * time.Second):
		t.Fatal("the node whose snapshot write failed did not stop")
	}
	if err := n.Err(); err == nil || !strings.Contains(err.Error(), "snapshot") {
		t.Fatalf("the recorded failure: %v", err)
	}
	if acked == 0 {
		t.Fatal("no write was acknowledged before the failure")
	}
	_ = n.Shutdown()
	armed.Store(false)
	r, err := Open(cfgs["a"])
	if err != nil {
		t.Fatalf("reopen after a failed snapshot write: %v", err)
	}
	t.Cleanup(func() { _ = r.Shutdown() })
	waitLeader(t, map[string]*Node{"a": r})
	testutil.Eventually(t, 10*time.Second, "an acknowledged write was lost", func() error {
		var missing string
		r.FSM().Read(func(s *state.State) {
			for i := range acked {
				if !s.GetLock(fmt.Sprintf("l%d", i)).Held {
					missing = fmt.Sprintf("l%d", i)
					return
				}
			}
		})
		if missing != "" {
			return fmt.Errorf("%s is not held", missing)
		}
		return nil
	})
}
