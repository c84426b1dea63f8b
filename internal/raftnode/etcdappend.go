// The etcd engine's storage-append goroutine: one per node, it takes the
// MsgStorageAppend messages of every group the node hosts (go.etcd.io/raft's
// AsyncStorageWrites), writes all that have queued up as one pebble batch
// with at most one fsync, and only then hands each group the responses the
// message carries — a follower's acknowledgement, a vote, and the leader's
// acknowledgement of its own entries. So the Raft goroutines never wait for a
// disk, and adding groups adds no fsyncs.

package raftnode

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	gometrics "github.com/hashicorp/go-metrics/compat"

	"github.com/cockroachdb/pebble/v2"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// appendOwner is the group a MsgStorageAppend came from. The writer calls it
// from its own goroutine; none of the calls may block on the group's Raft
// goroutine (that goroutine may itself be waiting to queue a write).
type appendOwner interface {
	// prepareAppend runs before the batch holding m is written: a write
	// that replaces the log's tail lowers the durable mark first, durably.
	prepareAppend(m *raftpb.Message) error
	// appended runs once m is durable (or, with no fsync needed, written).
	appended(m raftpb.Message)
	// appendFailed runs when the batch holding m failed: the node stops.
	appendFailed(err error)
}

// appendReq is one group's MsgStorageAppend.
type appendReq struct {
	group uint64
	owner appendOwner
	m     raftpb.Message
	// leader says the group's node led it when it made the write, for the
	// log-write timings.
	leader bool
	// at is when the write was queued.
	at time.Time
}

// The go-metrics keys hashicorp/raft times its log writes and applies
// under: the node's /metrics turns them into
// dlock_raft_leader_log_write_seconds, dlock_raft_follower_log_write_seconds
// and dlock_raft_fsm_apply_batch_seconds, so both engines feed them.
var (
	keyLeaderLogWrite   = []string{"raft", "leader", "dispatchLog"}
	keyFollowerLogWrite = []string{"raft", "rpc", "appendEntries", "storeLogs"}
	keyApplyBatch       = []string{"raft", "fsm", "applyBatch"}
)

// appendQueue is the writer's inbox; its bound holds back a Raft goroutine
// that produces writes faster than the disk takes them.
const appendQueue = 1024

// maxAppendBatch is the most messages one batch takes, so one fsync never
// waits behind an unbounded amount of staging.
const maxAppendBatch = 512

// errStoreFailed answers every write after one has failed: what the page
// cache holds after a failed fsync cannot be trusted, so nothing is written
// again (not the same index, not any other) until an operator restarts the
// node.
// errStoreClosed answers writes still queued when the store closes.
var errStoreClosed = errors.New("the raft log is closed")

var errStoreFailed = errors.New("an earlier raft log write failed; this node writes nothing more until it is restarted")

// appendWriter is the per-node storage-append goroutine's state.
type appendWriter struct {
	s     *multiStore
	reqc  chan appendReq
	stopc chan struct{}
	done  chan struct{}
	// batches and syncs count commits and fsyncs (for tests and benchmarks).
	batches, syncs atomic.Uint64
	// The goroutine's own.
	failed error
	// hs is each group's last written hard state: a write that changes only
	// the commit index needs no fsync (pebble's log is written in order, so
	// a later fsync covers it, and losing it loses nothing Raft relies on).
	hs map[uint64]raftpb.HardState
}

// writer returns the store's append goroutine, starting it on first use.
func (s *multiStore) writer() *appendWriter {
	s.wMu.Lock()
	defer s.wMu.Unlock()
	if s.w == nil {
		s.w = &appendWriter{s: s, reqc: make(chan appendReq, appendQueue), stopc: make(chan struct{}),
			done: make(chan struct{}), hs: map[uint64]raftpb.HardState{}}
		if s.wStopped {
			// Closed before first use: a writer that refuses everything.
			close(s.w.done)
		} else {
			go s.w.run()
		}
	}
	return s.w
}

// submitAppend queues group g's MsgStorageAppend. It blocks while the queue
// is full, until stop closes (false: not queued).
func (s *multiStore) submitAppend(g uint64, o appendOwner, m raftpb.Message, leader bool, stop <-chan struct{}) bool {
	w := s.writer()
	// Closed: refuse at once (the queue may still have room, and nothing
	// would ever answer from it).
	select {
	case <-w.done:
		o.appendFailed(errStoreClosed)
		return true
	default:
	}
	select {
	case w.reqc <- appendReq{group: g, owner: o, m: m, leader: leader, at: time.Now()}:
		return true
	case <-w.done:
		o.appendFailed(errStoreClosed)
		return true
	case <-stop:
		return false
	}
}

// stopWriter ends the append goroutine (at Close, after every group stopped).
func (s *multiStore) stopWriter() {
	s.wMu.Lock()
	defer s.wMu.Unlock()
	if !s.wStopped && s.w != nil {
		close(s.w.stopc)
		<-s.w.done
	}
	s.wStopped = true
}

func (w *appendWriter) run() {
	defer close(w.done)
	batch := make([]appendReq, 0, 64)
	for {
		batch = batch[:0]
		select {
		case r := <-w.reqc:
			batch = append(batch, r)
		case <-w.stopc:
			for {
				select {
				case r := <-w.reqc:
					r.owner.appendFailed(errStoreClosed)
				default:
					return
				}
			}
		}
		// Everything that queued while the last fsync ran shares this one.
		batch = w.drain(batch)
		if err := w.write(batch); err != nil {
			if w.failed == nil {
				w.failed = err
			}
			for _, r := range batch {
				r.owner.appendFailed(err)
			}
			continue
		}
		for _, r := range batch {
			r.owner.appended(r.m)
		}
	}
}

// drain adds to batch what is queued, up to maxAppendBatch.
func (w *appendWriter) drain(batch []appendReq) []appendReq {
	for len(batch) < maxAppendBatch {
		select {
		case r := <-w.reqc:
			batch = append(batch, r)
		default:
			return batch
		}
	}
	return batch
}

// write stages a batch of appends, of any groups, and commits them at once.
func (w *appendWriter) write(batch []appendReq) error {
	if w.failed != nil {
		return fmt.Errorf("%w (it was: %v)", errStoreFailed, w.failed)
	}
	start := time.Now()
	b := w.s.db.NewBatch()
	defer b.Close()
	sync := false
	for i := range batch {
		if m := batch[i].m; m.Snapshot != nil && !raft.IsEmptySnap(*m.Snapshot) {
			// A received snapshot and one the node takes itself
			// (SaveSnapshot) must not interleave: the older would win, or
			// one would drop the other's file before its record commits.
			w.s.snapMu.Lock()
			defer w.s.snapMu.Unlock()
			break
		}
	}
	hooked := map[uint64]bool{}
	for i := range batch {
		r := &batch[i]
		if err := r.owner.prepareAppend(&r.m); err != nil {
			return fmt.Errorf("write the durable mark: %w", err)
		}
		hs := raftpb.HardState{Term: r.m.Term, Vote: r.m.Vote, Commit: r.m.Commit}
		var snap raftpb.Snapshot
		if r.m.Snapshot != nil {
			snap = *r.m.Snapshot
		}
		if err := w.s.stage(b, r.group, hs, r.m.Entries, snap); err != nil {
			return err
		}
		if len(r.m.Entries) > 0 || !raft.IsEmptySnap(snap) {
			sync = true
		}
		if !raft.IsEmptyHardState(hs) {
			if old, ok := w.hs[r.group]; !ok || old.Term != hs.Term || old.Vote != hs.Vote {
				sync = true
			}
			w.hs[r.group] = hs
		}
		if w.s.writeHook != nil && !hooked[r.group] {
			hooked[r.group] = true
			if err := w.s.writeHook(r.group, !raft.IsEmptySnap(snap)); err != nil {
				return err
			}
		}
	}
	if b.Empty() {
		return nil
	}
	opt := pebble.NoSync
	if sync {
		opt = pebble.Sync
	}
	if err := commitBatch(b, opt); err != nil {
		return fmt.Errorf("write raft log: %w", err)
	}
	w.batches.Add(1)
	if sync {
		w.syncs.Add(1)
		// Only durable writes are timed: those are what a slow disk slows.
		leader, follower := false, false
		for i := range batch {
			leader = leader || batch[i].leader
			follower = follower || !batch[i].leader
		}
		if leader {
			gometrics.MeasureSince(keyLeaderLogWrite, start)
		}
		if follower {
			gometrics.MeasureSince(keyFollowerLogWrite, start)
		}
	}
	return nil
}

// writerState is embedded in multiStore.
type writerState struct {
	wMu      sync.Mutex
	w        *appendWriter
	wStopped bool
}
