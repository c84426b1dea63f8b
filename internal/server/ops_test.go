package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
)

// history reads a lock's history from one node's own state (stale), so each
// node's copy is checked, not the leader's.
func history(c *testcluster.Cluster, node, name string) (service.HistoryResponse, error) {
	var h service.HistoryResponse
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := c.Do(ctx, http.MethodGet, c.URL(node)+"/api/v1/history/"+name+"?stale=true", nil, &h)
	return h, err
}

// revokedRecordOn waits until node's history of name shows the revoked grant
// (token, reason) right behind the current one (holder).
func revokedRecordOn(t *testing.T, c *testcluster.Cluster, node, name string, token uint64, holder string) {
	t.Helper()
	testutil.Eventually(t, 20*time.Second, "the history on "+node+" shows the revoked grant", func() (bool, string) {
		h, err := history(c, node, name)
		if err != nil {
			return false, err.Error()
		}
		if len(h.Grants) < 2 {
			return false, "grants: " + jsonOf(h.Grants)
		}
		cur, rev := h.Grants[0], h.Grants[1]
		ok := cur.ClientID == holder && cur.EndCause == "" && cur.FencingToken > token &&
			rev.FencingToken == token && rev.EndCause == "revoked" && rev.Reason == "stuck" && rev.ClientID == "worker-1" &&
			rev.Value == "pid 4242 on host-1" && rev.TTLms == 60000 && !rev.EndedAt.IsZero()
		return ok, "grants: " + jsonOf(h.Grants)
	})
}

// The operator's story on a real cluster: a stuck holder's grant is in the
// history, a revoke through a follower hands the lock to the waiter at once
// with a higher token, the holder's renew says lock_lost, and the history —
// with the reason — is the same on every node, after the leader is killed
// and after every node restarts.
func TestRevokeAndHistorySurviveLeaderKillAndRestart(t *testing.T) {
	c := testcluster.New(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	follower := c.Follower()
	const name = "billing/batch-job"
	code, a := acquire(t, c, leader, name, map[string]any{"client_id": "worker-1", "ttl_ms": 60000, "value": "pid 4242 on host-1"})
	if code != 200 {
		t.Fatalf("acquire: %d", code)
	}
	if v := getLock(t, c, follower, name); v.Value != "pid 4242 on host-1" {
		t.Fatalf("GET shows value %q", v.Value)
	}
	w := startWaiter(t, c, follower, name, "worker-2", "w2-req")
	testutil.Eventually(t, 5*time.Second, "worker-2 queued", func() bool { return getLock(t, c, leader, name).Waiters == 1 })

	var h service.HistoryResponse
	if code, err := c.Do(context.Background(), http.MethodGet, c.URL(follower)+"/api/v1/history/"+name, nil, &h); err != nil || code != 200 ||
		len(h.Grants) != 1 || h.Grants[0].FencingToken != a.FencingToken || h.Grants[0].EndCause != "" {
		t.Fatalf("history before the revoke: %d %v %+v", code, err, h)
	}

	var rv service.RevokeResponse
	code, err := c.Do(context.Background(), http.MethodPost, c.URL(follower)+"/api/v1/locks/"+name+"/revoke",
		map[string]any{"fencing_token": a.FencingToken, "reason": "stuck"}, &rv)
	if err != nil || code != 200 || !rv.Revoked || rv.FencingToken != a.FencingToken {
		t.Fatalf("revoke: %d %v %+v", code, err, rv)
	}
	g := expectGrant(t, w, "worker-2", 10*time.Second)
	if g.FencingToken <= a.FencingToken {
		t.Fatalf("worker-2 got token %d, not above the revoked %d", g.FencingToken, a.FencingToken)
	}
	// The revoked holder learns it at its next renew.
	var lost struct {
		Error        struct{ Code string } `json:"error"`
		FencingToken uint64                `json:"fencing_token"`
	}
	code, err = c.Do(context.Background(), http.MethodPost, c.URL(leader)+"/api/v1/locks/"+name+"/renew",
		map[string]any{"client_id": "worker-1", "fencing_token": a.FencingToken, "lease_id": a.LeaseID}, &lost)
	if err != nil || code != 409 || lost.Error.Code != "lock_lost" || lost.FencingToken != a.FencingToken {
		t.Fatalf("renew of the revoked grant: %d %v %+v", code, err, lost)
	}
	// Revoking it again finds nothing.
	code, _ = c.Do(context.Background(), http.MethodPost, c.URL(leader)+"/api/v1/locks/"+name+"/revoke",
		map[string]any{"fencing_token": a.FencingToken, "reason": "stuck"}, nil)
	if code != 404 {
		t.Fatalf("second revoke: %d, want 404", code)
	}
	for _, id := range c.Running() {
		revokedRecordOn(t, c, id, name, a.FencingToken, "worker-2")
	}

	c.Kill(leader)
	c.WaitLeader(20 * time.Second)
	for _, id := range c.Running() {
		revokedRecordOn(t, c, id, name, a.FencingToken, "worker-2")
	}
	c.Start(leader)
	revokedRecordOn(t, c, leader, name, a.FencingToken, "worker-2")

	for _, id := range c.IDs() {
		c.Kill(id)
	}
	for _, id := range c.IDs() {
		c.Start(id)
	}
	c.WaitLeader(30 * time.Second)
	for _, id := range c.IDs() {
		revokedRecordOn(t, c, id, name, a.FencingToken, "worker-2")
	}
}

// With lock_delay_ms, a holder whose lease expires keeps the lock from
// everyone for that long: an immediate acquire is told lock_delayed with the
// time left, GET shows delayed_until, and the waiter gets the lock only after
// TTL + delay.
func TestLockDelayAfterExpiry(t *testing.T) {
	c := testcluster.New(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	const ttl, delay = 1000 * time.Millisecond, 2000 * time.Millisecond
	start := time.Now() // before the grant: its lease ends at least ttl after it
	code, a := acquire(t, c, leader, "delayed", map[string]any{"client_id": "dies", "ttl_ms": ttl.Milliseconds(), "lock_delay_ms": delay.Milliseconds()})
	if code != 200 {
		t.Fatalf("acquire: %d", code)
	}
	w := startWaiter(t, c, c.Follower(), "delayed", "next", "next-req")
	// The holder never renews. Once its lease has expired, the lock is in its
	// delay: nobody holds it, and an immediate acquire is refused.
	testutil.Eventually(t, 10*time.Second, "the lock-delay began", func() bool {
		v := getLock(t, c, leader, "delayed")
		return !v.Held && !v.DelayedUntil.IsZero()
	})
	var refused struct {
		Error struct {
			Code         string `json:"code"`
			RetryAfterMs int64  `json:"retry_after_ms"`
		} `json:"error"`
	}
	code, err := c.Do(context.Background(), http.MethodPost, c.URL(leader)+"/api/v1/locks/delayed/acquire",
		map[string]any{"client_id": "eager", "ttl_ms": 5000}, &refused)
	if err != nil || code != 409 || refused.Error.Code != "lock_delayed" || refused.Error.RetryAfterMs <= 0 || refused.Error.RetryAfterMs > delay.Milliseconds() {
		t.Fatalf("acquire in the delay: %d %v %+v", code, err, refused)
	}
	g := expectGrant(t, w, "next", 20*time.Second)
	// Never before TTL + delay: the leader counts both on its monotonic
	// clock, from the grant, which came after start.
	if took := time.Since(start); took < ttl+delay {
		t.Fatalf("the waiter got the lock %s after the grant, before TTL + lock-delay (%s)", took, ttl+delay)
	}
	if g.FencingToken <= a.FencingToken {
		t.Fatalf("token %d after %d", g.FencingToken, a.FencingToken)
	}
	var h service.HistoryResponse
	if code, err := c.Do(context.Background(), http.MethodGet, c.URL(leader)+"/api/v1/history/delayed", nil, &h); err != nil || code != 200 ||
		len(h.Grants) != 2 || h.Grants[1].EndCause != "expired" || h.Grants[1].LockDelayMs != delay.Milliseconds() {
		t.Fatalf("history: %d %v %+v", code, err, h)
	}
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
