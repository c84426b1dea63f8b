package demo

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	dproc "github.com/dlock/dlock/internal/proc"
)

var dlock = &dproc.Binary{Pkg: "github.com/dlock/dlock/cmd/dlock"}

func TestMain(m *testing.M) {
	code := m.Run()
	dlock.Cleanup()
	os.Exit(code)
}

// dlockBinary builds cmd/dlock once per test run, and checks that it runs
// the paused client of the demo (`dlock demo-writer`).
func dlockBinary(t *testing.T) string {
	t.Helper()
	bin := dlock.Path(t)
	if b, err := exec.Command(bin, "demo-writer", "-h").CombinedOutput(); err != nil {
		t.Fatalf("the built dlock has no demo-writer command (%v): wire newDemoCmd and newDemoWriterCmd into cmd/dlock/main.go\n%.300s", err, b)
	}
	return bin
}

// runDemo runs steps of the demo against real processes and returns the
// narration.
func runDemo(t *testing.T, cfg Config, bound time.Duration) string {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a cluster of real dlock processes; skipped under -short")
	}
	cfg.Binary = dlockBinary(t)
	cfg.Dir = t.TempDir()
	var out bytes.Buffer
	cfg.Out = &out
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	start := time.Now()
	err := Run(ctx, cfg)
	t.Logf("narration (%s):\n%s", time.Since(start).Round(time.Millisecond), out.String())
	if err != nil {
		t.Fatal(err)
	}
	return out.String()
}

// TestPausedWriter is step d (and e, which borrows its grant): a writer
// process frozen with SIGSTOP past its TTL must be refused with 409
// stale_token after the next holder wrote, and forged tokens with 403.
func TestPausedWriter(t *testing.T) {
	out := runDemo(t, Config{Nodes: 3, Steps: "de"}, 60*time.Second)
	for _, want := range []string{"SIGSTOP pid", "409 stale_token", "403 bad_proof", "GET /data: 2 records"} {
		if !strings.Contains(out, want) {
			t.Errorf("narration lacks %q", want)
		}
	}
}

// TestWholeDemo is `dlock demo` as a user runs it, 5 nodes and all.
func TestWholeDemo(t *testing.T) {
	runDemo(t, Config{}, 90*time.Second)
}
