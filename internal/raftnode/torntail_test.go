package raftnode

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/hashicorp/raft"
)

// A tail segment whose last batch lost its commit frame (a crash during the
// write) is reported, with the entries raft-wal will drop; an intact one is
// not.
func TestScanTornTail(t *testing.T) {
	dir := t.TempDir()
	st, closeFn, err := OpenLogStore(LogStoreWAL, dir)
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 5; i++ {
		if err := st.StoreLogs([]*raft.Log{{Index: i, Term: 1, Type: raft.LogCommand, Data: []byte("entry")}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := closeFn(); err != nil {
		t.Fatal(err)
	}
	walDir := filepath.Join(dir, walDirName)
	if tt := scanTornTail(walDir); tt != nil {
		t.Fatalf("an intact segment reported torn: %+v", tt)
	}
	segs, _ := filepath.Glob(filepath.Join(walDir, "*.wal"))
	b, err := os.ReadFile(segs[len(segs)-1])
	if err != nil {
		t.Fatal(err)
	}
	end := len(b)
	for end > 0 && b[end-1] == 0 {
		end--
	}
	// Cut into the last commit frame: batch 5's entry is there, its commit
	// is not.
	if err := os.Truncate(segs[len(segs)-1], int64(end-3)); err != nil {
		t.Fatal(err)
	}
	tt := scanTornTail(walDir)
	if tt == nil || tt.entries != 1 || tt.end <= tt.committedEnd {
		t.Fatalf("torn tail: %+v, want one entry after the last commit", tt)
	}
}
