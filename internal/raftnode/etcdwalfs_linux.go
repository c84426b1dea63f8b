// The pebble write-ahead log's files, allocated ahead and sized, as etcd's
// and raft-wal's are.

package raftnode

import (
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"
	"golang.org/x/sys/unix"
)

// walFS is the OS's file system for the log store, except that a WAL file
// grows by allocated, zero-filled blocks that count in its size. Pebble
// allocates the next block of its WAL ahead of the writes but keeps the
// file's size (FALLOC_FL_KEEP_SIZE), so every fdatasync of an append also
// commits a size change to the file system's journal; here an fdatasync
// writes the data alone, which on ext4 saves about a third of its time. Pebble
// reads a zeroed WAL tail as the log's end: it is how a preallocated or
// recycled WAL ends.
func walFS() vfs.FS { return walPreallocFS{FS: vfs.Default, fallocate: unix.Fallocate} }

type walPreallocFS struct {
	vfs.FS
	// fallocate is unix.Fallocate; tests make it fail.
	fallocate func(fd int, mode uint32, off, size int64) error
}

func (fs walPreallocFS) Create(name string, cat vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, cat)
	return fs.sizedWAL(name, f, err)
}

func (fs walPreallocFS) ReuseForWrite(oldname, newname string, cat vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.ReuseForWrite(oldname, newname, cat)
	return fs.sizedWAL(newname, f, err)
}

func (fs walPreallocFS) sizedWAL(name string, f vfs.File, err error) (vfs.File, error) {
	if err != nil || !strings.HasSuffix(name, ".log") || f.Fd() == vfs.InvalidFd {
		return f, err
	}
	return sizedFile{File: f, fallocate: fs.fallocate}, nil
}

type sizedFile struct {
	vfs.File
	fallocate func(fd int, mode uint32, off, size int64) error
}

// Preallocate allocates [offset, offset+length) and extends the file's size
// over it (mode 0, not FALLOC_FL_KEEP_SIZE). A file system without fallocate
// gets pebble's own behaviour.
func (f sizedFile) Preallocate(offset, length int64) error {
	if err := f.fallocate(int(f.Fd()), 0, offset, length); err != nil {
		return f.File.Preallocate(offset, length)
	}
	return nil
}
