//go:build linux

package demo

import "syscall"

// sysProcAttr has the kernel SIGKILL a child if the demo dies without its
// teardown (SIGKILL, a crash), so no node outlives it.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
