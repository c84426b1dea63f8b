// Data-dir lock fallback for platforms without flock(2).

//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package raftnode

// lockDir is a no-op here: dlock targets Linux, and bbolt's own file lock
// (with the open timeout set in OpenLogStore) still guards the bolt kind.
func lockDir(string) (unlock func() error, err error) {
	return func() error { return nil }, nil
}
