package server_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/raftnode"
	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
)

type errBody struct {
	Acquired *bool `json:"acquired"`
	Error    struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
	Holder *service.Holder `json:"holder"`
}

type acquireAnswer struct {
	service.AcquireResponse
	Error struct {
		Code string `json:"code"`
	} `json:"error"`
}

func acquire(t *testing.T, c *testcluster.Cluster, node, name string, body map[string]any) (int, acquireAnswer) {
	t.Helper()
	var a acquireAnswer
	code, err := c.Do(context.Background(), http.MethodPost, c.URL(node)+"/api/v1/locks/"+name+"/acquire", body, &a)
	if err != nil {
		t.Fatalf("acquire %s on %s: %v", name, node, err)
	}
	return code, a
}

func release(t *testing.T, c *testcluster.Cluster, node, name, client string, a acquireAnswer) int {
	t.Helper()
	var e errBody
	code, err := c.Do(context.Background(), http.MethodPost, c.URL(node)+"/api/v1/locks/"+name+"/release",
		map[string]any{"client_id": client, "fencing_token": a.FencingToken, "lease_id": a.LeaseID}, &e)
	if err != nil {
		t.Fatalf("release: %v", err)
	}
	return code
}

func getLock(t *testing.T, c *testcluster.Cluster, node, name string) service.LockView {
	t.Helper()
	var v service.LockView
	code, err := c.Do(context.Background(), http.MethodGet, c.URL(node)+"/api/v1/locks/"+name, nil, &v)
	if err != nil || code != 200 {
		t.Fatalf("get %s on %s: %d %v", name, node, code, err)
	}
	return v
}

func TestMutualExclusionUnderConcurrentAcquirers(t *testing.T) {
	c := testcluster.New(t, 3)
	nodes := c.IDs()
	const workers, rounds = 8, 5
	var inside atomic.Int32
	var mu sync.Mutex
	var tokens []uint64
	var wg sync.WaitGroup
	// Room for every error a worker can report (one per round, plus the one
	// it stops on): a full channel would block the worker, and wg.Wait with
	// it, so a broken lock would hang the test instead of failing it.
	errs := make(chan error, workers*(rounds+1))
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			client := fmt.Sprintf("worker-%d", w)
			node := nodes[w%len(nodes)] // spread over leader and followers
			for r := 0; r < rounds; r++ {
				code, a := acquire(t, c, node, "hot", map[string]any{"client_id": client, "ttl_ms": 10000, "wait_timeout_ms": 30000})
				if code != 200 || !a.Acquired {
					errs <- fmt.Errorf("%s: acquire answered %d %+v", client, code, a)
					return
				}
				if n := inside.Add(1); n != 1 {
					errs <- fmt.Errorf("%s: %d holders at once", client, n)
				}
				mu.Lock()
				tokens = append(tokens, a.FencingToken)
				mu.Unlock()
				time.Sleep(2 * time.Millisecond)
				inside.Add(-1)
				if code := release(t, c, node, "hot", client, a); code != 200 {
					errs <- fmt.Errorf("%s: release answered %d", client, code)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if len(tokens) != workers*rounds {
		t.Fatalf("got %d grants, want %d", len(tokens), workers*rounds)
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("tokens not strictly increasing in grant order: %v", tokens)
		}
	}
}

// startWaiter sends a blocking acquire and reports its answer on the channel.
func startWaiter(t *testing.T, c *testcluster.Cluster, node, name, client, requestID string) chan acquireAnswer {
	ch := make(chan acquireAnswer, 1)
	go func() {
		var a acquireAnswer
		code, err := c.Do(context.Background(), http.MethodPost, c.URL(node)+"/api/v1/locks/"+name+"/acquire",
			map[string]any{"client_id": client, "ttl_ms": 30000, "wait_timeout_ms": 60000, "request_id": requestID}, &a)
		if err != nil || code != 200 {
			a.Acquired = false
			a.Error.Code = fmt.Sprintf("status %d err %v", code, err)
		}
		ch <- a
	}()
	return ch
}

func expectGrant(t *testing.T, ch chan acquireAnswer, who string, timeout time.Duration) acquireAnswer {
	t.Helper()
	select {
	case a := <-ch:
		if !a.Acquired {
			t.Fatalf("%s: not acquired: %+v", who, a)
		}
		return a
	case <-time.After(timeout):
		t.Fatalf("%s: no grant within %s", who, timeout)
	}
	return acquireAnswer{}
}

func expectNothing(t *testing.T, ch chan acquireAnswer, who string, d time.Duration) {
	t.Helper()
	select {
	case a := <-ch:
		t.Fatalf("%s: answered too early: %+v", who, a)
	case <-time.After(d):
	}
}

func TestFIFOHandOffAndExpiry(t *testing.T) {
	c := testcluster.New(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	code, a := acquire(t, c, leader, "jobs/deploy", map[string]any{"client_id": "a", "ttl_ms": 30000})
	if code != 200 || !a.Acquired {
		t.Fatalf("a: %d %+v", code, a)
	}
	code, held := acquire(t, c, leader, "jobs/deploy", map[string]any{"client_id": "x", "ttl_ms": 30000})
	if code != http.StatusConflict || held.Error.Code != "lock_held" || held.Holder == nil || held.Holder.ClientID != "a" {
		t.Fatalf("second acquire without wait: %d %+v", code, held)
	}
	b := startWaiter(t, c, leader, "jobs/deploy", "b", "b-1")
	testutil.Eventually(t, 5*time.Second, "b queued", func() bool { return getLock(t, c, leader, "jobs/deploy").Waiters == 1 })
	cc := startWaiter(t, c, c.Follower(), "jobs/deploy", "c", "c-1")
	testutil.Eventually(t, 5*time.Second, "c queued", func() bool { return getLock(t, c, leader, "jobs/deploy").Waiters == 2 })
	expectNothing(t, b, "b", 200*time.Millisecond)

	if code := release(t, c, leader, "jobs/deploy", "a", a); code != 200 {
		t.Fatalf("release a: %d", code)
	}
	gb := expectGrant(t, b, "b", 5*time.Second)
	if gb.FencingToken <= a.FencingToken {
		t.Fatalf("b token %d not above a's %d", gb.FencingToken, a.FencingToken)
	}
	expectNothing(t, cc, "c", 200*time.Millisecond)
	// b never renews: its 30 s lease would take long, so renew it down to the
	// minimum TTL and let it lapse; c must then get the lock by itself.
	var rr service.RenewResponse
	code, err := c.Do(context.Background(), http.MethodPost, c.URL(leader)+"/api/v1/locks/jobs/deploy/renew",
		map[string]any{"client_id": "b", "fencing_token": gb.FencingToken, "lease_id": gb.LeaseID, "ttl_ms": 1000}, &rr)
	if err != nil || code != 200 || !rr.Renewed {
		t.Fatalf("renew b: %d %v %+v", code, err, rr)
	}
	start := time.Now()
	gc := expectGrant(t, cc, "c", 10*time.Second)
	if el := time.Since(start); el < 500*time.Millisecond {
		t.Fatalf("c granted after %s: b's 1 s lease expired too early", el)
	}
	if gc.FencingToken <= gb.FencingToken {
		t.Fatalf("c token %d not above b's %d", gc.FencingToken, gb.FencingToken)
	}
	// b's old token is now useless.
	if code := release(t, c, leader, "jobs/deploy", "b", gb); code != http.StatusConflict {
		t.Fatalf("release with expired lease answered %d, want 409", code)
	}
}

func TestLeaderKilledWhileHeldAndWaiting(t *testing.T) {
	c := testcluster.New(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	var followers []string
	for _, id := range c.Running() {
		if id != leader {
			followers = append(followers, id)
		}
	}
	code, a := acquire(t, c, leader, "l2", map[string]any{"client_id": "client1", "ttl_ms": 60000})
	if code != 200 {
		t.Fatalf("client1: %d", code)
	}
	// client2 waits through one follower, client3 through the leader that is
	// about to die; client3 retries with the same request_id, as a client does.
	w2 := startWaiter(t, c, followers[0], "l2", "client2", "c2-req")
	testutil.Eventually(t, 5*time.Second, "client2 queued", func() bool { return getLock(t, c, leader, "l2").Waiters == 1 })
	w3 := startWaiter(t, c, leader, "l2", "client3", "c3-req")
	testutil.Eventually(t, 5*time.Second, "client3 queued", func() bool { return getLock(t, c, leader, "l2").Waiters == 2 })

	c.Kill(leader)
	newLeader := c.WaitLeader(20 * time.Second)
	if newLeader == leader {
		t.Fatalf("leader did not change")
	}
	// client3's connection died with the old leader: it retries elsewhere.
	select {
	case r := <-w3:
		if r.Acquired {
			t.Fatalf("client3 granted while client1 still holds: %+v", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("client3's request to the killed leader did not fail")
	}
	w3 = startWaiter(t, c, newLeader, "l2", "client3", "c3-req")

	v := getLock(t, c, newLeader, "l2")
	if !v.Held || v.Holder.ClientID != "client1" || v.Holder.FencingToken != a.FencingToken || v.Waiters != 2 {
		t.Fatalf("after failover: %+v", v)
	}
	if code := release(t, c, newLeader, "l2", "client1", a); code != 200 {
		t.Fatalf("release client1 after failover: %d", code)
	}
	g2 := expectGrant(t, w2, "client2", 10*time.Second)
	expectNothing(t, w3, "client3", 200*time.Millisecond)
	if code := release(t, c, followers[0], "l2", "client2", g2); code != 200 {
		t.Fatalf("release client2: %d", code)
	}
	g3 := expectGrant(t, w3, "client3", 10*time.Second)
	if !(a.FencingToken < g2.FencingToken && g2.FencingToken < g3.FencingToken) {
		t.Fatalf("tokens not increasing across failover: %d %d %d", a.FencingToken, g2.FencingToken, g3.FencingToken)
	}
	// The killed node comes back from its data dir and catches up.
	c.Start(leader)
	testutil.Eventually(t, 10*time.Second, "restarted node catches up", func() bool {
		var v service.LockView
		code, err := c.Do(context.Background(), http.MethodGet, c.URL(leader)+"/api/v1/locks/l2?stale=true", nil, &v)
		return err == nil && code == 200 && v.Held && v.Holder.ClientID == "client3"
	})
}

func TestFullRestartFromDisk(t *testing.T) {
	c := testcluster.New(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	code, a := acquire(t, c, leader, "keep/me", map[string]any{"client_id": "holder", "ttl_ms": 120000})
	if code != 200 {
		t.Fatalf("acquire: %d", code)
	}
	var sess service.SessionResponse
	if code, err := c.Do(context.Background(), http.MethodPost, c.URL(leader)+"/api/v1/sessions", map[string]any{"client_id": "s", "ttl_ms": 120000}, &sess); err != nil || code != 201 {
		t.Fatalf("create session: %d %v", code, err)
	}
	code, sa := acquire(t, c, leader, "keep/session", map[string]any{"client_id": "s", "session_id": sess.SessionID})
	if code != 200 {
		t.Fatalf("session acquire: %d", code)
	}
	w := startWaiter(t, c, leader, "keep/me", "waiter", "w-1")
	testutil.Eventually(t, 5*time.Second, "waiter queued", func() bool { return getLock(t, c, leader, "keep/me").Waiters == 1 })

	for _, id := range c.IDs() {
		c.Kill(id)
	}
	<-w // its connection is gone
	for _, id := range c.IDs() {
		c.Start(id)
	}
	leader = c.WaitLeader(20 * time.Second)
	v := getLock(t, c, leader, "keep/me")
	if !v.Held || v.Holder.FencingToken != a.FencingToken || v.Waiters != 1 {
		t.Fatalf("after restart keep/me = %+v", v)
	}
	v = getLock(t, c, leader, "keep/session")
	if !v.Held || v.Holder.FencingToken != sa.FencingToken {
		t.Fatalf("after restart keep/session = %+v", v)
	}
	var ka service.SessionResponse
	if code, err := c.Do(context.Background(), http.MethodPost, c.URL(leader)+"/api/v1/sessions/"+sess.SessionID+"/keepalive", nil, &ka); err != nil || code != 200 {
		t.Fatalf("keepalive after restart: %d %v", code, err)
	}
	// The waiter retries with its request_id and keeps its place; a release
	// hands over with a token above everything before the restart.
	w = startWaiter(t, c, leader, "keep/me", "waiter", "w-1")
	if code := release(t, c, leader, "keep/me", "holder", a); code != 200 {
		t.Fatalf("release after restart: %d", code)
	}
	g := expectGrant(t, w, "waiter", 10*time.Second)
	if g.FencingToken <= sa.FencingToken {
		t.Fatalf("token after restart %d not above %d", g.FencingToken, sa.FencingToken)
	}
}

// A lease renewed just before the leader dies must not expire early on the new
// leader (its holder had a full TTL from the renewal's send time), and must not
// live on for ever either.
func TestLeaseSurvivesFailoverForFullTTL(t *testing.T) {
	c := testcluster.New(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	code, a := acquire(t, c, leader, "safety", map[string]any{"client_id": "h", "ttl_ms": 3000})
	if code != 200 {
		t.Fatalf("acquire: %d", code)
	}
	time.Sleep(time.Second)
	sent := time.Now()
	var rr service.RenewResponse
	if code, err := c.Do(context.Background(), http.MethodPost, c.URL(leader)+"/api/v1/locks/safety/renew",
		map[string]any{"client_id": "h", "fencing_token": a.FencingToken, "lease_id": a.LeaseID}, &rr); err != nil || code != 200 {
		t.Fatalf("renew: %d %v", code, err)
	}
	c.Kill(leader)
	newLeader := c.WaitLeader(20 * time.Second)
	// Until sent+TTL (less a margin for this test's own read latency) every
	// committed read must still show the holder.
	for time.Since(sent) < 2700*time.Millisecond {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		var v service.LockView
		code, err := c.Do(ctx, http.MethodGet, c.URL(newLeader)+"/api/v1/locks/safety", nil, &v)
		cancel()
		if err == nil && code == 200 && time.Since(sent) < 2700*time.Millisecond && !v.Held {
			t.Fatalf("lease expired %s after its renewal was sent; TTL is 3 s", time.Since(sent))
		}
		time.Sleep(50 * time.Millisecond)
	}
	// And it does end: within TTL plus a generous failover bound.
	testutil.Eventually(t, 15*time.Second, "lease to expire after failover", func() bool {
		return !getLock(t, c, newLeader, "safety").Held
	})
}

// With a tiny snapshot threshold, a node that was down catches up through an
// installed snapshot, and the whole cluster restarts from snapshot + log tail.
func TestSnapshotInstallAndRestartFromSnapshot(t *testing.T) {
	c := testcluster.New(t, 3)
	c.Tune = func(rc *raftnode.Config) {
		rc.SnapshotThreshold = 32
		rc.TrailingLogs = 8
		rc.SnapshotInterval = 200 * time.Millisecond
	}
	// Restart everyone with the tuning (the data dirs carry over).
	for _, id := range c.IDs() {
		c.Kill(id)
	}
	for _, id := range c.IDs() {
		c.Start(id)
	}
	leader := c.WaitLeader(20 * time.Second)
	var lagging string
	for _, id := range c.Running() {
		if id != leader {
			lagging = id
			break
		}
	}
	c.Kill(lagging)
	var last acquireAnswer
	for i := 0; i < 60; i++ {
		name := fmt.Sprintf("snap/%d", i%20)
		code, a := acquire(t, c, leader, name, map[string]any{"client_id": fmt.Sprintf("c%d", i), "ttl_ms": 120000})
		if code == 200 {
			last = a
			if i%3 == 0 {
				release(t, c, leader, name, fmt.Sprintf("c%d", i), a)
			}
		}
	}
	if err := c.Server(leader).Node.Raft().Snapshot().Error(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	want := getLock(t, c, leader, "snap/19")
	c.Start(lagging)
	testutil.Eventually(t, 15*time.Second, "lagging node installs the snapshot", func() bool {
		var v service.LockView
		code, err := c.Do(context.Background(), http.MethodGet, c.URL(lagging)+"/api/v1/locks/snap/19?stale=true", nil, &v)
		return err == nil && code == 200 && v.Held == want.Held && (v.Holder == nil) == (want.Holder == nil) &&
			(v.Holder == nil || v.Holder.FencingToken == want.Holder.FencingToken)
	})
	for _, id := range c.IDs() {
		c.Kill(id)
	}
	for _, id := range c.IDs() {
		c.Start(id)
	}
	leader = c.WaitLeader(20 * time.Second)
	got := getLock(t, c, leader, "snap/19")
	if got.Held != want.Held || (got.Holder != nil && got.Holder.FencingToken != want.Holder.FencingToken) {
		t.Fatalf("after restart from snapshot: %+v, want %+v", got, want)
	}
	code, a := acquire(t, c, leader, "snap/new", map[string]any{"client_id": "fresh", "ttl_ms": 5000})
	if code != 200 || a.FencingToken <= last.FencingToken {
		t.Fatalf("token after snapshot restart %d (code %d), want > %d", a.FencingToken, code, last.FencingToken)
	}
}

// Every node reports its newest state checkpoint on GET /cluster, and nodes
// that applied the same log report the same whole-state digest for it.
func TestNodesReportTheSameCheckpointDigest(t *testing.T) {
	c := testcluster.New(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	info := func(node string) service.ClusterInfo {
		var ci service.ClusterInfo
		code, err := c.Do(context.Background(), http.MethodGet, c.URL(node)+"/api/v1/cluster", nil, &ci)
		if err != nil || code != 200 {
			t.Fatalf("GET /cluster on %s: %d %v", node, code, err)
		}
		return ci
	}
	// Enough writes for a checkpoint (every 256 indexes), on distinct locks
	// and clients so the state is not trivial.
	for i := 0; info(leader).CheckpointIndex == 0; i++ {
		if i > 2000 {
			t.Fatal("no checkpoint after 2,000 writes")
		}
		if code, _ := acquire(t, c, leader, fmt.Sprintf("cp/%d", i%50), map[string]any{"client_id": fmt.Sprintf("c%d", i%7), "ttl_ms": 60000}); code != 200 && code != 409 {
			t.Fatalf("acquire: %d", code)
		}
	}
	want := info(leader)
	testutil.Eventually(t, 10*time.Second, "every node at the leader's checkpoint", func() bool {
		for _, id := range c.IDs() {
			if info(id).CheckpointIndex < want.CheckpointIndex {
				return false
			}
		}
		return true
	})
	want = info(leader)
	for _, id := range c.IDs() {
		got := info(id)
		if got.CheckpointIndex == want.CheckpointIndex && got.CheckpointDigest != want.CheckpointDigest {
			t.Fatalf("%s: checkpoint %d digest %s, leader %s", id, got.CheckpointIndex, got.CheckpointDigest, want.CheckpointDigest)
		}
		if len(got.CheckpointDigest) != 16 {
			t.Fatalf("%s: digest %q", id, got.CheckpointDigest)
		}
	}
}
