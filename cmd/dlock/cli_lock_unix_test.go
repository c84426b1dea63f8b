//go:build linux

package main

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/testutil"
)

type lostHolding chan struct{}

func (h lostHolding) Done() <-chan struct{} { return h }

// A command that is stopped (here it stops itself, as a read from the
// terminal in a background group would) must still act on the SIGTERM sent
// when the lock is lost, not sit stopped until the grace period's SIGKILL.
func TestLostLockStopsAStoppedCommandPromptly(t *testing.T) {
	cmd := exec.Command("sh", "-c", "kill -STOP $$; exec sleep 100")
	ownProcessGroup(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Wait until it is stopped.
	testutil.Eventually(t, 10*time.Second, "the command to stop", func() (bool, string) {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/stat")
		f := strings.Fields(string(b))
		return len(f) > 2 && f[2] == "T", string(b)
	})
	h := make(lostHolding)
	close(h)
	start := time.Now()
	code, lost := supervise(cmd, h, nil, 20*time.Second)
	if !lost || code != 128+15 {
		t.Fatalf("supervise = %d, %v; want the command killed by SIGTERM (143) and the lock lost", code, lost)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Fatalf("the stopped command ended %v after the loss: it waited for the SIGKILL", d)
	}
}
