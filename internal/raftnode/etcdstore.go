// The etcd engine's durable log: one pebble database per node, keyed by Raft
// group, so every group a node hosts shares one write-ahead log and one
// fsync per batch.

package raftnode

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// etcdStoreDir is the pebble database under a data dir (etcd engine).
const etcdStoreDir = "raftlog"

// Key layout: 'g' | group (8 bytes, big endian) | kind | [index (8 bytes)].
// Big-endian indexes make a group's entries one contiguous, ordered range.
const (
	keyEntry     byte = 'e'
	keyHardState byte = 'h'
	keySnapshot  byte = 's'
	// keyMarkKept is present once the group's durable mark file has been
	// written: from then on a missing mark file is damage (markKeptCheck).
	keyMarkKept byte = 'm'
)

// groupKey is the key of one record of group g.
func groupKey(g uint64, kind byte, index uint64) []byte {
	k := make([]byte, 0, 18)
	k = append(k, 'g')
	k = binary.BigEndian.AppendUint64(k, g)
	k = append(k, kind)
	if kind == keyEntry {
		k = binary.BigEndian.AppendUint64(k, index)
	}
	return k
}

// sealValue prefixes payload with a CRC-32C of key and payload: a record
// that pebble returns under the wrong key, or with flipped bits that its own
// block checksums missed, fails verification on read.
func sealValue(key, payload []byte) []byte {
	crc := crc32.Update(crc32.Checksum(key, castagnoli), castagnoli, payload)
	v := make([]byte, 4, 4+len(payload))
	binary.BigEndian.PutUint32(v, crc)
	return append(v, payload...)
}

// openValue checks a sealed value and returns its payload (a copy: pebble's
// buffer is only valid until its closer runs).
func openValue(key, v []byte) ([]byte, error) {
	if len(v) < 4 {
		return nil, fmt.Errorf("record %x is %d bytes, shorter than its checksum", key, len(v))
	}
	payload := v[4:]
	want := binary.BigEndian.Uint32(v[:4])
	if got := crc32.Update(crc32.Checksum(key, castagnoli), castagnoli, payload); got != want {
		return nil, fmt.Errorf("record %x: checksum mismatch (stored %08x, computed %08x)", key, want, got)
	}
	return append([]byte(nil), payload...), nil
}

// multiStore is one node's Raft log for every group it hosts. Writes from
// different groups that arrive together are committed by pebble's commit
// pipeline as one WAL write and one fsync (group commit), so adding groups
// adds no fsyncs.
type multiStore struct {
	db *pebble.DB
	// fs and dir are the store's file system and directory; snapshot files
	// live under dir (etcdsnapfile.go).
	fs  vfs.FS
	dir string
	// snapMu orders snapshot saves of one group: a snapshot received from
	// the leader and one taken locally may race, and the older must never
	// replace the newer. It is held from writing a snapshot's file until
	// the batch that refers to it commits or fails.
	snapMu sync.Mutex
	// writeHook, set only by tests, sees every log write before pebble does
	// (snapshot: the write stores a snapshot) and may fail or hold it.
	writeHook func(group uint64, snapshot bool) error
	// lastMu guards last: each group's last stored entry index, known once
	// the group's log was loaded or written. An append deletes a replaced
	// tail only when there is one: a range tombstone on every append made
	// pebble sort ever more overlapping tombstones in each flush, until
	// that sorting took both cores.
	lastMu sync.Mutex
	last   map[uint64]uint64
	// tailDeletes counts the range deletions of replaced tails (tests).
	tailDeletes atomic.Int64
	// The storage-append goroutine every group's writes go through
	// (etcdappend.go).
	writerState
}

// openMultiStore opens (creating if needed) the store at dir.
func openMultiStore(dir string) (*multiStore, error) {
	return openMultiStoreFS(dir, nil)
}

// openMultiStoreFS is openMultiStore on fs (nil: the OS's), for tests that
// inject disk errors.
func openMultiStoreFS(dir string, fs vfs.FS) (*multiStore, error) {
	if fs == nil {
		fs = walFS()
	}
	opts := &pebble.Options{Logger: quietPebbleLogger{}, FS: fs}
	db, err := pebble.Open(dir, opts)
	if err != nil {
		err = fmt.Errorf("open raft log %s: %w", dir, err)
		if pebble.IsCorruptionError(err) {
			err = &CorruptError{File: dir, Reason: err.Error()}
		}
		return nil, err
	}
	return &multiStore{db: db, fs: fs, dir: dir, last: map[uint64]uint64{}}, nil
}

// Close stops the append goroutine and closes the database; every group
// using the store has stopped before.
func (s *multiStore) Close() error {
	s.stopWriter()
	return s.db.Close()
}

// quietPebbleLogger keeps pebble's informational chatter out of the node's
// log; its errors reach us as returned errors. Pebble reports a failed
// write-ahead-log write (a full disk, an I/O error) through Fatalf, after
// which its commit pipeline takes no more writes: Fatalf panics with a
// pebbleFatal, which commitBatch turns back into the write's error, so the
// node stops as on any other storage failure ("stopped because its storage
// failed") instead of crashing with a stack trace.
type quietPebbleLogger struct{}

func (quietPebbleLogger) Infof(string, ...any)  {}
func (quietPebbleLogger) Errorf(string, ...any) {}
func (quietPebbleLogger) Fatalf(format string, args ...any) {
	panic(pebbleFatal{msg: fmt.Sprintf("pebble: "+format, args...)})
}

// pebbleFatal is what pebble's Fatalf panics with.
type pebbleFatal struct{ msg string }

func (f pebbleFatal) Error() string { return f.msg }

// commitBatch commits b; a pebble fatal error during the commit is returned
// as an error (nothing may be written afterwards: the callers' failure paths
// stop the node). Any other panic goes on.
func commitBatch(b *pebble.Batch, opt *pebble.WriteOptions) (err error) {
	defer func() {
		if p := recover(); p != nil {
			f, ok := p.(pebbleFatal)
			if !ok {
				panic(p)
			}
			err = f
		}
	}()
	return b.Commit(opt)
}

// groupState is what a group's log holds when it is opened.
type groupState struct {
	HardState raftpb.HardState
	Snapshot  raftpb.Snapshot
	// Entries follow Snapshot without a gap.
	Entries []raftpb.Entry
}

// Load reads and verifies group g's log: every record's checksum, every
// entry's index against its key, and that the entries after the snapshot are
// contiguous with non-decreasing terms. It never repairs anything.
func (s *multiStore) Load(g uint64) (groupState, error) {
	var gs groupState
	if b, err := s.get(groupKey(g, keyHardState, 0)); err != nil {
		return gs, err
	} else if b != nil {
		if err := gs.HardState.Unmarshal(b); err != nil {
			return gs, &CorruptError{File: etcdStoreDir, Reason: fmt.Sprintf("hard state: %v", err)}
		}
	}
	if b, err := s.get(groupKey(g, keySnapshot, 0)); err != nil {
		return gs, err
	} else if b != nil {
		if err := gs.Snapshot.Unmarshal(b); err != nil {
			return gs, &CorruptError{File: etcdStoreDir, Reason: fmt.Sprintf("snapshot: %v", err)}
		}
		ref, isRef, err := decodeSnapRef(gs.Snapshot.Data)
		if err != nil {
			return gs, &CorruptError{File: etcdStoreDir, Reason: err.Error()}
		}
		if isRef {
			if gs.Snapshot.Data, err = s.readSnapFile(ref); err != nil {
				return gs, err
			}
		}
	}
	first := gs.Snapshot.Metadata.Index + 1
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: groupKey(g, keyEntry, first), UpperBound: groupKey(g, keyEntry, math.MaxUint64)})
	if err != nil {
		return gs, fmt.Errorf("read raft log: %w", err)
	}
	defer it.Close()
	next, prevTerm := first, gs.Snapshot.Metadata.Term
	for it.First(); it.Valid(); it.Next() {
		idx := binary.BigEndian.Uint64(it.Key()[10:])
		v, err := it.ValueAndErr()
		if err != nil {
			return gs, &CorruptError{File: etcdStoreDir, Index: idx, Reason: err.Error()}
		}
		b, err := openValue(it.Key(), v)
		if err != nil {
			return gs, &CorruptError{File: etcdStoreDir, Index: idx, Reason: err.Error()}
		}
		var e raftpb.Entry
		if err := e.Unmarshal(b); err != nil {
			return gs, &CorruptError{File: etcdStoreDir, Index: idx, Reason: err.Error()}
		}
		switch {
		case e.Index != idx:
			return gs, &CorruptError{File: etcdStoreDir, Index: idx, Reason: fmt.Sprintf("entry says index %d", e.Index)}
		case idx != next:
			return gs, &CorruptError{File: etcdStoreDir, Index: next, Reason: fmt.Sprintf("entry missing: the log jumps to %d", idx)}
		case e.Term < prevTerm:
			return gs, &CorruptError{File: etcdStoreDir, Index: idx, Reason: fmt.Sprintf("term %d is below the previous entry's term %d", e.Term, prevTerm)}
		}
		next, prevTerm = idx+1, e.Term
		gs.Entries = append(gs.Entries, e)
	}
	if err := it.Error(); err != nil {
		return gs, &CorruptError{File: etcdStoreDir, Reason: err.Error()}
	}
	s.setLast(g, next-1)
	return gs, nil
}

func (s *multiStore) setLast(g, idx uint64) {
	s.lastMu.Lock()
	s.last[g] = idx
	s.lastMu.Unlock()
}

// replacesTail reports whether entries ending at end leave older entries
// after them that must go: when the group's last index is unknown (never
// loaded here), it assumes so.
func (s *multiStore) replacesTail(g, end uint64) bool {
	s.lastMu.Lock()
	defer s.lastMu.Unlock()
	last, known := s.last[g]
	s.last[g] = end
	return !known || last > end
}

// markKept reports whether group g has recorded that it keeps a durable
// mark file.
func (s *multiStore) markKept(g uint64) (bool, error) {
	b, err := s.get(groupKey(g, keyMarkKept, 0))
	return b != nil, err
}

// setMarkKept records, durably, that group g keeps a durable mark file.
func (s *multiStore) setMarkKept(g uint64) error {
	k := groupKey(g, keyMarkKept, 0)
	if err := s.db.Set(k, sealValue(k, []byte{1}), pebble.Sync); err != nil {
		return fmt.Errorf("write raft log: %w", err)
	}
	return nil
}

// get reads and verifies one record; nil if absent.
func (s *multiStore) get(key []byte) ([]byte, error) {
	v, closer, err := s.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read raft log: %w", err)
	}
	defer closer.Close()
	b, err := openValue(key, v)
	if err != nil {
		return nil, &CorruptError{File: etcdStoreDir, Reason: err.Error()}
	}
	return b, nil
}

// Save makes one Ready's writes of group g durable (sync) in one batch: the
// hard state, the new entries (dropping any later ones they replace) and a
// received snapshot.
func (s *multiStore) Save(g uint64, hs raftpb.HardState, ents []raftpb.Entry, snap raftpb.Snapshot, sync bool) error {
	if !raft.IsEmptySnap(snap) {
		s.snapMu.Lock()
		defer s.snapMu.Unlock()
	}
	b := s.db.NewBatch()
	defer b.Close()
	if err := s.stage(b, g, hs, ents, snap); err != nil {
		return err
	}
	if s.writeHook != nil {
		if err := s.writeHook(g, !raft.IsEmptySnap(snap)); err != nil {
			return err
		}
	}
	opt := pebble.NoSync
	if sync {
		opt = pebble.Sync
	}
	if err := commitBatch(b, opt); err != nil {
		return fmt.Errorf("write raft log: %w", err)
	}
	return nil
}

// stage adds one group's Ready writes to b; with a snapshot, the caller
// holds snapMu until b commits or fails.
func (s *multiStore) stage(b *pebble.Batch, g uint64, hs raftpb.HardState, ents []raftpb.Entry, snap raftpb.Snapshot) error {
	if !raft.IsEmptyHardState(hs) {
		v, err := hs.Marshal()
		if err != nil {
			return err
		}
		k := groupKey(g, keyHardState, 0)
		if err := b.Set(k, sealValue(k, v), nil); err != nil {
			return err
		}
	}
	if !raft.IsEmptySnap(snap) {
		if err := s.stageSnapshot(b, g, snap, true); err != nil {
			return err
		}
	}
	for i := range ents {
		v, err := ents[i].Marshal()
		if err != nil {
			return err
		}
		k := groupKey(g, keyEntry, ents[i].Index)
		if err := b.Set(k, sealValue(k, v), nil); err != nil {
			return err
		}
	}
	if n := len(ents); n > 0 && s.replacesTail(g, ents[n-1].Index) {
		// A new leader's entries replace a conflicting tail: drop whatever
		// followed it, or a restart would read the old tail back.
		s.tailDeletes.Add(1)
		if err := b.DeleteRange(groupKey(g, keyEntry, ents[n-1].Index+1), groupKey(g, keyEntry, math.MaxUint64), nil); err != nil {
			return err
		}
	}
	return nil
}

// stageSnapshot writes snap's data to its file and stores a reference to
// it, and drops the entries it covers; received (a snapshot from the leader)
// drops the whole log, as Raft does: entries after a received snapshot's
// index are not known to agree with it. The caller holds snapMu.
func (s *multiStore) stageSnapshot(b *pebble.Batch, g uint64, snap raftpb.Snapshot, received bool) error {
	// Files that no committed record refers to go first, so at most the
	// stored snapshot's file and this one's exist at a time.
	cur, err := s.storedSnapFile(g)
	if err != nil {
		return err
	}
	s.dropSnapFiles(g, cur)
	ref, err := s.writeSnapFile(g, snap.Metadata, snap.Data)
	if err != nil {
		return err
	}
	rec := snap
	rec.Data = ref.encode()
	v, err := rec.Marshal()
	if err != nil {
		return err
	}
	k := groupKey(g, keySnapshot, 0)
	if err := b.Set(k, sealValue(k, v), nil); err != nil {
		return err
	}
	end := groupKey(g, keyEntry, snap.Metadata.Index+1)
	if received {
		end = groupKey(g, keyEntry, math.MaxUint64)
		s.setLast(g, snap.Metadata.Index)
	}
	return b.DeleteRange(groupKey(g, keyEntry, 0), end, nil)
}

// SaveSnapshot stores a snapshot group g took itself, unless a newer one is
// already stored, and drops the entries it covers.
func (s *multiStore) SaveSnapshot(g uint64, snap raftpb.Snapshot) error {
	s.snapMu.Lock()
	defer s.snapMu.Unlock()
	cur, err := s.get(groupKey(g, keySnapshot, 0))
	if err != nil {
		return err
	}
	if cur != nil {
		var old raftpb.Snapshot
		if err := old.Unmarshal(cur); err == nil && old.Metadata.Index >= snap.Metadata.Index {
			return nil
		}
	}
	b := s.db.NewBatch()
	defer b.Close()
	if err := s.stageSnapshot(b, g, snap, false); err != nil {
		return err
	}
	if s.writeHook != nil {
		if err := s.writeHook(g, true); err != nil {
			return err
		}
	}
	if err := commitBatch(b, pebble.Sync); err != nil {
		return fmt.Errorf("write raft snapshot: %w", err)
	}
	s.dropSnapFiles(g, snapFileName(g, snap.Metadata))
	return nil
}
