//go:build !linux

package bench

import "syscall"

func sysProcAttr() *syscall.SysProcAttr { return nil }

// selfCPUSeconds is unknown here: the load generator's CPU is left out.
func selfCPUSeconds() (float64, bool) { return 0, false }
