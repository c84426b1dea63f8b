//go:build !linux

package raftnode

import "github.com/cockroachdb/pebble/v2/vfs"

// walFS is the OS's file system: sized WAL preallocation is Linux-only
// (etcdwalfs_linux.go).
func walFS() vfs.FS { return vfs.Default }
