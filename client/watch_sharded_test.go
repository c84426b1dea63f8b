package client_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock/client"
	"github.com/dlock/dlock/internal/shard"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
)

// startSharded is a real 3-node cluster with the default 4 shards (etcd
// engine) and its endpoints.
func startSharded(t *testing.T) *cluster {
	t.Helper()
	m, err := shard.NewMap(shard.DefaultBounds(4))
	if err != nil {
		t.Fatal(err)
	}
	tc := testcluster.NewWith(t, 3, testcluster.Options{Shards: &m})
	c := &cluster{Cluster: tc, t: t}
	for _, id := range tc.IDs() {
		c.endpoints = append(c.endpoints, tc.URL(id))
	}
	return c
}

// grantNames fall in every range, and in the range a split at "q" moves.
var grantNames = []string{"alpha/a", "hotel/b", "oscar/c", "romeo/d", "sierra/e", "tango/f"}

// grants locks and releases names in every range (and in the range a split
// at "q" moves) until stop, and returns every acknowledged grant.
func grants(t *testing.T, cl *client.Client, stop <-chan struct{}) func() []string {
	var mu sync.Mutex
	var got []string
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; ; i += 3 {
				select {
				case <-stop:
					return
				default:
				}
				name := grantNames[i%len(grantNames)]
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				g, err := cl.Acquire(ctx, name, client.AcquireOptions{TTL: 10 * time.Second, Wait: 20 * time.Second})
				if err == nil {
					mu.Lock()
					got = append(got, fmt.Sprintf("%s#%d", name, g.FencingToken))
					mu.Unlock()
					err = cl.Release(ctx, name, g.FencingToken, g.LeaseID)
					if errors.Is(err, client.ErrNotHolder) {
						err = nil // a retried release the first try did
					}
				}
				cancel()
				if err != nil && !errors.Is(err, client.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("%s: %v", name, err)
					return
				}
			}
		}()
	}
	return func() []string {
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), got...)
	}
}

// A merged watch over every shard, from now, through node kills (each
// breaks the stream, which resumes on another node from its per-shard
// place) and a split of a busy range: every acknowledged grant is seen
// exactly once, every event carries its shard and the place, and the place
// gains the new shard. Started later from a listed place, WatchRevisions
// sees the same grants after it.
func TestWatchShardedResumesFromRevisions(t *testing.T) {
	c := startSharded(t)
	cl := c.client("sharded-watch")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	_, listed, err := cl.ListWithRevisions(ctx, "")
	if err != nil || len(listed) != 4 {
		t.Fatalf("ListWithRevisions: %v %v", listed, err)
	}
	type seen struct {
		counts map[string]int
		last   map[int]uint64
		errs   []error
	}
	var mu sync.Mutex
	follow := func(evs func(func(client.WatchEvent, error) bool)) *seen {
		s := &seen{counts: map[string]int{}}
		go func() {
			for ev, err := range evs {
				mu.Lock()
				if err != nil {
					s.errs = append(s.errs, err)
					mu.Unlock()
					return
				}
				if ev.Shard == nil || ev.Revisions[*ev.Shard] != ev.Revision {
					s.errs = append(s.errs, fmt.Errorf("an event without its shard or place: %+v", ev))
				}
				if ev.Type == "acquired" {
					s.counts[fmt.Sprintf("%s#%d", ev.Name, ev.FencingToken)]++
				}
				s.last = ev.Revisions
				mu.Unlock()
			}
		}()
		return s
	}
	live := follow(cl.Watch(ctx, "", 0))
	fromList := follow(cl.WatchRevisions(ctx, "", client.NextRevisions(listed)))

	// "From now" is when each shard's part of the stream opens, which the
	// iterator does in the background: wait until the live watch sees a
	// grant in every range before counting on it.
	locker := c.client("sharded-locker")
	probed := map[string]time.Time{}
	testutil.Eventually(t, 60*time.Second, "the live watch is open on every shard", func() error {
		for _, name := range grantNames {
			probe := name + "-probe"
			mu.Lock()
			seen := 0
			for g, n := range live.counts {
				if strings.HasPrefix(g, probe+"#") {
					seen += n
				}
			}
			mu.Unlock()
			if seen > 0 {
				continue
			}
			if time.Since(probed[name]) > time.Second {
				pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
				g, err := locker.Acquire(pctx, probe, client.AcquireOptions{TTL: 10 * time.Second})
				if err == nil {
					err = locker.Release(pctx, probe, g.FencingToken, g.LeaseID)
				}
				pcancel()
				if err != nil {
					return err
				}
				probed[name] = time.Now()
			}
			return fmt.Errorf("the live watch has not seen %s", probe)
		}
		return nil
	})

	stop := make(chan struct{})
	wait := grants(t, locker, stop)
	// Break every node's streams in turn; split [n, t) at q in between.
	for i, id := range c.IDs() {
		c.Kill(id)
		if i == 1 {
			testutil.Eventually(t, 60*time.Second, "the split at q", func() error {
				sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
				defer scancel()
				_, err := c.client("splitter").SplitShard(sctx, "q")
				return err
			})
		}
		time.Sleep(time.Second) // grants go on while the node is down
		c.Start(id)
	}
	close(stop)
	want := wait()
	if len(want) < 20 {
		t.Fatalf("only %d grants", len(want))
	}
	for what, s := range map[string]*seen{"the watch from now": live, "the watch from the listed place": fromList} {
		testutil.Eventually(t, 60*time.Second, what+" sees every grant", func() error {
			mu.Lock()
			defer mu.Unlock()
			if len(s.errs) > 0 {
				t.Fatalf("%s: %v", what, s.errs)
			}
			for _, g := range want {
				if s.counts[g] == 0 {
					return fmt.Errorf("%s has not seen %s", what, g)
				}
			}
			return nil
		})
		mu.Lock()
		for g, n := range s.counts {
			if n > 1 {
				t.Errorf("%s saw %s %d times", what, g, n)
			}
		}
		if _, ok := s.last[4]; !ok || len(s.last) != 5 {
			t.Errorf("%s: the place %v lacks the split-off shard 4", what, s.last)
		}
		mu.Unlock()
	}
	// A revision means nothing across shards: Watch from one is refused.
	for _, err := range cl.Watch(ctx, "", 5) {
		if !errors.Is(err, client.ErrInvalidArgument) {
			t.Fatalf("Watch from revision 5 over every shard: %v, want ErrInvalidArgument", err)
		}
		break
	}
}
