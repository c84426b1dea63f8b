//go:build linux

package bench

import "syscall"

// sysProcAttr makes the kernel SIGKILL a started `dlock serve` if the bench
// process dies without cleaning up, so no node outlives it.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
