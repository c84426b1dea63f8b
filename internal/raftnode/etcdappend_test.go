package raftnode

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/dlock/dlock/internal/testutil"
)

// fakeOwner records what the append goroutine tells one group.
type fakeOwner struct {
	mu       sync.Mutex
	prepared []uint64 // first entry index of each prepared message
	done     []raftpb.Message
	failures []error
}

func (o *fakeOwner) prepareAppend(m *raftpb.Message) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(m.Entries) > 0 {
		o.prepared = append(o.prepared, m.Entries[0].Index)
	}
	return nil
}

func (o *fakeOwner) appended(m raftpb.Message) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.done = append(o.done, m)
}

func (o *fakeOwner) appendFailed(err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.failures = append(o.failures, err)
}

func (o *fakeOwner) counts() (done, failed int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.done), len(o.failures)
}

// appendMsg is a MsgStorageAppend of entry idx (term 1) whose response
// carries idx, so the order of delivery can be checked.
func appendMsg(idx uint64) raftpb.Message {
	return raftpb.Message{
		Type: raftpb.MsgStorageAppend, Term: 1, Commit: idx - 1,
		Entries:   []raftpb.Entry{{Term: 1, Index: idx, Data: []byte(fmt.Sprint("cmd-", idx))}},
		Responses: []raftpb.Message{{Type: raftpb.MsgStorageAppendResp, Index: idx, LogTerm: 1}},
	}
}

// blockFirstWrite makes the store's first log write wait until release is
// closed, and closes entered when it starts waiting.
func blockFirstWrite(s *multiStore) (entered, release chan struct{}) {
	entered, release = make(chan struct{}), make(chan struct{})
	var once sync.Once
	s.writeHook = func(uint64, bool) error {
		first := false
		once.Do(func() { first = true })
		if first {
			close(entered)
			<-release
		}
		return nil
	}
	return entered, release
}

// TestAppendWriterOneFsyncForManyGroups: writes of many groups that queue
// while a write is in flight share the next batch and its one fsync, and each
// group hears of its writes in order, only after they are stored.
func TestAppendWriterOneFsyncForManyGroups(t *testing.T) {
	s, err := openMultiStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	entered, release := blockFirstWrite(s)
	const groups, perGroup = 10, 5
	owners := make([]*fakeOwner, groups+1)
	for g := range owners {
		owners[g] = &fakeOwner{}
	}
	stop := make(chan struct{})
	// Group 0's write holds the writer while the others queue.
	s.submitAppend(0, owners[0], appendMsg(1), false, stop)
	<-entered
	for i := uint64(1); i <= perGroup; i++ {
		for g := uint64(1); g <= groups; g++ {
			if !s.submitAppend(g, owners[g], appendMsg(i), false, stop) {
				t.Fatal("not queued")
			}
		}
	}
	for g := 1; g <= groups; g++ {
		if d, f := owners[g].counts(); d != 0 || f != 0 {
			t.Fatalf("group %d heard of a write before it was stored: %d done, %d failed", g, d, f)
		}
	}
	close(release)
	testutil.Eventually(t, 20*time.Second, "writes not acknowledged", func() bool {
		for g := 1; g <= groups; g++ {
			if d, _ := owners[g].counts(); d != perGroup {
				return false
			}
		}
		return true
	})
	w := s.writer()
	if b, y := w.batches.Load(), w.syncs.Load(); b != 2 || y != 2 {
		t.Fatalf("%d groups × %d writes took %d batches and %d fsyncs, want 2 and 2 (the held one and one for the rest)", groups, perGroup, b, y)
	}
	for g := uint64(1); g <= groups; g++ {
		o := owners[g]
		for i, m := range o.done {
			if m.Responses[0].Index != uint64(i+1) {
				t.Fatalf("group %d: write %d answered in position %d", g, m.Responses[0].Index, i+1)
			}
		}
		gs, err := s.Load(g)
		if err != nil {
			t.Fatal(err)
		}
		if len(gs.Entries) != perGroup || gs.HardState.Commit != perGroup-1 {
			t.Fatalf("group %d stored %d entries, commit %d; want %d, %d", g, len(gs.Entries), gs.HardState.Commit, perGroup, perGroup-1)
		}
	}
}

// TestAppendWriterCommitOnlyNeedsNoFsync: a hard state that moves only the
// commit index is written without an fsync; a new term or vote is synced.
func TestAppendWriterCommitOnlyNeedsNoFsync(t *testing.T) {
	s, err := openMultiStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	o := &fakeOwner{}
	stop := make(chan struct{})
	submit := func(m raftpb.Message, wantDone int) {
		t.Helper()
		s.submitAppend(1, o, m, false, stop)
		testutil.Eventually(t, 10*time.Second, "write not acknowledged", func() bool { d, _ := o.counts(); return d == wantDone })
	}
	submit(appendMsg(1), 1)
	w := s.writer()
	base := w.syncs.Load()
	submit(raftpb.Message{Type: raftpb.MsgStorageAppend, Term: 1, Commit: 1}, 2)
	if got := w.syncs.Load(); got != base {
		t.Fatalf("a commit-only hard state was fsynced (%d → %d)", base, got)
	}
	submit(raftpb.Message{Type: raftpb.MsgStorageAppend, Term: 2, Vote: 7, Commit: 1}, 3)
	if got := w.syncs.Load(); got != base+1 {
		t.Fatalf("a new term and vote were not fsynced (%d → %d)", base, got)
	}
	gs, err := s.Load(1)
	if err != nil {
		t.Fatal(err)
	}
	if gs.HardState.Term != 2 || gs.HardState.Vote != 7 || gs.HardState.Commit != 1 {
		t.Fatalf("stored hard state %+v", gs.HardState)
	}
}

// TestAppendWriterFailureStopsEveryWrite: a failed write fails every group
// in its batch, and nothing is written afterwards — not the same index, not
// any other — until the store is opened again.
func TestAppendWriterFailureStopsEveryWrite(t *testing.T) {
	dir := t.TempDir()
	s, err := openMultiStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	failNow, calls := false, 0
	s.writeHook = func(uint64, bool) error {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if failNow {
			return errors.New("injected fsync failure")
		}
		return nil
	}
	a, b := &fakeOwner{}, &fakeOwner{}
	stop := make(chan struct{})
	s.submitAppend(1, a, appendMsg(1), false, stop)
	testutil.Eventually(t, 10*time.Second, "first write", func() bool { d, _ := a.counts(); return d == 1 })
	mu.Lock()
	failNow = true
	mu.Unlock()
	s.submitAppend(1, a, appendMsg(2), false, stop)
	testutil.Eventually(t, 10*time.Second, "failure not reported", func() bool { _, f := a.counts(); return f == 1 })
	mu.Lock()
	callsAtFailure := calls
	mu.Unlock()
	// The same index again, a later one, and another group's: all refused
	// without reaching the disk.
	s.submitAppend(1, a, appendMsg(2), false, stop)
	s.submitAppend(1, a, appendMsg(3), false, stop)
	s.submitAppend(2, b, appendMsg(1), false, stop)
	testutil.Eventually(t, 10*time.Second, "later writes not refused", func() bool {
		_, fa := a.counts()
		_, fb := b.counts()
		return fa == 3 && fb == 1
	})
	for _, err := range append(a.failures[1:], b.failures...) {
		if !errors.Is(err, errStoreFailed) {
			t.Fatalf("a write after the failure was answered %v, want errStoreFailed", err)
		}
	}
	mu.Lock()
	if calls != callsAtFailure {
		t.Fatalf("the store wrote %d more times after a failed write", calls-callsAtFailure)
	}
	mu.Unlock()
	if d, _ := a.counts(); d != 1 {
		t.Fatalf("%d writes acknowledged, want only the one before the failure", d)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = openMultiStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for g, want := range map[uint64]int{1: 1, 2: 0} {
		gs, err := s.Load(g)
		if err != nil {
			t.Fatal(err)
		}
		if len(gs.Entries) != want {
			t.Fatalf("group %d holds %d entries after the failure, want %d", g, len(gs.Entries), want)
		}
	}
}

// TestAppendWriterCloseAnswersQueuedWrites: writes still queued when the
// store closes are answered (as closed), so no group waits forever.
func TestAppendWriterCloseAnswersQueuedWrites(t *testing.T) {
	s, err := openMultiStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	entered, release := blockFirstWrite(s)
	o := &fakeOwner{}
	stop := make(chan struct{})
	s.submitAppend(1, o, appendMsg(1), false, stop)
	<-entered
	for i := uint64(2); i <= 5; i++ {
		s.submitAppend(1, o, appendMsg(i), false, stop)
	}
	closed := make(chan error)
	go func() { closed <- s.Close() }()
	// Close waits for the write in flight, which the hook holds.
	close(release)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	d, f := o.counts()
	if d+f != 5 {
		t.Fatalf("%d of 5 writes answered", d+f)
	}
	for _, err := range o.failures {
		if !errors.Is(err, errStoreClosed) {
			t.Fatalf("a queued write was answered %v, want errStoreClosed", err)
		}
	}
	s.submitAppend(1, o, appendMsg(6), false, stop)
	if _, f2 := o.counts(); f2 != f+1 {
		t.Fatal("a write after Close was not refused")
	}
}

// An append deletes a replaced tail only when there is one, and then the
// replaced entries are gone for good: a range tombstone on every append made
// pebble's flushes sort ever more of them until they took both cores.
func TestEtcdStoreDeletesOnlyReplacedTails(t *testing.T) {
	s, err := openMultiStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const g = 7
	if _, err := s.Load(g); err != nil {
		t.Fatal(err)
	}
	save := func(ents ...raftpb.Entry) {
		t.Helper()
		if err := s.Save(g, raftpb.HardState{}, ents, raftpb.Snapshot{}, false); err != nil {
			t.Fatal(err)
		}
	}
	for i := uint64(1); i <= 200; i++ {
		save(raftpb.Entry{Term: 1, Index: i, Data: []byte{byte(i)}})
	}
	if n := s.tailDeletes.Load(); n != 0 {
		t.Fatalf("%d tail deletions for 200 plain appends, want 0", n)
	}
	// A new leader's entries replace the tail from 150 on.
	save(raftpb.Entry{Term: 2, Index: 150}, raftpb.Entry{Term: 2, Index: 151})
	if n := s.tailDeletes.Load(); n != 1 {
		t.Fatalf("%d tail deletions after a conflicting append, want 1", n)
	}
	gs, err := s.Load(g)
	if err != nil {
		t.Fatal(err)
	}
	if len(gs.Entries) != 151 || gs.Entries[150].Term != 2 || gs.Entries[148].Term != 1 {
		t.Fatalf("after the replace the log holds %d entries (want 151, term 2 from 150 on)", len(gs.Entries))
	}

	// A store whose group was never loaded here cannot know its tail and
	// deletes it.
	s2, err := openMultiStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if err := s2.Save(g, raftpb.HardState{}, []raftpb.Entry{{Term: 1, Index: 1}}, raftpb.Snapshot{}, false); err != nil {
		t.Fatal(err)
	}
	if n := s2.tailDeletes.Load(); n != 1 {
		t.Fatalf("an append to a group of unknown tail made %d deletions, want 1", n)
	}
}
