package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/state"
)

// dlock snapshot restore says that the backup's signing key is retired in
// the new cluster, and what to do about the old cluster and the file.
func TestSnapshotRestoreSaysTheOldKeyIsRetired(t *testing.T) {
	st := state.New()
	st.Apply(1, &command.Envelope{TS: 1, ClientID: "dlock", Body: &command.SetTokenKey{Seed: [32]byte{9}}})
	st.Apply(2, &command.Envelope{TS: 2, ClientID: "c", Body: &command.Acquire{Name: "a", LeaseID: command.LeaseID{1}, TTLms: 5000}})
	_, id, _ := st.SigningKey()
	file := filepath.Join(t.TempDir(), "b.snap")
	if err := os.WriteFile(file, st.Snapshot(), 0o600); err != nil {
		t.Fatal(err)
	}

	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	_, err = execute("snapshot", "restore", file, "--data-dir", filepath.Join(t.TempDir(), "n1"), "--initial-cluster", "n1=127.0.0.1:7071")
	os.Stdout = stdout
	w.Close()
	out, _ := io.ReadAll(r)
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	for _, want := range []string{fmt.Sprintf("token-signing key %x is retired", id), "tokens up to 1 only", "starts a new key", "Retire the old cluster", "secret"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
