package server_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
)

// lockLoop keeps clients locking one lock while the cluster changes under
// them, checking mutual exclusion and increasing tokens; 503s are retried as a
// client would.
type lockLoop struct {
	stop     chan struct{}
	wg       sync.WaitGroup
	grants   atomic.Int64
	mu       sync.Mutex
	last     uint64
	failure  error
	haltOnce sync.Once
}

func startLockLoop(t *testing.T, c *testcluster.Cluster, workers int) *lockLoop {
	l := &lockLoop{stop: make(chan struct{})}
	// A test that fails before finish still stops the workers before the
	// cluster goes (cleanups run last-registered first).
	t.Cleanup(l.halt)
	var inside atomic.Int32
	for w := 0; w < workers; w++ {
		l.wg.Add(1)
		go func(w int) {
			defer l.wg.Done()
			client := fmt.Sprintf("loop-%d", w)
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				nodes := c.Running()
				if len(nodes) == 0 {
					time.Sleep(20 * time.Millisecond)
					continue // the cluster is between a kill and a start, or stopped
				}
				node := nodes[i%len(nodes)]
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				var a acquireAnswer
				code, err := c.Do(ctx, http.MethodPost, c.URL(node)+"/api/v1/locks/churn/acquire",
					map[string]any{"client_id": client, "ttl_ms": 5000, "wait_timeout_ms": 5000, "request_id": fmt.Sprintf("%s-%d", client, i)}, &a)
				cancel()
				if err != nil || code != 200 {
					time.Sleep(20 * time.Millisecond)
					continue // node going away, election, or timeout: try again
				}
				if inside.Add(1) != 1 {
					l.fail(fmt.Errorf("two holders of churn at once"))
				}
				l.mu.Lock()
				if a.FencingToken <= l.last {
					l.failure = fmt.Errorf("token %d after %d", a.FencingToken, l.last)
				}
				l.last = a.FencingToken
				l.mu.Unlock()
				l.grants.Add(1)
				inside.Add(-1)
				for try := 0; try < 50; try++ {
					running := c.Running()
					if len(running) == 0 {
						time.Sleep(20 * time.Millisecond)
						continue
					}
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					code, err := c.Do(ctx, http.MethodPost, c.URL(running[try%len(running)])+"/api/v1/locks/churn/release",
						map[string]any{"client_id": client, "fencing_token": a.FencingToken, "lease_id": a.LeaseID, "request_id": fmt.Sprintf("%s-%d-r", client, i)}, nil)
					cancel()
					if err == nil && (code == 200 || code == 409) {
						break
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
		}(w)
	}
	return l
}

func (l *lockLoop) fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.failure == nil {
		l.failure = err
	}
}

// halt stops the workers and waits for them; once is enough.
func (l *lockLoop) halt() {
	l.haltOnce.Do(func() { close(l.stop) })
	l.wg.Wait()
}

func (l *lockLoop) finish(t *testing.T) {
	t.Helper()
	l.halt()
	if l.failure != nil {
		t.Fatal(l.failure)
	}
	if l.grants.Load() == 0 {
		t.Fatal("the lock loop never got the lock")
	}
}

func clusterInfo(t *testing.T, c *testcluster.Cluster, node string) service.ClusterInfo {
	t.Helper()
	var ci service.ClusterInfo
	if code, err := c.Do(context.Background(), http.MethodGet, c.URL(node)+"/api/v1/cluster", nil, &ci); err != nil || code != 200 {
		t.Fatalf("cluster on %s: %d %v", node, code, err)
	}
	return ci
}

func voters(ci service.ClusterInfo) int {
	n := 0
	for _, m := range ci.Members {
		if m.Suffrage == "voter" {
			n++
		}
	}
	return n
}

func TestGrowShrinkRemoveLeaderAndTransferUnderLoad(t *testing.T) {
	c := testcluster.New(t, 3)
	loop := startLockLoop(t, c, 3)

	// Grow 3 → 5: new nodes join as non-voters and are promoted once caught up.
	n4, n5 := c.Join(), c.Join()
	leader := c.WaitLeader(10 * time.Second)
	testutil.Eventually(t, 30*time.Second, "5 voters", func() bool { return voters(clusterInfo(t, c, leader)) == 5 })
	testutil.Eventually(t, 10*time.Second, "new members registered their API", func() bool {
		for _, m := range clusterInfo(t, c, leader).Members {
			if m.APIAddr == "" {
				return false
			}
		}
		return true
	})
	// The new node serves reads from its own caught-up state.
	testutil.Eventually(t, 10*time.Second, "n5 caught up", func() bool {
		var v service.LockView
		code, err := c.Do(context.Background(), http.MethodGet, c.URL(n5)+"/api/v1/locks/churn", nil, &v)
		return err == nil && code == 200
	})

	// Transfer leadership to n4 under load.
	var ci service.ClusterInfo
	if code, err := c.Do(context.Background(), http.MethodPost, c.URL(c.Follower())+"/api/v1/cluster/leadership-transfer", map[string]any{"id": n4}, &ci); err != nil || code != 200 {
		t.Fatalf("transfer: %d %v", code, err)
	}
	testutil.Eventually(t, 10*time.Second, "n4 leads", func() bool { return c.WaitLeader(10*time.Second) == n4 })

	// Shrink 5 → 3, removing the leader itself among others.
	for _, id := range []string{n4, "n1"} {
		from := c.Follower()
		if code, err := c.Do(context.Background(), http.MethodDelete, c.URL(from)+"/api/v1/cluster/members/"+id, nil, &ci); err != nil || code != 200 {
			t.Fatalf("remove %s via %s: %d %v", id, from, code, err)
		}
		c.Kill(id)
		testutil.Eventually(t, 20*time.Second, "cluster without "+id, func() bool {
			l := c.WaitLeader(20 * time.Second)
			ci := clusterInfo(t, c, l)
			for _, m := range ci.Members {
				if m.ID == id {
					return false
				}
			}
			return true
		})
	}
	leader = c.WaitLeader(20 * time.Second)
	if got := voters(clusterInfo(t, c, leader)); got != 3 {
		t.Fatalf("voters after shrink: %d", got)
	}
	// With n2 down, removing another voter would leave one reachable voter of
	// two: no quorum, so it is refused.
	c.Kill("n2")
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	code, err := c.Do(context.Background(), http.MethodDelete, c.URL(c.WaitLeader(20*time.Second))+"/api/v1/cluster/members/n3", nil, &e)
	if err != nil || code != 400 || e.Error.Code != "invalid_argument" {
		t.Fatalf("removal that loses quorum: %d %v %+v", code, err, e)
	}
	c.Start("n2")
	loop.finish(t)
}

// An alias of a member's raft address (localhost for 127.0.0.1), and an
// address that is not host:port, are refused over HTTP with 400
// invalid_argument, through the leader and a follower, and the members stay
// as they were: the alias once became a voter, one process with two votes.
func TestAddMemberRefusesAliasAndBadAddress(t *testing.T) {
	c := testcluster.New(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	_, port, err := net.SplitHostPort(c.RaftAddr("n1"))
	if err != nil {
		t.Fatal(err)
	}
	for _, body := range []map[string]any{
		{"id": "n9", "raft_addr": "localhost:" + port},
		{"id": "n9", "raft_addr": "not an addr"},
	} {
		for _, via := range []string{leader, c.Follower()} {
			var e struct {
				Error struct{ Code, Message string } `json:"error"`
			}
			code, err := c.Do(context.Background(), http.MethodPost, c.URL(via)+"/api/v1/cluster/members", body, &e)
			if err != nil || code != 400 || e.Error.Code != "invalid_argument" {
				t.Fatalf("add %v via %s: %d %v %+v; want 400 invalid_argument", body, via, code, err, e)
			}
			t.Logf("add %v via %s: %s", body, via, e.Error.Message)
		}
	}
	if ci := clusterInfo(t, c, c.WaitLeader(10*time.Second)); len(ci.Members) != 3 || voters(ci) != 3 {
		t.Fatalf("members after the refused adds: %+v", ci.Members)
	}
}
