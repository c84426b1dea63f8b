package e2e

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/loopback"
	"github.com/dlock/dlock/internal/testutil"
)

// ---------------------------------------------------------------------------
// A lock-loop workload with a safety check, for tests that change the cluster
// while clients lock.

// endpointSet is the list of API URLs the clients spread their requests over;
// the test takes a node out of it before removing the node.
type endpointSet struct {
	mu   sync.Mutex
	urls []string
}

func (e *endpointSet) add(u string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !slices.Contains(e.urls, u) {
		e.urls = append(e.urls, u)
	}
}

func (e *endpointSet) remove(u string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.urls = slices.DeleteFunc(e.urls, func(s string) bool { return s == u })
}

func (e *endpointSet) pick(i int) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.urls[i%len(e.urls)]
}

// lockChecker records the grants the clients saw acknowledged. A client
// marks itself the holder when its acquire is acknowledged and clears the
// mark before it sends its release, so a second holder marked while the first
// is still marked means two clients held the lock at once by their own
// acknowledgements. Tokens must increase from one grant to the next.
type lockChecker struct {
	mu         sync.Mutex
	holder     string
	lastToken  uint64
	grants     int
	retries    int // requests retried after a 5xx or a connection error
	violations []string
	errs       []string
}

func (c *lockChecker) granted(client string, token uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.holder != "" {
		c.violations = append(c.violations, fmt.Sprintf("%s was granted token %d while %s still held the lock", client, token, c.holder))
	}
	if token <= c.lastToken {
		c.violations = append(c.violations, fmt.Sprintf("%s was granted token %d after token %d", client, token, c.lastToken))
	}
	c.holder, c.lastToken = client, max(c.lastToken, token)
	c.grants++
}

func (c *lockChecker) released(client string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.holder == client {
		c.holder = ""
	}
}

func (c *lockChecker) errorf(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.errs) < 20 {
		c.errs = append(c.errs, fmt.Sprintf(format, args...))
	}
}

func (c *lockChecker) retried() {
	c.mu.Lock()
	c.retries++
	c.mu.Unlock()
}

func (c *lockChecker) stats() (grants, retries int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.grants, c.retries
}

// waitProgress waits until the clients have had n more grants.
func (c *lockChecker) waitProgress(t *testing.T, step string, n int, within time.Duration) {
	t.Helper()
	start := time.Now()
	from, _ := c.stats()
	testutil.Eventually(t, within, fmt.Sprintf("%d more grants after %s", n, step), func() (bool, string) {
		g, r := c.stats()
		return g >= from+n, fmt.Sprintf("%d grants (%d before), %d retries", g, from, r)
	})
	g, r := c.stats()
	t.Logf("%s: %d more grants within %s (%d grants, %d retries in all)", step, n, time.Since(start).Round(time.Millisecond), g, r)
}

// lockClient keeps acquiring and releasing one lock until ctx is done. Every
// acquire and release carries a request_id and is retried with the same body
// on another node after a 5xx or a connection error, until it has a definite
// answer, so no grant is ever abandoned (ctx only stops new acquires).
func lockClient(ctx context.Context, id, lock string, eps *endpointSet, chk *lockChecker) {
	next := rand.IntN(1000)
	// send retries body until an answer that is not a 5xx; ok is false if
	// stop ended the attempts first.
	send := func(stop context.Context, op string, body map[string]any) (*response, bool) {
		for {
			if stop.Err() != nil {
				return nil, false
			}
			u := eps.pick(next) + "/api/v1/locks/" + lock + "/" + op
			rctx, cancel := context.WithTimeout(stop, requestTimeout)
			r, err := callCtx(rctx, http.MethodPost, u, body)
			cancel()
			if err == nil && r.Status < 500 {
				return r, true
			}
			chk.retried()
			next++
			select {
			case <-stop.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	for n := 1; ctx.Err() == nil; n++ {
		// An acquire, once sent, is seen through to a definite answer even
		// if ctx ends meanwhile (an abandoned acquire may still be granted
		// and would hold the lock until its TTL); it is bounded on its own.
		actx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		r, ok := send(actx, "acquire", map[string]any{"client_id": id, "ttl_ms": 15000, "request_id": fmt.Sprintf("%s-acquire-%d", id, n)})
		cancel()
		if !ok {
			chk.errorf("%s acquire %d: no answer within 60 s", id, n)
			return
		}
		var a acquireAnswer
		if err := r.decode(&a); err != nil {
			chk.errorf("%s acquire: %v", id, err)
			return
		}
		switch {
		case r.Status == http.StatusOK && a.Acquired:
		case r.Status == http.StatusConflict && a.Error != nil && a.Error.Code == "lock_held":
			if a.Holder != nil && a.Holder.ClientID == id {
				// Only possible if an earlier acquire of ours, retried with
				// its request_id, was granted but answered otherwise.
				chk.errorf("%s acquire %d: lock_held by ourselves (token %d): a grant we were never told of", id, n, a.Holder.FencingToken)
			}
			time.Sleep(time.Duration(2+rand.IntN(5)) * time.Millisecond)
			continue
		default:
			chk.errorf("%s acquire %d: unexpected answer %s", id, n, r)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		chk.granted(id, a.FencingToken)
		time.Sleep(time.Duration(1+rand.IntN(3)) * time.Millisecond)
		chk.released(id)
		// Likewise the release, so no lease is left behind.
		rctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		r, ok = send(rctx, "release", map[string]any{"client_id": id, "fencing_token": a.FencingToken, "lease_id": a.LeaseID,
			"request_id": fmt.Sprintf("%s-release-%d", id, n)})
		cancel()
		if !ok {
			chk.errorf("%s release of token %d: no answer within 60 s", id, a.FencingToken)
			return
		}
		if r.Status != http.StatusOK {
			chk.errorf("%s release of token %d: %s", id, a.FencingToken, r)
		}
	}
}

// startLockClients runs n lockClients; the returned stop ends them and waits
// for them (bounded).
func startLockClients(t *testing.T, n int, lock string, eps *endpointSet, chk *lockChecker) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lockClient(ctx, fmt.Sprintf("client%d", i+1), lock, eps, chk)
		}()
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(90 * time.Second):
				t.Errorf("lock clients still running 90 s after they were told to stop")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func (c *lockChecker) check(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	t.Logf("lock clients: %d grants, %d retried requests, last token %d", c.grants, c.retries, c.lastToken)
	for _, v := range c.violations {
		t.Errorf("SAFETY: %s", v)
	}
	for _, e := range c.errs {
		t.Errorf("lock client: %s", e)
	}
}

// ---------------------------------------------------------------------------
// Membership helpers.

// getCluster reads GET /api/v1/cluster from one node.
func getCluster(url string) (clusterInfo, error) {
	var ci clusterInfo
	r, err := call(http.MethodGet, url+"/api/v1/cluster", nil)
	if err != nil {
		return ci, err
	}
	if r.Status != http.StatusOK {
		return ci, fmt.Errorf("GET /api/v1/cluster: %s", r)
	}
	return ci, r.decode(&ci)
}

// waitVoters waits until the leader, as named by the nodes in via, lists
// exactly the voters want, every one with an API address, and no other member.
func (c *procCluster) waitVoters(within time.Duration, via []string, want ...string) {
	c.t.Helper()
	want = slices.Sorted(slices.Values(want))
	testutil.Eventually(c.t, within, fmt.Sprintf("the leader to list voters %v with API addresses", want), func() (bool, string) {
		var leader string
		for _, id := range via {
			if ci, err := getCluster(c.url(id)); err == nil && ci.LeaderID != "" {
				leader = ci.LeaderID
				break
			}
		}
		if leader == "" || !slices.Contains(via, leader) {
			return false, fmt.Sprintf("leader %q", leader)
		}
		ci, err := getCluster(c.url(leader))
		if err != nil {
			return false, err.Error()
		}
		var got, desc []string
		ok := ci.LeaderID == leader
		for _, m := range ci.Members {
			desc = append(desc, fmt.Sprintf("%s(%s api=%q)", m.ID, m.Suffrage, m.APIAddr))
			if m.Suffrage == "voter" && m.APIAddr != "" {
				got = append(got, m.ID)
			} else {
				ok = false
			}
		}
		slices.Sort(got)
		return ok && slices.Equal(got, want), "leader " + leader + ": " + strings.Join(desc, " ")
	})
}

// cli runs the dlock CLI with a bound and fails the test unless it exits 0.
func (c *procCluster) cli(args ...string) string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start := time.Now()
	out, err := exec.CommandContext(ctx, c.bin, args...).CombinedOutput()
	if err != nil {
		c.t.Fatalf("dlock %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	c.t.Logf("dlock %s (%s): %s", strings.Join(args, " "), time.Since(start).Round(time.Millisecond), strings.TrimSpace(string(out)))
	return string(out)
}

func (c *procCluster) endpointsFlag(ids ...string) string {
	var urls []string
	for _, id := range ids {
		urls = append(urls, c.url(id))
	}
	return strings.Join(urls, ",")
}

// join starts new nodes with --join through the given member's API (no
// --initial-cluster) and the cluster's other flags (--shards), in the
// cluster's directory so clean-up stops them.
func (c *procCluster) join(through string, ids ...string) {
	c.t.Helper()
	dir := filepath.Dir(c.nodes[0].dataDir)
	offsets := make([]int, 0, 2*len(ids))
	for i := range ids {
		offsets = append(offsets, 10*i, 10*i+1)
	}
	base := pickBasePort(c.t, offsets...)
	for i, id := range ids {
		nd := &node{
			id:       id,
			apiAddr:  fmt.Sprintf("127.0.0.1:%d", base+10*i),
			raftAddr: fmt.Sprintf("127.0.0.1:%d", base+10*i+1),
			dataDir:  filepath.Join(dir, id),
			logPath:  filepath.Join(dir, id+".log"),
		}
		c.nodes = append(c.nodes, nd)
		args := []string{"serve", "--id", nd.id, "--data-dir", nd.dataDir,
			"--api-addr", nd.apiAddr, "--raft-addr", nd.raftAddr, "--log-level", "warn", "--join", c.url(through)}
		nd.p = launch(c.t, nd.id, nd.logPath, nil, c.bin, append(args, c.extra...)...)
	}
}

// sigterm stops one node with SIGTERM and fails the test unless it exits 0 in time.
func (c *procCluster) sigterm(id string) {
	c.t.Helper()
	nd := c.node(id)
	took, killed := nd.p.stop(syscall.SIGTERM)
	switch {
	case killed:
		c.t.Errorf("%s did not exit within %s of SIGTERM", id, stopTimeout)
	case nd.p.ExitCode() != 0:
		c.t.Errorf("%s exited with %v after SIGTERM, want exit status 0", id, nd.p.WaitErr())
	default:
		c.t.Logf("%s exited 0, %s after SIGTERM", id, took.Round(time.Millisecond))
	}
}

// TestMembershipWithRealProcesses grows a cluster of `dlock serve` processes
// from 3 to 5 with --join, moves leadership with `dlock members
// transfer-leadership`, and shrinks it back to 3 with `dlock members remove`,
// the leader first, while clients keep taking and giving back one lock: no two
// clients ever hold it at once, tokens increase, and every step lets the
// clients go on.
func TestMembershipWithRealProcesses(t *testing.T) {
	c := startCluster(t, 3)
	eps := &endpointSet{}
	for _, id := range c.ids() {
		eps.add(c.url(id))
	}
	chk := &lockChecker{}
	stop := startLockClients(t, 3, "membership", eps, chk)
	chk.waitProgress(t, "start", 20, 30*time.Second*slow)

	// Grow 3 -> 5.
	c.join("n1", "n4", "n5")
	c.waitReady(30*time.Second*slow, "n4", "n5")
	c.waitVoters(30*time.Second*slow, c.ids(), "n1", "n2", "n3", "n4", "n5")
	eps.add(c.url("n4"))
	eps.add(c.url("n5"))
	chk.waitProgress(t, "growing to 5", 20, 30*time.Second*slow)

	// Hand leadership to a node that joined, under load.
	c.cli("members", "transfer-leadership", "n4", "--endpoints", c.endpointsFlag("n2", "n3", "n5"))
	testutil.Eventually(t, 15*time.Second*slow, "every node to name n4 leader", func() (bool, string) {
		var seen []string
		for _, id := range c.ids() {
			ci, err := getCluster(c.url(id))
			if err != nil {
				return false, id + ": " + err.Error()
			}
			seen = append(seen, id+"->"+ci.LeaderID)
			if ci.LeaderID != "n4" {
				return false, strings.Join(seen, " ")
			}
		}
		return true, ""
	})
	chk.waitProgress(t, "transferring leadership to n4", 20, 30*time.Second*slow)

	// Shrink 5 -> 3: remove the leader itself, then n1.
	// The clients keep sending to the removed nodes until they are stopped,
	// as clients that were not told would.
	c.cli("members", "remove", "n4", "--endpoints", c.endpointsFlag("n2", "n3", "n5", "n1"))
	rest := []string{"n1", "n2", "n3", "n5"}
	c.waitVoters(30*time.Second*slow, rest, rest...)
	if l := c.waitLeader(15*time.Second*slow, rest...); l == "n4" {
		t.Fatalf("the removed leader n4 still leads")
	}
	chk.waitProgress(t, "removing the leader n4", 20, 30*time.Second*slow)

	c.cli("members", "remove", "n1", "--endpoints", c.endpointsFlag("n2", "n3", "n5"))
	rest = []string{"n2", "n3", "n5"}
	c.waitVoters(30*time.Second*slow, rest, rest...)
	chk.waitProgress(t, "removing n1", 20, 30*time.Second*slow)

	c.sigterm("n4")
	c.sigterm("n1")
	eps.remove(c.url("n4"))
	eps.remove(c.url("n1"))
	c.waitReady(15*time.Second*slow, rest...)
	leader := c.waitLeader(15*time.Second*slow, rest...)
	t.Logf("leader of the remaining %v: %s", rest, leader)
	chk.waitProgress(t, "stopping the removed n1 and n4", 20, 30*time.Second*slow)
	for _, id := range rest {
		// A linearizable read through each survivor.
		getLock(t, c.url(id), "membership")
	}

	stop()
	chk.check(t)
	if t.Failed() {
		return
	}
	// With the clients stopped (every release answered), the lock is free and
	// a fresh client gets it through each survivor with a greater token.
	chk.mu.Lock()
	last := chk.lastToken
	chk.mu.Unlock()
	for i, id := range rest {
		r := mustCall(t, http.MethodPost, c.url(id)+"/api/v1/locks/membership/acquire",
			map[string]any{"client_id": "final-" + id, "ttl_ms": 30000, "request_id": "final-acquire-" + id}, http.StatusOK, nil)
		a := checkGrant(t, "final acquire through "+id, r)
		if a.FencingToken <= last {
			t.Fatalf("final acquire %d through %s: token %d, not above %d", i, id, a.FencingToken, last)
		}
		last = a.FencingToken
		mustCall(t, http.MethodPost, c.url(id)+"/api/v1/locks/membership/release",
			map[string]any{"client_id": "final-" + id, "fencing_token": a.FencingToken, "lease_id": a.LeaseID, "request_id": "final-release-" + id},
			http.StatusOK, nil)
	}
}

// ---------------------------------------------------------------------------
// A partition built from per-node loopback IPs and in-test TCP proxies.

// partIP is node i's own loopback IP (i from 0).
func partIP(i int) string { return fmt.Sprintf("127.0.0.%d", 11+i) }

// partNodeOf maps a source IP to a node index, -1 if none.
func partNodeOf(ip string) int {
	s, ok := strings.CutPrefix(ip, "127.0.0.")
	if !ok {
		return -1
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 11 || n > 40 {
		return -1
	}
	return n - 11
}

// partition is the in-test network: node i's Raft listener is reached only
// through proxies[i]; isolated, when >= 0, is a node cut off from all others
// (its inbound proxy refuses everything and the other proxies refuse
// connections from its IP).
type partition struct {
	mu       sync.Mutex
	isolated int
	proxies  []*partProxy
}

type partProxy struct {
	p      *partition
	node   int
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  map[net.Conn]int // both ends of every live link -> source node
	wg     sync.WaitGroup
}

func (pt *partition) blocked(dst, src int) bool {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	return pt.isolated >= 0 && src != dst && (dst == pt.isolated || src == pt.isolated)
}

// isolate cuts node k off (k < 0 heals) and closes the links it cuts.
func (pt *partition) isolate(k int) {
	pt.mu.Lock()
	pt.isolated = k
	pt.mu.Unlock()
	for _, px := range pt.proxies {
		px.mu.Lock()
		for cn, src := range px.conns {
			if pt.blocked(px.node, src) {
				cn.Close()
				delete(px.conns, cn)
			}
		}
		px.mu.Unlock()
	}
}

func (px *partProxy) serve() {
	defer px.wg.Done()
	for {
		in, err := px.ln.Accept()
		if err != nil {
			return
		}
		host, _, _ := net.SplitHostPort(in.RemoteAddr().String())
		src := partNodeOf(host)
		if px.p.blocked(px.node, src) {
			in.Close()
			continue
		}
		out, err := net.DialTimeout("tcp", px.target, 2*time.Second)
		if err != nil {
			in.Close()
			continue
		}
		px.mu.Lock()
		if px.conns == nil { // closed
			px.mu.Unlock()
			in.Close()
			out.Close()
			return
		}
		px.conns[in], px.conns[out] = src, src
		px.mu.Unlock()
		pipe := func(dst, s net.Conn) {
			defer px.wg.Done()
			_, _ = io.Copy(dst, s)
			dst.Close()
			s.Close()
			px.mu.Lock()
			if px.conns != nil {
				delete(px.conns, dst)
				delete(px.conns, s)
			}
			px.mu.Unlock()
		}
		px.wg.Add(2)
		go pipe(in, out)
		go pipe(out, in)
	}
}

func (px *partProxy) close() {
	px.ln.Close()
	px.mu.Lock()
	for cn := range px.conns {
		cn.Close()
	}
	px.conns = nil
	px.mu.Unlock()
	px.wg.Wait()
}

// listenOn listens on a free port of ip in the e2e port range.
func listenOn(t *testing.T, ip string) net.Listener {
	t.Helper()
	lo, hi := loopback.PortRange()
	for range 200 {
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(lo+rand.IntN(hi-lo))))
		if err == nil {
			return ln
		}
	}
	t.Fatalf("no free port on %s in [%d, %d)", ip, lo, hi)
	return nil
}

func readyz(url string) (int, string) {
	r, err := call(http.MethodGet, url+"/readyz", nil)
	if err != nil {
		return 0, err.Error()
	}
	return r.Status, r.String()
}

// TestReadyzFalseOnPartitionedMinority cuts one follower off from the other two
// nodes of a cluster of real processes: its /readyz turns 503 within a few
// election timeouts and it grants nothing, while the majority stays ready and
// grants locks; once healed, it is ready again and has caught up.
func TestReadyzFalseOnPartitionedMinority(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("needs the whole 127.0.0.0/8 on loopback")
	}
	if ln, err := net.Listen("tcp", partIP(1)+":0"); err != nil {
		t.Skipf("cannot listen on %s: %v", partIP(1), err)
	} else {
		ln.Close()
	}
	const n = 3
	bin := dlockBinary(t)
	dir := t.TempDir()
	pt := &partition{isolated: -1}
	t.Cleanup(func() { // runs after the processes are stopped
		for _, px := range pt.proxies {
			px.close()
		}
	})
	apiBase := pickBasePort(t, 0, 10, 20)
	c := &procCluster{t: t, bin: bin}
	var initial, advertise []string
	for i := range n {
		id := fmt.Sprintf("n%d", i+1)
		realLn := listenOn(t, partIP(i)) // reserve, then free for dlock
		realAddr := realLn.Addr().String()
		realLn.Close()
		ln := listenOn(t, partIP(i))
		px := &partProxy{p: pt, node: i, ln: ln, target: realAddr, conns: map[net.Conn]int{}}
		pt.proxies = append(pt.proxies, px)
		px.wg.Add(1)
		go px.serve()
		nd := &node{
			id:       id,
			apiAddr:  fmt.Sprintf("127.0.0.1:%d", apiBase+10*i),
			raftAddr: realAddr,
			dataDir:  filepath.Join(dir, id),
			logPath:  filepath.Join(dir, id+".log"),
		}
		c.nodes = append(c.nodes, nd)
		advertise = append(advertise, ln.Addr().String())
		initial = append(initial, id+"="+ln.Addr().String())
	}
	c.initial = strings.Join(initial, ",")
	t.Cleanup(c.cleanup)
	for i, nd := range c.nodes {
		nd.p = launch(t, nd.id, nd.logPath, nil, bin, "serve", "--id", nd.id, "--data-dir", nd.dataDir,
			"--api-addr", nd.apiAddr, "--raft-addr", nd.raftAddr, "--raft-advertise", advertise[i],
			"--initial-cluster", c.initial, "--log-level", "warn")
	}
	c.waitReady(15*time.Second*slow, c.ids()...)
	leader := c.waitLeader(15*time.Second*slow, c.ids()...)
	victim := c.others(leader)[0]
	majority := c.others(victim)
	k := slices.Index(c.ids(), victim)
	t.Logf("leader %s; isolating follower %s (%s)", leader, victim, partIP(k))

	r := mustCall(t, http.MethodPost, c.url(leader)+"/api/v1/locks/part/acquire",
		map[string]any{"client_id": "before", "ttl_ms": 30000, "request_id": "before-1"}, http.StatusOK, nil)
	before := checkGrant(t, "acquire before the partition", r)
	mustCall(t, http.MethodPost, c.url(victim)+"/api/v1/locks/part/release",
		map[string]any{"client_id": "before", "fencing_token": before.FencingToken, "lease_id": before.LeaseID, "request_id": "before-2"},
		http.StatusOK, nil)

	cut := time.Now()
	pt.isolate(k)
	testutil.Eventually(t, 10*time.Second*slow, victim+"'s /readyz to turn 503", func() (bool, string) {
		st, s := readyz(c.url(victim))
		return st == http.StatusServiceUnavailable, s
	})
	t.Logf("%s unready %s after the cut", victim, time.Since(cut).Round(time.Millisecond))

	// The majority stays ready and grants; the isolated node grants nothing.
	last := before.FencingToken
	for round := range 10 {
		for _, id := range majority {
			if st, s := readyz(c.url(id)); st != http.StatusOK {
				t.Errorf("round %d: %s's /readyz during the partition: %s", round, id, s)
			}
		}
		if st, s := readyz(c.url(victim)); st != http.StatusServiceUnavailable {
			t.Errorf("round %d: isolated %s's /readyz: %s, want 503", round, victim, s)
		}
		via := majority[round%len(majority)]
		cl := fmt.Sprintf("during-%d", round)
		r := mustCall(t, http.MethodPost, c.url(via)+"/api/v1/locks/part/acquire",
			map[string]any{"client_id": cl, "ttl_ms": 30000, "request_id": cl + "-a"}, http.StatusOK, nil)
		a := checkGrant(t, "acquire through "+via+" during the partition", r)
		if a.FencingToken <= last {
			t.Fatalf("token %d after %d", a.FencingToken, last)
		}
		last = a.FencingToken
		mustCall(t, http.MethodPost, c.url(via)+"/api/v1/locks/part/release",
			map[string]any{"client_id": cl, "fencing_token": a.FencingToken, "lease_id": a.LeaseID, "request_id": cl + "-r"},
			http.StatusOK, nil)
		time.Sleep(100 * time.Millisecond)
	}
	if t.Failed() {
		t.FailNow()
	}
	// It answers 503 (no_leader), after holding the request for up to the
	// server's apply timeout (10 s) in case a leader turns up.
	sent := time.Now()
	mctx, mcancel := context.WithTimeout(context.Background(), 30*time.Second)
	r, err := callCtx(mctx, http.MethodPost, c.url(victim)+"/api/v1/locks/minority/acquire",
		map[string]any{"client_id": "minority", "ttl_ms": 30000, "request_id": "minority-1"})
	mcancel()
	switch {
	case err != nil:
		t.Fatalf("acquire on the isolated %s: no answer after %s: %v", victim, time.Since(sent).Round(time.Millisecond), err)
	case r.Status != http.StatusServiceUnavailable:
		t.Fatalf("acquire on the isolated %s: %s, want 503", victim, r)
	default:
		t.Logf("acquire on the isolated %s answered after %s: %s", victim, time.Since(sent).Round(time.Millisecond), r)
	}

	// Heal: ready again, and caught up.
	healed := time.Now()
	pt.isolate(-1)
	c.waitReady(15*time.Second*slow, victim)
	t.Logf("%s ready %s after the heal", victim, time.Since(healed).Round(time.Millisecond))
	c.waitReady(15*time.Second*slow, majority...)
	v := getLock(t, c.url(victim), "part")
	if v.Held {
		t.Fatalf("after the heal %s shows part held: %+v", victim, v)
	}
	v = getLock(t, c.url(victim), "minority")
	if v.Held {
		t.Fatalf("after the heal the lock asked of the isolated node is held: %+v", v.Holder)
	}
	r = mustCall(t, http.MethodPost, c.url(victim)+"/api/v1/locks/part/acquire",
		map[string]any{"client_id": "after", "ttl_ms": 30000, "request_id": "after-1"}, http.StatusOK, nil)
	if a := checkGrant(t, "acquire through the healed "+victim, r); a.FencingToken <= last {
		t.Fatalf("token %d after the heal, not above %d", a.FencingToken, last)
	}
}
