package client

import (
	"testing"
	"time"
)

// LastSent is the client's own record of when it sent the last acquire or
// renew of l that was answered with success.
func LastSent(l *Lease) time.Time {
	l.k.mu.Lock()
	defer l.k.mu.Unlock()
	return l.k.sent
}

// SessionID is the session's secret id, for tests that end it behind the
// client's back.
func SessionID(s *Session) string { return s.id }

// SetMaxWait lowers the server's wait limit the client assumes, for tests
// that see a wait outlast it, until the test ends.
func SetMaxWait(t testing.TB, d time.Duration) {
	old := maxWait
	maxWait = d
	t.Cleanup(func() { maxWait = old })
}
