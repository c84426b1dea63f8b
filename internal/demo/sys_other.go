//go:build !linux

package demo

import "syscall"

// sysProcAttr: only Linux can tie a child's life to the parent's; elsewhere
// the teardown alone stops the children.
func sysProcAttr() *syscall.SysProcAttr { return nil }
