package apierror

import (
	"testing"
	"time"
)

func TestRetryAfterSeconds(t *testing.T) {
	for _, tc := range []struct {
		e    *Error
		secs int64
		ok   bool
	}{
		{&Error{Code: Unavailable}, 1, true},                                   // never 0: a retry storm
		{&Error{Code: NoLeader, RetryAfter: 2500 * time.Millisecond}, 3, true}, // rounded up
		{&Error{Code: RateLimited, RetryAfter: 72 * time.Hour}, 3600, true},    // capped
		{&Error{Code: LockHeld, RetryAfter: time.Second}, 0, false},            // 409s carry none
	} {
		secs, ok := RetryAfterSeconds(tc.e)
		if secs != tc.secs || ok != tc.ok {
			t.Errorf("%s %v: %d %v, want %d %v", tc.e.Code, tc.e.RetryAfter, secs, ok, tc.secs, tc.ok)
		}
	}
}
