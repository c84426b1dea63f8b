package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// binDir holds the dlock binary built for this test run; TestMain removes it.
var binDir string

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "dlock-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: make a directory for the dlock binary:", err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// dlockBinary builds cmd/dlock once per test run (lazily, so `go test -list`
// and filtered runs that need no binary stay fast) and returns its path.
func dlockBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		goTool, err := exec.LookPath("go")
		if err != nil {
			buildErr = fmt.Errorf("the go command is needed to build dlock: %w", err)
			return
		}
		out := filepath.Join(binDir, "dlock")
		args := []string{"build"}
		if raceEnabled {
			args = append(args, "-race")
		}
		args = append(args, "-o", out, "github.com/dlock/dlock/cmd/dlock")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		start := time.Now()
		if b, err := exec.CommandContext(ctx, goTool, args...).CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go %v: %w\n%s", args, err, b)
			return
		}
		binPath = out
		t.Logf("built %s (race=%v) in %s", out, raceEnabled, time.Since(start).Round(time.Millisecond))
	})
	if buildErr != nil {
		t.Fatalf("build dlock: %v", buildErr)
	}
	return binPath
}
