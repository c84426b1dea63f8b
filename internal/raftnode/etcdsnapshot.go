package raftnode

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	gometrics "github.com/hashicorp/go-metrics/compat"
	hraft "github.com/hashicorp/raft"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// A snapshot the group takes itself: encoded on the apply goroutine, which
// owns the state machine, then written by a goroutine of its own, so the
// write's fsyncs do not hold up the applies behind it (hashicorp/raft
// persists its snapshots beside its FSM in the same way). At most one is
// being written at a time; the log is compacted once it is durable.

// snapWrite is one snapshot on its way to the log store.
type snapWrite struct {
	snap raftpb.Snapshot
	// applyBytes is the apply goroutine's applyBytes at the snapshot.
	applyBytes uint64
	start      time.Time // when the encode began
	f          *efuture  // nil for one the group took by itself
	err        error
}

// takeSnapshot snapshots the state machine at the applied index and starts
// writing it; snapshotWritten finishes the work. A request while another
// snapshot is being written waits for that one, then is taken.
func (e *etcdEngine) takeSnapshot(f *efuture) {
	if e.writing != nil {
		if f != nil {
			e.asked = append(e.asked, f)
		} else {
			e.snapDue = true
		}
		return
	}
	finish := func(err error) {
		if f != nil {
			f.finish(nil, err)
		}
	}
	if e.applied == 0 {
		finish(errors.New("nothing to snapshot yet"))
		return
	}
	if e.applied == e.snapIndex {
		if f != nil {
			s, _ := e.mem.Snapshot()
			f.meta = &hraft.SnapshotMeta{Index: s.Metadata.Index, Term: s.Metadata.Term}
			f.snap = s.Data
		}
		finish(nil)
		return
	}
	if hold := e.cfg.SnapshotHold; hold != nil {
		// Held: the log keeps every entry since the last snapshot, and an
		// automatic snapshot is tried again after the next applied batch.
		if err := hold(); err != nil {
			e.snapDue = f == nil
			finish(fmt.Errorf("snapshot held back: %w", err))
			return
		}
	}
	e.snapDue = false
	start := time.Now()
	fs, err := e.fsm.Snapshot()
	if err != nil {
		finish(err)
		return
	}
	gometrics.MeasureSince(keyFSMSnapshot, start)
	var sink memSink
	if err := fs.Persist(&sink); err != nil {
		finish(err)
		return
	}
	cs := e.applyConf
	snap, err := e.mem.CreateSnapshot(e.applied, &cs, encodeSnapData(e.applyBook, sink.Bytes()))
	if errors.Is(err, raft.ErrSnapOutOfDate) {
		finish(nil)
		return
	}
	if err != nil {
		finish(err)
		return
	}
	w := &snapWrite{snap: snap, applyBytes: e.applyBytes, start: start, f: f}
	e.writing = w
	go func() {
		persist := time.Now()
		w.err = e.store.SaveSnapshot(e.group, w.snap)
		gometrics.MeasureSince(keySnapPersist, persist)
		e.snapWritten <- w // buffered for the one write in flight
	}()
}

// snapshotWritten, on the apply goroutine, finishes a snapshot once its
// write returned: it compacts the log behind it and takes whatever came
// due meanwhile.
func (e *etcdEngine) snapshotWritten(w *snapWrite) {
	e.writing = nil
	if w.err != nil {
		e.failed.Store(true)
		e.cfg.OnFail(fmt.Errorf("raft snapshot write failed: %w", w.err))
		e.finishAsked(w.err)
		if w.f != nil {
			w.f.finish(nil, w.err)
		}
		return
	}
	gometrics.MeasureSince(keySnapCreate, w.start)
	// A snapshot received from the leader meanwhile may have overtaken
	// this one; its install already reset what follows.
	if at := w.snap.Metadata.Index; at > e.snapIndex {
		e.snapIndex, e.snapBytes, e.snapNext = at, w.applyBytes, e.nextSnapAt()
		e.hist.trim(e.snapIndex)
		if c := e.compactTo(at, w.applyBytes); c > 0 {
			if err := e.mem.Compact(c); err != nil && !errors.Is(err, raft.ErrCompacted) {
				e.log.Warn("compacting the in-memory raft log failed", "err", err)
			}
			i := 0
			for i < len(e.sizeMarks) && e.sizeMarks[i].index <= c {
				i++
			}
			e.sizeMarks = append(e.sizeMarks[:0], e.sizeMarks[i:]...)
		}
	}
	if w.f != nil {
		w.f.meta = &hraft.SnapshotMeta{Index: w.snap.Metadata.Index, Term: w.snap.Metadata.Term}
		w.f.snap = w.snap.Data
		w.f.finish(nil, nil)
	}
	asked := e.asked
	e.asked = nil
	if e.snapDue {
		e.takeSnapshot(nil)
	}
	for _, f := range asked {
		e.takeSnapshot(f)
	}
}

// finishAsked answers every requested snapshot still waiting with err.
func (e *etcdEngine) finishAsked(err error) {
	for _, f := range e.asked {
		f.finish(nil, err)
	}
	e.asked = nil
}

// endSnapshots, as the apply goroutine ends, waits out a snapshot being
// written (the log store must not close under it) and answers the
// requests still waiting.
func (e *etcdEngine) endSnapshots() {
	asked := e.asked
	e.asked, e.snapDue = nil, false
	if e.writing != nil {
		e.snapshotWritten(<-e.snapWritten)
	}
	e.asked = asked
	e.finishAsked(hraft.ErrRaftShutdown)
}

// compactTo is how far the memory log may be compacted behind a snapshot at
// index at, taken when applyBytes entry bytes were applied: keep Trailing
// entries for followers a little behind, but no more than TrailingBytes of
// them.
func (e *etcdEngine) compactTo(at, applyBytes uint64) uint64 {
	var c uint64
	if at > e.cfg.Trailing {
		c = at - e.cfg.Trailing
	}
	limit := e.cfg.TrailingBytes
	if limit == 0 {
		limit = defaultLogBytes
	}
	for _, m := range e.sizeMarks {
		if m.index > at || (m.index > c && applyBytes-m.bytes <= limit) {
			break
		}
		c = max(c, m.index)
	}
	return min(c, at)
}

// nextSnapAt is when a snapshot for Threshold may next be taken.
func (e *etcdEngine) nextSnapAt() time.Time {
	if e.cfg.Interval <= 0 {
		return time.Time{}
	}
	return time.Now().Add(e.cfg.Interval + rand.N(e.cfg.Interval))
}

// memSink collects an FSM snapshot in memory (raft.SnapshotSink).
type memSink struct{ bytes.Buffer }

func (*memSink) ID() string    { return "etcd" }
func (*memSink) Cancel() error { return nil }
func (*memSink) Close() error  { return nil }
