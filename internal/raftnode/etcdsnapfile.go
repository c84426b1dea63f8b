// The etcd engine keeps a snapshot's data in a file of its own under the log
// store's directory, and only a reference to it (name, size, checksum) in the
// log store. Written through the store, megabytes of snapshot went through
// pebble's one write-ahead log, and every group's appends queued behind them
// for as long as they took to write and sync (docs/benchmarks.md, "Snapshots
// of a large state"). hashicorp/raft and etcd keep snapshots beside their logs
// for the same reason; CockroachDB keeps large Raft payloads beside pebble
// this way.

package raftnode

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3/raftpb"
)

// snapFileDir is the snapshot files' directory inside the log store's.
const snapFileDir = "snap"

// snapRefMagic starts a snapshot record whose data lives in a file. Records
// written before files were used hold the data itself, which starts with
// snapMagic, and are still read.
const snapRefMagic = "DLSNAPREF1"

// snapRef is a snapshot record's reference to its data file.
type snapRef struct {
	name string
	size uint64
	crc  uint32 // CRC-32C of the data
}

func (r snapRef) encode() []byte {
	b := append([]byte(snapRefMagic), binary.AppendUvarint(nil, uint64(len(r.name)))...)
	b = append(b, r.name...)
	b = binary.AppendUvarint(b, r.size)
	return binary.BigEndian.AppendUint32(b, r.crc)
}

// decodeSnapRef reads a snapshot record's data: ok is false when the data
// is the snapshot itself (a record from before snapshot files).
func decodeSnapRef(b []byte) (ref snapRef, ok bool, err error) {
	rest, found := bytes.CutPrefix(b, []byte(snapRefMagic))
	if !found {
		return ref, false, nil
	}
	n, k := binary.Uvarint(rest)
	if k <= 0 || n == 0 || n > 256 || uint64(len(rest)-k) < n {
		return ref, true, errors.New("snapshot reference: bad file name length")
	}
	ref.name, rest = string(rest[k:k+int(n)]), rest[k+int(n):]
	if strings.ContainsAny(ref.name, `/\`) || ref.name == "." || ref.name == ".." {
		return ref, true, fmt.Errorf("snapshot reference: %q is not a file name", ref.name)
	}
	ref.size, k = binary.Uvarint(rest)
	if k <= 0 || len(rest)-k != 4 {
		return ref, true, errors.New("snapshot reference: truncated")
	}
	ref.crc = binary.BigEndian.Uint32(rest[k:])
	return ref, true, nil
}

// snapFileName names group g's snapshot at index of term; hex, so a
// directory listing sorts by group, term and index.
func snapFileName(g uint64, meta raftpb.SnapshotMetadata) string {
	return fmt.Sprintf("%016x-%016x-%016x.snap", g, meta.Term, meta.Index)
}

func (s *multiStore) snapDir() string { return s.fs.PathJoin(s.dir, snapFileDir) }

// writeSnapFile writes data durably to its own file (through a temporary
// name, so a crash never leaves a partial file under a final name) and
// returns the reference to store. Callers hold snapMu.
func (s *multiStore) writeSnapFile(g uint64, meta raftpb.SnapshotMetadata, data []byte) (snapRef, error) {
	ref := snapRef{name: snapFileName(g, meta), size: uint64(len(data)), crc: crc32.Checksum(data, castagnoli)}
	dir := s.snapDir()
	if err := s.fs.MkdirAll(dir, 0o750); err != nil {
		return ref, fmt.Errorf("write raft snapshot: %w", err)
	}
	path, tmp := s.fs.PathJoin(dir, ref.name), s.fs.PathJoin(dir, ref.name+".tmp")
	f, err := s.fs.Create(tmp, vfs.WriteCategoryUnspecified)
	if err != nil {
		return ref, fmt.Errorf("write raft snapshot: %w", err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = s.fs.Rename(tmp, path)
	}
	if err == nil {
		err = s.syncDir(dir)
	}
	if err != nil {
		_ = s.fs.Remove(tmp)
		return ref, fmt.Errorf("write raft snapshot %s: %w", path, err)
	}
	return ref, nil
}

func (s *multiStore) syncDir(dir string) error {
	d, err := s.fs.OpenDir(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// readSnapFile reads and verifies a referenced snapshot file.
func (s *multiStore) readSnapFile(ref snapRef) ([]byte, error) {
	path := s.fs.PathJoin(s.snapDir(), ref.name)
	corrupt := func(reason string) error {
		return &CorruptError{File: path, Reason: "snapshot file: " + reason}
	}
	f, err := s.fs.Open(path)
	if err != nil {
		return nil, corrupt(err.Error())
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("read raft snapshot %s: %w", path, err)
	}
	if uint64(st.Size()) != ref.size {
		return nil, corrupt(fmt.Sprintf("%d bytes, the log store says %d", st.Size(), ref.size))
	}
	data := make([]byte, ref.size)
	if _, err := io.ReadFull(f, data); err != nil {
		return nil, fmt.Errorf("read raft snapshot %s: %w", path, err)
	}
	if got := crc32.Checksum(data, castagnoli); got != ref.crc {
		return nil, corrupt(fmt.Sprintf("checksum mismatch (stored %08x, computed %08x)", ref.crc, got))
	}
	return data, nil
}

// dropSnapFiles removes group g's snapshot files other than keep: older
// snapshots, and any written for a batch that never committed (a crash, a
// failed write). Callers hold snapMu, so no file being written for an
// uncommitted batch is removed.
func (s *multiStore) dropSnapFiles(g uint64, keep string) {
	names, err := s.fs.List(s.snapDir())
	if err != nil {
		return // no directory yet; anything else is retried next time
	}
	prefix := fmt.Sprintf("%016x-", g)
	for _, n := range names {
		if strings.HasPrefix(n, prefix) && n != keep {
			_ = s.fs.Remove(s.fs.PathJoin(s.snapDir(), n))
		}
	}
}

// storedSnapFile is the file group g's stored snapshot record refers to
// ("" if none, or if its data is inline).
func (s *multiStore) storedSnapFile(g uint64) (string, error) {
	b, err := s.get(groupKey(g, keySnapshot, 0))
	if err != nil || b == nil {
		return "", err
	}
	var snap raftpb.Snapshot
	if err := snap.Unmarshal(b); err != nil {
		return "", &CorruptError{File: etcdStoreDir, Reason: fmt.Sprintf("snapshot: %v", err)}
	}
	ref, ok, err := decodeSnapRef(snap.Data)
	if err != nil || !ok {
		return "", err
	}
	return ref.name, nil
}
