// Checksummed log store: every entry carries a CRC32C that is checked when it
// is read back, a durable high-water mark catches a log that lost its tail,
// and any failed write stops the node instead of letting Raft carry on.

package raftnode

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"
)

// Entry checksums live in raft.Log.Extensions, which Raft reserves for
// middleware like this and dlock does not otherwise use. Both log stores
// persist Extensions verbatim.
const (
	checksumVersion = 0xD1 // first byte of Extensions: this format
	checksumLen     = 5    // version byte + CRC32C (little endian)
)

// checksumFromKey (stable store) is the first log index that must carry a
// checksum. Data dirs written before checksums existed hold older entries
// without one; recording where checksums start means an entry that lost its
// checksum to corruption cannot pass for one of those.
var checksumFromKey = []byte("dlock.ChecksumFrom")

// markFileName holds the durable high-water mark: the last log index a
// StoreLogs call made durable, as of at most markFlushEvery ago.
const markFileName = "durable-index"

// markKeptKey (stable store) is set once the durable mark file has been
// written: from then on a missing or empty mark file is damage, not a data
// dir that never had one (markKeptCheck).
var markKeptKey = []byte("dlock.MarkKept")

// markKeptCheck refuses a mark file that is gone (or empty) although the
// store recorded keeping one: deleting it would otherwise disarm the check
// for a log that lost its tail.
func markKeptCheck(kept, existed bool, path string) error {
	if kept && !existed {
		return fmt.Errorf("the durable mark %s is missing or empty although this data dir kept one: %w", path, errMarkMissing)
	}
	return nil
}

var errMarkMissing = errors.New("it was deleted or damaged, so the log cannot be checked for lost entries")

// syncDir fsyncs a directory, so a file created in it survives a crash.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// markFlushEvery is how often the mark is rewritten while it changes. Raising
// it lowers the cost (one small fsync per period) and widens the window in
// which a lost tail goes unnoticed (docs/reliability.md, "Storage integrity").
const markFlushEvery = 50 * time.Millisecond

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func entryChecksum(l *raft.Log) uint32 {
	var hdr [17]byte
	binary.BigEndian.PutUint64(hdr[0:], l.Index)
	binary.BigEndian.PutUint64(hdr[8:], l.Term)
	hdr[16] = byte(l.Type)
	return crc32.Update(crc32.Checksum(hdr[:], castagnoli), castagnoli, l.Data)
}

// CorruptError says a log entry (or the log as a whole) cannot be trusted:
// which file, which index, and what was wrong.
type CorruptError struct {
	File   string
	Index  uint64
	Reason string
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("raft log entry %d in %s is corrupt: %s", e.Index, e.File, e.Reason)
}

// ErrStorageFailed marks a write to the log or stable store that failed: the
// node stops, since after a failed fsync the page cache may have dropped the
// data while later writes succeed.
var ErrStorageFailed = errors.New("storage write failed")

// checkedStore wraps a log and stable store (see the file comment).
type checkedStore struct {
	inner LogAndStableStore
	// from is the first index that must carry a checksum.
	from uint64
	// locate names the file that holds an index, for messages.
	locate func(index uint64) string

	// failed is the first write error; every later write returns it.
	failed  atomic.Pointer[error]
	onFatal atomic.Pointer[func(error)]

	// parked is never closed: see stableFailed.
	parked chan struct{}

	mark *durableMark
	// markAtOpen is what the mark file held when the store was opened.
	markAtOpen uint64
}

// monotonicCheckedStore keeps raft.MonotonicLogStore visible through the
// wrapper when the inner store has it (raft-wal): Raft then truncates the log
// before installing a snapshot, as raft-wal requires.
type monotonicCheckedStore struct{ *checkedStore }

func (monotonicCheckedStore) IsMonotonic() bool { return true }

// raftStore is the store as Raft must see it: with the inner store's
// optional interfaces.
func (s *checkedStore) raftStore() LogAndStableStore {
	if m, ok := s.inner.(raft.MonotonicLogStore); ok && m.IsMonotonic() {
		return monotonicCheckedStore{s}
	}
	return s
}

// checked returns the checkedStore behind a store from OpenLogStore.
func checked(st LogAndStableStore) *checkedStore {
	switch s := st.(type) {
	case *checkedStore:
		return s
	case monotonicCheckedStore:
		return s.checkedStore
	}
	return nil
}

// SetFatal installs the function told (once) of the first failed write or
// of corruption found while running.
func (s *checkedStore) SetFatal(f func(error)) {
	s.onFatal.Store(&f)
	if err := s.failure(); err != nil {
		f(err)
	}
}

func (s *checkedStore) fail(err error) error {
	err = fmt.Errorf("%w: %w", ErrStorageFailed, err)
	if s.failed.CompareAndSwap(nil, &err) {
		if f := s.onFatal.Load(); f != nil {
			(*f)(err)
		}
	}
	return *s.failed.Load()
}

func (s *checkedStore) failure() error {
	if p := s.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// corrupt reports corruption found while running (a read for replication
// or apply): the node must stop serving, as at start-up, and write nothing
// more. Offline tools (no fatal handler) just get the error, so a dump can
// go on past a damaged entry.
func (s *checkedStore) corrupt(err error) error {
	f := s.onFatal.Load()
	if f == nil {
		return err
	}
	if s.failed.CompareAndSwap(nil, &err) {
		(*f)(err)
	}
	return err
}

func (s *checkedStore) FirstIndex() (uint64, error) { return s.inner.FirstIndex() }
func (s *checkedStore) LastIndex() (uint64, error)  { return s.inner.LastIndex() }

// GetLog reads an entry and verifies it, handing Raft the entry without the
// checksum (so a leader sends followers clean entries, and each follower
// checksums what it stores).
func (s *checkedStore) GetLog(index uint64, l *raft.Log) error {
	err := s.getLog(index, l)
	var ce *CorruptError
	if errors.As(err, &ce) {
		return s.corrupt(err)
	}
	return err
}

func (s *checkedStore) getLog(index uint64, l *raft.Log) error {
	if err := s.innerGetLog(index, l); err != nil {
		if errors.Is(err, raft.ErrLogNotFound) || errors.Is(err, raftwal.ErrClosed) {
			return err
		}
		return &CorruptError{File: s.locate(index), Index: index, Reason: "unreadable: " + err.Error()}
	}
	if l.Index != index {
		return &CorruptError{File: s.locate(index), Index: index, Reason: fmt.Sprintf("it says it is entry %d", l.Index)}
	}
	ext := l.Extensions
	l.Extensions = nil
	if len(ext) == 0 {
		if index >= s.from {
			return &CorruptError{File: s.locate(index), Index: index, Reason: fmt.Sprintf("no checksum (every entry from %d on has one)", s.from)}
		}
		return nil // written before this data dir had checksums
	}
	if len(ext) != checksumLen || ext[0] != checksumVersion {
		return &CorruptError{File: s.locate(index), Index: index, Reason: "checksum field damaged"}
	}
	if got, want := entryChecksum(l), binary.LittleEndian.Uint32(ext[1:]); got != want {
		return &CorruptError{File: s.locate(index), Index: index, Reason: fmt.Sprintf("checksum mismatch (stored %08x, content %08x)", want, got)}
	}
	return nil
}

// innerGetLog reads from the inner store, turning a panic into an error:
// raft-wal's decoder panics on some damaged length fields.
func (s *checkedStore) innerGetLog(index uint64, l *raft.Log) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("the store could not decode it: %v", r)
		}
	}()
	return s.inner.GetLog(index, l)
}

func (s *checkedStore) StoreLog(l *raft.Log) error { return s.StoreLogs([]*raft.Log{l}) }

// StoreLogs stores copies of the entries with their checksums: the caller's
// entries stay as they are (Raft's log cache keeps them).
func (s *checkedStore) StoreLogs(logs []*raft.Log) error {
	if err := s.failure(); err != nil {
		return err
	}
	if len(logs) == 0 {
		return nil
	}
	copies := make([]raft.Log, len(logs))
	ptrs := make([]*raft.Log, len(logs))
	exts := make([]byte, checksumLen*len(logs))
	for i, l := range logs {
		copies[i] = *l
		ext := exts[i*checksumLen : (i+1)*checksumLen : (i+1)*checksumLen]
		ext[0] = checksumVersion
		binary.LittleEndian.PutUint32(ext[1:], entryChecksum(l))
		copies[i].Extensions = ext
		ptrs[i] = &copies[i]
	}
	if err := s.inner.StoreLogs(ptrs); err != nil {
		return s.fail(fmt.Errorf("store log entries %d..%d: %w", logs[0].Index, logs[len(logs)-1].Index, err))
	}
	if err := s.mark.stored(logs[len(logs)-1].Index); err != nil {
		return s.fail(fmt.Errorf("write the durable mark %s: %w", s.mark.path, err))
	}
	return nil
}

// DeleteRange lowers the durable mark before it removes the log's tail (a
// conflicting suffix on a follower, or everything before a snapshot install),
// so a crash in between never leaves a mark above what the log may hold.
func (s *checkedStore) DeleteRange(min, max uint64) error {
	if err := s.failure(); err != nil {
		return err
	}
	if err := s.mark.truncating(min, max); err != nil {
		return s.fail(fmt.Errorf("lower the durable mark before deleting entries %d..%d: %w", min, max, err))
	}
	if err := s.inner.DeleteRange(min, max); err != nil {
		return s.fail(fmt.Errorf("delete log entries %d..%d: %w", min, max, err))
	}
	return nil
}

func (s *checkedStore) Set(key, val []byte) error {
	if err := s.failure(); err != nil {
		return s.stableFailed(err)
	}
	if err := s.inner.Set(key, val); err != nil {
		return s.stableFailed(s.fail(fmt.Errorf("write %s to the stable store: %w", key, err)))
	}
	return nil
}

func (s *checkedStore) SetUint64(key []byte, val uint64) error {
	if err := s.failure(); err != nil {
		return s.stableFailed(err)
	}
	if err := s.inner.SetUint64(key, val); err != nil {
		return s.stableFailed(s.fail(fmt.Errorf("write %s to the stable store: %w", key, err)))
	}
	return nil
}

// stableFailed is what a stable store write answers once the store has
// failed. Offline tools get the error. Under a running node the calling
// goroutine — Raft's main loop, which panics when it cannot save its term —
// is parked for good instead: the node is stopping (fail told it), and a
// parked Raft neither panics the process nor acts on a term or vote it could
// not save.
func (s *checkedStore) stableFailed(err error) error {
	if s.onFatal.Load() == nil {
		return err
	}
	<-s.parked
	return err
}

func (s *checkedStore) Get(key []byte) ([]byte, error)       { return s.inner.Get(key) }
func (s *checkedStore) GetUint64(key []byte) (uint64, error) { return s.inner.GetUint64(key) }

// stableUint64 reads a key written with Set as 8 bytes; ok is false if unset
// (the two stores answer an unset key differently).
func stableUint64(st raft.StableStore, key []byte) (v uint64, ok bool, err error) {
	b, err := st.Get(key)
	if err != nil {
		if err.Error() == "not found" { // raft-boltdb's ErrKeyNotFound
			return 0, false, nil
		}
		return 0, false, err
	}
	if len(b) == 0 {
		return 0, false, nil
	}
	if len(b) != 8 {
		return 0, false, fmt.Errorf("stable store key %s holds %d bytes, want 8", key, len(b))
	}
	return binary.BigEndian.Uint64(b), true, nil
}

// initChecksumFrom reads, or on the first open with checksums records, the
// first index that must carry a checksum.
func (s *checkedStore) initChecksumFrom(markExisted bool) error {
	from, ok, err := stableUint64(s.inner, checksumFromKey)
	if err != nil {
		return fmt.Errorf("read %s from the stable store: %w", checksumFromKey, err)
	}
	if ok {
		s.from = from
		return nil
	}
	if markExisted {
		// The mark is written only by code that also records the key: the
		// stable store lost it.
		return fmt.Errorf("the stable store has no %s although %s exists: the stable store was damaged or replaced", checksumFromKey, markFileName)
	}
	last, err := s.inner.LastIndex()
	if err != nil {
		return err
	}
	s.from = last + 1
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], s.from)
	if err := s.inner.Set(checksumFromKey, b[:]); err != nil {
		return fmt.Errorf("record %s in the stable store: %w", checksumFromKey, err)
	}
	return nil
}

// durableMark keeps the durable high-water mark file (see markFileName).
// StoreLogs writes each new mark into the file without fsync: the write
// costs a system call, not a disk flush, and it survives the process being
// killed (the page cache keeps it), so after a kill -9 the mark covers every
// entry the log made durable. A goroutine fsyncs it at most every
// markFlushEvery, which bounds what a power loss can take from the mark.
// File writes are serialized by wmu, and each one writes the value current
// when it took wmu, so a write can never put back a mark that a truncation
// lowered.
type durableMark struct {
	path string
	f    *os.File

	// wmu serializes writes to f and guards cached (what the file says, in
	// the page cache) and synced (what an fsync covered).
	wmu    sync.Mutex
	cached uint64
	synced uint64
	// mu guards last, the last index the log holds durably.
	mu   sync.Mutex
	last uint64

	onError func(error)
	stop    chan struct{}
	done    chan struct{}
}

// openMark opens the mark file; existed says whether it was there with a
// mark in it, and value is what it holds (0 if new).
func openMark(dir string) (m *durableMark, value uint64, existed bool, err error) {
	path := filepath.Join(dir, markFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, 0, false, err
	}
	m = &durableMark{path: path, f: f}
	var b [12]byte
	n, err := f.ReadAt(b[:], 0)
	switch {
	case n == 0:
		return m, 0, false, nil
	case n != len(b):
		f.Close()
		return nil, 0, true, fmt.Errorf("%s holds %d bytes, want %d: it is damaged", path, n, len(b))
	}
	if crc32.Checksum(b[:8], castagnoli) != binary.LittleEndian.Uint32(b[8:]) {
		f.Close()
		return nil, 0, true, fmt.Errorf("%s fails its checksum: it is damaged", path)
	}
	value = binary.BigEndian.Uint64(b[:8])
	m.last, m.cached, m.synced = value, value, value
	return m, value, true, nil
}

// writeLocked stores v in the file, without fsync. Caller holds wmu.
func (m *durableMark) writeLocked(v uint64) error {
	var b [12]byte
	binary.BigEndian.PutUint64(b[:8], v)
	binary.LittleEndian.PutUint32(b[8:], crc32.Checksum(b[:8], castagnoli))
	if _, err := m.f.WriteAt(b[:], 0); err != nil {
		return err
	}
	m.cached = v
	return nil
}

// syncLocked stores v and fsyncs. Caller holds wmu.
func (m *durableMark) syncLocked(v uint64) error {
	if err := m.writeLocked(v); err != nil {
		return err
	}
	if err := m.f.Sync(); err != nil {
		return err
	}
	m.synced = v
	return nil
}

func (m *durableMark) current() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.last
}

// flush makes the current mark durable if an fsync has not covered it yet.
// The fsync runs outside wmu, so StoreLogs never waits for it.
func (m *durableMark) flush() error {
	m.wmu.Lock()
	if v := m.current(); v != m.cached {
		if err := m.writeLocked(v); err != nil {
			m.wmu.Unlock()
			return err
		}
	}
	v, need := m.cached, m.cached != m.synced
	m.wmu.Unlock()
	if !need {
		return nil
	}
	if err := m.f.Sync(); err != nil {
		return err
	}
	m.wmu.Lock()
	// v was in the file before the fsync began; a truncation since then
	// synced its own lower value (and a later flush syncs whatever follows).
	if m.cached == v {
		m.synced = v
	}
	m.wmu.Unlock()
	return nil
}

// set makes v the mark now, durably (at open).
func (m *durableMark) set(v uint64) error {
	m.wmu.Lock()
	defer m.wmu.Unlock()
	m.mu.Lock()
	m.last = v
	m.mu.Unlock()
	return m.syncLocked(v)
}

// stored records that the log holds index durably, and writes it into the
// file (no fsync: see the type comment).
func (m *durableMark) stored(index uint64) error {
	m.wmu.Lock()
	defer m.wmu.Unlock()
	m.mu.Lock()
	m.last = index
	m.mu.Unlock()
	return m.writeLocked(index)
}

// truncating lowers the mark, durably, when [min, max] reaches the log's end.
// Compaction of the head (after a snapshot) leaves it alone.
func (m *durableMark) truncating(lo, hi uint64) error {
	if lo == 0 || hi < m.current() {
		return nil
	}
	m.wmu.Lock()
	defer m.wmu.Unlock()
	m.mu.Lock()
	m.last = min(m.last, lo-1)
	v := m.last
	m.mu.Unlock()
	if m.cached <= v && m.synced <= v {
		return nil
	}
	return m.syncLocked(v)
}

// run writes the mark out at most every markFlushEvery while it changes.
func (m *durableMark) run() {
	defer close(m.done)
	t := time.NewTicker(markFlushEvery)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		if err := m.flush(); err != nil {
			m.onError(fmt.Errorf("write the durable mark %s: %w", m.path, err))
			return
		}
	}
}

func (m *durableMark) start(onError func(error)) {
	m.onError = onError
	m.stop, m.done = make(chan struct{}), make(chan struct{})
	go m.run()
}

// close stops the writer and leaves the exact mark on disk (unless the store
// failed: then the disk is not to be trusted with more writes).
func (m *durableMark) close(failed bool) error {
	if m.stop != nil {
		close(m.stop)
		<-m.done
	}
	var err error
	if !failed {
		err = m.flush()
	}
	return errors.Join(err, m.f.Close())
}
