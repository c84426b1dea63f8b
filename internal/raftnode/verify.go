// Start-up verification of a data dir, before Raft sees it: the newest
// snapshot, the log entries after it (every one, checksummed and contiguous),
// and the durable mark. A node whose data fails any check refuses to start.

package raftnode

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"
)

// RefusedError is a data dir a node must not start from: Raft would vote and
// serve from a log that may no longer hold what this node acknowledged.
type RefusedError struct {
	Dir string
	Err error
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("refusing data dir %s: %v. This node must not vote or serve from it. "+
		"To recover: keep the node stopped, move the data dir aside (keep it for diagnosis), "+
		"remove the member from the cluster and add it back as a new, empty member (--join); "+
		"see docs/operations.md, \"A node refuses its data dir\"", e.Dir, e.Err)
}

func (e *RefusedError) Unwrap() error { return e.Err }

// refuseOnPanic turns a panic of a log store reading damaged files into a
// refusal: bbolt asserts (panics) when a page is not what its parent says,
// e.g. in a raft.db that was truncated, and such a node must say what is
// wrong and how to recover, not crash with a stack trace.
func refuseOnPanic(dir string, err *error) {
	if r := recover(); r != nil {
		*err = &RefusedError{Dir: dir, Err: fmt.Errorf("reading the raft log store failed (%v): its files are damaged", r)}
	}
}

// newRaftRefusingPanics runs hashicorp/raft's start-up, which replays the
// log after the snapshot and panics on an entry it cannot read: the entry
// was damaged after verifyDataDir read it (e.g. by a bbolt write through a
// damaged free list), and the node refuses its data dir instead of crashing.
func newRaftRefusingPanics(dir string, start func() (*raft.Raft, error)) (r *raft.Raft, err error) {
	defer refuseOnPanic(dir, &err)
	return start()
}

// checkSnapshotMeta checks the newest snapshot's meta.json against what
// its name says (term-index-time, as raft names it) and its state file's
// size. The CRC in meta.json covers state.bin only: a flipped digit of
// Index or Term would otherwise make the node believe its state is at
// another index, skip entries or replay them twice.
func checkSnapshotMeta(snapDir string, meta *raft.SnapshotMeta) error {
	path := filepath.Join(snapDir, meta.ID, "meta.json")
	var term, index uint64
	var ts int64
	if n, err := fmt.Sscanf(meta.ID, "%d-%d-%d", &term, &index, &ts); err != nil || n != 3 {
		return fmt.Errorf("snapshot %s: its id is not term-index-time: %s is damaged", meta.ID, path)
	}
	if meta.Version < 1 || meta.Version > raft.SnapshotVersionMax {
		return fmt.Errorf("snapshot %s: version %d: %s is damaged", meta.ID, meta.Version, path)
	}
	if term != meta.Term || index != meta.Index {
		return fmt.Errorf("snapshot %s says term %d, index %d but its id says term %d, index %d: %s is damaged",
			meta.ID, meta.Term, meta.Index, term, index, path)
	}
	fi, err := os.Stat(filepath.Join(snapDir, meta.ID, "state.bin"))
	if err != nil {
		return err
	}
	if fi.Size() != meta.Size {
		return fmt.Errorf("snapshot %s: meta.json says %d bytes but state.bin holds %d: %s is damaged", meta.ID, meta.Size, fi.Size(), path)
	}
	if err := checkSnapshotConfiguration(meta); err != nil {
		return fmt.Errorf("snapshot %s: %w: %s is damaged", meta.ID, err, path)
	}
	return nil
}

// checkSnapshotConfiguration checks the members in a snapshot's meta.json:
// each well formed and unique, and the voters' addresses the same as in the
// Peers field raft writes beside them (msgpack, for old raft versions).
func checkSnapshotConfiguration(meta *raft.SnapshotMeta) error {
	conf := meta.Configuration
	if len(conf.Servers) == 0 {
		return errors.New("it names no cluster members")
	}
	if meta.ConfigurationIndex < 1 || meta.ConfigurationIndex > meta.Index {
		return fmt.Errorf("its configuration index %d is outside 1..%d", meta.ConfigurationIndex, meta.Index)
	}
	ids, addrs := map[raft.ServerID]bool{}, map[raft.ServerAddress]bool{}
	var voters []string
	for _, srv := range conf.Servers {
		if _, _, err := net.SplitHostPort(string(srv.Address)); err != nil || srv.ID == "" || ids[srv.ID] || addrs[srv.Address] {
			return fmt.Errorf("member %q at %q is malformed or repeated", srv.ID, srv.Address)
		}
		switch srv.Suffrage {
		case raft.Voter:
			voters = append(voters, string(srv.Address))
		case raft.Nonvoter, raft.Staging:
		default:
			return fmt.Errorf("member %q has suffrage %d", srv.ID, srv.Suffrage)
		}
		ids[srv.ID], addrs[srv.Address] = true, true
	}
	if len(meta.Peers) > 0 {
		var enc [][]byte
		if err := codec.NewDecoderBytes(meta.Peers, &codec.MsgpackHandle{}).Decode(&enc); err != nil {
			return fmt.Errorf("its Peers field does not decode: %v", err)
		}
		peers := make([]string, 0, len(enc))
		for _, p := range enc {
			peers = append(peers, string(p))
		}
		slices.Sort(voters)
		slices.Sort(peers)
		if !slices.Equal(voters, peers) {
			return fmt.Errorf("its voters %v differ from its Peers %v", voters, peers)
		}
	}
	return nil
}

// verifyDataDir checks the data dir as Raft would find it, then starts the
// durable mark at the verified log's end. It reads every entry once; the
// log holds at most about TrailingLogs + SnapshotThreshold of them. Entries
// after the newest snapshot must be contiguous; below it a gap is allowed
// (see the loop).
func verifyDataDir(cs *checkedStore, snaps *raft.FileSnapshotStore, dir string, logger *slog.Logger) (err error) {
	defer refuseOnPanic(dir, &err)
	refuse := func(format string, args ...any) error {
		return &RefusedError{Dir: dir, Err: fmt.Errorf(format, args...)}
	}
	first, err := cs.FirstIndex()
	if err != nil {
		return refuse("read the log's first index: %w", err)
	}
	last, err := cs.LastIndex()
	if err != nil {
		return refuse("read the log's last index: %w", err)
	}

	metas, err := snaps.List()
	if err != nil {
		return refuse("list snapshots: %w", err)
	}
	snapDir := filepath.Join(dir, "snapshots")
	var snapIdx uint64
	if len(metas) > 0 {
		newest := metas[0]
		snapIdx = newest.Index
		if err := unreadableNewerSnapshot(snapDir, newest); err != nil {
			return refuse("%w", err)
		}
		meta, rc, err := snaps.Open(newest.ID)
		if err != nil {
			return refuse("the newest snapshot %s (entries up to %d) fails its check: %v", filepath.Join(snapDir, newest.ID, "state.bin"), newest.Index, err)
		}
		_ = rc.Close()
		if err := checkSnapshotMeta(snapDir, meta); err != nil {
			return refuse("%w", err)
		}
		// Raft replays the log from snapIdx+1: it must start there or
		// earlier, unless nothing follows the snapshot.
		if last > snapIdx && first > snapIdx+1 {
			return refuse("the newest snapshot %s ends at entry %d but the log starts at %d: entries %d..%d are missing", newest.ID, snapIdx, first, snapIdx+1, first-1)
		}
	} else {
		if err := unreadableNewerSnapshot(snapDir, nil); err != nil {
			return refuse("%w", err)
		}
		if first > 1 {
			return refuse("the log starts at entry %d and there is no snapshot of the entries before it (snapshots in %s are missing)", first, snapDir)
		}
	}

	var l raft.Log
	var prevTerm uint64
	for i := first; i <= last && i > 0; i++ {
		if err := cs.getLog(i, &l); err != nil {
			if errors.Is(err, raft.ErrLogNotFound) && i <= snapIdx {
				// A log store that is not monotonic (bolt) keeps its old
				// entries across a snapshot install and appends after the
				// snapshot: a gap the snapshot covers. Raft reads entries
				// below the snapshot only to replicate them, verified then.
				i = snapIdx
				continue
			}
			if errors.Is(err, raft.ErrLogNotFound) {
				err = &CorruptError{File: cs.locate(i), Index: i, Reason: fmt.Sprintf("missing, though the log spans %d..%d", first, last)}
			}
			return &RefusedError{Dir: dir, Err: err}
		}
		if l.Term < prevTerm {
			return &RefusedError{Dir: dir, Err: &CorruptError{File: cs.locate(i), Index: i, Reason: fmt.Sprintf("term %d is below the previous entry's term %d", l.Term, prevTerm)}}
		}
		prevTerm = l.Term
	}

	if mark := cs.markAtOpen; mark > max(last, snapIdx) {
		return refuse("the log ends at entry %d (in %s) but entries up to %d were durably written here (%s): "+
			"entries %d..%d were lost, e.g. a file was truncated or damaged; this node may have acknowledged them to a leader",
			last, cs.locate(last+1), mark, filepath.Join(dir, markFileName), max(last, snapIdx)+1, mark)
	}
	logger.Info("verified the data dir", "log_first", first, "log_last", last, "snapshot_index", snapIdx,
		"durable_mark", cs.markAtOpen, "checksums_from", cs.from)
	if err := cs.mark.set(last); err != nil {
		return fmt.Errorf("write the durable mark in %s: %w", dir, err)
	}
	if _, kept, err := stableUint64(cs.inner, markKeptKey); err != nil {
		return refuse("read %s from the stable store: %w", markKeptKey, err)
	} else if !kept {
		// The mark file's directory entry must be durable before the key
		// says the file exists.
		if err := syncDir(dir); err != nil {
			return fmt.Errorf("sync %s: %w", dir, err)
		}
		var one [8]byte
		one[7] = 1
		if err := cs.inner.Set(markKeptKey, one[:]); err != nil {
			return fmt.Errorf("record %s in the stable store: %w", markKeptKey, err)
		}
	}
	cs.mark.start(func(err error) { _ = cs.fail(err) })
	return nil
}

// unreadableNewerSnapshot finds a snapshot directory newer than the newest
// one raft lists (nil: none listed) whose meta.json raft could not read: raft
// skips such a snapshot silently and falls back to an older one.
func unreadableNewerSnapshot(snapDir string, newest *raft.SnapshotMeta) error {
	entries, err := os.ReadDir(snapDir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("list %s: %w", snapDir, err)
	}
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() || strings.HasSuffix(name, ".tmp") || (newest != nil && name == newest.ID) {
			continue
		}
		// Snapshot dirs are named term-index-millis.
		parts := strings.Split(name, "-")
		if len(parts) != 3 {
			continue
		}
		term, err1 := strconv.ParseUint(parts[0], 10, 64)
		index, err2 := strconv.ParseUint(parts[1], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		if newest != nil && (index < newest.Index || (index == newest.Index && term <= newest.Term)) {
			continue
		}
		return fmt.Errorf("snapshot %s (entries up to %d) is newer than every readable snapshot but its meta.json cannot be read", filepath.Join(snapDir, name), index)
	}
	return nil
}
