package openapi

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestLint lints the document with Redocly's CLI (its recommended rules,
// less the exceptions in api/openapi/.redocly.lint-ignore.yaml, each with
// its reason): no error and no warning. It needs `redocly` on PATH (npm
// install -g @redocly/cli); without it the test is skipped, unless
// DLOCK_OPENAPI_LINT=require.
func TestLint(t *testing.T) {
	bin, err := exec.LookPath("redocly")
	if err != nil {
		if os.Getenv("DLOCK_OPENAPI_LINT") == "require" {
			t.Fatal("redocly not found: npm install -g @redocly/cli")
		}
		t.Skip("redocly not found: npm install -g @redocly/cli to lint the OpenAPI document")
	}
	_, file, _, _ := runtime.Caller(0)
	dir := filepath.Join(filepath.Dir(file), "..", "..", "api", "openapi")
	cmd := exec.Command(bin, "lint", "--format=stylish", "dlock.yaml")
	cmd.Dir = dir // where .redocly.lint-ignore.yaml is
	// No usage reports or update checks from a test.
	cmd.Env = append(os.Environ(), "REDOCLY_TELEMETRY=off", "REDOCLY_SUPPRESS_UPDATE_NOTICE=true")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("redocly lint: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, " warning ") || strings.Contains(line, " error ") {
			t.Errorf("redocly lint: %s", strings.TrimSpace(line))
		}
	}
}
