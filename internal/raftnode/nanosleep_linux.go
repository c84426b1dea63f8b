package raftnode

import (
	"time"

	"golang.org/x/sys/unix"
)

// nanosleep blocks the calling thread for d. A Go timer shorter than a
// millisecond fires about a millisecond late in a process with no other
// work (the runtime's poller sleeps in whole milliseconds), which would make
// the append writer's 100 µs linger ten times longer.
func nanosleep(d time.Duration) {
	ts := unix.NsecToTimespec(d.Nanoseconds())
	for unix.Nanosleep(&ts, &ts) == unix.EINTR {
	}
}
