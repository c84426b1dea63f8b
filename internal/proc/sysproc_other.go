//go:build !linux

package proc

import "syscall"

// sysProcAttr: only Linux can tie a child's life to its parent; elsewhere the
// callers' clean-ups are the only guard.
func sysProcAttr() *syscall.SysProcAttr { return nil }
