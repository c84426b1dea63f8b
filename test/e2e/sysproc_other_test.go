//go:build !linux

package e2e

import "syscall"

// sysProcAttr: only Linux can tie a child's life to its parent; elsewhere the
// t.Cleanup stop is the only guard.
func sysProcAttr() *syscall.SysProcAttr { return nil }
