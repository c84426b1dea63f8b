//go:build unix

package demo

import (
	"os"
	"syscall"
)

// pause freezes a process as a long GC pause or a suspended VM would: it
// keeps its memory and its belief that it holds the lock.
func pause(p *os.Process) error { return p.Signal(syscall.SIGSTOP) }

func resume(p *os.Process) error { return p.Signal(syscall.SIGCONT) }
