package e2e

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/testutil"
)

// busy is four clients locking and releasing names through every node while
// an operator changes the ranges (the split and move stories). A call
// answered 503 — or, where the story kills nodes, not at all — is resent
// with the same body and so the same request_id, as a client would; any
// other failure fails the test. Each name's tokens are kept in grant order.
type busy struct {
	t        *testing.T
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	rounds   atomic.Int64
	retried  atomic.Int64
	failures chan string
	mu       sync.Mutex
	seqs     map[string][]uint64
	stopped  bool
	// unanswered: resend calls that got no answer too (nodes are killed).
	unanswered bool
}

// startBusy starts worker w cycling through names(w), each call through the
// next of urls, with leases of ttlMs.
func startBusy(t *testing.T, urls []string, ttlMs int, unanswered bool, names func(w int) []string) *busy {
	ctx, cancel := context.WithCancel(context.Background())
	b := &busy{t: t, cancel: cancel, failures: make(chan string, 16), seqs: map[string][]uint64{}, unanswered: unanswered}
	t.Cleanup(b.stop)
	for w := 0; w < 4; w++ {
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			b.work(ctx, w, urls, ttlMs, names(w))
		}()
	}
	return b
}

func (b *busy) work(ctx context.Context, w int, urls []string, ttlMs int, names []string) {
	client := fmt.Sprintf("w%d", w)
	for i := 0; ctx.Err() == nil; i++ {
		name := names[i%len(names)]
		r, err := b.try(ctx, http.MethodPost, urls[(w+i)%len(urls)]+"/api/v1/locks/"+name+"/acquire", map[string]any{"client_id": client,
			"ttl_ms": ttlMs, "wait_timeout_ms": 30000, "request_id": fmt.Sprintf("w%d-%d", w, i)})
		if ctx.Err() != nil {
			return
		}
		var a acquireAnswer
		if err != nil || r.Status != http.StatusOK || r.decode(&a) != nil || !a.Acquired {
			b.failures <- fmt.Sprintf("worker %d acquire %s: %v %v", w, name, r, err)
			return
		}
		b.mu.Lock()
		b.seqs[name] = append(b.seqs[name], a.FencingToken)
		b.mu.Unlock()
		// With a request_id: a release resent after its answer was lost
		// with a killed node is answered from the dedup table, not refused
		// as not_holder.
		r, err = b.try(ctx, http.MethodPost, urls[(w+i+1)%len(urls)]+"/api/v1/locks/"+name+"/release",
			map[string]any{"client_id": client, "fencing_token": a.FencingToken, "lease_id": a.LeaseID,
				"request_id": fmt.Sprintf("r%d-%d", w, i)})
		if ctx.Err() != nil {
			return
		}
		if err != nil || r.Status != http.StatusOK {
			b.failures <- fmt.Sprintf("worker %d release %s: %v %v", w, name, r, err)
			return
		}
		b.rounds.Add(1)
	}
}

// try sends one request until it is answered anything but a 503.
func (b *busy) try(ctx context.Context, method, url string, body any) (*response, error) {
	for {
		r, err := callCtx(ctx, method, url, body)
		if (err != nil && !b.unanswered) || (err == nil && r.Status != http.StatusServiceUnavailable) {
			return r, err
		}
		b.retried.Add(1)
		select {
		case <-ctx.Done():
			return r, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// waitRounds waits until the clients have done n rounds in all, failing at
// once on a client's failure.
func (b *busy) waitRounds(what string, n int64) {
	b.t.Helper()
	testutil.Eventually(b.t, 60*time.Second*slow, what, func() (bool, string) {
		select {
		case f := <-b.failures:
			b.t.Fatal(f)
		default:
		}
		return b.rounds.Load() >= n, fmt.Sprint(b.rounds.Load(), " rounds")
	})
}

// stop ends the clients (once) and fails on a failure they left behind.
func (b *busy) stop() {
	if b.stopped {
		return
	}
	b.stopped = true
	b.cancel()
	b.wg.Wait()
	select {
	case f := <-b.failures:
		b.t.Error(f)
	default:
	}
}

// checkRising stops the clients and checks every name's tokens rose.
func (b *busy) checkRising() {
	b.t.Helper()
	b.stop()
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := testutil.Rising(b.seqs); err != nil {
		b.t.Fatal(err)
	}
}
