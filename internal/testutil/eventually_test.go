package testutil

import (
	"strings"
	"testing"
	"time"
)

type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = format
	panic(r)
}

func TestEventuallyWaitsAndFails(t *testing.T) {
	n := 0
	Eventually(t, time.Second, "third poll", func() bool { n++; return n == 3 })
	if n != 3 {
		t.Fatalf("polled %d times", n)
	}
	r := &recorder{TB: t}
	func() {
		defer func() { recover() }()
		Eventually(r, 50*time.Millisecond, "never", func() (bool, string) { return false, "still no" })
	}()
	if !strings.Contains(r.failed, "not within") {
		t.Fatalf("a condition that never holds did not fail the test: %q", r.failed)
	}
}
