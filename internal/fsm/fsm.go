// Package fsm adapts dlock's pure state machine to hashicorp/raft: it decodes
// log entries, dispatches them to the state, hands the events they produced to
// observers, and takes and restores snapshots. Apply never blocks, reads no
// clock and draws no random numbers.
package fsm

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"

	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/state"
)

// Observer is told about every applied change. Both methods run on Raft's
// apply goroutine with the FSM locked: they must be quick and must never block
// or call back into the FSM.
type Observer interface {
	// Applied receives the events of one log entry, in order.
	Applied(index uint64, events []state.Event)
	// Restored says the whole state was replaced from a snapshot. The state is
	// passed because the FSM is locked: observers must not call Read.
	Restored(s *state.State)
}

// Response is the answer to one command: what Apply returns for an entry of
// one command (raft's future.Response()); an entry of several packed commands
// (command.TypePacked) returns a []Response, one per command in order.
type Response struct {
	// Index is the log entry that carried the command.
	Index uint64
	// Seq names the command (command.Seq); a grant made by this very command
	// has Result.Seq == Seq.
	Seq    uint64
	Result command.Result
	// Endorsement is not the state machine's: it is what the leader's
	// service added to its answer to a write a follower forwarded
	// (raftnode.Endorser), empty everywhere else.
	Endorsement string
}

// ApplyEntry applies one command log entry to st: its lone command, or each
// command packed into it, in order. It is the FSM's apply and the offline
// replay's (forensics), so both read a log the same way. A decoding error
// leaves st unchanged.
func ApplyEntry(st *state.State, l *raft.Log) (resps []Response, packed bool, err error) {
	envs, packed, err := command.DecodeEntry(l.Data)
	if err != nil {
		return nil, packed, err
	}
	resps = make([]Response, len(envs))
	for j, env := range envs {
		if env.ClockTerm != 0 && env.ClockTerm != l.Term {
			// Stamped by a leader of an earlier term, appended only in this
			// one: its lease clock would count time between the terms that
			// no leader measured (command.Envelope.ClockTerm). The command
			// still applies; the lease clock just does not move with it.
			env.Clock = 0
		}
		seq := command.Seq(l.Index, j)
		resps[j] = Response{Index: l.Index, Seq: seq, Result: st.ApplyAt(l.Index, seq, env)}
	}
	return resps, packed, nil
}

// FSM is the raft.FSM (and raft.BatchingFSM) of a dlock node.
type FSM struct {
	logger *slog.Logger

	mu        sync.RWMutex
	st        *state.State
	observers []Observer

	applied    atomic.Uint64
	checkpoint atomic.Pointer[Checkpoint] // the last one logged
	notifyMu   sync.Mutex
	notify     chan struct{} // closed and replaced whenever applied advances
}

// New returns an FSM over an empty state.
func New(logger *slog.Logger) *FSM {
	if logger == nil {
		logger = slog.Default()
	}
	return &FSM{logger: logger, st: state.New(), notify: make(chan struct{})}
}

// AddObserver registers an observer. Call before Raft starts.
func (f *FSM) AddObserver(o Observer) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.observers = append(f.observers, o)
}

// Apply applies one entry.
func (f *FSM) Apply(l *raft.Log) interface{} {
	return f.ApplyBatch([]*raft.Log{l})[0]
}

// ApplyBatch applies consecutive committed entries under one lock acquisition.
func (f *FSM) ApplyBatch(logs []*raft.Log) []interface{} {
	out := make([]interface{}, len(logs))
	f.mu.Lock()
	for i, l := range logs {
		if l.Type != raft.LogCommand {
			f.st.SetIndex(l.Index)
			continue
		}
		resps, packed, err := ApplyEntry(f.st, l)
		if err != nil {
			// Skipping an entry would silently fork this replica from the others.
			// Stop instead: this node must be upgraded or its data repaired.
			f.mu.Unlock()
			panic(fmt.Sprintf("dlock fsm: cannot apply log index %d: %v", l.Index, err))
		}
		if packed {
			out[i] = resps
		} else {
			out[i] = &resps[0]
		}
		if l.Index%CheckpointEvery == 0 {
			f.logCheckpoint(l)
		}
		if ev := f.st.TakeEvents(); len(ev) > 0 {
			for _, o := range f.observers {
				o.Applied(l.Index, ev)
			}
		}
	}
	if n := len(logs); n > 0 {
		f.applied.Store(logs[n-1].Index)
	}
	f.mu.Unlock()
	f.wake()
	return out
}

// CheckpointEvery is how often (in log indexes) the FSM logs a checkpoint of
// its state. Replicas that applied the same log log the same checkpoint at
// the same index, so comparing node logs finds a divergence and narrows it to
// CheckpointEvery entries (docs/reliability.md, "Finding a divergence"). The
// digest covers the whole state (state.Digest: every lock, waiter, lease,
// member, key, ACL token and dedup entry), kept up to date as entries apply,
// so a checkpoint costs the same with a million locks as with none.
const CheckpointEvery = 256

// Checkpoint is what the FSM logged at one checkpoint index.
type Checkpoint struct {
	Index, Term uint64
	// Digest is state.Digest after the entry at Index.
	Digest uint64
}

func (f *FSM) logCheckpoint(l *raft.Log) {
	cp := &Checkpoint{Index: l.Index, Term: l.Term, Digest: f.st.Digest()}
	f.checkpoint.Store(cp)
	f.logger.Info("fsm checkpoint", "index", l.Index, "term", l.Term,
		"revision", f.st.Revision(), "last_token", f.st.LastToken(), "digest", fmt.Sprintf("%016x", cp.Digest))
}

// LastCheckpoint is the newest checkpoint this FSM logged since it started
// (ok false before the first). Nodes that report the same index must report
// the same digest, so comparing it across nodes is a cheap divergence check.
func (f *FSM) LastCheckpoint() (cp Checkpoint, ok bool) {
	if p := f.checkpoint.Load(); p != nil {
		return *p, true
	}
	return Checkpoint{}, false
}

func (f *FSM) wake() {
	f.notifyMu.Lock()
	close(f.notify)
	f.notify = make(chan struct{})
	f.notifyMu.Unlock()
}

// AppliedIndex is the index of the last applied entry.
func (f *FSM) AppliedIndex() uint64 { return f.applied.Load() }

// WaitApplied blocks until the entry at index has been applied or ctx ends.
func (f *FSM) WaitApplied(ctx context.Context, index uint64) error {
	for {
		f.notifyMu.Lock()
		ch := f.notify
		f.notifyMu.Unlock()
		if f.applied.Load() >= index {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("waiting for log index %d to be applied here: %w", index, ctx.Err())
		}
	}
}

// Read runs fn with the state locked for reading. fn must not keep the pointer.
func (f *FSM) Read(fn func(*state.State)) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	fn(f.st)
}

// Snapshot encodes the state now; Persist only writes the bytes, so Apply can
// continue while the snapshot is written to disk.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.RLock()
	b := f.st.Snapshot()
	f.mu.RUnlock()
	return snapshot(b), nil
}

// Restore replaces the whole state with a snapshot and tells observers.
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return fmt.Errorf("read snapshot: %w", err)
	}
	st, err := state.Restore(b)
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.st = st
	st.TakeEvents()
	f.applied.Store(st.Index())
	for _, o := range f.observers {
		o.Restored(st)
	}
	f.mu.Unlock()
	f.wake()
	f.logger.Info("state restored from snapshot", "index", st.Index(), "revision", st.Revision())
	return nil
}

type snapshot []byte

func (s snapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(s); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("write snapshot: %w", err)
	}
	return sink.Close()
}

func (s snapshot) Release() {}

var _ raft.BatchingFSM = (*FSM)(nil)
