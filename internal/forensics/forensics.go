// Package forensics reads a stopped node's Raft log and snapshots to explain a
// divergence between replicas: it lists log entries, and replays the log on
// top of a snapshot to compare the result with another snapshot
// (docs/reliability.md, "Finding a divergence"). It never writes to the data
// it reads.
package forensics

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/hashicorp/raft"

	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/fsm"
	"github.com/dlock/dlock/internal/raftnode"
	"github.com/dlock/dlock/internal/state"
)

// DumpLog writes one line per log entry of the node's data dir: index, term,
// type, a short hash of the entry and the decoded command. Run it on a copy of
// a stopped node's dir (opening takes the dir's lock).
func DumpLog(dataDir string, kind raftnode.LogStoreKind, from, to uint64, w io.Writer) error {
	st, closeFn, err := raftnode.OpenLogStore(kind, dataDir)
	if err != nil {
		return err
	}
	defer closeFn()
	first, err := st.FirstIndex()
	if err != nil {
		return err
	}
	last, err := st.LastIndex()
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "# log %s: entries %d..%d\n", dataDir, first, last)
	from, to = max(from, first), min(to, last)
	for i := from; i <= to && i > 0; i++ {
		var l raft.Log
		if err := st.GetLog(i, &l); err != nil {
			fmt.Fprintf(w, "%d error %v\n", i, err)
			continue
		}
		h := sha256.Sum256(l.Data)
		desc := ""
		if l.Type == raft.LogCommand {
			if envs, packed, err := command.DecodeEntry(l.Data); err == nil {
				for j, env := range envs {
					if packed {
						desc += fmt.Sprintf("[%d/%d] ", j, len(envs))
					}
					desc += fmt.Sprintf("ts=%d clock=%d client=%q req=%q %T%+v ", env.TS, env.Clock, env.ClientID, env.RequestID, env.Body, env.Body)
				}
				desc = strings.TrimSuffix(desc, " ")
			} else {
				desc = "undecodable: " + err.Error()
			}
		}
		fmt.Fprintf(w, "%d term=%d type=%s sha=%x %s\n", i, l.Term, l.Type, h[:6], desc)
	}
	return nil
}

// ReplayResult is the state after a replay, and how it compares with a
// reference snapshot if one was given.
type ReplayResult struct {
	FromIndex, ToIndex  uint64
	Revision, LastToken uint64
	// Compared is set when a reference was given; Same says whether the
	// replayed state is byte-for-byte the reference.
	Compared, Same          bool
	RefRevision, RefLastTok uint64
	RefIndex                uint64
}

// Replay restores a snapshot's state file (snapshots/<id>/state.bin), applies
// the log entries after it up to index to from the node's data dir, and, if
// refStateFile is given, compares the result with that snapshot (which must
// be at index to). Equal states prove the entries in between were applied
// the same way on both nodes.
func Replay(stateFile, dataDir string, kind raftnode.LogStoreKind, to uint64, refStateFile string) (*ReplayResult, error) {
	b, err := os.ReadFile(stateFile)
	if err != nil {
		return nil, err
	}
	st, err := state.Restore(b)
	if err != nil {
		return nil, err
	}
	res := &ReplayResult{FromIndex: st.Index()}
	logs, closeFn, err := raftnode.OpenLogStore(kind, dataDir)
	if err != nil {
		return nil, err
	}
	defer closeFn()
	for i := st.Index() + 1; i <= to; i++ {
		var l raft.Log
		if err := logs.GetLog(i, &l); err != nil {
			return nil, fmt.Errorf("log entry %d: %w (is it compacted away? replay from a later snapshot)", i, err)
		}
		switch l.Type {
		case raft.LogCommand:
		case raft.LogConfiguration:
			// Raft hands these to the FSM, which records their index.
			st.SetIndex(i)
			continue
		default:
			// Barriers (the leader's commit notices among them) and no-ops
			// never reach the FSM: the node's state keeps the index of the
			// entry before, and so must the replay.
			continue
		}
		if _, _, err := fsm.ApplyEntry(st, &l); err != nil {
			return nil, fmt.Errorf("log entry %d: %w", i, err)
		}
		st.TakeEvents()
	}
	res.ToIndex, res.Revision, res.LastToken = st.Index(), st.Revision(), st.LastToken()
	if refStateFile != "" {
		rb, err := os.ReadFile(refStateFile)
		if err != nil {
			return nil, err
		}
		ref, err := state.Restore(rb)
		if err != nil {
			return nil, err
		}
		res.Compared = true
		res.RefIndex, res.RefRevision, res.RefLastTok = ref.Index(), ref.Revision(), ref.LastToken()
		res.Same = bytes.Equal(st.Snapshot(), ref.Snapshot())
	}
	return res, nil
}
