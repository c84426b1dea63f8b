package e2e

import (
	"os"
	"testing"

	dproc "github.com/dlock/dlock/internal/proc"
)

// dlock is the binary under test, built on first use.
var dlock = &dproc.Binary{Pkg: "github.com/dlock/dlock/cmd/dlock", Race: raceEnabled}

func TestMain(m *testing.M) {
	code := m.Run()
	dlock.Cleanup()
	plain.Cleanup()
	os.Exit(code)
}

// dlockBinary builds cmd/dlock once per test run and returns its path.
func dlockBinary(t testing.TB) string { return dlock.Path(t) }
