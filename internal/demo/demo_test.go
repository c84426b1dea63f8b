package demo

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	binDir    string // removed by TestMain
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "dlock-demo-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo: make a directory for the dlock binary:", err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// dlockBinary builds cmd/dlock once per test run, lazily so that -short
// and -list stay fast.
func dlockBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		root, err := moduleRoot()
		if err != nil {
			buildErr = fmt.Errorf("find the module root (go.mod) above the test's directory: %w", err)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		out := filepath.Join(binDir, "dlock")
		cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/dlock")
		cmd.Dir = root
		if b, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/dlock: %w\n%s", err, b)
			return
		}
		// The demo runs the paused client as `dlock demo-writer`.
		if b, err := exec.CommandContext(ctx, out, "demo-writer", "-h").CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("the built dlock has no demo-writer command (%w): wire runDemo and runDemoWriter into cmd/dlock/main.go\n%.300s", err, b)
			return
		}
		binPath = out
	})
	if buildErr != nil {
		t.Fatalf("build dlock: %v", buildErr)
	}
	return binPath
}

// moduleRoot walks up from the package directory to go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", os.ErrNotExist
		}
		dir = parent
	}
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
