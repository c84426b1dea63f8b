package raftnode

import (
	"errors"
	"testing"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/command"
)

func TestDiskGuard(t *testing.T) {
	full := func(string) (uint64, error) { return 1 << 20, nil }
	if err := newDiskGuard(".", 0, full).check(); apierror.CodeOf(err) != apierror.DiskFull {
		t.Fatalf("1 MiB free under the default reserve: %v", err)
	}
	if err := newDiskGuard(".", -1, full).check(); err != nil {
		t.Fatalf("a disabled guard refused: %v", err)
	}
	if err := newDiskGuard(".", 512<<10, full).check(); err != nil {
		t.Fatalf("1 MiB free above a 512 KiB reserve refused: %v", err)
	}
	unknown := func(string) (uint64, error) { return 0, errors.New("statfs: not supported") }
	if err := newDiskGuard(".", 0, unknown).check(); err != nil {
		t.Fatalf("a file system that cannot say refused: %v", err)
	}
	if _, err := freeSpace(t.TempDir()); err != nil {
		t.Fatalf("statfs of a real dir: %v", err)
	}
	if guarded(&command.Envelope{Body: &command.Renew{}}) || !guarded(&command.Envelope{Body: &command.Acquire{}}) {
		t.Fatal("renewals must pass the guard and acquires not")
	}
}
