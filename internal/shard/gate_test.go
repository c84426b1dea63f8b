package shard

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/service"
)

// TestGateHoldsCallsOverShards: with the gate shut every call that spans
// shards, and readiness, answer the retryable catching-up 503 without
// reaching a shard; once it closes the wait passes.
func TestGateHoldsCallsOverShards(t *testing.T) {
	m, err := NewMap(DefaultBounds(4))
	if err != nil {
		t.Fatal(err)
	}
	r := NewRouter(m, make([]*service.Service, 4))
	gate := make(chan struct{})
	r.SetGate(gate)
	catching := func(what string, err error) {
		t.Helper()
		var ae *apierror.Error
		if !errors.As(err, &ae) || ae.Code != apierror.Unavailable || ae.RetryAfter == 0 || !strings.Contains(ae.Message, "catching up") {
			t.Fatalf("%s with the gate shut: %v, want a retryable catching-up 503", what, err)
		}
	}
	catching("readiness", r.Ready())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err = r.ListLocks(ctx, service.ListRequest{})
	catching("list locks", err)
	_, err = r.ListElections(ctx, service.ListRequest{})
	catching("list elections", err)
	_, err = r.Watch(ctx, service.WatchRequest{})
	catching("watch", err)
	_, err = r.CreateSession(ctx, service.CreateSessionRequest{})
	catching("create session", err)
	_, err = r.KeepAlive(ctx, service.KeepAliveRequest{})
	catching("keepalive", err)
	_, err = r.DeleteSession(ctx, service.DeleteSessionRequest{})
	catching("delete session", err)
	_, err = r.TokenKeys(ctx)
	catching("token keys", err)

	close(gate)
	if err := r.awaitGate(context.Background()); err != nil {
		t.Fatalf("open gate: %v", err)
	}
	r.SetGate(nil)
	if err := r.awaitGate(context.Background()); err != nil {
		t.Fatalf("no gate: %v", err)
	}
}
