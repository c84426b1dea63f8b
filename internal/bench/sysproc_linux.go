//go:build linux

package bench

import (
	"syscall"
	"time"
)

// sysProcAttr makes the kernel SIGKILL a started `dlock serve` if the bench
// process dies without cleaning up, so no node outlives it.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// selfCPUSeconds is the CPU time (user + system) this process has used.
func selfCPUSeconds() (float64, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds(), true
}
