package raftnode

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
)

// A backup file (dlock snapshot save) is the state snapshot framed with its
// length and a CRC32C, so that a file damaged in storage or in transit is
// refused by dlock snapshot restore instead of seeding a new cluster with a
// silently changed state: a flipped byte in a lock name, a lease id or a
// value passes every structural check of the snapshot decoder. The frame:
//
//	"DLBAK" version(1) crc32c(4, little endian) length(8, little endian) snapshot
//
// Files without the frame (the raw snapshot, as GET /cluster/snapshot sends
// it: saved with curl, or by dlock before the frame existed) still restore,
// unchecked.
var backupMagic = []byte("DLBAK")

const (
	backupVersion   = 1
	backupHeaderLen = 5 + 1 + 4 + 8
)

// rawSnapshotMagic starts a bare state snapshot (internal/state).
var rawSnapshotMagic = []byte("DLSNAP")

// WriteBackup writes the snapshot read from r to f (a new, empty file) in
// the framed format and returns the snapshot's length.
func WriteBackup(f *os.File, r io.Reader) (int64, error) {
	if _, err := f.Write(make([]byte, backupHeaderLen)); err != nil {
		return 0, err
	}
	h := crc32.New(castagnoli)
	n, err := io.Copy(io.MultiWriter(f, h), r)
	if err != nil {
		return n, err
	}
	hdr := make([]byte, 0, backupHeaderLen)
	hdr = append(hdr, backupMagic...)
	hdr = append(hdr, backupVersion)
	hdr = binary.LittleEndian.AppendUint32(hdr, h.Sum32())
	hdr = binary.LittleEndian.AppendUint64(hdr, uint64(n))
	_, err = f.WriteAt(hdr, 0)
	return n, err
}

// ErrBackupUnchecked is returned, with the snapshot, for a file that has no
// frame and so no checksum: it restores, unverified.
var ErrBackupUnchecked = errors.New("the file carries no checksum (a bare snapshot, saved with curl or an older dlock): it could not be verified")

// ReadBackup returns the snapshot inside a backup file's bytes, checked
// against the frame's length and checksum.
func ReadBackup(b []byte) ([]byte, error) {
	switch {
	case bytes.HasPrefix(b, rawSnapshotMagic):
		return b, ErrBackupUnchecked
	case !bytes.HasPrefix(b, backupMagic):
		return nil, errors.New("not a dlock backup (it starts with neither the backup nor the snapshot header)")
	case len(b) < backupHeaderLen:
		return nil, fmt.Errorf("the file is truncated: %d bytes, shorter than the backup header", len(b))
	}
	if v := b[len(backupMagic)]; v != backupVersion {
		return nil, fmt.Errorf("backup format version %d is not supported by this build (upgrade dlock) or the header is damaged", v)
	}
	sum := binary.LittleEndian.Uint32(b[len(backupMagic)+1:])
	n := binary.LittleEndian.Uint64(b[len(backupMagic)+5:])
	body := b[backupHeaderLen:]
	if uint64(len(body)) != n {
		return nil, fmt.Errorf("the file is damaged or truncated: its header says %d bytes of snapshot, it holds %d", n, len(body))
	}
	if got := crc32.Checksum(body, castagnoli); got != sum {
		return nil, fmt.Errorf("the file is damaged: checksum mismatch (stored %08x, content %08x)", sum, got)
	}
	return body, nil
}
