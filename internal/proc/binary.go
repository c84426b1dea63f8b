package proc

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// Binary is a Go program built once per test process, lazily (so `go test
// -list` and runs that need no binary stay fast), into a temporary directory
// that Cleanup removes. Declare one per test package and call Cleanup from
// TestMain after m.Run.
type Binary struct {
	Pkg  string // e.g. "github.com/dlock/dlock/cmd/dlock"
	Race bool   // build with the race detector

	once sync.Once
	dir  string
	path string
	err  error
}

// Path builds the binary the first time and returns its path, failing tb if
// the build fails.
func (b *Binary) Path(tb testing.TB) string {
	tb.Helper()
	b.once.Do(func() {
		if b.dir, b.err = os.MkdirTemp("", "dlock-test-bin-"); b.err != nil {
			return
		}
		out := filepath.Join(b.dir, filepath.Base(b.Pkg))
		start := time.Now()
		if b.err = Build(b.Pkg, out, b.Race); b.err == nil {
			b.path = out
			tb.Logf("built %s (race=%v) in %s", b.Pkg, b.Race, time.Since(start).Round(time.Millisecond))
		}
	})
	if b.err != nil {
		tb.Fatalf("build %s: %v", b.Pkg, b.err)
	}
	return b.path
}

// Cleanup removes the built binary's directory.
func (b *Binary) Cleanup() {
	if b.dir != "" {
		if err := os.RemoveAll(b.dir); err != nil {
			fmt.Fprintln(os.Stderr, "remove the test binary:", err)
		}
	}
}
