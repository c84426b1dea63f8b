//go:build !unix

package main

import (
	"os"
	"os/exec"
)

// Without process groups only the command itself can be signalled, and
// only killed.

func ownProcessGroup(*exec.Cmd) {}

func signalGroup(cmd *exec.Cmd, _ os.Signal) {
	if cmd.Process != nil {
		_ = cmd.Process.Kill()
	}
}

func groupAlive(*exec.Cmd) bool { return false }

func signalNumber(os.Signal) int { return 0 }

func exitStatus(ps *os.ProcessState) int { return ps.ExitCode() }
