//go:build !linux

package bench

import "syscall"

func sysProcAttr() *syscall.SysProcAttr { return nil }
