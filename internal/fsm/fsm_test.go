package fsm_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/fsm"
	"github.com/dlock/dlock/internal/state"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func lease(n byte) command.LeaseID {
	var id command.LeaseID
	id[0], id[15] = 0x5A, n
	return id
}

const ts0 = 1_700_000_000_000

func cmdLog(index uint64, client string, b command.Body) *raft.Log {
	return &raft.Log{Index: index, Term: 1, Type: raft.LogCommand,
		Data: command.Encode(&command.Envelope{TS: ts0 + int64(index), ClientID: client, Body: b})}
}

// recorder is an Observer that keeps what it is told.
type recorder struct {
	mu       sync.Mutex
	applied  []appliedCall
	restored int
	// restoredSnap is the snapshot of the state passed to Restored.
	restoredSnap []byte
}

type appliedCall struct {
	index  uint64
	events []state.Event
}

func (r *recorder) Applied(index uint64, ev []state.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.applied = append(r.applied, appliedCall{index, append([]state.Event(nil), ev...)})
}

func (r *recorder) Restored(s *state.State) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.restored++
	r.restoredSnap = s.Snapshot()
}

// within bounds a receive that a broken FSM would block for ever; it is a
// guard, not a delay: correct code answers at once.
func within[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("timed out: a waiter was never woken")
		panic("unreachable")
	}
}

func guardCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func stateBytes(f *fsm.FSM) []byte {
	var b []byte
	f.Read(func(s *state.State) { b = s.Snapshot() })
	return b
}

// script is a small log exercising grants, queues, hand-offs and a refusal.
func script() []*raft.Log {
	return []*raft.Log{
		{Index: 1, Term: 1, Type: raft.LogConfiguration},
		cmdLog(2, "n1", &command.RegisterMember{ID: "n1", RaftAddr: "r1", APIAddr: "a1"}),
		cmdLog(3, "c1", &command.Acquire{Name: "a", LeaseID: lease(1), TTLms: 10_000}),
		cmdLog(4, "c2", &command.Acquire{Name: "a", LeaseID: lease(2), TTLms: 10_000}), // refused: no events
		cmdLog(5, "c2", &command.Acquire{Name: "a", LeaseID: lease(3), TTLms: 10_000, WaitMs: 5_000}),
		{Index: 6, Term: 2, Type: raft.LogNoop},
		cmdLog(7, "c1", &command.Release{Name: "a", LeaseID: lease(1), Token: 1}),
		cmdLog(8, "c3", &command.CreateSession{LeaseID: lease(4), TTLms: 20_000}),
		{Index: 9, Term: 2, Type: raft.LogBarrier},
	}
}

func TestApplyReturnsResponseWithIndex(t *testing.T) {
	f := fsm.New(quietLogger())
	for _, l := range script() {
		out := f.Apply(l)
		if l.Type != raft.LogCommand {
			if out != nil {
				t.Fatalf("index %d (%v): response %v, want nil", l.Index, l.Type, out)
			}
		} else {
			resp, ok := out.(*fsm.Response)
			if !ok {
				t.Fatalf("index %d: response %T", l.Index, out)
			}
			if resp.Index != l.Index {
				t.Fatalf("response index %d, want %d", resp.Index, l.Index)
			}
			switch l.Index {
			case 3:
				if resp.Result.Status != command.StatusOK || resp.Result.Token != 1 {
					t.Fatalf("acquire %+v", resp.Result)
				}
			case 4:
				if resp.Result.Status != command.StatusLockHeld {
					t.Fatalf("refusal %+v", resp.Result)
				}
			case 5:
				if resp.Result.Status != command.StatusQueued || resp.Result.Seq != 5 {
					t.Fatalf("queued %+v", resp.Result)
				}
			}
		}
		if f.AppliedIndex() != l.Index {
			t.Fatalf("applied index %d after %d", f.AppliedIndex(), l.Index)
		}
		f.Read(func(s *state.State) {
			if s.Index() != l.Index {
				t.Fatalf("state index %d after %d", s.Index(), l.Index)
			}
		})
	}
	f.Read(func(s *state.State) {
		if h := s.LockHolder("a"); h.Holder != lease(3) || h.Token != 2 {
			t.Fatalf("holder %+v", h)
		}
	})
}

func TestNonCommandEntriesOnlyAdvanceIndex(t *testing.T) {
	f := fsm.New(nil) // nil logger is allowed
	rec := &recorder{}
	f.AddObserver(rec)
	before := stateBytes(f)
	for i, typ := range []raft.LogType{raft.LogConfiguration, raft.LogNoop, raft.LogBarrier, raft.LogAddPeerDeprecated, raft.LogRemovePeerDeprecated} {
		idx := uint64(10 * (i + 1))
		if out := f.Apply(&raft.Log{Index: idx, Type: typ, Data: []byte("not a command")}); out != nil {
			t.Fatalf("%v: response %v", typ, out)
		}
		if f.AppliedIndex() != idx {
			t.Fatalf("%v: applied %d", typ, f.AppliedIndex())
		}
	}
	var rev uint64
	var idx uint64
	f.Read(func(s *state.State) { rev, idx = s.Revision(), s.Index() })
	if rev != 0 || idx != 50 {
		t.Fatalf("revision %d index %d", rev, idx)
	}
	// Only the index in the header moved.
	after := stateBytes(f)
	ref, _ := state.Restore(before)
	ref.SetIndex(50)
	if !bytes.Equal(after, ref.Snapshot()) {
		t.Fatal("non-command entries changed the state")
	}
	if len(rec.applied) != 0 {
		t.Fatalf("observer told about non-commands: %+v", rec.applied)
	}
}

func TestApplyBatchMatchesApplyAndNotifiesObserversInOrder(t *testing.T) {
	logs := script()
	single := fsm.New(quietLogger())
	recS := &recorder{}
	single.AddObserver(recS)
	var singleOut []interface{}
	for _, l := range logs {
		singleOut = append(singleOut, single.Apply(l))
	}

	batch := fsm.New(quietLogger())
	rec1, rec2 := &recorder{}, &recorder{}
	batch.AddObserver(rec1)
	batch.AddObserver(rec2)
	out := append(batch.ApplyBatch(logs[:4]), batch.ApplyBatch(logs[4:])...)
	if len(out) != len(logs) {
		t.Fatalf("%d responses for %d entries", len(out), len(logs))
	}
	if !reflect.DeepEqual(out, singleOut) {
		t.Fatalf("batch responses differ from single applies:\n%+v\n%+v", out, singleOut)
	}
	if !bytes.Equal(stateBytes(batch), stateBytes(single)) {
		t.Fatal("batch and single apply give different states")
	}
	if batch.AppliedIndex() != 9 {
		t.Fatalf("applied %d", batch.AppliedIndex())
	}
	if got := batch.ApplyBatch(nil); len(got) != 0 || batch.AppliedIndex() != 9 {
		t.Fatal("empty batch changed something")
	}

	// Every observer sees every entry that produced events, in log order, with
	// exactly the events the state produced.
	ref := state.New()
	var want []appliedCall
	for _, l := range logs {
		if l.Type != raft.LogCommand {
			ref.SetIndex(l.Index)
			continue
		}
		e, _ := command.Decode(l.Data)
		ref.Apply(l.Index, e)
		if ev := ref.TakeEvents(); len(ev) > 0 {
			want = append(want, appliedCall{l.Index, ev})
		}
	}
	for i, rec := range []*recorder{rec1, rec2, recS} {
		if !reflect.DeepEqual(rec.applied, want) {
			t.Fatalf("observer %d saw\n%+v\nwant\n%+v", i, rec.applied, want)
		}
	}
	var idx []uint64
	for _, c := range want {
		idx = append(idx, c.index)
	}
	// RegisterMember (2) changes state but emits no event; 4 was refused.
	if !reflect.DeepEqual(idx, []uint64{3, 5, 7, 8}) {
		t.Fatalf("observed indexes %v", idx)
	}
}

func TestApplyPanicsOnUndecodableEntryAndReleasesLock(t *testing.T) {
	for _, data := range [][]byte{nil, {0xff, 1}, {byte(command.TypeAcquire), command.Version + 1}, append(command.Encode(&command.Envelope{Body: &command.KeepAlive{}}), 0)} {
		f := fsm.New(quietLogger())
		f.Apply(cmdLog(1, "c", &command.Acquire{Name: "a", LeaseID: lease(1), TTLms: 1000}))
		before := stateBytes(f)
		var p any
		func() {
			defer func() { p = recover() }()
			f.ApplyBatch([]*raft.Log{{Index: 2, Type: raft.LogCommand, Data: data}})
		}()
		if p == nil {
			t.Fatalf("undecodable entry %x applied silently", data)
		}
		// The FSM is not left locked, and nothing was half-applied.
		done := make(chan []byte)
		go func() { done <- stateBytes(f) }()
		if got := within(t, done); !bytes.Equal(got, before) {
			t.Fatal("state changed by an undecodable entry")
		}
		if f.AppliedIndex() != 1 {
			t.Fatalf("applied index moved to %d", f.AppliedIndex())
		}
	}
}

// fakeSink is an in-memory raft.SnapshotSink.
type fakeSink struct {
	bytes.Buffer
	closed, cancelled int
	failWrite         bool
}

func (s *fakeSink) Write(p []byte) (int, error) {
	if s.failWrite {
		return 0, errors.New("disk full")
	}
	return s.Buffer.Write(p)
}
func (s *fakeSink) ID() string    { return "fake" }
func (s *fakeSink) Close() error  { s.closed++; return nil }
func (s *fakeSink) Cancel() error { s.cancelled++; return nil }

var _ raft.SnapshotSink = (*fakeSink)(nil)

type trackingReader struct {
	io.Reader
	closed int
}

func (r *trackingReader) Close() error { r.closed++; return nil }

func TestSnapshotPersistRestore(t *testing.T) {
	f := fsm.New(quietLogger())
	for _, l := range script() {
		f.Apply(l)
	}
	want := stateBytes(f)
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	// Applying after Snapshot must not change what Persist writes.
	f.Apply(cmdLog(10, "c9", &command.Acquire{Name: "later", LeaseID: lease(9), TTLms: 1000}))
	sink := &fakeSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	snap.Release()
	if sink.closed != 1 || sink.cancelled != 0 {
		t.Fatalf("sink closed %d cancelled %d", sink.closed, sink.cancelled)
	}
	if !bytes.Equal(sink.Bytes(), want) {
		t.Fatal("persisted bytes are not the state at snapshot time")
	}

	g := fsm.New(quietLogger())
	rec := &recorder{}
	g.AddObserver(rec)
	g.Apply(cmdLog(1, "x", &command.Acquire{Name: "old", LeaseID: lease(50), TTLms: 1000})) // replaced by the restore
	rc := &trackingReader{Reader: bytes.NewReader(sink.Bytes())}
	if err := g.Restore(rc); err != nil {
		t.Fatal(err)
	}
	if rc.closed != 1 {
		t.Fatalf("snapshot reader closed %d times", rc.closed)
	}
	if rec.restored != 1 || len(rec.applied) != 1 {
		t.Fatalf("observer: restored %d, applied %d", rec.restored, len(rec.applied))
	}
	if !bytes.Equal(stateBytes(g), want) {
		t.Fatal("restored state differs")
	}
	if !bytes.Equal(rec.restoredSnap, want) {
		t.Fatal("Restored was not handed the restored state")
	}
	if g.AppliedIndex() != 9 {
		t.Fatalf("applied index after restore %d", g.AppliedIndex())
	}
	if err := g.WaitApplied(guardCtx(t), 9); err != nil {
		t.Fatal(err)
	}
	// Both continue identically.
	next := cmdLog(10, "c9", &command.Acquire{Name: "later", LeaseID: lease(9), TTLms: 1000})
	g.Apply(next)
	if !bytes.Equal(stateBytes(g), stateBytes(f)) {
		t.Fatal("restored FSM diverges from the original")
	}
}

func TestPersistWriteFailureCancelsSink(t *testing.T) {
	f := fsm.New(quietLogger())
	snap, _ := f.Snapshot()
	sink := &fakeSink{failWrite: true}
	if err := snap.Persist(sink); err == nil {
		t.Fatal("Persist ignored a write error")
	}
	if sink.cancelled != 1 || sink.closed != 0 {
		t.Fatalf("sink closed %d cancelled %d", sink.closed, sink.cancelled)
	}
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("io error") }

func TestRestoreRejectsCorruptSnapshotAndKeepsState(t *testing.T) {
	f := fsm.New(quietLogger())
	rec := &recorder{}
	f.AddObserver(rec)
	for _, l := range script() {
		f.Apply(l)
	}
	before := stateBytes(f)
	good := append([]byte(nil), before...)
	for name, r := range map[string]io.Reader{
		"empty":     bytes.NewReader(nil),
		"garbage":   bytes.NewReader([]byte("garbage")),
		"truncated": bytes.NewReader(good[:len(good)/2]),
		"trailing":  bytes.NewReader(append(append([]byte(nil), good...), 1)),
		"io error":  failingReader{},
	} {
		rc := &trackingReader{Reader: r}
		if err := f.Restore(rc); err == nil {
			t.Fatalf("%s: Restore succeeded", name)
		}
		if rc.closed != 1 {
			t.Fatalf("%s: reader closed %d times", name, rc.closed)
		}
		if !bytes.Equal(stateBytes(f), before) || f.AppliedIndex() != 9 || rec.restored != 0 {
			t.Fatalf("%s: failed restore changed the FSM", name)
		}
	}
}

func TestWaitApplied(t *testing.T) {
	f := fsm.New(quietLogger())
	if err := f.WaitApplied(guardCtx(t), 0); err != nil {
		t.Fatal(err)
	}
	ctx := guardCtx(t)
	type res struct {
		idx uint64
		err error
	}
	done := make(chan res, 10)
	for _, idx := range []uint64{2, 3, 5} {
		go func() { done <- res{idx, f.WaitApplied(ctx, idx)} }()
	}
	f.Apply(cmdLog(1, "c", &command.RegisterMember{ID: "n"}))
	select {
	case r := <-done:
		t.Fatalf("WaitApplied(%d) returned at index 1: %v", r.idx, r.err)
	default:
	}
	// A batch that jumps past several waiters wakes all of them.
	f.ApplyBatch([]*raft.Log{{Index: 2, Type: raft.LogNoop}, cmdLog(3, "c", &command.RegisterMember{ID: "m"})})
	got := map[uint64]bool{}
	for range 2 {
		r := within(t, done)
		if r.err != nil || r.idx == 5 {
			t.Fatalf("WaitApplied(%d) = %v at index 3", r.idx, r.err)
		}
		got[r.idx] = true
	}
	if !got[2] || !got[3] {
		t.Fatalf("woken: %v", got)
	}
	select {
	case r := <-done:
		t.Fatalf("WaitApplied(%d) returned early: %v", r.idx, r.err)
	default:
	}
	// A restore also counts.
	src := fsm.New(quietLogger())
	src.Apply(&raft.Log{Index: 7, Type: raft.LogConfiguration})
	if err := f.Restore(io.NopCloser(bytes.NewReader(stateBytes(src)))); err != nil {
		t.Fatal(err)
	}
	if r := within(t, done); r.idx != 5 || r.err != nil {
		t.Fatalf("after restore: %+v", r)
	}
}

func TestWaitAppliedHonoursContext(t *testing.T) {
	f := fsm.New(quietLogger())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := f.WaitApplied(ctx, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
	// Already applied wins over a cancelled context.
	f.Apply(&raft.Log{Index: 1, Type: raft.LogNoop})
	if err := f.WaitApplied(ctx, 1); err != nil {
		t.Fatalf("already applied: %v", err)
	}

	ctx, cancel = context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- f.WaitApplied(ctx, 100) }()
	f.Apply(&raft.Log{Index: 2, Type: raft.LogNoop}) // wakes it, not enough
	cancel()
	if err := within(t, errc); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancel while waiting: %v", err)
	}

	dctx, dcancel := context.WithDeadline(context.Background(), time.Unix(0, 0))
	defer dcancel()
	if err := f.WaitApplied(dctx, 100); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("deadline: %v", err)
	}
}

func TestConcurrentReadsWaitsAndApplies(t *testing.T) {
	f := fsm.New(quietLogger())
	const n = 300
	ctx := guardCtx(t)
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := uint64(1); i <= n; i += 7 {
				if err := f.WaitApplied(ctx, i); err != nil {
					t.Error(err)
					return
				}
				f.Read(func(s *state.State) {
					if s.Index() < i {
						t.Errorf("state index %d < waited %d", s.Index(), i)
					}
					s.ListLocks("", "", 10)
				})
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 20; i++ {
			if snap, err := f.Snapshot(); err == nil {
				snap.Persist(&fakeSink{})
			}
		}
	}()
	for i := uint64(1); i <= n; i++ {
		f.Apply(cmdLog(i, fmt.Sprintf("c%d", i%5), &command.Acquire{Name: fmt.Sprintf("l%d", i%13), LeaseID: lease(byte(i)), TTLms: 1000, WaitMs: int64(i % 2 * 1000)}))
	}
	wg.Wait()
}

// TestWithRealRaft runs a single in-memory Raft node over the FSM: commands go
// through raft.Apply, responses come back as *fsm.Response, and a Raft
// snapshot restores into a fresh FSM with the same state.
func TestWithRealRaft(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Raft node")
	}
	f, r, snaps, rec := startRaft(t)
	var lastIdx uint64
	for i := 0; i < 20; i++ {
		env := (&command.Envelope{ClientID: fmt.Sprintf("c%d", i%3), Body: &command.Acquire{Name: "job", TTLms: 5000, WaitMs: 1000}}).Stamped(ts0 + int64(i))
		fut := r.Apply(command.Encode(env), 5*time.Second)
		if err := fut.Error(); err != nil {
			t.Fatal(err)
		}
		resp, ok := fut.Response().(*fsm.Response)
		if !ok || resp.Index != fut.Index() {
			t.Fatalf("response %#v for index %d", fut.Response(), fut.Index())
		}
		if s := resp.Result.Status; s != command.StatusOK && s != command.StatusQueued {
			t.Fatalf("status %v", s)
		}
		lastIdx = fut.Index()
	}
	if err := f.WaitApplied(guardCtx(t), lastIdx); err != nil {
		t.Fatal(err)
	}
	if f.AppliedIndex() < lastIdx {
		t.Fatalf("applied %d < %d", f.AppliedIndex(), lastIdx)
	}
	if err := r.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	list, err := snaps.List()
	if err != nil || len(list) == 0 {
		t.Fatalf("snapshots %v %v", list, err)
	}
	_, rc, err := snaps.Open(list[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	g := fsm.New(quietLogger())
	if err := g.Restore(rc); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(stateBytes(g), stateBytes(f)) {
		t.Fatal("state restored from the Raft snapshot differs")
	}
	if len(rec.applied) == 0 {
		t.Fatal("observer saw nothing")
	}
}

func startRaft(t *testing.T) (*fsm.FSM, *raft.Raft, *raft.InmemSnapshotStore, *recorder) {
	t.Helper()
	conf := raft.DefaultConfig()
	conf.LocalID = "n1"
	conf.HeartbeatTimeout = 50 * time.Millisecond
	conf.ElectionTimeout = 50 * time.Millisecond
	conf.LeaderLeaseTimeout = 50 * time.Millisecond
	conf.CommitTimeout = 5 * time.Millisecond
	conf.Logger = hclog.NewNullLogger()
	f := fsm.New(quietLogger())
	rec := &recorder{}
	f.AddObserver(rec)
	store := raft.NewInmemStore()
	snaps := raft.NewInmemSnapshotStore()
	_, trans := raft.NewInmemTransport("n1")
	r, err := raft.NewRaft(conf, f, store, store, snaps, trans)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Shutdown().Error() })
	if err := r.BootstrapCluster(raft.Configuration{Servers: []raft.Server{{ID: "n1", Address: trans.LocalAddr()}}}).Error(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.LeaderCh():
	case <-time.After(10 * time.Second):
		t.Fatal("no leader")
	}
	for r.State() != raft.Leader {
		<-r.LeaderCh()
	}
	return f, r, snaps, rec
}

// A SetACLToken entry exactly as the first builds with ACLs (350f8fa) wrote
// it: command version 2, without TTLms and CertCNs. A node must replay it (it
// once made ApplyBatch panic).
func TestApplyFirstLayoutACLEntry(t *testing.T) {
	data, _ := hex.DecodeString("0d0280a0abfef9620561646d696e057265712d310100000000000000000000000000000002000000000000000000000000000000000000000000000000000000000000000f626f6f74737472617020746f6b656e01001f0001")
	f := fsm.New(quietLogger())
	var p any
	func() {
		defer func() { p = recover() }()
		f.ApplyBatch([]*raft.Log{{Index: 1, Type: raft.LogCommand, Data: data}})
	}()
	if p != nil {
		t.Fatalf("the previous build's ACL entry stops the FSM: %v", p)
	}
}

// A version 4 snapshot of the first ACL layout, with one token (bytes from
// State.Snapshot at 350f8fa), restores.
func TestRestoreFirstLayoutV4Snapshot(t *testing.T) {
	b, _ := hex.DecodeString("444c534e4150040180a0abfef962010000000000000101000000000000000000000000000000020000000000000000000000000000000000000000000000000000000000000009626f6f74737472617080a0abfef96201001f00")
	f := fsm.New(quietLogger())
	if err := f.Restore(io.NopCloser(bytes.NewReader(b))); err != nil {
		t.Fatalf("previous build's snapshot refused: %v", err)
	}
}

// The lease clock moves only with readings taken in the entry's own term (or
// entries that say nothing of their term: before command version 4).
func TestLeaseClockOnlyFromTheEntrysTerm(t *testing.T) {
	f := fsm.New(quietLogger())
	entry := func(index, term uint64, clock int64, clockTerm uint64) *raft.Log {
		return &raft.Log{Index: index, Term: term, Type: raft.LogCommand,
			Data: command.Encode(&command.Envelope{TS: ts0, Clock: clock, ClockTerm: clockTerm, ClientID: "dlock", Body: &command.Tick{}})}
	}
	clock := func() (c int64) {
		f.Read(func(s *state.State) { c = s.LeaseClock() })
		return c
	}
	for _, tc := range []struct {
		log  *raft.Log
		want int64
	}{
		{entry(1, 5, 1_000, 5), 1_000}, // its own term
		{entry(2, 7, 9_000, 5), 1_000}, // stamped in term 5, appended in 7: ignored
		{entry(3, 7, 1_200, 7), 1_200}, // term 7's own reading
		{entry(4, 7, 1_300, 0), 1_300}, // no term (version 3): taken
		{entry(5, 8, 1_100, 8), 1_300}, // older than the clock: the clock keeps its max
	} {
		f.ApplyBatch([]*raft.Log{tc.log})
		if got := clock(); got != tc.want {
			t.Fatalf("after entry %d: lease clock %d, want %d", tc.log.Index, got, tc.want)
		}
	}
}

// packedLog packs commands (all of client c, at ts0) into one entry.
func packedLog(index, term uint64, envs ...*command.Envelope) *raft.Log {
	cmds := make([][]byte, len(envs))
	for i, e := range envs {
		if e.TS == 0 {
			e.TS = ts0 + int64(index)
		}
		cmds[i] = command.Encode(e)
	}
	return &raft.Log{Index: index, Term: term, Type: raft.LogCommand, Data: command.EncodePacked(cmds)}
}

func env(client, requestID string, b command.Body) *command.Envelope {
	return &command.Envelope{ClientID: client, RequestID: requestID, Body: b}
}

// A packed entry applies its commands in order, each named by its own Seq:
// a lease that waits, withdraws and waits again on one lock inside one entry
// holds two different waits, so a stale timer for the first cannot end the
// second. Observers hear of the whole entry once, with every event in order.
func TestPackedEntryAppliesEachCommandInOrder(t *testing.T) {
	f := fsm.New(quietLogger())
	rec := &recorder{}
	f.AddObserver(rec)
	f.Apply(cmdLog(1, "n1", &command.RegisterMember{ID: "n1", RaftAddr: "r1", APIAddr: "a1"}))
	s1, s2 := command.Seq(2, 1), command.Seq(2, 3)
	out := f.Apply(packedLog(2, 1,
		env("c1", "r1", &command.Acquire{Name: "a", LeaseID: lease(1), TTLms: 10_000}),
		env("c2", "r2", &command.Acquire{Name: "a", LeaseID: lease(2), TTLms: 10_000, WaitMs: 5_000}),
		env("c2", "", &command.CancelWait{Wait: command.WaitRef{LeaseID: lease(2), Name: "a", Seq: s1}}),
		env("c2", "r3", &command.Acquire{Name: "a", LeaseID: lease(2), TTLms: 10_000, WaitMs: 5_000}),
		env("c1", "r1", &command.Acquire{Name: "a", LeaseID: lease(1), TTLms: 10_000}), // a retry of r1
	))
	resps, ok := out.([]fsm.Response)
	if !ok || len(resps) != 5 {
		t.Fatalf("a packed entry of 5 commands answered %T %+v; want 5 responses", out, out)
	}
	for j, r := range resps {
		if r.Index != 2 || r.Seq != command.Seq(2, j) {
			t.Fatalf("response %d: index %d seq %d; want 2 and %d", j, r.Index, r.Seq, command.Seq(2, j))
		}
	}
	if r := resps[0].Result; r.Status != command.StatusOK || r.Token != 1 || r.Seq != resps[0].Seq {
		t.Fatalf("first acquire: %+v; want a grant named by its own Seq", r)
	}
	if r := resps[1].Result; r.Status != command.StatusQueued || r.Seq != s1 {
		t.Fatalf("first wait: %+v; want queued with Seq %d", r, s1)
	}
	if r := resps[3].Result; r.Status != command.StatusQueued || r.Seq != s2 {
		t.Fatalf("second wait: %+v; want queued with Seq %d", r, s2)
	}
	if r := resps[4].Result; !r.Replayed || r.Token != 1 || r.Seq != resps[0].Seq {
		t.Fatalf("the retry in the same entry: %+v; want the first answer, replayed", r)
	}
	// The first wait's timer fires late: it must not touch the second wait.
	f.Apply(cmdLog(3, "dlock", &command.ExpireWaits{Waits: []command.WaitRef{{LeaseID: lease(2), Name: "a", Seq: s1}}}))
	f.Read(func(s *state.State) {
		if seq, ok := s.WaitSeq(lease(2), "a"); !ok || seq != s2 {
			t.Fatalf("after the first wait's stale timer: wait %d, %v; want the second wait (%d) still in line", seq, ok, s2)
		}
	})
	// The hand-off grants the second wait under its own Seq.
	f.Apply(cmdLog(4, "c1", &command.Release{Name: "a", LeaseID: lease(1), Token: 1}))
	f.Read(func(s *state.State) {
		if h := s.LockHolder("a"); h.Holder != lease(2) || h.GrantSeq != s2 || h.Token != 2 {
			t.Fatalf("after the release: %+v; want lease 2 holding under Seq %d", h, s2)
		}
	})
	// One Applied call for the packed entry, its events in command order.
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.applied) == 0 || rec.applied[0].index != 2 {
		t.Fatalf("observer calls %+v; want the packed entry's first, at index 2", rec.applied)
	}
	var types []state.EventType
	for _, e := range rec.applied[0].events {
		types = append(types, e.Type)
	}
	want := []state.EventType{state.EventLeaseTimer, state.EventAcquired, // c1's grant
		state.EventQueued, state.EventWaitTimer, // c2 waits
		state.EventDequeued, state.EventWaitGone, state.EventLeaseGone, // and withdraws (its idle lease ends)
		state.EventQueued, state.EventWaitTimer} // c2 waits again; the retry changes nothing
	if !reflect.DeepEqual(types, want) {
		t.Fatalf("events of the packed entry %v; want %v", types, want)
	}
}

// Replicas that apply the same packed log end byte-identical, a snapshot
// keeps the Seqs above 2^48, and the offline replay (forensics) reads a
// packed log as the FSM does.
func TestPackedEntriesAreDeterministicAndSnapshot(t *testing.T) {
	logs := []*raft.Log{
		cmdLog(1, "n1", &command.RegisterMember{ID: "n1", RaftAddr: "r1", APIAddr: "a1"}),
		packedLog(2, 1,
			env("c1", "", &command.Acquire{Name: "x", LeaseID: lease(1), TTLms: 10_000}),
			env("c2", "", &command.Acquire{Name: "x", LeaseID: lease(2), TTLms: 10_000, WaitMs: 60_000}),
			env("c3", "", &command.Acquire{Name: "x", LeaseID: lease(3), TTLms: 10_000, WaitMs: 60_000})),
		packedLog(3, 2, env("c1", "", &command.Release{Name: "x", LeaseID: lease(1), Token: 1})),
	}
	a, b := fsm.New(quietLogger()), fsm.New(quietLogger())
	a.ApplyBatch(logs)
	for _, l := range logs {
		b.Apply(l)
	}
	if !bytes.Equal(stateBytes(a), stateBytes(b)) {
		t.Fatal("two replicas applying one packed log differ")
	}
	st, err := state.Restore(stateBytes(a))
	if err != nil {
		t.Fatal(err)
	}
	if h := st.LockHolder("x"); h.Holder != lease(2) || h.GrantSeq != command.Seq(2, 1) {
		t.Fatalf("restored holder %+v; want lease 2 under Seq %d", h, command.Seq(2, 1))
	}
	if seq, ok := st.WaitSeq(lease(3), "x"); !ok || seq != command.Seq(2, 2) {
		t.Fatalf("restored wait %d, %v; want Seq %d", seq, ok, command.Seq(2, 2))
	}
	replayed := state.New()
	for _, l := range logs {
		if _, _, err := fsm.ApplyEntry(replayed, l); err != nil {
			t.Fatal(err)
		}
		replayed.TakeEvents()
	}
	if !bytes.Equal(replayed.Snapshot(), stateBytes(a)) {
		t.Fatal("ApplyEntry on a bare state differs from the FSM")
	}
}

// The lease clock rule holds for each command of a packed entry.
func TestPackedEntryLeaseClockPerCommand(t *testing.T) {
	f := fsm.New(quietLogger())
	f.Apply(packedLog(1, 7,
		&command.Envelope{ClientID: "dlock", Clock: 5_000, ClockTerm: 5, Body: &command.Tick{}}, // an earlier term's reading: ignored
		&command.Envelope{ClientID: "dlock", Clock: 1_000, ClockTerm: 7, Body: &command.Tick{}},
	))
	f.Read(func(s *state.State) {
		if s.LeaseClock() != 1_000 {
			t.Fatalf("lease clock %d after a packed entry; want 1000 (the command stamped in an earlier term does not move it)", s.LeaseClock())
		}
	})
}

// An undecodable packed entry stops the replica, as any undecodable entry.
func TestApplyPanicsOnMalformedPackedEntry(t *testing.T) {
	f := fsm.New(quietLogger())
	bad := command.EncodePacked([][]byte{command.Encode(env("c", "", &command.Tick{})), {byte(command.TypePacked), 1, 0}})
	defer func() {
		if recover() == nil {
			t.Fatal("a packed entry holding a packed entry was applied")
		}
		if f.AppliedIndex() != 0 {
			t.Fatal("a malformed packed entry advanced the applied index")
		}
	}()
	f.Apply(&raft.Log{Index: 1, Term: 1, Type: raft.LogCommand, Data: bad})
}

// checkpoints returns the digest of every "fsm checkpoint" line, by index.
func checkpoints(t *testing.T, logs string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, line := range strings.Split(logs, "\n") {
		if !strings.Contains(line, `msg="fsm checkpoint"`) {
			continue
		}
		var index, digest string
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "index="); ok {
				index = v
			}
			if v, ok := strings.CutPrefix(f, "digest="); ok {
				digest = v
			}
		}
		out[index] = digest
	}
	return out
}

// A replica that forked — here, one entry granted a lock to another client,
// so every count and counter still matches — logs a different checkpoint
// digest than the others; replicas that applied the same log (one of them
// restored from a snapshot on the way) log the same one.
func TestCheckpointDigestCatchesAForkedReplica(t *testing.T) {
	run := func(fork bool, snapshotAt uint64) map[string]string {
		var buf bytes.Buffer
		logger := slog.New(slog.NewTextHandler(&buf, nil))
		f := fsm.New(logger)
		for i := uint64(1); i <= 2*fsm.CheckpointEvery; i++ {
			client := fmt.Sprintf("c%d", i%7)
			if fork && i == 10 {
				client = "forked"
			}
			id := lease(byte(i))
			id[14] = byte(i >> 8)
			f.Apply(cmdLog(i, client, &command.Acquire{Name: fmt.Sprintf("lock/%d", i), LeaseID: id, TTLms: 60_000}))
			if i == snapshotAt {
				snap, err := f.Snapshot()
				if err != nil {
					t.Fatal(err)
				}
				sink := &fakeSink{}
				if err := snap.Persist(sink); err != nil {
					t.Fatal(err)
				}
				f = fsm.New(logger)
				if err := f.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
					t.Fatal(err)
				}
			}
		}
		cps := checkpoints(t, buf.String())
		if len(cps) != 2 {
			t.Fatalf("want 2 checkpoints, got %v", cps)
		}
		// The newest one is what the node reports (GET /cluster).
		last, ok := f.LastCheckpoint()
		if !ok || last.Index != 2*fsm.CheckpointEvery || fmt.Sprintf("%016x", last.Digest) != cps[fmt.Sprint(last.Index)] {
			t.Fatalf("LastCheckpoint %+v %v, logged %v", last, ok, cps)
		}
		return cps
	}
	a, b, forked := run(false, 0), run(false, 100), run(true, 0)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("replicas that applied the same log checkpoint differently: %v vs %v", a, b)
	}
	for index, d := range a {
		if forked[index] == d {
			t.Fatalf("a forked replica logged the same digest %s at index %s", d, index)
		}
	}
}
