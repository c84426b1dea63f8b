package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	dproc "github.com/dlock/dlock/internal/proc"
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
		out := filepath.Join(binDir, "dlock")
		start := time.Now()
		if buildErr = dproc.Build("github.com/dlock/dlock/cmd/dlock", out, raceEnabled); buildErr != nil {
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
