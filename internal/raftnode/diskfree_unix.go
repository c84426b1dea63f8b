// Free space of a data dir's file system via statfs(2).

//go:build linux || darwin || freebsd

package raftnode

import "syscall"

// freeSpace is the space an unprivileged process may still write under dir.
func freeSpace(dir string) (uint64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return uint64(st.Bavail) * uint64(st.Bsize), nil
}
