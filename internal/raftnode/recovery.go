// Offline recovery tools, run on a stopped node's data dir: force a new
// configuration after a quorum loss (peers.json-style), and seed a new
// cluster from a saved state snapshot.

package raftnode

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/dlock/dlock/internal/fsm"
	"github.com/dlock/dlock/internal/state"
)

func peersConfiguration(peers map[string]string) (raft.Configuration, error) {
	if len(peers) == 0 {
		return raft.Configuration{}, errors.New("give the surviving members as id=raft-host:port")
	}
	ids := make([]string, 0, len(peers))
	for id := range peers {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var cfg raft.Configuration
	for _, id := range ids {
		cfg.Servers = append(cfg.Servers, raft.Server{ID: raft.ServerID(id), Address: raft.ServerAddress(peers[id]), Suffrage: raft.Voter})
	}
	return cfg, nil
}

// dataDirKind is the log store a data dir was created with (default if new).
func dataDirKind(dir string) LogStoreKind {
	if b, err := os.ReadFile(filepath.Join(dir, "LOG_STORE")); err == nil {
		return LogStoreKind(strings.TrimSpace(string(b)))
	}
	return DefaultLogStore
}

// Recover forces a new member list onto a stopped node's data dir after a
// quorum loss. Run it with the SAME peers on every surviving node, then start
// them: they elect a leader among themselves with every entry they have, and
// the state (fencing counter included) continues from there. Entries that
// were not yet committed when quorum was lost may become committed.
func Recover(dataDir string, peers map[string]string) error {
	cfg, err := peersConfiguration(peers)
	if err != nil {
		return err
	}
	if k, err := DataDirEngine(dataDir); err != nil {
		return err
	} else if k == EngineEtcd {
		return recoverEtcd(dataDir, peers)
	}
	kind := dataDirKind(dataDir)
	store, snaps, hlog, closeLogs, err := openOffline(kind, dataDir)
	if err != nil {
		return err
	}
	defer closeLogs()
	rc := raft.DefaultConfig()
	rc.LocalID = cfg.Servers[0].ID
	rc.Logger = hlog
	_, trans := raft.NewInmemTransport("")
	if err := raft.RecoverCluster(rc, fsm.New(slog.New(slog.DiscardHandler)), store, store, snaps, trans, cfg); err != nil {
		return fmt.Errorf("recover %s: %w", dataDir, err)
	}
	return nil
}

// Restored says what RestoreSnapshot seeded.
type Restored struct {
	// Index is the log index the snapshot was taken at.
	Index uint64
	// RetiredKey is the old cluster's signing key, retired in the seeded
	// state (RetiredKeyOK false if the snapshot had no current key): the
	// new cluster's first leader installs a new key, and the old one only
	// verifies proofs of tokens up to RetiredKey.MaxToken.
	RetiredKey   state.TokenKey
	RetiredKeyOK bool
}

// RestoreSnapshot seeds an EMPTY data dir with a state snapshot saved by
// `dlock snapshot save`, under a new member list. Seed every member of the
// new cluster the same way, then start them: they form the cluster with the
// saved locks, leases, queues and counters (fencing tokens continue upwards).
// The old cluster's signing key is retired in the seeded state, so the new
// cluster signs with a key of its own (state.RetireSigningKey).
func RestoreSnapshot(dataDir string, kind LogStoreKind, snapshot []byte, peers map[string]string) (Restored, error) {
	return RestoreSnapshotOn(EngineHashicorp, dataDir, kind, snapshot, peers)
}

// RestoreSnapshotOn is RestoreSnapshot into a data dir of the given engine
// (kind is the hashicorp engine's log store; the etcd engine has one). It
// is also how a cluster moves between engines: save a snapshot from the old
// cluster, restore it into new data dirs of the other engine.
func RestoreSnapshotOn(engine EngineKind, dataDir string, kind LogStoreKind, snapshot []byte, peers map[string]string) (Restored, error) {
	cfg, err := peersConfiguration(peers)
	if err != nil {
		return Restored{}, err
	}
	st, err := state.Restore(snapshot)
	if err != nil {
		return Restored{}, fmt.Errorf("the snapshot file is not a valid dlock snapshot: %w", err)
	}
	if entries, err := os.ReadDir(dataDir); err == nil && len(entries) > 0 {
		return Restored{}, fmt.Errorf("data dir %s is not empty; restore into a new, empty directory", dataDir)
	}
	info := Restored{Index: st.Index()}
	info.RetiredKey, info.RetiredKeyOK = st.RetireSigningKey()
	snapshot = st.Snapshot()
	if engine == EngineEtcd {
		err = seedEtcdSnapshot(dataDir, snapshot, st.Index(), peers)
	} else {
		err = seedSnapshot(dataDir, kind, snapshot, st.Index(), cfg)
	}
	if err != nil {
		return Restored{}, err
	}
	return info, nil
}

func seedSnapshot(dataDir string, kind LogStoreKind, snapshot []byte, snapIndex uint64, cfg raft.Configuration) error {
	if err := os.MkdirAll(dataDir, 0o750); err != nil {
		return fmt.Errorf("create data dir %s: %w", dataDir, err)
	}
	if kind == "" {
		kind = DefaultLogStore
	}
	if err := checkLogStoreKind(dataDir, kind); err != nil {
		return err
	}
	store, snaps, _, closeLogs, err := openOffline(kind, dataDir)
	if err != nil {
		return err
	}
	defer closeLogs()
	index := max(snapIndex, 1)
	_, trans := raft.NewInmemTransport("")
	sink, err := snaps.Create(raft.SnapshotVersionMax, index, 1, cfg, 1, trans)
	if err != nil {
		return fmt.Errorf("create snapshot: %w", err)
	}
	if _, err := sink.Write(snapshot); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("write snapshot: %w", err)
	}
	if err := sink.Close(); err != nil {
		return fmt.Errorf("write snapshot: %w", err)
	}
	// The term must be at least the snapshot's, or the node would refuse it.
	if err := store.SetUint64([]byte("CurrentTerm"), 1); err != nil {
		return fmt.Errorf("write term: %w", err)
	}
	return nil
}

// openOffline opens a stopped node's log store and snapshot store for the
// offline tools (recover, restore), with Raft's logger at warn on stderr.
func openOffline(kind LogStoreKind, dataDir string) (LogAndStableStore, *raft.FileSnapshotStore, hclog.Logger, func() error, error) {
	store, closeLogs, err := OpenLogStore(kind, dataDir)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	hlog := hclog.New(&hclog.LoggerOptions{Name: "raft", Level: hclog.Warn, Output: os.Stderr})
	snaps, err := raft.NewFileSnapshotStoreWithLogger(dataDir, 2, hlog)
	if err != nil {
		_ = closeLogs()
		return nil, nil, nil, nil, fmt.Errorf("open snapshot store in %s: %w", dataDir, err)
	}
	return store, snaps, hlog, closeLogs, nil
}
