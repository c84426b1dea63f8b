package raftnode

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3/raftpb"
	"golang.org/x/sys/unix"
)

// TestEtcdStoreWALIsAllocatedAhead: the log store's WAL file is allocated
// and sized beyond what was written (so an fsync commits no size change),
// and a copy of the store taken while it runs — what a crash leaves — opens
// with every synced entry: pebble reads the zero-filled tail as the log's end.
func TestEtcdStoreWALIsAllocatedAhead(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "log")
	s, err := openMultiStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ents := saveInTwoWrites(t, s)

	logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	if len(logs) == 0 {
		t.Fatal("no WAL file")
	}
	wal := logs[len(logs)-1]
	b, err := os.ReadFile(wal)
	if err != nil {
		t.Fatal(err)
	}
	written := len(bytes.TrimRight(b, "\x00"))
	var st syscall.Stat_t
	if err := syscall.Stat(wal, &st); err != nil {
		t.Fatal(err)
	}
	if st.Size < 1<<20 || int64(written) >= st.Size {
		t.Fatalf("WAL %s: size %d with %d bytes written; want it sized ahead (at least 1 MiB)", wal, st.Size, written)
	}
	if st.Blocks*512 < st.Size {
		t.Fatalf("WAL %s: %d bytes allocated for a size of %d: sparse, not allocated", wal, st.Blocks*512, st.Size)
	}

	crash := filepath.Join(t.TempDir(), "crash")
	if err := os.MkdirAll(crash, 0o700); err != nil {
		t.Fatal(err)
	}
	files, _ := os.ReadDir(dir)
	for _, f := range files {
		if f.Name() == "LOCK" {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, f.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(crash, f.Name()), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c, err := openMultiStore(crash)
	if err != nil {
		t.Fatalf("open the store as a crash left it: %v", err)
	}
	defer c.Close()
	requireEntries(t, c, ents, "after the crash")
}

// TestEtcdStoreWALFallsBackWithoutFallocate: on a file system that refuses
// fallocate's mode 0 (EOPNOTSUPP), no write fails — pebble ignores an
// allocation error, and the wrapper falls back to pebble's own allocation —
// the WAL is not sized ahead, and the store keeps every entry across a
// reopen.
func TestEtcdStoreWALFallsBackWithoutFallocate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "log")
	refused := 0
	fs := walPreallocFS{FS: vfs.Default, fallocate: func(fd int, mode uint32, off, size int64) error {
		if mode == 0 {
			refused++
			return unix.EOPNOTSUPP
		}
		return unix.Fallocate(fd, mode, off, size)
	}}
	s, err := openMultiStoreFS(dir, fs)
	if err != nil {
		t.Fatal(err)
	}
	ents := saveInTwoWrites(t, s)
	if refused == 0 {
		t.Fatal("the WAL never asked for a sized allocation: the fallback was not exercised")
	}
	logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	if len(logs) == 0 {
		t.Fatal("no WAL file")
	}
	b, err := os.ReadFile(logs[len(logs)-1])
	if err != nil {
		t.Fatal(err)
	}
	if len(b) >= 1<<20 {
		t.Fatalf("WAL is %d bytes: it was sized ahead although fallocate refused", len(b))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	r, err := openMultiStoreFS(dir, fs)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	requireEntries(t, r, ents, "after a reopen")
}

// saveInTwoWrites makes 20 entries durable in two writes (pebble allocates
// the WAL's next block before each write after the first) and returns them.
func saveInTwoWrites(t *testing.T, s *multiStore) []raftpb.Entry {
	t.Helper()
	var ents []raftpb.Entry
	for i := uint64(1); i <= 20; i++ {
		ents = append(ents, raftpb.Entry{Term: 1, Index: i, Data: bytes.Repeat([]byte{byte(i)}, 100)})
	}
	for _, part := range [][]raftpb.Entry{ents[:10], ents[10:]} {
		if err := s.Save(defaultGroup, raftpb.HardState{Term: 1, Commit: part[len(part)-1].Index}, part, raftpb.Snapshot{}, true); err != nil {
			t.Fatal(err)
		}
	}
	return ents
}

// requireEntries fails unless s holds exactly ents.
func requireEntries(t *testing.T, s *multiStore, ents []raftpb.Entry, when string) {
	t.Helper()
	gs, err := s.Load(defaultGroup)
	if err != nil {
		t.Fatal(err)
	}
	if len(gs.Entries) != len(ents) {
		t.Fatalf("%s the log holds %d entries, want all %d", when, len(gs.Entries), len(ents))
	}
	for i, e := range gs.Entries {
		if e.Index != ents[i].Index || !bytes.Equal(e.Data, ents[i].Data) {
			t.Fatalf("%s entry %d differs from the one saved", when, ents[i].Index)
		}
	}
}
