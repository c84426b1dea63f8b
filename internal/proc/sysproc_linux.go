//go:build linux

package proc

import "syscall"

// sysProcAttr makes the kernel SIGKILL a child if this process dies without
// running its clean-ups (a test's -timeout panic, a crash).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
