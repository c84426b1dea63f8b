// Package testutil holds the helpers tests across the tree share: one way to
// wait for a condition.
package testutil

import (
	"testing"
	"time"
)

// Cond is a condition Eventually polls: a plain check, or one that also says
// why it does not hold yet (shown if it never does), as a string or as an
// error (nil: it holds).
type Cond interface {
	~func() bool | ~func() (bool, string) | ~func() error
}

// pollEvery is how often Eventually checks.
const pollEvery = 20 * time.Millisecond

// Eventually polls cond until it holds, failing the test if it still does not
// after within, with what and cond's last explanation. A test waits on the
// condition it needs, never a fixed sleep: the machines are shared and slow.
func Eventually[C Cond](t testing.TB, within time.Duration, what string, cond C) {
	t.Helper()
	check := func() (bool, string) {
		switch c := any(cond).(type) {
		case func() bool:
			return c(), ""
		case func() (bool, string):
			return c()
		case func() error:
			if err := c(); err != nil {
				return false, err.Error()
			}
			return true, ""
		}
		panic("testutil.Eventually: unsupported condition type")
	}
	deadline := time.Now().Add(within)
	for {
		ok, why := check()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			if why != "" {
				t.Fatalf("%s: not within %s (last: %s)", what, within, why)
			}
			t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(pollEvery)
	}
}
