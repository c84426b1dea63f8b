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

// A data dir whose RAFT_ENGINE file was lost or damaged is refused, not
// opened with a guessed engine: before, an etcd dir without the file started
// as an empty hashicorp node (a node that forgot every entry it had
// acknowledged, able to vote), and wrote a new log beside the old one.
func TestDamagedEngineFileRefusesStart(t *testing.T) {
	d := newDiskNode(t, func(c *Config) { c.Engine = EngineEtcd })
	n := d.start()
	register(t, n, "member-0001")
	if err := n.Shutdown(); err != nil {
		t.Fatal(err)
	}
	// Later starts name no engine, as dlock serve does without --raft-engine.
	d.set = func(c *Config) { c.Engine = "" }
	path := filepath.Join(d.dir, engineFile)
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	damage := map[string]func() error{
		"deleted": func() error { return os.Remove(path) },
		"empty":   func() error { return os.WriteFile(path, nil, 0o640) },
		"garbage": func() error { return os.WriteFile(path, []byte("etcc\n"), 0o640) },
		"other":   func() error { return os.WriteFile(path, []byte("hashicorp\n"), 0o640) },
	}
	for name, do := range damage {
		t.Run(name, func(t *testing.T) {
			if err := do(); err != nil {
				t.Fatal(err)
			}
			_, err := d.open()
			refused(t, err, engineFile)
			for _, f := range []string{walDirName, boltFileName, "LOG_STORE"} {
				if _, err := os.Stat(filepath.Join(d.dir, f)); err == nil {
					t.Errorf("the refused start created %s", f)
				}
			}
			if err := os.WriteFile(path, orig, 0o640); err != nil {
				t.Fatal(err)
			}
		})
	}
	n = d.start()
	if !hasMember(n, "member-0001") {
		t.Fatal("the restored dir lost its entry")
	}
}
