package main

import (
	"context"
	"testing"
	"time"
)

// A node that stops itself (a storage failure) ends serve's wait without a
// signal, after an orderly shutdown.
func TestWaitForSignalOrEndsWhenTheNodeStops(t *testing.T) {
	stop := make(chan struct{})
	shut := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- waitForSignalOr(stop, func(context.Context) error { close(shut); return nil }, func(string, ...any) {})
	}()
	close(stop)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("wait returned %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve kept waiting after its node stopped")
	}
	select {
	case <-shut:
	default:
		t.Fatal("the server was not shut down")
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "64MiB": 64 << 20, "1GiB": 1 << 30, "512 KiB": 512 << 10, "100": 100, "100B": 100} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-1", "64MB", "lots"} {
		if _, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) accepted", in)
		}
	}
}
