package raftnode

import (
	"errors"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// A write-ahead-log write that fails (here: a full disk) reaches pebble's
// Fatalf; the commit must come back as an error — which stops the node as
// a storage failure — not crash the process with a panic. The sharded
// fault-injection soak found the panic (docs/reliability.md).
func TestFailedLogWriteIsAnErrorNotAPanic(t *testing.T) {
	var full atomic.Bool
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if full.Load() && strings.HasSuffix(op.Path, ".log") &&
			(op.Kind == errorfs.OpFileWrite || op.Kind == errorfs.OpFileSync || op.Kind == errorfs.OpFileSyncData) {
			return syscall.ENOSPC
		}
		return nil
	})
	s, err := openMultiStoreFS(t.TempDir(), errorfs.Wrap(vfs.Default, inj))
	if err != nil {
		t.Fatal(err)
	}
	b := s.db.NewBatch()
	_ = b.Set([]byte("before"), []byte("x"), nil)
	if err := commitBatch(b, pebble.Sync); err != nil {
		t.Fatalf("a write before the disk filled: %v", err)
	}
	_ = b.Close()
	full.Store(true)
	b = s.db.NewBatch()
	_ = b.Set([]byte("after"), []byte("y"), nil)
	err = commitBatch(b, pebble.Sync)
	var f pebbleFatal
	if !errors.As(err, &f) || !strings.Contains(err.Error(), "no space left on device") {
		t.Fatalf("the write on a full disk answered %v, want pebble's fatal commit error", err)
	}
	// The store is not closed: pebble's commit pipeline is broken after a
	// fatal error, and the node stops instead.
}
