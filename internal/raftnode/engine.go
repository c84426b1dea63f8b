// Replication engines: hashicorp/raft (the default) or go.etcd.io/raft/v3
// (etcdengine.go). The node drives either through one interface, the subset
// of *raft.Raft it uses, so everything above raftnode is the same on both.

package raftnode

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/raft"
)

// EngineKind names a replication engine.
type EngineKind string

const (
	// EngineHashicorp is github.com/hashicorp/raft with the log store of
	// Config.LogStore.
	EngineHashicorp EngineKind = "hashicorp"
	// EngineEtcd is go.etcd.io/raft/v3 with a pebble log shared by every
	// group of the node.
	EngineEtcd EngineKind = "etcd"
)

// DefaultEngine is the engine of new data dirs when none is chosen.
const DefaultEngine = EngineHashicorp

// ParseEngine checks an engine name from a flag.
func ParseEngine(s string) (EngineKind, error) {
	switch k := EngineKind(s); k {
	case EngineHashicorp, EngineEtcd:
		return k, nil
	case "":
		return DefaultEngine, nil
	}
	return "", fmt.Errorf("raft engine %q: use hashicorp or etcd", s)
}

// Engine is what the node uses of its replication engine: hashicorp/raft's
// *raft.Raft satisfies it as it is, and the etcd engine presents the same
// methods.
type Engine interface {
	State() raft.RaftState
	LeaderWithID() (raft.ServerAddress, raft.ServerID)
	LeaderCh() <-chan bool
	LastContact() time.Time
	CurrentTerm() uint64
	CommitIndex() uint64
	Apply(cmd []byte, timeout time.Duration) raft.ApplyFuture
	Barrier(timeout time.Duration) raft.Future
	VerifyLeader() raft.Future
	GetConfiguration() raft.ConfigurationFuture
	AddVoter(id raft.ServerID, addr raft.ServerAddress, prevIndex uint64, timeout time.Duration) raft.IndexFuture
	AddNonvoter(id raft.ServerID, addr raft.ServerAddress, prevIndex uint64, timeout time.Duration) raft.IndexFuture
	RemoveServer(id raft.ServerID, prevIndex uint64, timeout time.Duration) raft.IndexFuture
	LeadershipTransfer() raft.Future
	LeadershipTransferToServer(id raft.ServerID, addr raft.ServerAddress) raft.Future
	Snapshot() raft.SnapshotFuture
	Shutdown() raft.Future
}

var (
	_ Engine = (*raft.Raft)(nil)
	_ Engine = (*etcdEngine)(nil)

	_ confirmedRead = (*efuture)(nil)
)

// confirmedRead is a VerifyLeader future that also answers the commit index
// the quorum confirmed (the etcd engine's ReadIndex); hashicorp/raft's does not.
type confirmedRead interface {
	raft.Future
	Index() uint64
}

// engineFile records a data dir's engine.
const engineFile = "RAFT_ENGINE"

// DataDirEngine is the engine a data dir was created with: its RAFT_ENGINE
// file, else hashicorp for a dir that has a log already (created before
// engines could be chosen), else "" for a new dir. A RAFT_ENGINE file that is
// missing or names no engine while the dir holds an engine's files is damage
// (a *RefusedError): guessing could open the dir with the other engine, which
// finds no log there and starts the node empty, able to vote as if it had
// never acknowledged anything.
func DataDirEngine(dir string) (EngineKind, error) {
	path := filepath.Join(dir, engineFile)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		switch k := EngineKind(strings.TrimSpace(string(b))); k {
		case EngineHashicorp, EngineEtcd:
			if held := engineOfFiles(dir); held != "" && held != k {
				return "", &RefusedError{Dir: dir, Err: fmt.Errorf("%s says %s but the dir holds the %s engine's files: the file is damaged (if you are sure, write %s into it)",
					path, k, held, held)}
			}
			return k, nil
		}
		if held := engineOfFiles(dir); held != "" {
			return "", &RefusedError{Dir: dir, Err: fmt.Errorf("%s holds %q, which names no replication engine: the file is damaged (the dir holds the %s engine's files; if you are sure, write %s into it)",
				path, truncateBytes(b, 40), held, held)}
		}
		// A new dir whose first start stopped before the file was written.
		return "", nil
	case !errors.Is(err, os.ErrNotExist):
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	if _, err := os.Stat(filepath.Join(dir, etcdStoreDir)); err == nil {
		return "", &RefusedError{Dir: dir, Err: fmt.Errorf("%s is missing although the dir holds the etcd engine's log (%s): the file was lost (if you are sure, write etcd into it)",
			path, etcdStoreDir)}
	}
	if _, err := os.Stat(filepath.Join(dir, "LOG_STORE")); err == nil {
		return EngineHashicorp, nil
	}
	return "", nil
}

// engineOfFiles is the engine whose files dir holds, or "".
func engineOfFiles(dir string) EngineKind {
	if _, err := os.Stat(filepath.Join(dir, etcdStoreDir)); err == nil {
		return EngineEtcd
	}
	for _, f := range []string{"LOG_STORE", walDirName, boltFileName} {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			return EngineHashicorp
		}
	}
	return ""
}

func truncateBytes(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

// checkEngine pins a data dir to the engine it was created with: the other
// engine would find no log there and could bootstrap a fresh, empty cluster
// over the old one.
func checkEngine(dir string, kind EngineKind) error {
	got, err := DataDirEngine(dir)
	if err != nil {
		return err
	}
	switch got {
	case kind:
		if _, err := os.Stat(filepath.Join(dir, engineFile)); err == nil {
			return nil
		}
	case "":
	default:
		return fmt.Errorf("data dir %s was created with --raft-engine %s; start with --raft-engine %s (or use a new data dir; docs/operations.md says how to move a cluster between engines)", dir, got, got)
	}
	if err := os.WriteFile(filepath.Join(dir, engineFile), []byte(string(kind)+"\n"), 0o640); err != nil {
		return fmt.Errorf("record raft engine in %s: %w", dir, err)
	}
	return nil
}
