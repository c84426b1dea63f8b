package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// repoRoot is the checkout's root (this file is test/deploy/helpers_test.go).
func repoRoot(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// need returns the path of tool, or skips the test naming the Debian package
// that has it.
func need(t *testing.T, tool, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(tool)
	if err != nil {
		if os.Getenv("DLOCK_DEPLOY_TESTS") == "require" {
			t.Fatalf("%s not found (apt-get install %s)", tool, pkg)
		}
		t.Skipf("%s not found: apt-get install %s to run this check", tool, pkg)
	}
	return p
}
