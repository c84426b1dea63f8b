package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/server"
	"github.com/dlock/dlock/internal/shard"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
)

// getRaw answers a request's status and body.
func getRaw(t *testing.T, c *testcluster.Cluster, method, u string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func allReady(t *testing.T, c *testcluster.Cluster, ids ...string) {
	t.Helper()
	for _, id := range ids {
		testutil.Eventually(t, 90*time.Second, "node "+id+" is ready", func() error {
			if code, body := getRaw(t, c, http.MethodGet, c.URL(id)+"/readyz"); code != 200 {
				return fmt.Errorf("readyz %d: %s", code, body)
			}
			return nil
		})
	}
}

// TestStartGateHoldsCallsOverShards restarts a node whose meta group cannot
// confirm its shard map (the barrier is held, as for a node cut off from
// the meta group's quorum): it is not ready, refuses a merged list and a
// keepalive with a retryable 503 once RouteWait passes, but serves a call
// on one name; once the barrier goes through it serves everything.
func TestStartGateHoldsCallsOverShards(t *testing.T) {
	c, _ := shardedCluster(t, 3)
	ids := c.IDs()
	allReady(t, c, ids...)
	var sess struct {
		SessionID string `json:"session_id"`
	}
	if code := doRetried(t, c, http.MethodPost, c.URL(ids[0])+"/api/v1/sessions", map[string]any{"client_id": "g", "ttl_ms": 120000, "request_id": "gate-sess"}, &sess); code != 201 {
		t.Fatalf("create session: %d", code)
	}

	slow := ids[2]
	var held atomic.Bool
	held.Store(true)
	tries := atomic.Int64{}
	server.SetGateHook(func(node string) error {
		if node == slow && held.Load() {
			tries.Add(1)
			return errors.New("held by the test: the meta group's quorum is out of reach")
		}
		return nil
	})
	t.Cleanup(func() { server.SetGateHook(nil) })
	c.Kill(slow)
	c.Start(slow)
	testutil.Eventually(t, 30*time.Second, "the held barrier was tried", func() error {
		if tries.Load() == 0 {
			return errors.New("no try yet")
		}
		return nil
	})

	if code, body := getRaw(t, c, http.MethodGet, c.URL(slow)+"/readyz"); code != 503 || !strings.Contains(body, "catching up") {
		t.Fatalf("readyz while held: %d %s", code, body)
	}
	start := time.Now()
	if code, body := getRaw(t, c, http.MethodGet, c.URL(slow)+"/api/v1/locks?prefix="); code != 503 || !strings.Contains(body, "catching up") {
		t.Fatalf("merged list while held: %d %s", code, body)
	}
	if waited := time.Since(start); waited < shard.RouteWait {
		t.Fatalf("the list was refused after %s, before RouteWait (%s)", waited, shard.RouteWait)
	}
	if code, body := getRaw(t, c, http.MethodPost, c.URL(slow)+"/api/v1/sessions/"+sess.SessionID+"/keepalive"); code != 503 || !strings.Contains(body, "catching up") {
		t.Fatalf("keepalive while held: %d %s", code, body)
	}
	// A call on one name is served: its shard refuses a name it lost.
	for _, name := range []string{"alpha/x", "mike/x", "zulu/x"} {
		if code := doRetried(t, c, http.MethodPost, c.URL(slow)+"/api/v1/locks/"+name+"/acquire", map[string]any{"client_id": "g", "ttl_ms": 30000}, nil); code != 200 {
			t.Fatalf("acquire %s through the held node: %d", name, code)
		}
	}
	if tries.Load() == 0 || !held.Load() {
		t.Fatal("the gate was not held through the checks")
	}

	held.Store(false)
	allReady(t, c, slow)
	var l struct {
		Locks []struct {
			Name string `json:"name"`
		} `json:"locks"`
	}
	if code := doRetried(t, c, http.MethodGet, c.URL(slow)+"/api/v1/locks?prefix=", nil, &l); code != 200 || len(l.Locks) != 3 {
		t.Fatalf("merged list once open: %d %+v", code, l)
	}
	if code := doRetried(t, c, http.MethodPost, c.URL(slow)+"/api/v1/sessions/"+sess.SessionID+"/keepalive", nil, nil); code != 200 {
		t.Fatalf("keepalive once open: %d", code)
	}
}

// TestStartGateFullRestart restarts every node of a sharded cluster at
// once: the meta group elects a leader among the restarting nodes, so every
// gate opens (the barrier waits on no node's gate).
func TestStartGateFullRestart(t *testing.T) {
	c, _ := shardedCluster(t, 3)
	ids := c.IDs()
	allReady(t, c, ids...)
	if code := doRetried(t, c, http.MethodPost, c.URL(ids[0])+"/api/v1/locks/kilo/x/acquire", map[string]any{"client_id": "g", "ttl_ms": 120000}, nil); code != 200 {
		t.Fatalf("acquire: %d", code)
	}
	for _, id := range ids {
		c.Kill(id)
	}
	for _, id := range ids {
		c.Start(id)
	}
	allReady(t, c, ids...)
	for _, id := range ids {
		var l struct {
			Locks []struct {
				Name string `json:"name"`
			} `json:"locks"`
		}
		if code := doRetried(t, c, http.MethodGet, c.URL(id)+"/api/v1/locks?prefix=", nil, &l); code != 200 || len(l.Locks) != 1 {
			t.Fatalf("merged list through %s after the restart: %d %+v", id, code, l)
		}
	}
}
