package shard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/shard"
	"github.com/dlock/dlock/internal/testcluster"
)

// lossy sends routed calls through the node's own Remote, but loses the
// answer of the next calls of an op after the replica ran them, as a
// connection that breaks once the call was sent would.
type lossy struct {
	shard.Remote
	mu   sync.Mutex
	lose map[string]int // op → answers still to lose
	sent map[string]int // op → calls sent
}

func (l *lossy) Call(ctx context.Context, node string, body []byte, accept time.Duration) ([]byte, error) {
	var in struct {
		Op string `json:"op"`
	}
	_ = json.Unmarshal(body, &in)
	l.mu.Lock()
	l.sent[in.Op]++
	lose := l.lose[in.Op] > 0
	if lose {
		l.lose[in.Op]--
	}
	l.mu.Unlock()
	b, err := l.Remote.Call(ctx, node, body, accept)
	if err == nil && lose {
		return nil, fmt.Errorf("node %s: the connection broke after the call was sent (lost by the test)", node)
	}
	return b, err
}

func (l *lossy) arm(op string) (sentBefore int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lose[op]++
	return l.sent[op]
}

func (l *lossy) sentSince(op string, before int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sent[op] - before
}

// A forwarded call that reached a replica and ran there, but whose answer
// was lost, is sent to another replica only when running it twice is
// harmless: a write without a request_id is answered "outcome unknown"
// (503) and not sent again — it ran exactly once — while the same write
// with a request_id, and a read, go on to the next replica and succeed (the
// shard's dedup table answers the retried write with its first grant).
func TestForwardedCallWithLostAnswer(t *testing.T) {
	c, m, away := placed4(t, testcluster.Options{})
	r := c.Server("n1").Router()
	l := &lossy{Remote: r.Remote(), lose: map[string]int{}, sent: map[string]int{}}
	r.SetRemote(l)
	base := c.URL("n1") + "/api/v1/locks/" + shardName(t, m, away)
	lockView := func(name string) service.LockView {
		t.Helper()
		var v service.LockView
		if code := do(t, c, "GET", c.URL("n2")+"/api/v1/locks/"+shardName(t, m, away)+"/"+name, nil, &v); code != 200 {
			t.Fatalf("GET %s: %d", name, code)
		}
		return v
	}

	// Settle: a call through n1 that loses nothing (a shard may still be
	// finishing an election).
	var first service.AcquireResponse
	if code := post(t, c, base+"/settle/acquire", map[string]any{"client_id": "s", "ttl_ms": 60000, "request_id": "settle"}, &first); code != 200 || !first.Acquired {
		t.Fatalf("acquire through n1: %d %+v", code, first)
	}

	// A write without a request_id: not sent again, outcome unknown.
	before := l.arm("acquire")
	var refused struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	code, err := c.Do(ctx, "POST", base+"/plain/acquire", map[string]any{"client_id": "x", "ttl_ms": 60000}, &refused)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	if code != http.StatusServiceUnavailable || refused.Error.Code != "unavailable" || !strings.Contains(refused.Error.Message, "outcome is unknown") {
		t.Fatalf("acquire without a request_id whose answer was lost: %d %+v, want 503 unavailable, outcome unknown", code, refused)
	}
	if n := l.sentSince("acquire", before); n != 1 {
		t.Fatalf("the acquire was sent %d times, want once", n)
	}
	if v := lockView("plain"); !v.Held || len(v.Holders) != 1 || v.Holders[0].ClientID != "x" {
		t.Fatalf("after the lost answer the lock is %+v, want held once by x (the call ran once)", v)
	}

	// The same write with a request_id: sent again, answered from the dedup
	// table with the one grant.
	before = l.arm("acquire")
	var a service.AcquireResponse
	if code := post(t, c, base+"/keyed/acquire", map[string]any{"client_id": "y", "ttl_ms": 60000, "request_id": "keyed-1"}, &a); code != 200 || !a.Acquired {
		t.Fatalf("acquire with a request_id whose first answer was lost: %d %+v", code, a)
	}
	if n := l.sentSince("acquire", before); n != 2 {
		t.Fatalf("the acquire with a request_id was sent %d times, want twice", n)
	}
	if v := lockView("keyed"); len(v.Holders) != 1 || v.Holders[0].ClientID != "y" || v.Holders[0].FencingToken != a.FencingToken {
		t.Fatalf("the lock is %+v, want held once by y with token %d", v, a.FencingToken)
	}

	// A read: sent again.
	before = l.arm("get_lock")
	var v service.LockView
	if code := do(t, c, "GET", base+"/keyed", nil, &v); code != 200 || v.Holders[0].FencingToken != a.FencingToken {
		t.Fatalf("GET through n1 after a lost answer: %d %+v", code, v)
	}
	if n := l.sentSince("get_lock", before); n != 2 {
		t.Fatalf("the read was sent %d times, want twice", n)
	}
}
