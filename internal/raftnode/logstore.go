// Durable Raft log and stable store selection: raft-wal or raft-boltdb.

package raftnode

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	raftwal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"go.etcd.io/bbolt"
)

// LogStoreKind names a durable log store implementation.
type LogStoreKind string

const (
	// LogStoreWAL is github.com/hashicorp/raft-wal: append-only segment
	// files, one write and one fsync per StoreLogs.
	LogStoreWAL LogStoreKind = "wal"
	// LogStoreBolt is github.com/hashicorp/raft-boltdb/v2: a B+tree with
	// copy-on-write pages, so each commit rewrites and fsyncs pages as well
	// as the meta page.
	LogStoreBolt LogStoreKind = "bolt"
)

// DefaultLogStore is the store that measured fastest for dlock's write
// pattern (small commands, small batches, fsync on every append); see
// LOGSTORE_RESULTS.txt and BenchmarkLogStore.
const DefaultLogStore = LogStoreWAL

// LogAndStableStore is what a Raft node persists to: the log and the small
// stable values (current term, last vote). Both implementations keep them
// in one place so a single directory is a node's whole durable Raft state
// besides snapshots.
type LogAndStableStore interface {
	raft.LogStore
	raft.StableStore
}

// Paths under the directory passed to OpenLogStore.
const (
	walDirName    = "wal"
	boltFileName  = "raft.db"
	lockFileName  = "logstore.lock"
	boltOpenLimit = time.Second
)

// OpenLogStore opens (creating if needed) the log and stable store of the
// given kind under dir. Reopening the same dir sees everything written
// before. The returned store checksums every entry it stores and verifies
// every entry it reads (checkstore.go); it keeps raft's optional interfaces
// (raft.MonotonicLogStore, which raft-wal implements) visible. closeFn
// closes the store and releases the directory lock; call it after raft has
// shut down.
//
// Durability: both kinds fsync before StoreLogs/StoreLog and Set/SetUint64
// return. raft-wal has no option to skip the fsync (segment.Writer syncs on
// every commit frame, and its meta store is bbolt with syncing on), and
// bolt's NoSync is left false here, which is also bbolt's default. Raft's
// safety depends on this: a node must not acknowledge an entry or a vote it
// could forget after a crash.
//
// A second open of the same dir, from this or another process, fails fast
// instead of blocking on bbolt's file lock, which would otherwise wait
// forever.
func OpenLogStore(kind LogStoreKind, dir string) (store LogAndStableStore, closeFn func() error, err error) {
	if k, _ := DataDirEngine(dir); k == EngineEtcd {
		return openEtcdLogReader(dir)
	}
	cs, closeFn, err := openCheckedStore(kind, dir)
	if err != nil {
		return nil, nil, err
	}
	return cs.raftStore(), closeFn, nil
}

// walSegmentBytes is the size of raft-wal's segment files, allocated whole
// when each is created. raft-wal also begins a new one at every cut of the
// log's tail (a follower dropping entries a new leader never had, a start
// that drops a torn tail), and only a snapshot's compaction frees the old
// ones: at raft-wal's default, 64 MiB, a follower through many leader
// changes and restarts filled a 1 GiB disk in minutes
// (docs/reliability.md, "A node that kept restarting filled its disk").
// 8 MiB still holds tens of thousands of lock entries (up to 16 of the
// largest, command.MaxEntryBytes).
const walSegmentBytes = 8 << 20

// openCheckedStore opens the store under its checksumming wrapper
// (checkstore.go). The durable mark is read but not yet enforced or kept:
// Node.Open does both once it has verified the data dir (verifyDataDir);
// offline tools only keep the mark exact when they close.
func openCheckedStore(kind LogStoreKind, dir string) (cs *checkedStore, closeFn func() error, err error) {
	if kind == "" {
		kind = DefaultLogStore
	}
	if kind != LogStoreWAL && kind != LogStoreBolt {
		return nil, nil, fmt.Errorf("unknown raft log store kind %q: use %q or %q", kind, LogStoreWAL, LogStoreBolt)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("create raft data dir %s: %w (check the path and its permissions)", dir, err)
	}
	unlock, err := lockDir(filepath.Join(dir, lockFileName))
	if err != nil {
		return nil, nil, fmt.Errorf("lock raft data dir %s: %w (is another dlock node using this dir?)", dir, err)
	}
	defer func() {
		if err != nil {
			_ = unlock()
		}
	}()
	defer refuseOnPanic(dir, &err)

	var inner LogAndStableStore
	var closeInner func() error
	var locate func(uint64) string
	switch kind {
	case LogStoreWAL:
		walDir := filepath.Join(dir, walDirName)
		if err := os.MkdirAll(walDir, 0o700); err != nil {
			return nil, nil, fmt.Errorf("create raft wal dir %s: %w (check its permissions)", walDir, err)
		}
		// raft-wal (v0.4.0 at least) does not close its meta bolt DB, leaking
		// the fd and its flock, so a reopen in the same process would block
		// forever. Owning the meta store lets closeFn close it.
		meta := &metadb.BoltMetaDB{}
		w, err := raftwal.Open(walDir, raftwal.WithMetaStore(meta), raftwal.WithSegmentSize(walSegmentBytes))
		if err != nil {
			_ = meta.Close()
			return nil, nil, &RefusedError{Dir: dir, Err: fmt.Errorf("open raft wal in %s: %w", walDir, err)}
		}
		inner, locate = w, func(i uint64) string { return walSegmentFile(walDir, i) }
		closeInner = func() error {
			// BoltMetaDB.Close is idempotent, so this stays correct if a
			// later raft-wal closes the meta store itself.
			return errors.Join(w.Close(), meta.Close())
		}

	default: // LogStoreBolt
		path := filepath.Join(dir, boltFileName)
		if err := checkBoltFile(path); err != nil {
			return nil, nil, &RefusedError{Dir: dir, Err: err}
		}
		b, err := raftboltdb.New(raftboltdb.Options{
			Path: path,
			// bbolt otherwise waits forever for the file lock; the dir lock
			// should already rule that out, this is the belt to its braces.
			BoltOptions: &bbolt.Options{Timeout: boltOpenLimit},
			NoSync:      false, // Raft safety: fsync every commit (see above).
		})
		if err != nil {
			return nil, nil, &RefusedError{Dir: dir, Err: fmt.Errorf("open raft bolt store %s: %w", path, err)}
		}
		inner, locate, closeInner = b, func(uint64) string { return path }, b.Close
	}
	mark, markValue, markExisted, err := openMark(dir)
	if err != nil {
		_ = closeInner()
		return nil, nil, &RefusedError{Dir: dir, Err: err}
	}
	cs = &checkedStore{inner: inner, locate: locate, mark: mark, markAtOpen: markValue, parked: make(chan struct{})}
	if err := cs.initChecksumFrom(markExisted); err != nil {
		_ = mark.close(true)
		_ = closeInner()
		return nil, nil, &RefusedError{Dir: dir, Err: err}
	}
	_, kept, err := stableUint64(inner, markKeptKey)
	if err == nil {
		err = markKeptCheck(kept, markExisted, mark.path)
	}
	if err != nil {
		_ = mark.close(true)
		_ = closeInner()
		return nil, nil, &RefusedError{Dir: dir, Err: err}
	}
	closeAll := func() error {
		return errors.Join(mark.close(cs.failure() != nil), closeInner())
	}
	return cs, closeOnce(closeAll, unlock), nil
}

// checkBoltFile refuses a raft.db shorter than its own pages say: bbolt
// reads the missing pages as zeros, and v1.4 panics on them (in places no
// recover reaches) where v1.3 looped for ever. (bbolt's full consistency
// check, tx.Check, is not run: it panics in a goroutine of its own on
// damaged pages, taking the process down without the refusal.)
func checkBoltFile(path string) error {
	fi, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) || (err == nil && fi.Size() == 0) {
		// New, or never initialised: the stable store checks that follow
		// refuse an empty one that should hold a log.
		return nil
	}
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true, Timeout: boltOpenLimit})
	if err != nil {
		return fmt.Errorf("open raft bolt store %s: %w", path, err)
	}
	defer db.Close()
	return db.View(func(tx *bbolt.Tx) error {
		if tx.Size() > fi.Size() {
			return fmt.Errorf("raft bolt store %s is damaged: it holds %d bytes but its pages reach %d: the file was truncated", path, fi.Size(), tx.Size())
		}
		return nil
	})
}

// walSegmentFile names the raft-wal segment file that holds index: the one
// with the greatest base index not above it (raft-wal names segments
// <base index>-<id>.wal). It falls back to the wal dir.
func walSegmentFile(walDir string, index uint64) string {
	entries, err := os.ReadDir(walDir)
	if err != nil {
		return walDir
	}
	best, bestBase := "", uint64(0)
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".wal") {
			continue
		}
		baseStr, _, ok := strings.Cut(name, "-")
		if !ok {
			continue
		}
		base, err := strconv.ParseUint(baseStr, 10, 64)
		if err != nil || base > index || (best != "" && base < bestBase) {
			continue
		}
		best, bestBase = name, base
	}
	if best == "" {
		return walDir
	}
	return filepath.Join(walDir, best)
}

// closeOnce closes the store, then releases the dir lock even if the store
// close failed, so a retrying caller is not locked out by its own process.
// Later calls return the first result, so shutdown paths may call it freely.
func closeOnce(closeStore, unlock func() error) func() error {
	return sync.OnceValue(func() error {
		var errs []error
		if err := closeStore(); err != nil {
			errs = append(errs, fmt.Errorf("close raft log store: %w", err))
		}
		if err := unlock(); err != nil {
			errs = append(errs, fmt.Errorf("release raft data dir lock: %w", err))
		}
		return errors.Join(errs...)
	})
}
