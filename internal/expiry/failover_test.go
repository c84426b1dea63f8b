package expiry_test

import (
	"context"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/testcluster"
)

// design.md §3: a failover extends a lease "by about one election, never by a
// full TTL per failover". The new leader counts each lease's time left as of
// the newest entry again from its takeover, so in a quiet cluster the leader
// must keep the lease clock moving (Tick): without it the extension is the
// whole time since the last command — here, with a dead holder and the leader
// killed 2.7 s into a 3 s TTL, about another full TTL after the takeover
// (~6 s in all instead of ~3.5 s).
func TestQuietFailoverDoesNotExtendLeaseByTTL(t *testing.T) {
	c := testcluster.New(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	ctx := context.Background()
	const ttl = 3000
	var acq struct {
		Acquired bool `json:"acquired"`
	}
	start := time.Now()
	code, err := c.Do(ctx, "POST", c.URL(leader)+"/api/v1/locks/idle/acquire", map[string]any{"client_id": "dead-holder", "ttl_ms": ttl}, &acq)
	if err != nil || code != 200 || !acq.Acquired {
		t.Fatalf("acquire: %d %v %+v", code, err, acq)
	}
	// Nobody renews: the holder is dead. The cluster is otherwise idle.
	time.Sleep(2700 * time.Millisecond)
	c.Kill(leader)
	killed := time.Since(start)
	newLeader := c.WaitLeader(10 * time.Second)
	elected := time.Since(start)
	var freed time.Duration
	for time.Since(start) < 15*time.Second {
		var v struct {
			Held bool `json:"held"`
		}
		code, err := c.Do(ctx, "GET", c.URL(newLeader)+"/api/v1/locks/idle?stale=true", nil, &v)
		if err == nil && code == 200 && !v.Held {
			freed = time.Since(start)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("leader killed at %v, new leader ready at %v, lock freed at %v (TTL %d ms)", killed, elected, freed, ttl)
	if freed == 0 {
		t.Fatal("lock never freed")
	}
	// Allowed: TTL + the failover (+ generous slack), not TTL + failover + TTL.
	if limit := time.Duration(ttl)*time.Millisecond + (elected - killed) + 1500*time.Millisecond; freed > limit {
		t.Fatalf("dead holder's lock freed %v after the grant; the contract allows about TTL + one election (%v)", freed, limit)
	}
}
