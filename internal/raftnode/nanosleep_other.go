//go:build !linux

package raftnode

import "time"

// nanosleep waits d (nanosleep_linux.go says why Linux does not use a timer).
func nanosleep(d time.Duration) { time.Sleep(d) }
