package python

import (
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/loopback"
	"github.com/dlock/dlock/internal/proc"
)

var dlockBin = &proc.Binary{Pkg: "github.com/dlock/dlock/cmd/dlock"}

func TestMain(m *testing.M) {
	code := m.Run()
	dlockBin.Cleanup()
	os.Exit(code)
}

// debianPackages is what the Python tests need from Debian.
const debianPackages = "python3-venv python3-pytest python3-cryptography python3-setuptools python3-wheel python3-pyflakes"

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// python is Debian's python3 (DLOCK_PYTHON overrides), checked for what the
// tests import; the test is skipped without it unless required.
func python(t *testing.T) string {
	t.Helper()
	py := os.Getenv("DLOCK_PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	out, err := exec.Command(py, "-c", "import venv, ensurepip, pytest, cryptography, setuptools, wheel, pyflakes").CombinedOutput()
	if err != nil {
		msg := "Debian's python3 with " + debianPackages + " is needed (" + strings.TrimSpace(lastLine(string(out))) + "): apt-get install " + debianPackages
		if os.Getenv("DLOCK_PYTHON_TESTS") == "require" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return py
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	if s == "" {
		return "not found"
	}
	return s
}

// TestPythonClient installs the client as the README says and runs its
// tests: two processes never hold one lock at once, tokens rise, a paused
// holder sees lease.lost and its late write is refused, a leader killed
// during a blocking acquire still grants exactly once, an observer sees
// every leader change, a watch across a node kill sees every event once,
// and dlock.fence against proofs of a real cluster.
func TestPythonClient(t *testing.T) {
	if testing.Short() {
		t.Skip("starts clusters of dlock processes")
	}
	py := python(t)
	bin := dlockBin.Path(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := copyTree(filepath.Join(repoRoot(), "clients", "python"), src); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	env := append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "PIP_NO_INPUT=1", "PIP_DISABLE_PIP_VERSION_CHECK=1")
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	venv := filepath.Join(dir, "V")
	run(py, "-m", "venv", "--system-site-packages", venv)
	run(filepath.Join(venv, "bin", "pip"), "install", "--no-index", "--no-build-isolation", src)

	var addrs []string
	for range 60 {
		a, err := loopback.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, a)
	}
	// From dir, not src: the tests must import the installed package.
	cmd := exec.CommandContext(ctx, filepath.Join(venv, "bin", "python"), "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
		filepath.Join(src, "tests"))
	cmd.Dir = dir
	cmd.Env = append(env, "DLOCK_BIN="+bin, "DLOCK_TEST_ADDRS="+strings.Join(addrs, ","))
	start := time.Now()
	out, err := cmd.CombinedOutput()
	t.Logf("pytest (%s):\n%s", time.Since(start).Round(time.Millisecond), out)
	if err != nil {
		t.Fatalf("pytest failed: %v", err)
	}
	last := lastLine(string(out))
	if !strings.Contains(last, " passed") || strings.Contains(last, "failed") || strings.Contains(last, "error") {
		t.Fatalf("pytest's summary %q does not say every test passed", last)
	}
	if strings.Contains(last, "skipped") {
		t.Fatalf("pytest skipped tests (%q); every one must run here", last)
	}
}

// copyTree copies the client's sources, without caches or build output.
func copyTree(from, to string) error {
	return filepath.WalkDir(from, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, p)
		name := d.Name()
		if d.IsDir() && (name == "__pycache__" || name == "build" || name == ".pytest_cache" || strings.HasSuffix(name, ".egg-info")) {
			return filepath.SkipDir
		}
		target := filepath.Join(to, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o644)
	})
}

// TestPythonLint runs pyflakes over the client and its tests: undefined
// names and unused imports, which Python itself reports only when the line
// runs.
func TestPythonLint(t *testing.T) {
	py := python(t)
	dir := filepath.Join(repoRoot(), "clients", "python")
	cmd := exec.Command(py, "-m", "pyflakes", "dlock", "tests")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pyflakes: %v\n%s", err, out)
	}
}
