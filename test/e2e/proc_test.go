package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/loopback"
	dproc "github.com/dlock/dlock/internal/proc"
	"github.com/dlock/dlock/internal/testutil"
)

// stopTimeout is how long a process gets to exit after SIGTERM/SIGINT; the
// server's own shutdown is bounded by 10 s.
const stopTimeout = 10 * time.Second

// proc is one dlock process, started through the shared harness
// (internal/proc), with what these tests add: failing the test instead of
// returning errors, and remembering a forced stop.
type proc struct {
	*dproc.Proc
	dumped bool // stop had to force it: the log ends with every goroutine's stack
}

// launch starts bin with args. Its stderr (and stdout, unless stdout is given)
// is appended to logPath, after a header naming the start.
func launch(t testing.TB, name, logPath string, stdout *os.File, bin string, args ...string) *proc {
	t.Helper()
	var env []string
	if raceEnabled {
		// A race-built binary sleeps 1 s at exit by default; keep any GORACE
		// options the caller set.
		env = append(os.Environ(), "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	}
	p, err := dproc.Start(name, logPath, bin, args, dproc.Options{Stdout: stdout, Env: env})
	if err != nil {
		t.Fatal(err)
	}
	return &proc{Proc: p}
}

// kill SIGKILLs the process, as a crash or `kill -9` would, and reaps it.
func (p *proc) kill(t testing.TB) {
	t.Helper()
	if p.Exited() {
		t.Fatalf("%s: already exited before the kill: %v", p.Name, p.WaitErr())
	}
	if err := p.Kill(stopTimeout); err != nil {
		t.Fatal(err)
	}
}

// stop sends sig and waits up to stopTimeout, then forces the exit (SIGQUIT
// for a stack dump in the log, then SIGKILL). It returns how long the exit
// took and whether it had to be forced.
func (p *proc) stop(sig os.Signal) (took time.Duration, killed bool) {
	took, killed = p.Stop(sig, stopTimeout)
	if killed {
		p.dumped = true
	}
	return took, killed
}

// stackSummary returns the goroutine dump that ends a SIGQUIT process's log,
// cut down to each goroutine's header and its frames in dlock's own code.
func stackSummary(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	_, dump, ok := strings.Cut(string(b), "SIGQUIT: quit")
	if !ok {
		return "(no goroutine dump in the log)"
	}
	var out []string
	for _, line := range strings.Split(dump, "\n") {
		if strings.HasPrefix(line, "goroutine ") || strings.HasPrefix(line, "github.com/dlock/dlock/") {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// checkRaces fails the test if the race detector reported a data race in a
// dlock process's log.
func checkRaces(t testing.TB, name, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	if i := bytes.Index(b, []byte("WARNING: DATA RACE")); i >= 0 {
		end := min(len(b), i+8000)
		t.Errorf("%s: the race detector found a data race in dlock:\n%s", name, b[i:end])
	}
}

// node is one `dlock serve` process of a cluster, with the flags it is
// (re)started with.
type node struct {
	id       string
	apiAddr  string
	raftAddr string
	dataDir  string
	logPath  string
	p        *proc // current or last process
}

func (n *node) url() string { return "http://" + n.apiAddr }

// procCluster is a cluster of `dlock serve` processes on loopback.
type procCluster struct {
	t       *testing.T
	bin     string
	nodes   []*node
	initial string   // the --initial-cluster value
	extra   []string // more flags for every start
}

// startCluster starts n nodes on first boot and waits until every node is
// ready and names the same leader. Everything is stopped at test clean-up.
func startCluster(t *testing.T, n int) *procCluster {
	t.Helper()
	return startClusterWith(t, n)
}

// startClusterWith is startCluster with more flags for every node.
func startClusterWith(t *testing.T, n int, extra ...string) *procCluster {
	t.Helper()
	bin := dlockBinary(t)
	dir := t.TempDir()
	offsets := make([]int, 0, 2*n)
	for i := range n {
		offsets = append(offsets, 10*i, 10*i+1)
	}
	base := pickBasePort(t, offsets...)
	c := &procCluster{t: t, bin: bin, extra: extra}
	var initial []string
	for i := range n {
		id := fmt.Sprintf("n%d", i+1)
		nd := &node{
			id:       id,
			apiAddr:  fmt.Sprintf("127.0.0.1:%d", base+10*i),
			raftAddr: fmt.Sprintf("127.0.0.1:%d", base+10*i+1),
			dataDir:  filepath.Join(dir, id),
			logPath:  filepath.Join(dir, id+".log"),
		}
		c.nodes = append(c.nodes, nd)
		initial = append(initial, id+"="+nd.raftAddr)
	}
	c.initial = strings.Join(initial, ",")
	// Registered after t.TempDir, so it runs before the data dirs are removed.
	t.Cleanup(c.cleanup)
	for _, nd := range c.nodes {
		c.start(nd.id, true)
	}
	c.waitReady(10*time.Second*slow, c.ids()...)
	c.waitLeader(10*time.Second*slow, c.ids()...)
	return c
}

// slow stretches bounds that cover process start-up under the race detector.
var slow = func() time.Duration {
	if raceEnabled {
		return 2
	}
	return 1
}()

func (c *procCluster) ids() []string {
	var ids []string
	for _, nd := range c.nodes {
		ids = append(ids, nd.id)
	}
	return ids
}

func (c *procCluster) node(id string) *node {
	for _, nd := range c.nodes {
		if nd.id == id {
			return nd
		}
	}
	c.t.Fatalf("no node %q", id)
	return nil
}

func (c *procCluster) url(id string) string { return c.node(id).url() }

// start starts (or restarts, from its data dir) one node with the same flags;
// withInitial passes --initial-cluster, which only the first start needs.
func (c *procCluster) start(id string, withInitial bool) {
	c.t.Helper()
	nd := c.node(id)
	if nd.p != nil && !nd.p.Exited() {
		c.t.Fatalf("start %s: it is still running", id)
	}
	args := []string{"serve", "--id", nd.id, "--data-dir", nd.dataDir,
		"--api-addr", nd.apiAddr, "--raft-addr", nd.raftAddr, "--log-level", "warn"}
	args = append(args, c.extra...)
	if withInitial {
		args = append(args, "--initial-cluster", c.initial)
	}
	nd.p = launch(c.t, nd.id, nd.logPath, nil, c.bin, args...)
}

// kill SIGKILLs one node.
func (c *procCluster) kill(id string) {
	c.t.Helper()
	c.node(id).p.kill(c.t)
}

// others lists the nodes other than the given ones.
func (c *procCluster) others(not ...string) []string {
	var out []string
	for _, id := range c.ids() {
		skip := false
		for _, n := range not {
			skip = skip || id == n
		}
		if !skip {
			out = append(out, id)
		}
	}
	return out
}

// cleanup stops every process still running (SIGTERM, SIGKILL after 10 s),
// in parallel, and on failure prints the tail of every node's log.
func (c *procCluster) cleanup() {
	var wg sync.WaitGroup
	for _, nd := range c.nodes {
		if nd.p == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if took, killed := nd.p.stop(syscall.SIGTERM); killed {
				c.t.Errorf("%s did not exit within %s of SIGTERM at clean-up; SIGKILLed it", nd.id, took.Round(time.Millisecond))
			}
		}()
	}
	wg.Wait()
	for _, nd := range c.nodes {
		checkRaces(c.t, nd.id, nd.logPath)
	}
	if c.t.Failed() {
		for _, nd := range c.nodes {
			c.t.Logf("--- tail of %s's log (%s):\n%s", nd.id, nd.logPath, dproc.LogTail(nd.logPath, 60))
			if nd.p != nil && nd.p.dumped {
				c.t.Logf("--- %s's goroutines when it was sent SIGQUIT (dlock frames):\n%s", nd.id, stackSummary(nd.logPath))
			}
		}
	}
}

// waitReady waits until GET /readyz answers 200 on every given node.
func (c *procCluster) waitReady(within time.Duration, ids ...string) {
	c.t.Helper()
	for _, id := range ids {
		url := c.url(id) + "/readyz"
		testutil.Eventually(c.t, within, id+" ready", func() (bool, string) {
			r, err := call(http.MethodGet, url, nil)
			if err != nil {
				return false, err.Error()
			}
			return r.Status == 200, r.String()
		})
	}
}

// waitLeader waits until every given node names the same leader, one of them,
// in GET /api/v1/cluster, and returns its id.
func (c *procCluster) waitLeader(within time.Duration, ids ...string) string {
	c.t.Helper()
	var leader string
	testutil.Eventually(c.t, within, fmt.Sprintf("a leader among %v", ids), func() (bool, string) {
		var seen []string
		leader = ""
		for _, id := range ids {
			var ci clusterInfo
			r, err := call(http.MethodGet, c.url(id)+"/api/v1/cluster", nil)
			if err == nil {
				err = r.decode(&ci)
			}
			if err != nil {
				return false, fmt.Sprintf("%s: %v", id, err)
			}
			seen = append(seen, fmt.Sprintf("%s->%q(term %d)", id, ci.LeaderID, ci.Term))
			if ci.LeaderID == "" || (leader != "" && ci.LeaderID != leader) {
				return false, strings.Join(seen, " ")
			}
			leader = ci.LeaderID
		}
		for _, id := range ids {
			if id == leader {
				return true, ""
			}
		}
		return false, "leader is not among them: " + strings.Join(seen, " ")
	})
	return leader
}

// lineReader collects a process's stdout lines.
type lineReader struct {
	mu    sync.Mutex
	lines []string
	done  chan struct{}
}

func readLines(f *os.File, tee *os.File) *lineReader {
	lr := &lineReader{done: make(chan struct{})}
	go func() {
		defer close(lr.done)
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			lr.mu.Lock()
			lr.lines = append(lr.lines, sc.Text())
			lr.mu.Unlock()
			if tee != nil {
				fmt.Fprintln(tee, sc.Text())
			}
		}
	}()
	return lr
}

func (lr *lineReader) snapshot() []string {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	return append([]string(nil), lr.lines...)
}

// pickBasePort finds a base port such that base+off is free on 127.0.0.1 for
// every offset.
func pickBasePort(t testing.TB, offsets ...int) int {
	t.Helper()
	base, err := loopback.FreeBase([]string{"127.0.0.1"}, offsets, rand.IntN)
	if err != nil {
		t.Fatal(err)
	}
	return base
}
