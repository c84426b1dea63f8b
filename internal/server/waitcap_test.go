package server_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/server"
	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
)

// Many blocking acquires at once, through every node, cannot queue more
// waiters than --max-waiters-per-lock. Each node's early check reads its own
// state, where none of the racing waits is queued yet, so all of them used
// to pass it and queue; the state machine now refuses the ones past the cap,
// whichever node took them.
func TestWaiterCapHoldsUnderConcurrentWaits(t *testing.T) {
	const limit, waits = 5, 60
	c := testcluster.NewWith(t, 3, testcluster.Options{Limits: server.Limits{Service: service.Limits{MaxWaitersPerLock: limit}}})
	leader := c.WaitLeader(10 * time.Second)
	if code, _ := acquire(t, c, leader, "capped", map[string]any{"client_id": "holder", "ttl_ms": 120000}); code != 200 {
		t.Fatalf("holder: %d", code)
	}
	nodes := c.IDs()
	ctx, hangUp := context.WithCancel(context.Background())
	var (
		mu      sync.Mutex
		refused int
		other   []string
		wg      sync.WaitGroup
	)
	start := make(chan struct{})
	for i := range waits {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			var e errBody
			code, err := c.Do(ctx, http.MethodPost, c.URL(nodes[i%len(nodes)])+"/api/v1/locks/capped/acquire",
				map[string]any{"client_id": fmt.Sprintf("w%d", i), "ttl_ms": 60000, "wait_timeout_ms": 60000}, &e)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case ctx.Err() != nil:
				// Still waiting in line when the test hung up.
			case code == http.StatusTooManyRequests && e.Error.Code == "rate_limited":
				refused++
			default:
				other = append(other, fmt.Sprintf("%d %s %v", code, e.Error.Code, err))
			}
		}()
	}
	close(start)
	defer func() {
		hangUp()
		wg.Wait()
	}()
	// Every wait is either in line or refused: then count.
	testutil.Eventually(t, 30*time.Second, "every wait queued or refused", func() bool {
		mu.Lock()
		done := refused + len(other)
		mu.Unlock()
		v, err := staleLock(c, leader, "capped")
		return err == nil && v.Waiters+done >= waits
	})
	v := getLock(t, c, leader, "capped")
	mu.Lock()
	defer mu.Unlock()
	if len(other) > 0 {
		t.Fatalf("unexpected answers: %v", other)
	}
	if v.Waiters > limit {
		t.Fatalf("%d waiters queued with the cap at %d (%d refused)", v.Waiters, limit, refused)
	}
	if v.Waiters != limit || refused != waits-limit {
		t.Fatalf("%d waiters queued and %d refused of %d, want %d and %d", v.Waiters, refused, waits, limit, waits-limit)
	}
}
