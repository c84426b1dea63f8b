// Offline tools on an etcd-engine data dir: read its log (dlock debug log and
// replay), seed it from a state snapshot (dlock snapshot restore) and force a
// new member list after a quorum loss (dlock recover).

package raftnode

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"

	hraft "github.com/hashicorp/raft"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/dlock/dlock/internal/fsm"
)

// etcdLogReader presents an etcd-engine log, read and verified once, as a
// read-only raft.LogStore for the forensics tools.
type etcdLogReader struct {
	snap raftpb.SnapshotMetadata
	ents []raftpb.Entry
}

var errReadOnly = errors.New("the etcd engine's log is read-only here")

func openEtcdLogReader(dataDir string) (LogAndStableStore, func() error, error) {
	s, err := openMultiStore(filepath.Join(dataDir, etcdStoreDir))
	if err != nil {
		return nil, nil, err
	}
	defer s.Close()
	gs, err := s.Load(defaultGroup)
	if err != nil {
		return nil, nil, err
	}
	return &etcdLogReader{snap: gs.Snapshot.Metadata, ents: gs.Entries}, func() error { return nil }, nil
}

func (r *etcdLogReader) FirstIndex() (uint64, error) {
	if len(r.ents) == 0 {
		return 0, nil
	}
	return r.ents[0].Index, nil
}

func (r *etcdLogReader) LastIndex() (uint64, error) {
	if len(r.ents) == 0 {
		return r.snap.Index, nil
	}
	return r.ents[len(r.ents)-1].Index, nil
}

func (r *etcdLogReader) GetLog(index uint64, l *hraft.Log) error {
	if len(r.ents) == 0 || index < r.ents[0].Index || index > r.ents[len(r.ents)-1].Index {
		return hraft.ErrLogNotFound
	}
	*l = *etcdLog(r.ents[index-r.ents[0].Index])
	return nil
}

// etcdLog is an etcd entry as the FSM and the forensics tools read entries:
// commands, no-ops (the leaders' empty entries and barriers) and
// configuration changes.
func etcdLog(ent raftpb.Entry) *hraft.Log {
	l := &hraft.Log{Index: ent.Index, Term: ent.Term}
	switch {
	case ent.Type == raftpb.EntryNormal && len(ent.Data) > 0:
		l.Type, l.Data = hraft.LogCommand, ent.Data
	case ent.Type == raftpb.EntryNormal:
		l.Type = hraft.LogNoop
	default:
		l.Type = hraft.LogConfiguration
	}
	return l
}

func (r *etcdLogReader) StoreLog(*hraft.Log) error        { return errReadOnly }
func (r *etcdLogReader) StoreLogs([]*hraft.Log) error     { return errReadOnly }
func (r *etcdLogReader) DeleteRange(uint64, uint64) error { return errReadOnly }
func (r *etcdLogReader) Set([]byte, []byte) error         { return errReadOnly }
func (r *etcdLogReader) Get([]byte) ([]byte, error)       { return nil, errReadOnly }
func (r *etcdLogReader) SetUint64([]byte, uint64) error   { return errReadOnly }
func (r *etcdLogReader) GetUint64([]byte) (uint64, error) { return 0, errReadOnly }

// peersBook is the member list peers as a configuration and address book.
func peersBook(peers map[string]string) (raftpb.ConfState, map[uint64]etcdMember, error) {
	if len(peers) == 0 {
		return raftpb.ConfState{}, nil, errors.New("give the members as id=raft-host:port")
	}
	ids := make([]string, 0, len(peers))
	for id := range peers {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var cs raftpb.ConfState
	book := map[uint64]etcdMember{}
	for _, id := range ids {
		nid := raftID(id)
		if other, dup := book[nid]; dup {
			return cs, nil, fmt.Errorf("member ids %q and %q hash to the same raft id; rename one", other.ID, id)
		}
		book[nid] = etcdMember{ID: id, Addr: peers[id]}
		cs.Voters = append(cs.Voters, nid)
	}
	return cs, book, nil
}

// writeEtcdSnapshot replaces group 1's log in dataDir by one snapshot of
// state at index (of term) with the member list peers, and hard state hs.
func writeEtcdSnapshot(s *multiStore, state []byte, index, term uint64, hs raftpb.HardState, peers map[string]string) error {
	cs, book, err := peersBook(peers)
	if err != nil {
		return err
	}
	snap := raftpb.Snapshot{Data: encodeSnapData(book, state),
		Metadata: raftpb.SnapshotMetadata{Index: index, Term: term, ConfState: cs}}
	hs.Term, hs.Commit = max(hs.Term, term), index
	return s.Save(defaultGroup, hs, nil, snap, true)
}

// seedEtcdSnapshot seeds an empty dir (RestoreSnapshotOn).
func seedEtcdSnapshot(dataDir string, state []byte, index uint64, peers map[string]string) error {
	if err := os.MkdirAll(dataDir, 0o750); err != nil {
		return fmt.Errorf("create data dir %s: %w", dataDir, err)
	}
	if err := checkEngine(dataDir, EngineEtcd); err != nil {
		return err
	}
	s, err := openMultiStore(filepath.Join(dataDir, etcdStoreDir))
	if err != nil {
		return err
	}
	defer s.Close()
	return writeEtcdSnapshot(s, state, max(index, 1), 1, raftpb.HardState{}, peers)
}

// recoverEtcd applies every entry the stopped node holds (committed or not,
// as hashicorp/raft's RecoverCluster does) and replaces its log by one
// snapshot of the result under the member list peers.
func recoverEtcd(dataDir string, peers map[string]string) error {
	if _, _, err := peersBook(peers); err != nil {
		return err
	}
	s, err := openMultiStore(filepath.Join(dataDir, etcdStoreDir))
	if err != nil {
		return err
	}
	defer s.Close()
	gs, err := s.Load(defaultGroup)
	if err != nil {
		return fmt.Errorf("recover %s: %w", dataDir, err)
	}
	f := fsm.New(slog.New(slog.DiscardHandler))
	if len(gs.Snapshot.Data) > 0 {
		_, data, err := decodeSnapData(gs.Snapshot.Data)
		if err != nil {
			return fmt.Errorf("recover %s: snapshot: %w", dataDir, err)
		}
		if err := f.Restore(io.NopCloser(bytes.NewReader(data))); err != nil {
			return fmt.Errorf("recover %s: %w", dataDir, err)
		}
	}
	index, term := gs.Snapshot.Metadata.Index, gs.Snapshot.Metadata.Term
	logs := make([]*hraft.Log, 0, len(gs.Entries))
	for _, ent := range gs.Entries {
		logs = append(logs, etcdLog(ent))
		index, term = ent.Index, ent.Term
	}
	if len(logs) > 0 {
		f.ApplyBatch(logs)
	}
	if index == 0 {
		return fmt.Errorf("recover %s: the node holds no state to recover from", dataDir)
	}
	fs, err := f.Snapshot()
	if err != nil {
		return err
	}
	var sink memSink
	if err := fs.Persist(&sink); err != nil {
		return err
	}
	// The hard state keeps the newest term and vote this node knew, so it
	// never votes twice in one term.
	return writeEtcdSnapshot(s, sink.Bytes(), index, term, gs.HardState, peers)
}
