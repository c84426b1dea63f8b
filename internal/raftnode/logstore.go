// Durable Raft log and stable store selection: raft-wal or raft-boltdb.

package raftnode

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
// before. The returned value is the library's own type, not a wrapper, so
// raft's optional-interface checks (e.g. raft.MonotonicLogStore, which
// raft-wal implements) still see it. closeFn closes the store and releases
// the directory lock; call it after raft has shut down.
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
		w, err := raftwal.Open(walDir, raftwal.WithMetaStore(meta))
		if err != nil {
			_ = meta.Close()
			return nil, nil, fmt.Errorf("open raft wal in %s: %w (if it is corrupt, restore the node from a peer by removing the dir and rejoining)", walDir, err)
		}
		closeWAL := func() error {
			// BoltMetaDB.Close is idempotent, so this stays correct if a
			// later raft-wal closes the meta store itself.
			return errors.Join(w.Close(), meta.Close())
		}
		return w, closeOnce(closeWAL, unlock), nil

	default: // LogStoreBolt
		path := filepath.Join(dir, boltFileName)
		b, err := raftboltdb.New(raftboltdb.Options{
			Path: path,
			// bbolt otherwise waits forever for the file lock; the dir lock
			// should already rule that out, this is the belt to its braces.
			BoltOptions: &bbolt.Options{Timeout: boltOpenLimit},
			NoSync:      false, // Raft safety: fsync every commit (see above).
		})
		if err != nil {
			return nil, nil, fmt.Errorf("open raft bolt store %s: %w (if it is corrupt, restore the node from a peer by removing the file and rejoining)", path, err)
		}
		return b, closeOnce(b.Close, unlock), nil
	}
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
