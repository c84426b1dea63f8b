package shard_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
)

// busy is six clients locking and releasing names through every node in
// turn while a test changes the ranges (splits, moves); post resends what is
// answered 503. Each name's tokens are kept in grant order.
type busy struct {
	t      *testing.T
	stop   chan struct{}
	once   sync.Once
	wg     sync.WaitGroup
	mu     sync.Mutex
	seqs   map[string][]uint64
	rounds atomic.Int64
}

// startBusy starts worker w cycling through names(w), each acquire through
// the next of urls and its release through the one after, and waits until
// they are busy.
func startBusy(t *testing.T, c *testcluster.Cluster, urls []string, names func(w int) []string) *busy {
	b := &busy{t: t, stop: make(chan struct{}), seqs: map[string][]uint64{}}
	t.Cleanup(b.halt)
	for w := 0; w < 6; w++ {
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			mine := names(w)
			for i := 0; ; i++ {
				select {
				case <-b.stop:
					return
				default:
				}
				name := mine[i%len(mine)]
				var a service.AcquireResponse
				code := post(t, c, urls[(w+i)%len(urls)]+"/api/v1/locks/"+name+"/acquire", map[string]any{"client_id": fmt.Sprintf("w%d", w), "ttl_ms": 20000,
					"wait_timeout_ms": 30000, "request_id": fmt.Sprintf("w%d-%d", w, i)}, &a)
				if code != 200 || !a.Acquired {
					t.Errorf("worker %d acquire %s: %d %+v", w, name, code, a)
					return
				}
				b.mu.Lock()
				b.seqs[name] = append(b.seqs[name], a.FencingToken)
				b.mu.Unlock()
				var rel service.ReleaseResponse
				if code := post(t, c, urls[(w+i+1)%len(urls)]+"/api/v1/locks/"+name+"/release", map[string]any{"client_id": fmt.Sprintf("w%d", w),
					"fencing_token": a.FencingToken, "lease_id": a.LeaseID}, &rel); code != 200 {
					t.Errorf("worker %d release %s token %d: %d", w, name, a.FencingToken, code)
					return
				}
				b.rounds.Add(1)
			}
		}()
	}
	b.waitRounds("the clients are busy", 30)
	return b
}

// waitRounds waits until the clients have done n rounds in all.
func (b *busy) waitRounds(what string, n int64) {
	b.t.Helper()
	testutil.Eventually(b.t, 60*time.Second, what, func() error {
		if r := b.rounds.Load(); r < n {
			return fmt.Errorf("%d rounds", r)
		}
		return nil
	})
}

// halt stops the clients (once).
func (b *busy) halt() {
	b.once.Do(func() {
		close(b.stop)
		b.wg.Wait()
	})
}

// checkRising stops the clients and checks every name's tokens rose.
func (b *busy) checkRising() {
	b.t.Helper()
	b.halt()
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := testutil.Rising(b.seqs); err != nil {
		b.t.Fatal(err)
	}
}
