// Finding a torn final write in raft-wal's tail segment, so that the node can
// say it dropped one. raft-wal keeps only what ends in a commit frame and
// silently ignores a batch a crash cut short; that batch was never made
// durable, so nothing acknowledged is lost, but an operator should hear of it.

package raftnode

import (
	"bytes"
	"encoding/binary"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
)

// raft-wal's segment layout (github.com/hashicorp/raft-wal/segment, format.go):
// a 32-byte file header, then 8-byte-aligned frames whose 8-byte header is a
// type byte, three reserved bytes and a length (entries, index) or a CRC
// (commit, no payload). Unwritten space is zero.
const (
	walFileHeaderLen  = 32
	walFrameHeaderLen = 8
	walFrameEntry     = 1
	walFrameIndex     = 2
	walFrameCommit    = 3
)

// tornTail describes what follows the last commit frame of a segment file:
// the offset where the committed data ends, where written bytes end, and how
// many entry frames (complete or not) lie between.
type tornTail struct {
	file              string
	committedEnd, end int64
	entries           int
}

// scanTornTail reads the newest segment under walDir. It returns nil when
// there is no segment, the file is not in the expected layout, or nothing
// follows the last commit.
func scanTornTail(walDir string) *tornTail {
	segs, _ := filepath.Glob(filepath.Join(walDir, "*.wal"))
	if len(segs) == 0 {
		return nil
	}
	sort.Strings(segs) // named by base index: the last is the tail
	b, err := os.ReadFile(segs[len(segs)-1])
	if err != nil || len(b) < walFileHeaderLen {
		return nil
	}
	end := len(b)
	for end > 0 && b[end-1] == 0 {
		end--
	}
	off, committed, entries := walFileHeaderLen, walFileHeaderLen, 0
	for off+walFrameHeaderLen <= len(b) {
		h := b[off : off+walFrameHeaderLen]
		typ := h[0]
		if typ == 0 && bytes.Equal(h, make([]byte, walFrameHeaderLen)) {
			break
		}
		switch typ {
		case walFrameEntry, walFrameIndex:
			n := int(binary.LittleEndian.Uint32(h[4:8]))
			if typ == walFrameEntry {
				entries++
			}
			off += walFrameHeaderLen + n + (walFrameHeaderLen-n%walFrameHeaderLen)&(walFrameHeaderLen-1)
		case walFrameCommit:
			off += walFrameHeaderLen
			committed, entries = off, 0
		default:
			off = len(b) // not a frame: stop
		}
	}
	if int64(end) <= int64(committed) {
		return nil
	}
	return &tornTail{file: segs[len(segs)-1], committedEnd: int64(committed), end: int64(end), entries: entries}
}

// logTornTail says, before raft-wal opens walDir, whether its tail segment
// ends in a write that never completed (raft-wal drops it on open).
func logTornTail(walDir string, logger *slog.Logger) {
	if t := scanTornTail(walDir); t != nil {
		logger.Warn("the raft log ends in a write that never completed (a crash during it); it is dropped: it was never made durable or acknowledged",
			"file", t.file, "committed_bytes", t.committedEnd, "dropped_bytes", t.end-t.committedEnd, "dropped_entry_frames", t.entries)
	}
}
