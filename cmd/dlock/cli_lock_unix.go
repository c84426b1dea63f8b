//go:build unix

package main

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
)

// ownProcessGroup starts the command in a process group of its own, so that
// dlock can signal it and everything it started, and nothing else.
func ownProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}

// signalGroup sends sig to the command's group, and SIGCONT after it: a
// process stopped (by SIGTTIN for reading the terminal from a background
// group, or SIGTSTP) would otherwise not act on a SIGTERM until the SIGKILL
// of the grace period.
func signalGroup(cmd *exec.Cmd, sig os.Signal) {
	if s, ok := sig.(syscall.Signal); ok && cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, s)
		if s != syscall.SIGKILL && s != syscall.SIGCONT {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGCONT)
		}
	}
}

// groupAlive reports whether any process of the command's group is left.
func groupAlive(cmd *exec.Cmd) bool {
	return cmd.Process != nil && !errors.Is(syscall.Kill(-cmd.Process.Pid, 0), syscall.ESRCH)
}

func signalNumber(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return int(s)
	}
	return 0
}

// exitStatus is the shell's view of how the command ended: its exit code,
// or 128+N if signal N killed it.
func exitStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}
