package raftnode

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/dlock/dlock/internal/state"
	"go.etcd.io/raft/v3/raftpb"
)

func testSnap(index, term uint64, size int) raftpb.Snapshot {
	data := bytes.Repeat([]byte{byte(index)}, size)
	return raftpb.Snapshot{Data: data, Metadata: raftpb.SnapshotMetadata{Index: index, Term: term,
		ConfState: raftpb.ConfState{Voters: []uint64{1}}}}
}

func snapFiles(t *testing.T, dir string) []string {
	t.Helper()
	names, _ := filepath.Glob(filepath.Join(dir, snapFileDir, "*"))
	for i := range names {
		names[i] = filepath.Base(names[i])
	}
	sort.Strings(names)
	return names
}

// TestEtcdStoreSnapshotDataLivesInAFile: a snapshot's megabytes go to a file
// of their own, the log store keeps a reference of a few dozen bytes, Load
// returns the data whole, and once a newer snapshot is stored only its file
// is left — for a snapshot the node takes itself and one received from the
// leader alike.
func TestEtcdStoreSnapshotDataLivesInAFile(t *testing.T) {
	dir := t.TempDir()
	s, err := openMultiStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	ents := make([]raftpb.Entry, 0, 20)
	for i := uint64(1); i <= 20; i++ {
		ents = append(ents, raftpb.Entry{Index: i, Term: 1, Data: []byte("x")})
	}
	if err := s.Save(7, raftpb.HardState{Term: 1, Commit: 20}, ents, raftpb.Snapshot{}, true); err != nil {
		t.Fatal(err)
	}
	own := testSnap(10, 1, 3<<20)
	if err := s.SaveSnapshot(7, own); err != nil {
		t.Fatal(err)
	}
	rec, err := s.get(groupKey(7, keySnapshot, 0))
	if err != nil {
		t.Fatal(err)
	}
	if len(rec) > 256 {
		t.Fatalf("the stored snapshot record is %d bytes: the data went into the log store", len(rec))
	}
	if got := snapFiles(t, dir); len(got) != 1 || got[0] != snapFileName(7, own.Metadata) {
		t.Fatalf("snapshot files %v, want only %s", got, snapFileName(7, own.Metadata))
	}
	gs, err := s.Load(7)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(gs.Snapshot.Data, own.Data) || gs.Snapshot.Metadata.Index != 10 {
		t.Fatalf("Load: snapshot at %d with %d bytes, want 10 with %d", gs.Snapshot.Metadata.Index, len(gs.Snapshot.Data), len(own.Data))
	}
	if len(gs.Entries) != 10 || gs.Entries[0].Index != 11 {
		t.Fatalf("Load: %d entries after the snapshot, want 11..20", len(gs.Entries))
	}

	// A stray file of the group (a batch that never committed) and one of
	// another group.
	stray := filepath.Join(dir, snapFileDir, snapFileName(7, raftpb.SnapshotMetadata{Term: 9, Index: 99}))
	other := filepath.Join(dir, snapFileDir, snapFileName(8, raftpb.SnapshotMetadata{Term: 1, Index: 5}))
	for _, f := range []string{stray, other} {
		if err := os.WriteFile(f, []byte("junk"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	recv := testSnap(30, 2, 1<<20)
	if err := s.Save(7, raftpb.HardState{Term: 2, Commit: 30}, nil, recv, true); err != nil {
		t.Fatal(err)
	}
	// The received snapshot's batch dropped the stray; the previous
	// snapshot's file goes when the next one is stored.
	if got, want := snapFiles(t, dir), []string{snapFileName(7, own.Metadata), snapFileName(7, recv.Metadata), filepath.Base(other)}; !slices.Equal(got, slices.Sorted(slices.Values(want))) {
		t.Fatalf("snapshot files %v, want %v", got, want)
	}
	_ = s.Close()
	if s, err = openMultiStore(dir); err != nil {
		t.Fatal(err)
	}
	gs, err = s.Load(7)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(gs.Snapshot.Data, recv.Data) || len(gs.Entries) != 0 {
		t.Fatalf("after reopening: snapshot %d bytes and %d entries, want %d bytes and none", len(gs.Snapshot.Data), len(gs.Entries), len(recv.Data))
	}
	next := testSnap(40, 2, 1000)
	if err := s.SaveSnapshot(7, next); err != nil {
		t.Fatal(err)
	}
	if got, want := snapFiles(t, dir), []string{snapFileName(7, next.Metadata), filepath.Base(other)}; !slices.Equal(got, slices.Sorted(slices.Values(want))) {
		t.Fatalf("snapshot files %v, want %v", got, want)
	}
}

// TestEtcdStoreRefusesADamagedSnapshotFile: a flipped byte, a cut file or a
// missing one is corruption, reported on the file, never a snapshot loaded
// with other data.
func TestEtcdStoreRefusesADamagedSnapshotFile(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(path string) error
	}{
		{"flipped byte", func(p string) error {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			b[len(b)/2] ^= 0x01
			return os.WriteFile(p, b, 0o600)
		}},
		{"cut short", func(p string) error { return os.Truncate(p, 100) }},
		{"missing", os.Remove},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s, err := openMultiStore(dir)
			if err != nil {
				t.Fatal(err)
			}
			snap := testSnap(5, 1, 64<<10)
			if err := s.Save(1, raftpb.HardState{Term: 1, Commit: 5}, nil, snap, true); err != nil {
				t.Fatal(err)
			}
			_ = s.Close()
			if err := tc.damage(filepath.Join(dir, snapFileDir, snapFileName(1, snap.Metadata))); err != nil {
				t.Fatal(err)
			}
			if s, err = openMultiStore(dir); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = s.Close() }()
			_, err = s.Load(1)
			var ce *CorruptError
			if !errors.As(err, &ce) || filepath.Base(ce.File) != snapFileName(1, snap.Metadata) {
				t.Fatalf("Load = %v, want corruption of the snapshot file", err)
			}
		})
	}
}

// TestEtcdStoreReadsInlineSnapshots: a data dir written before snapshot
// files holds the data in the record itself, and still loads.
func TestEtcdStoreReadsInlineSnapshots(t *testing.T) {
	dir := t.TempDir()
	s, err := openMultiStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	snap := testSnap(12, 3, 4096)
	snap.Data = append([]byte(snapMagic), snap.Data...)
	v, err := snap.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	k := groupKey(1, keySnapshot, 0)
	if err := s.db.Set(k, sealValue(k, v), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	gs, err := s.Load(1)
	_ = s.Close()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(gs.Snapshot.Data, snap.Data) || gs.Snapshot.Metadata.Index != 12 {
		t.Fatalf("Load: snapshot at %d with %d bytes, want 12 with %d", gs.Snapshot.Metadata.Index, len(gs.Snapshot.Data), len(snap.Data))
	}
}

// TestDecodeSnapRef: a reference round-trips, and a record that only looks
// like one (bad lengths, a path instead of a name) is refused.
func TestDecodeSnapRef(t *testing.T) {
	ref := snapRef{name: "0000000000000001-0000000000000002-0000000000000003.snap", size: 1 << 30, crc: 0xdeadbeef}
	got, ok, err := decodeSnapRef(ref.encode())
	if err != nil || !ok || got != ref {
		t.Fatalf("round trip: %+v %v %v", got, ok, err)
	}
	if _, ok, err := decodeSnapRef([]byte(snapMagic + "data")); ok || err != nil {
		t.Fatalf("inline data read as a reference: %v %v", ok, err)
	}
	for _, bad := range [][]byte{
		[]byte(snapRefMagic),
		append([]byte(snapRefMagic), 0xff),
		snapRef{name: "../../etc/passwd", size: 1}.encode(),
		snapRef{name: "..", size: 1}.encode(),
		ref.encode()[:len(ref.encode())-1],
		append(ref.encode(), 0),
	} {
		if _, ok, err := decodeSnapRef(bad); !ok || err == nil {
			t.Fatalf("decodeSnapRef(%q) = %v, %v; want refused", bad, ok, err)
		}
	}
}

// TestEtcdEngineSnapshotFileAcrossRestarts: a node's own snapshot is a file
// it restarts from with its state whole; with one byte of that file flipped
// it refuses its data dir, as for any damaged record.
func TestEtcdEngineSnapshotFileAcrossRestarts(t *testing.T) {
	nodes, cfgs := openEtcdCluster(t, []string{"a"}, nil)
	for i := range 5 {
		acquire(t, nodes["a"], fmt.Sprintf("l%d", i))
	}
	if err := nodes["a"].Raft().Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	acquire(t, nodes["a"], "after-snapshot")
	_ = nodes["a"].Shutdown()
	store := filepath.Join(cfgs["a"].DataDir, etcdStoreDir)
	files := snapFiles(t, store)
	if len(files) != 1 {
		t.Fatalf("snapshot files %v, want one", files)
	}

	n, err := Open(cfgs["a"])
	if err != nil {
		t.Fatal(err)
	}
	waitLeader(t, map[string]*Node{"a": n})
	n.FSM().Read(func(s *state.State) {
		for _, name := range []string{"l0", "l4", "after-snapshot"} {
			if !s.GetLock(name).Held {
				t.Errorf("%s is not held after the restart", name)
			}
		}
	})
	_ = n.Shutdown()

	path := filepath.Join(store, snapFileDir, files[0])
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] ^= 0x20
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Open(cfgs["a"])
	var re *RefusedError
	if !errors.As(err, &re) {
		t.Fatalf("Open = %v, want the data dir refused", err)
	}
}
