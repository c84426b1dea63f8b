//go:build unix

package proc

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/testutil"
)

func TestStartStopKillAndLog(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "sh.log")
	p, err := Start("sh", log, "/bin/sh", []string{"-c", "trap 'echo b\"\"ye; exit 3' TERM; echo rea\"\"dy; while :; do sleep 0.05; done"}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	waitLog(t, log, "\nready")
	if p.Exited() {
		t.Fatal("exited early")
	}
	if _, forced := p.Stop(syscall.SIGTERM, 5*time.Second); forced || p.ExitCode() != 3 || !strings.Contains(LogTail(log, 5), "\nbye") {
		t.Fatalf("stop: forced %v, exit %d, log %q", forced, p.ExitCode(), LogTail(log, 5))
	}
	// A process that ignores SIGTERM is forced.
	q, err := Start("stubborn", log, "/bin/sh", []string{"-c", "trap '' TERM; echo stub\"\"born; while :; do sleep 0.05; done"}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	waitLog(t, log, "\nstubborn")
	if _, forced := q.Stop(syscall.SIGTERM, 200*time.Millisecond); !forced || !q.Exited() {
		t.Fatalf("a process ignoring SIGTERM was not forced: %v", forced)
	}
	r, _ := Start("killed", log, "/bin/sh", []string{"-c", "sleep 30"}, Options{})
	if err := r.Kill(5 * time.Second); err != nil || r.ExitCode() != -1 {
		t.Fatalf("kill: %v, exit %d", err, r.ExitCode())
	}
	if err := r.Kill(time.Second); err != nil {
		t.Fatalf("killing an exited process: %v", err)
	}
}

func waitLog(t *testing.T, log, marker string) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, fmt.Sprintf("%q in the log", marker), func() (bool, string) {
		tail := LogTail(log, 5)
		return strings.Contains(tail, marker), tail
	})
}
