package shard_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/shard"
)

// TestSessionThroughAStaleMapReachesEveryShard keeps a session alive
// through a router whose map predates a split (as a node's is while it
// replays the meta group after a restart): the split-off shard, which
// holds the session's lock, is not in that map. The keepalive must not be
// answered ok without renewing it: without the newer map it answers a
// retryable 503, and once the newer map arrives it renews the new shard
// too. The routed answers' split list stays out of the HTTP answer. A
// session delete through the old map is not ok either until it has ended
// the session on shard 4, which frees the lock.
func TestSessionThroughAStaleMapReachesEveryShard(t *testing.T) {
	c, _ := sharded(t, 3)
	ids := c.IDs()
	node := c.Server(ids[0])
	fresh := node.Router()
	// The map before the split, over the same (real, running) services.
	oldMap, oldServices := fresh.Map(), fresh.Services()
	stale := shard.NewRouter(oldMap, oldServices)

	splitAtQ(t, c, ids[0])
	if k := stale.Map().Lookup("romeo"); stale.Map().IDs[k] == 4 {
		t.Fatal("the stale map already has the split")
	}

	var sess service.SessionResponse
	if code := post(t, c, c.URL(ids[0])+"/api/v1/sessions", map[string]any{"client_id": "ka", "ttl_ms": 15000, "request_id": "ka-sess"}, &sess); code != 201 {
		t.Fatalf("create session: %d %+v", code, sess)
	}
	var a service.AcquireResponse
	if code := post(t, c, c.URL(ids[0])+"/api/v1/locks/romeo/acquire", map[string]any{"client_id": "ka", "session_id": sess.SessionID, "request_id": "ka-romeo"}, &a); code != 200 || !a.Acquired {
		t.Fatalf("acquire romeo: %d %+v", code, a)
	}
	if k := fresh.Map().Lookup("romeo"); fresh.Map().IDs[k] != 4 {
		t.Fatalf("romeo is on shard %d, want the split-off shard 4", fresh.Map().IDs[k])
	}

	// Without the newer map: a retryable 503, never ok.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	resp, err := stale.KeepAlive(ctx, service.KeepAliveRequest{SessionID: sess.SessionID})
	cancel()
	var ae *apierror.Error
	if err == nil {
		t.Fatalf("a keepalive through a map without shard 4 answered ok (%+v): shard 4's lease was not renewed", resp)
	}
	if !errors.As(err, &ae) || ae.Code != apierror.Unavailable || ae.RetryAfter <= 0 {
		t.Fatalf("keepalive through a stale map: %v, want a retryable unavailable", err)
	}

	// The newer map arrives while the keepalive waits (or before it
	// starts): it renews shard 4 as well. The answer's expiry is the
	// earliest of every shard's, so it is past the session's first expiry
	// only if shard 4's lease was renewed.
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go stale.Update(fresh.Map(), fresh.Services())
	resp, err = stale.KeepAlive(ctx, service.KeepAliveRequest{SessionID: sess.SessionID})
	if err != nil {
		t.Fatalf("keepalive once the map arrived: %v", err)
	}
	if !resp.ExpiresAt.After(sess.ExpiresAt) {
		t.Fatalf("keepalive answered expires_at %v, not past the session's first expiry %v: a shard was not renewed", resp.ExpiresAt, sess.ExpiresAt)
	}
	if resp.SplitGroups != nil {
		t.Fatalf("the router's answer carries the shards' split lists: %v", resp.SplitGroups)
	}

	var raw json.RawMessage
	if code := post(t, c, c.URL(ids[0])+"/api/v1/sessions/"+sess.SessionID+"/keepalive", map[string]any{}, &raw); code != 200 {
		t.Fatalf("keepalive over HTTP: %d %s", code, raw)
	}
	if strings.Contains(string(raw), "split") {
		t.Fatalf("the HTTP keepalive answer shows the internal split list: %s", raw)
	}

	// A delete through the old map: not ok while shard 4 keeps the
	// session (and romeo held); once the map arrives, romeo is free.
	stale = shard.NewRouter(oldMap, oldServices)
	dctx, dcancel := context.WithTimeout(context.Background(), 3*time.Second)
	d, err := stale.DeleteSession(dctx, service.DeleteSessionRequest{SessionID: sess.SessionID})
	dcancel()
	if err == nil {
		t.Fatalf("a session delete through a map without shard 4 answered ok (%+v) and left shard 4's copy", d)
	}
	if !errors.As(err, &ae) || ae.Code != apierror.Unavailable || ae.RetryAfter <= 0 {
		t.Fatalf("session delete through a stale map: %v, want a retryable unavailable", err)
	}
	go stale.Update(fresh.Map(), fresh.Services())
	if d, err = stale.DeleteSession(ctx, service.DeleteSessionRequest{SessionID: sess.SessionID}); err != nil || !d.Deleted {
		t.Fatalf("session delete once the map arrived: %+v %v", d, err)
	}
	var lv service.LockView
	if code := do(t, c, "GET", c.URL(ids[0])+"/api/v1/locks/romeo", nil, &lv); code != 200 || lv.Held {
		t.Fatalf("romeo after the session's delete: %d %+v", code, lv)
	}
}
