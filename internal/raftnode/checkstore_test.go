// Unit tests of the checksumming log store wrapper over an in-memory store:
// what it verifies, what it accepts from before checksums, how a failed
// write stops it, and how the durable mark follows truncations.

package raftnode

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
)

func newCheckedInmem(t testing.TB, from uint64) (*checkedStore, *raft.InmemStore) {
	t.Helper()
	mem := raft.NewInmemStore()
	m, _, _, err := openMark(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.close(false) })
	return &checkedStore{inner: mem, from: from, locate: func(uint64) string { return "seg.wal" }, mark: m, parked: make(chan struct{})}, mem
}

func logs(from, to uint64) []*raft.Log {
	var out []*raft.Log
	for i := from; i <= to; i++ {
		out = append(out, &raft.Log{Index: i, Term: 2, Type: raft.LogCommand, Data: []byte{byte(i), 'x'}})
	}
	return out
}

func TestCheckedStoreVerifiesAndStrips(t *testing.T) {
	cs, mem := newCheckedInmem(t, 1)
	var fatal atomic.Value
	cs.SetFatal(func(err error) { fatal.Store(err) })
	in := logs(1, 5)
	if err := cs.StoreLogs(in); err != nil {
		t.Fatal(err)
	}
	if in[0].Extensions != nil {
		t.Fatal("StoreLogs changed the caller's entry (Raft's log cache holds it)")
	}
	var raw raft.Log
	if err := mem.GetLog(3, &raw); err != nil || len(raw.Extensions) != checksumLen {
		t.Fatalf("stored entry has extensions %x (%v), want a checksum", raw.Extensions, err)
	}
	var l raft.Log
	if err := cs.GetLog(3, &l); err != nil || l.Extensions != nil || string(l.Data) != "\x03x" {
		t.Fatalf("GetLog = %+v, %v", l, err)
	}

	// A flipped bit in the data, then an entry that lost its checksum.
	raw.Data = []byte{3, 'y'}
	_ = mem.StoreLog(&raw)
	var ce *CorruptError
	if err := cs.GetLog(3, &l); !errors.As(err, &ce) || ce.Index != 3 || ce.File != "seg.wal" {
		t.Fatalf("GetLog of a damaged entry = %v, want a CorruptError at 3 in seg.wal", err)
	}
	if fatal.Load() == nil {
		t.Fatal("corruption read while running did not stop the node")
	}
	if err := cs.StoreLogs(logs(6, 6)); err == nil {
		t.Fatal("a write after corruption was found succeeded")
	}
	_ = mem.GetLog(4, &raw)
	raw.Extensions = nil
	_ = mem.StoreLog(&raw)
	if err := cs.GetLog(4, &l); !errors.As(err, &ce) || !strings.Contains(err.Error(), "no checksum") {
		t.Fatalf("GetLog of an entry without its checksum = %v", err)
	}
	if err := cs.GetLog(99, &l); !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("GetLog of a missing entry = %v, want ErrLogNotFound", err)
	}
}

// Entries from before the data dir had checksums are accepted below the
// recorded first checksummed index, and only there.
func TestCheckedStoreLegacyEntries(t *testing.T) {
	cs, mem := newCheckedInmem(t, 4)
	if err := mem.StoreLogs(logs(1, 3)); err != nil {
		t.Fatal(err)
	}
	if err := cs.StoreLogs(logs(4, 6)); err != nil {
		t.Fatal(err)
	}
	var l raft.Log
	for i := uint64(1); i <= 6; i++ {
		if err := cs.GetLog(i, &l); err != nil {
			t.Fatalf("GetLog(%d): %v", i, err)
		}
	}
	_ = mem.StoreLogs(logs(5, 5)) // entry 5 loses its checksum
	if err := cs.GetLog(5, &l); err == nil {
		t.Fatal("an entry at or past the first checksummed index passed without a checksum")
	}
}

// errStore fails every write.
type errStore struct {
	*raft.InmemStore
	writes atomic.Int32
}

func (e *errStore) StoreLogs([]*raft.Log) error {
	e.writes.Add(1)
	return errors.New("disk on fire")
}
func (e *errStore) Set([]byte, []byte) error { e.writes.Add(1); return errors.New("disk on fire") }

func TestCheckedStoreFailedWriteIsFinal(t *testing.T) {
	cs, _ := newCheckedInmem(t, 1)
	bad := &errStore{InmemStore: raft.NewInmemStore()}
	cs.inner = bad
	if err := cs.StoreLogs(logs(1, 1)); !errors.Is(err, ErrStorageFailed) {
		t.Fatalf("StoreLogs = %v, want ErrStorageFailed", err)
	}
	// Offline (no fatal handler): stable writes answer the error.
	if err := cs.Set([]byte("k"), []byte("v")); !errors.Is(err, ErrStorageFailed) {
		t.Fatalf("Set after a failure = %v", err)
	}
	if err := cs.StoreLogs(logs(2, 2)); err == nil {
		t.Fatal("a write after a failed write succeeded")
	}
	if n := bad.writes.Load(); n != 1 {
		t.Fatalf("%d writes reached the store; after the first failure none may", n)
	}
	var got []error
	cs.SetFatal(func(err error) { got = append(got, err) })
	if len(got) != 1 || !strings.Contains(got[0].Error(), "disk on fire") {
		t.Fatalf("a handler installed after the failure was told %v", got)
	}
}

// Removing the log's tail lowers the durable mark on disk before the entries
// go; compacting the head leaves it.
func TestDurableMarkFollowsTruncation(t *testing.T) {
	dir := t.TempDir()
	m, _, _, err := openMark(dir)
	if err != nil {
		t.Fatal(err)
	}
	cs := &checkedStore{inner: raft.NewInmemStore(), from: 1, locate: func(uint64) string { return "" }, mark: m, parked: make(chan struct{})}
	if err := cs.StoreLogs(logs(1, 10)); err != nil {
		t.Fatal(err)
	}
	if err := m.set(10); err != nil {
		t.Fatal(err)
	}
	onDisk := func() uint64 {
		t.Helper()
		m2, v, _, err := openMark(dir)
		if err != nil {
			t.Fatal(err)
		}
		_ = m2.f.Close()
		return v
	}
	if err := cs.DeleteRange(1, 3); err != nil {
		t.Fatal(err)
	}
	if v := onDisk(); v != 10 {
		t.Fatalf("compaction moved the mark to %d", v)
	}
	if err := cs.DeleteRange(8, 10); err != nil {
		t.Fatal(err)
	}
	if v := onDisk(); v != 7 {
		t.Fatalf("after truncating 8..10 the mark on disk is %d, want 7", v)
	}
	if err := cs.StoreLogs(logs(8, 12)); err != nil {
		t.Fatal(err)
	}
	if err := m.close(false); err != nil {
		t.Fatal(err)
	}
	if v := onDisk(); v != 12 {
		t.Fatalf("after a clean close the mark is %d, want 12", v)
	}
}

func TestOpenLogStoreKeepsMonotonic(t *testing.T) {
	for _, kind := range logStoreKinds {
		st, closeFn, err := OpenLogStore(kind, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		_, mono := st.(raft.MonotonicLogStore)
		if mono != (kind == LogStoreWAL) {
			t.Errorf("%s: MonotonicLogStore visible = %v", kind, mono)
		}
		_ = closeFn()
	}
}

// BenchmarkChecksumOverhead is the wrapper's CPU cost per batch over an
// in-memory store (the real stores' cost is the fsync, BenchmarkLogStore).
func BenchmarkChecksumOverhead(b *testing.B) {
	for _, wrapped := range []bool{false, true} {
		name := "inmem"
		if wrapped {
			name = "checked"
		}
		b.Run(name, func(b *testing.B) {
			cs, mem := newCheckedInmem(b, 1)
			var st raft.LogStore = mem
			if wrapped {
				st = cs
			}
			batch := newBatch(16)
			next := uint64(1)
			for b.Loop() {
				for _, l := range batch {
					l.Index = next
					next++
				}
				if err := st.StoreLogs(batch); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// A data dir written before checksums existed opens: its entries are
// accepted as they are, and the first index that must carry a checksum is
// recorded once, so a reopen keeps it.
func TestLegacyDataDirOpens(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, walDirName), 0o700); err != nil {
		t.Fatal(err)
	}
	meta := &metadb.BoltMetaDB{}
	w, err := raftwal.Open(filepath.Join(dir, walDirName), raftwal.WithMetaStore(meta))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.StoreLogs(logs(1, 5)); err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	_ = meta.Close()

	for round := range 2 {
		cs, closeFn, err := openCheckedStore(LogStoreWAL, dir)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if cs.from != 6 {
			t.Fatalf("round %d: checksums from %d, want 6", round, cs.from)
		}
		var l raft.Log
		for i := uint64(1); i <= 5+uint64(round)*2; i++ {
			if err := cs.GetLog(i, &l); err != nil {
				t.Fatalf("round %d: GetLog(%d): %v", round, i, err)
			}
		}
		if round == 0 {
			if err := cs.StoreLogs(logs(6, 7)); err != nil {
				t.Fatal(err)
			}
		}
		if err := closeFn(); err != nil {
			t.Fatal(err)
		}
	}
}
