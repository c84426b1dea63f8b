package bench

import (
	"context"
	"fmt"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/testcluster"
)

// BenchmarkInProcessUncontended runs the uncontended workload (acquire with
// ttl_ms + release over HTTP to the leader) against a real 3-node cluster in
// this process, to profile the whole path under load:
//
//	go test -run '^$' -bench InProcessUncontended/workers=64 -benchtime 20000x \
//	    -cpuprofile cpu.out ./internal/bench
//	go tool pprof -top -tagignore role=client internal/bench/bench.test cpu.out   # servers only
//
// The load generator's goroutines (and the HTTP client connections they
// dial) carry the pprof label role=client, so the servers' share of the
// profile can be told apart. All three nodes share the process.
func BenchmarkInProcessUncontended(b *testing.B) {
	c := testcluster.New(b, 3)
	var eps []string
	for _, id := range c.IDs() {
		eps = append(eps, c.URL(id))
	}
	for _, workers := range []int{1, 64} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			cl := newDlockClient(eps, workers+16)
			if _, _, err := cl.waitLeader(context.Background(), 10*time.Second); err != nil {
				b.Fatal(err)
			}
			id := runID()
			var left atomic.Int64
			left.Store(int64(b.N))
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			b.ResetTimer()
			for w := range workers {
				wg.Add(1)
				go pprof.Do(context.Background(), pprof.Labels("role", "client"), func(ctx context.Context) {
					defer wg.Done()
					name := fmt.Sprintf("bench/%s/p/w%d", id, w)
					cid := fmt.Sprintf("bench-%s-w%d", id, w)
					for left.Add(-1) >= 0 {
						a, err := cl.acquire(ctx, name, acquireReq{ClientID: cid, TTLms: 10_000})
						if err == nil {
							err = cl.release(ctx, name, holderReq{ClientID: cid, FencingToken: a.FencingToken, LeaseID: a.LeaseID})
						}
						if err != nil {
							errs <- err
							return
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			select {
			case err := <-errs:
				b.Fatal(err)
			default:
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
		})
	}
}
