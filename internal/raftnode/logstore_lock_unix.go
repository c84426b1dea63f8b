// Exclusive data-dir lock via flock(2), so two nodes never share a log.

//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package raftnode

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// lockDir takes a non-blocking exclusive flock on path. flock is tied to the
// open file, so the kernel drops it if the process dies: no stale lock files
// to clean up by hand. It also conflicts between two opens in one process,
// which catches a node opening its own dir twice.
func lockDir(path string) (unlock func() error, err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s is held by another open store: %w", path, err)
		}
		return nil, fmt.Errorf("flock %s: %w", path, err)
	}
	// Closing the file releases the flock.
	return f.Close, nil
}
