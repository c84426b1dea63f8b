package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dlock/dlock/internal/loopback"

	"github.com/dlock/dlock/internal/proc"
)

// cnode is one `dlock serve` node.
type cnode struct {
	idx       int
	id        string
	ip        string
	apiAddr   string
	raftAddr  string // where it listens
	proxyAddr string // what it advertises; the proxy forwards to raftAddr
	grpcAddr  string
	dataDir   string
	logPath   string
	disk      string // the tmpfs the data dir is on, when the disk faults run

	p       *proc.Proc
	paused  bool
	started bool // first start done (later starts omit --initial-cluster)
	// rejoins: the node was removed from the cluster and its data wiped; it
	// starts with --join through the other nodes (idempotent once it is a
	// member again) instead of --initial-cluster.
	rejoins bool
	// out: a spare slot that is not a member of the cluster now (never
	// joined, or removed and wiped): nothing starts it, and the health
	// and final checks leave it out. removing: its removal is under way,
	// so no heal restarts it (it stops by itself once removed). noMoves:
	// joining or leaving, so the move nemesis puts no replica on it.
	out, removing, noMoves bool
}

func (n *cnode) url() string { return "http://" + n.apiAddr }

// cluster is N dlock processes behind the link proxies.
type cluster struct {
	bin   string
	dir   string
	nodes []*cnode
	net   *network
	init  string
	// shards is --shards (1: one group): every node runs that many Raft
	// groups on the etcd engine, more once ranges split (known).
	shards int
	// replicas is --shard-replicas (0: every shard on every node): each
	// initial range runs on that many nodes, and moves change which.
	replicas int
	// known is the most shards every node has reported at once (splits
	// only add shards): healthy() waits for every node to have them all.
	known atomic.Int64

	mu sync.Mutex // serialises process operations
}

var (
	flagMu    sync.Mutex
	flagCache = map[string]string{}
)

// binHasFlag reports whether `bin serve` knows --name (the tree changes under
// the suite: newer binaries grow listeners that need their own port).
func binHasFlag(bin, name string) bool {
	flagMu.Lock()
	defer flagMu.Unlock()
	help, ok := flagCache[bin]
	if !ok {
		out, _ := exec.Command(bin, "serve", "-h").CombinedOutput()
		help = string(out)
		flagCache[bin] = help
	}
	return strings.Contains(help, "-"+name+" ")
}

func nodeIP(i int) string { return fmt.Sprintf("127.0.0.%d", 11+i) }

// pickBasePort finds base such that base … base+3 are free on every node IP
// (API, Raft, proxy, gRPC).
func pickBasePort(n int, rng *rand.Rand) (int, error) {
	ips := make([]string, n)
	for i := range ips {
		ips[i] = nodeIP(i)
	}
	return loopback.FreeBase(ips, loopback.Span(4), rng.IntN)
}

func newCluster(bin, dir string, n int, rng *rand.Rand) (*cluster, error) {
	base, err := pickBasePort(n, rng)
	if err != nil {
		return nil, err
	}
	c := &cluster{bin: bin, dir: dir}
	var ips, initial []string
	for i := range n {
		ip := nodeIP(i)
		nd := &cnode{
			idx:       i,
			id:        fmt.Sprintf("n%d", i+1),
			ip:        ip,
			apiAddr:   net.JoinHostPort(ip, strconv.Itoa(base)),
			raftAddr:  net.JoinHostPort(ip, strconv.Itoa(base+1)),
			proxyAddr: net.JoinHostPort(ip, strconv.Itoa(base+2)),
			grpcAddr:  net.JoinHostPort(ip, strconv.Itoa(base+3)),
			dataDir:   filepath.Join(dir, fmt.Sprintf("n%d", i+1)),
			logPath:   filepath.Join(dir, fmt.Sprintf("n%d.log", i+1)),
		}
		c.nodes = append(c.nodes, nd)
		ips = append(ips, ip)
		initial = append(initial, nd.id+"="+nd.proxyAddr)
	}
	c.init = strings.Join(initial, ",")
	c.net = newNetwork(ips)
	for _, nd := range c.nodes {
		if err := c.net.listen(nd.idx, nd.proxyAddr, nd.raftAddr); err != nil {
			c.net.close()
			return nil, fmt.Errorf("proxy for %s: %w", nd.id, err)
		}
	}
	return c, nil
}

// start starts (or restarts from its data dir) one node.
func (c *cluster) start(i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.startLocked(i)
}

func (c *cluster) startLocked(i int) error {
	nd := c.nodes[i]
	if nd.out || nd.removing {
		return nil // not a member: only the member cycle starts it (join)
	}
	if nd.p != nil && !nd.p.Exited() {
		return fmt.Errorf("start %s: still running", nd.id)
	}
	args := []string{"serve", "--id", nd.id, "--data-dir", nd.dataDir,
		"--api-addr", nd.apiAddr, "--raft-addr", nd.raftAddr, "--raft-advertise", nd.proxyAddr,
		"--log-level", "info", "--raft-log-level", "info"}
	switch {
	case nd.rejoins:
		var urls []string
		for _, o := range c.nodes {
			if o != nd && !o.out {
				urls = append(urls, o.url())
			}
		}
		args = append(args, "--join", strings.Join(urls, ","))
	case !nd.started:
		args = append(args, "--initial-cluster", c.init)
	}
	if binHasFlag(c.bin, "grpc-addr") {
		args = append(args, "--grpc-addr", nd.grpcAddr)
	}
	if c.shards > 1 {
		// Shards run only on the etcd engine (one log and one raft port for
		// all groups of a node).
		args = append(args, "--shards", strconv.Itoa(c.shards), "--raft-engine", "etcd")
		if c.replicas > 0 {
			args = append(args, "--shard-replicas", strconv.Itoa(c.replicas))
		}
	}
	if ls := os.Getenv("DLOCK_CHAOS_LOG_STORE"); ls != "" {
		args = append(args, "--log-store", ls)
	}
	// Extra serve flags, e.g. to keep every log entry and snapshot for a
	// replay after a failure (scripts/chaos.sh --forensic).
	args = append(args, strings.Fields(os.Getenv("DLOCK_CHAOS_SERVE_ARGS"))...)
	p, err := proc.Start(nd.id, nd.logPath, c.bin, args, proc.Options{})
	if err != nil {
		return err
	}
	nd.p, nd.paused, nd.started = p, false, true
	return nil
}

// removeMember takes node i out of the cluster's configuration through node
// via (any node forwards to the leader).
func (c *cluster) removeMember(via, i int) error {
	return c.admin(via, http.MethodDelete, "/api/v1/cluster/members/"+c.nodes[i].id, "", "remove "+c.nodes[i].id)
}

// transferLeadership asks, through node via, for leadership to move to node
// to (the leader finishes its in-flight work and steps down; to must win the
// election it starts).
func (c *cluster) transferLeadership(via, to int) error {
	return c.admin(via, http.MethodPost, "/api/v1/cluster/leadership-transfer", `{"id":"`+c.nodes[to].id+`"}`, "transfer leadership to "+c.nodes[to].id)
}

// admin sends one membership request to node via and wants a 200.
func (c *cluster) admin(via int, method, path, body, what string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, c.nodes[via].url()+path, strings.NewReader(body))
	if err != nil {
		return err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := statusClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
		return fmt.Errorf("%s: %d %s", what, resp.StatusCode, strings.TrimSpace(string(b)))
	}
	return nil
}

// wipe kills node i and deletes its data dir: it comes back as a new
// member through --join.
func (c *cluster) wipe(i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	nd := c.nodes[i]
	if nd.p != nil {
		if err := nd.p.Kill(killWithin); err != nil {
			return err
		}
	}
	nd.paused, nd.rejoins = false, true
	return os.RemoveAll(nd.dataDir)
}

// removedFromCluster reports whether the leader's configuration no longer
// lists node i (false when no leader answers: nothing is known).
func (c *cluster) removedFromCluster(i int) bool {
	leader := c.leader()
	if leader < 0 {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	var v struct {
		Members []struct {
			ID string `json:"id"`
		} `json:"members"`
	}
	if code, err := getJSON(ctx, c.nodes[leader].url()+"/api/v1/cluster", &v); err != nil || code != http.StatusOK {
		return false
	}
	for _, m := range v.Members {
		if m.ID == c.nodes[i].id {
			return false
		}
	}
	return true
}

// voters reports whether the leader's view lists every node as a voter.
func (c *cluster) voters(leader int) (bool, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	var v struct {
		Members []struct {
			ID       string `json:"id"`
			Suffrage string `json:"suffrage"`
		} `json:"members"`
	}
	if _, err := getJSON(ctx, c.nodes[leader].url()+"/api/v1/cluster", &v); err != nil {
		return false, err.Error()
	}
	voter := map[string]bool{}
	for _, m := range v.Members {
		if m.Suffrage == "voter" {
			voter[m.ID] = true
		}
	}
	want := c.memberIdx()
	for _, i := range want {
		if !voter[c.nodes[i].id] {
			return false, fmt.Sprintf("%d of %d nodes are voters: %+v", len(voter), len(want), v.Members)
		}
	}
	return true, ""
}

// in reports whether node i is a member the harness keeps running: not a
// spare out of the cluster, nor one whose removal is under way.
func (c *cluster) in(i int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.nodes[i].out && !c.nodes[i].removing
}

// memberIdx are the nodes that are in (c.in), in index order: every node
// unless the run has a spare.
func (c *cluster) memberIdx() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []int
	for i, nd := range c.nodes {
		if !nd.out && !nd.removing {
			out = append(out, i)
		}
	}
	return out
}

// moveTargets are the ids of the nodes a move may put a replica on: in,
// and neither joining nor leaving.
func (c *cluster) moveTargets() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, nd := range c.nodes {
		if !nd.out && !nd.removing && !nd.noMoves {
			out = append(out, nd.id)
		}
	}
	return out
}

// kill SIGKILLs one node (a stopped one too).
func (c *cluster) kill(i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	nd := c.nodes[i]
	if nd.p == nil {
		return nil
	}
	err := nd.p.Kill(killWithin)
	nd.paused = false
	return err
}

func (c *cluster) pause(i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	nd := c.nodes[i]
	if nd.p == nil || nd.p.Exited() {
		return fmt.Errorf("pause %s: not running", nd.id)
	}
	if err := nd.p.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	nd.paused = true
	return nil
}

func (c *cluster) resume(i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.resumeLocked(i)
}

func (c *cluster) resumeLocked(i int) error {
	nd := c.nodes[i]
	if !nd.paused || nd.p == nil || nd.p.Exited() {
		nd.paused = false
		return nil
	}
	nd.paused = false
	return nd.p.Signal(syscall.SIGCONT)
}

// running reports whether node i's process is alive (paused or not).
func (c *cluster) running(i int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	nd := c.nodes[i]
	return nd.p != nil && !nd.p.Exited()
}

// unexpectedExits lists nodes whose process exited without being killed by
// the harness (a crash or a refusal to start).
func (c *cluster) deadNodes() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []int
	for i, nd := range c.nodes {
		if !nd.out && !nd.removing && (nd.p == nil || nd.p.Exited()) {
			out = append(out, i)
		}
	}
	return out
}

// healAll undoes every fault: links healed, paused nodes continued, dead
// nodes started.
func (c *cluster) healAll() []error {
	c.net.healAll()
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for i, nd := range c.nodes {
		if nd.p != nil && !nd.p.Exited() {
			if err := c.resumeLocked(i); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		if err := c.startLocked(i); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// shutdown SIGKILLs every node and stops the proxies.
func (c *cluster) shutdown() {
	c.mu.Lock()
	for _, nd := range c.nodes {
		if nd.p != nil {
			_ = nd.p.Kill(killWithin)
			nd.paused = false
		}
	}
	c.mu.Unlock()
	c.net.close()
}

// clusterView is a node's answer to GET /api/v1/cluster.
type clusterView struct {
	NodeID       string `json:"node_id"`
	LeaderID     string `json:"leader_id"`
	Term         uint64 `json:"term"`
	CommitIndex  uint64 `json:"commit_index"`
	AppliedIndex uint64 `json:"applied_index"`
	Revision     uint64 `json:"revision"`
	LastToken    uint64 `json:"last_fencing_token"`
	// Shards is set by a sharded cluster (the fields above are shard 0's).
	Shards []shardView `json:"shards"`
	// ShardGeneration is the map generation the node routes by.
	ShardGeneration uint64 `json:"shard_generation"`
}

// knownShards is how many shards the cluster has at least: --shards, more
// after splits.
func (c *cluster) knownShards() int { return max(c.shards, int(c.known.Load())) }

// noteShards records that every node has n shards.
func (c *cluster) noteShards(n int) {
	for {
		k := c.known.Load()
		if int64(n) <= k || c.known.CompareAndSwap(k, int64(n)) {
			return
		}
	}
}

var statusClient = &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}

func getJSON(ctx context.Context, url string, out any) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := statusClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			return resp.StatusCode, err
		}
	}
	return resp.StatusCode, nil
}

// view asks one node for its cluster view (bounded by d).
func (c *cluster) view(i int, d time.Duration) (clusterView, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var v clusterView
	code, err := getJSON(ctx, c.nodes[i].url()+"/api/v1/cluster", &v)
	if err == nil && code != 200 {
		err = fmt.Errorf("status %d", code)
	}
	return v, err
}

// leader returns the index of the node that a majority of the answering
// nodes name as leader, or -1 (on a sharded cluster: shard 0's leader, which
// GET /cluster's leader_id names).
func (c *cluster) leader() int { return c.shardLeaders()[0] }

// healthy reports whether every node runs, is ready and names the same
// leader; the reason if not.
func (c *cluster) healthy() (bool, string) {
	leader := ""
	var shardLeaders []string
	var gen uint64
	for i, nd := range c.nodes {
		if !c.in(i) {
			continue // a spare out of the cluster, or one being removed
		}
		if !c.running(i) {
			return false, nd.id + " is not running"
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		code, err := getJSON(ctx, nd.url()+"/readyz", nil)
		cancel()
		if err != nil || code != 200 {
			return false, fmt.Sprintf("%s not ready (%d %v)", nd.id, code, err)
		}
		v, err := c.view(i, 500*time.Millisecond)
		if err != nil {
			return false, fmt.Sprintf("%s: %v", nd.id, err)
		}
		if v.LeaderID == "" || (leader != "" && v.LeaderID != leader) {
			return false, fmt.Sprintf("%s names leader %q, others %q", nd.id, v.LeaderID, leader)
		}
		leader = v.LeaderID
		// A sharded cluster is healthy when every node routes by the same
		// map, with every shard the cluster has had, and every shard has a
		// leader that every node names.
		if c.shards > 1 {
			if want := c.knownShards(); len(v.Shards) < want {
				return false, fmt.Sprintf("%s lists %d shards, want %d", nd.id, len(v.Shards), want)
			}
			if shardLeaders == nil {
				shardLeaders, gen = make([]string, len(v.Shards)), v.ShardGeneration
			}
			if v.ShardGeneration != gen || len(v.Shards) != len(shardLeaders) {
				return false, fmt.Sprintf("%s routes by shard map generation %d (%d shards), another node by %d (%d shards)", nd.id, v.ShardGeneration, len(v.Shards), gen, len(shardLeaders))
			}
			for k, s := range v.Shards {
				if s.LeaderID == "" || (shardLeaders[k] != "" && s.LeaderID != shardLeaders[k]) {
					return false, fmt.Sprintf("%s names %q as shard %d's leader, others %q", nd.id, s.LeaderID, s.ID, shardLeaders[k])
				}
				// A shard on some nodes is led by one of them (a node that
				// does not run it answers with a replica's view).
				if len(s.Replicas) > 0 && !slices.Contains(s.Replicas, s.LeaderID) {
					return false, fmt.Sprintf("%s names %q as shard %d's leader, not one of its replicas %v", nd.id, s.LeaderID, s.ID, s.Replicas)
				}
				shardLeaders[k] = s.LeaderID
			}
		}
	}
	if shardLeaders != nil {
		c.noteShards(len(shardLeaders))
	}
	// A replaced node must be back as a voter, not left a non-voter.
	for i, nd := range c.nodes {
		if nd.id == leader {
			return c.voters(i)
		}
	}
	return true, ""
}

// waitHealthy polls healthy until it holds or within passes.
func (c *cluster) waitHealthy(within time.Duration, stop <-chan struct{}) (time.Duration, error) {
	start := time.Now()
	deadline := start.Add(within)
	why := ""
	for {
		ok, w := c.healthy()
		if ok {
			return time.Since(start), nil
		}
		why = w
		if time.Now().After(deadline) {
			return time.Since(start), fmt.Errorf("cluster not healthy after %s: %s", within, why)
		}
		select {
		case <-stop:
			return time.Since(start), fmt.Errorf("stopped while waiting: %s", why)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// logTails returns the last n lines of every node's log.
func (c *cluster) logTails(n int) string {
	var b strings.Builder
	for _, nd := range c.nodes {
		fmt.Fprintf(&b, "--- tail of %s's log (%s):\n%s\n", nd.id, nd.logPath, proc.LogTail(nd.logPath, n))
	}
	return b.String()
}

// logProblems scans node logs for panics, fatal errors and data races.
func (c *cluster) logProblems() []string {
	var out []string
	for _, nd := range c.nodes {
		b, err := os.ReadFile(nd.logPath)
		if err != nil {
			continue
		}
		s := string(b)
		for _, needle := range []string{"panic:", "fatal error:", "WARNING: DATA RACE", "level=ERROR"} {
			if i := strings.Index(s, needle); i >= 0 {
				end := min(len(s), i+1500)
				start := max(0, i-300)
				out = append(out, fmt.Sprintf("%s's log has %q:\n%s", nd.id, needle, s[start:end]))
			}
		}
	}
	return out
}

// checkpointDivergence compares the FSM checkpoints ("fsm checkpoint" lines,
// every fsm.CheckpointEvery indexes) that the nodes logged, restarts and
// replays included, and describes the first index at which two of them
// disagree, or returns "". It pins a divergence to a window of entries long
// before the final state comparison would notice it.
func (c *cluster) checkpointDivergence() string {
	type seen struct{ node, val string }
	type at struct {
		shard string // the group's shard ("" on a one-group node)
		index uint64
	}
	first := map[at]seen{}
	var worst at
	var what string
	for _, nd := range c.nodes {
		b, err := os.ReadFile(nd.logPath)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if !strings.Contains(line, `msg="fsm checkpoint"`) {
				continue
			}
			var idx at
			var val []string
			for _, f := range strings.Fields(line) {
				k, v, ok := strings.Cut(f, "=")
				if !ok {
					continue
				}
				switch k {
				case "index":
					idx.index, _ = strconv.ParseUint(v, 10, 64)
				case "shard":
					idx.shard = v
				case "revision", "last_token", "digest":
					val = append(val, f)
				}
			}
			if idx.index == 0 {
				continue
			}
			v := strings.Join(val, " ")
			prev, ok := first[idx]
			if !ok {
				first[idx] = seen{nd.id, v}
				continue
			}
			if prev.val != v && (worst.index == 0 || idx.index < worst.index) {
				worst = idx
				where := ""
				if idx.shard != "" {
					where = " of shard " + idx.shard
				}
				what = fmt.Sprintf("at log index %d%s %s had %s but %s had %s", idx.index, where, prev.node, prev.val, nd.id, v)
			}
		}
	}
	return what
}
