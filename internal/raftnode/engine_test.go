package raftnode

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseEngine(t *testing.T) {
	for in, want := range map[string]EngineKind{"": DefaultEngine, "hashicorp": EngineHashicorp, "etcd": EngineEtcd} {
		if got, err := ParseEngine(in); err != nil || got != want {
			t.Errorf("ParseEngine(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseEngine("raft"); err == nil || !strings.Contains(err.Error(), "hashicorp or etcd") {
		t.Errorf("ParseEngine(raft) = %v, want an error naming the choices", err)
	}
}

// A data dir keeps its engine: a new dir records the one it starts with, the
// other is refused, and a dir from before engines could be chosen (it has a
// LOG_STORE file) is hashicorp's.
func TestDataDirKeepsItsEngine(t *testing.T) {
	dir := t.TempDir()
	if k, err := DataDirEngine(dir); err != nil || k != "" {
		t.Fatalf("new dir: %q, %v", k, err)
	}
	if err := checkEngine(dir, EngineEtcd); err != nil {
		t.Fatal(err)
	}
	if k, _ := DataDirEngine(dir); k != EngineEtcd {
		t.Fatalf("recorded %q", k)
	}
	if err := checkEngine(dir, EngineEtcd); err != nil {
		t.Fatal(err)
	}
	if err := checkEngine(dir, EngineHashicorp); err == nil || !strings.Contains(err.Error(), "--raft-engine etcd") {
		t.Fatalf("the other engine on an etcd dir: %v", err)
	}

	old := t.TempDir()
	if err := os.WriteFile(filepath.Join(old, "LOG_STORE"), []byte("wal\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if k, _ := DataDirEngine(old); k != EngineHashicorp {
		t.Fatalf("a dir with a log store only: %q", k)
	}
	if err := checkEngine(old, EngineEtcd); err == nil {
		t.Fatal("an existing hashicorp dir opened with the etcd engine")
	}
	if err := checkEngine(old, EngineHashicorp); err != nil {
		t.Fatal(err)
	}
}
