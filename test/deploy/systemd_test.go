package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// systemd-analyze verify exits 0 even for directives it ignores, so any line
// it prints about the unit is a failure.
func TestSystemdUnitVerifies(t *testing.T) {
	sa := need(t, "systemd-analyze", "systemd")
	unit, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "systemd", "dlock.service"))
	if err != nil {
		t.Fatal(err)
	}
	// verify checks that ExecStart's binary exists: point it at one that does.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "dlock.service")
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(string(unit), "/usr/local/bin/dlock", self)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(sa, "verify", path).CombinedOutput()
	if err != nil || strings.Contains(string(out), "dlock.service") {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
	for _, want := range []string{"Type=notify", "User=dlock", "EnvironmentFile=", "LimitNOFILE=", "NoNewPrivileges=yes"} {
		if !strings.Contains(string(unit), want) {
			t.Errorf("unit lacks %s", want)
		}
	}
}
