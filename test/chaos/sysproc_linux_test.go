//go:build linux

package chaos

import "syscall"

// sysProcAttr makes the kernel SIGKILL a dlock child if the test binary dies
// without running its clean-ups (a -timeout panic, a crash), so no dlock
// process outlives the suite.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
