package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dproc "github.com/dlock/dlock/internal/proc"
	"github.com/dlock/dlock/internal/testutil"
)

// The memory one open SSE watch may cost a node, whatever revision it starts
// from and whether or not its client reads: the HTTP connection (buffers,
// goroutines) and the watcher (a cursor into the shared history, a 16-event
// hand-off channel, its goroutine). watcherBudget is what stays live after a
// collection (measured: 43.6 KB each for 10,000 watchers, of which ~21 KB
// goroutine stacks and ~10 KB HTTP buffers); RSS also holds the garbage of
// streaming the backlog until the next collection (measured: 75 KB each).
// The slacks cover what does not grow with the number of watchers.
// docs/api.md and docs/security.md state them.
const (
	watcherBudget    = 48 << 10
	liveSlack        = 64 << 20
	watcherRSSBudget = 96 << 10
	rssSlack         = 64 << 20
)

// Watches from the oldest kept revision whose clients never read cost a node
// a bounded amount each (watcherRSSBudget), and 300 of them after 6,000
// events with 1 KiB values grow it by far less than 256 MiB. The node is a
// real `dlock serve` process and the watchers are raw connections from this
// process that send their request and never read a byte. Before the history
// was shared, each such watcher copied its backlog into a channel of its own
// (2.4 GB for 1,000 of them on a follower). DLOCK_WATCH_MEM_WATCHERS=10000
// runs it with the node's default --max-watchers (about 3 minutes; 10,000
// open files on each side).
func TestSSEWatchersFromOldRevisionHaveBoundedMemory(t *testing.T) {
	watchers := 300
	if v := os.Getenv("DLOCK_WATCH_MEM_WATCHERS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("DLOCK_WATCH_MEM_WATCHERS=%q: want a positive number", v)
		}
		watchers = n
	}
	raiseFileLimit(t, watchers+256)
	bin := plainBinary(t)
	dir := t.TempDir()
	base := pickBasePort(t, 0, 1)
	api, raftAddr := fmt.Sprintf("127.0.0.1:%d", base), fmt.Sprintf("127.0.0.1:%d", base+1)
	p := launch(t, "n1", filepath.Join(dir, "n1.log"), nil, bin, "serve", "--id", "n1", "--data-dir", filepath.Join(dir, "n1"),
		"--api-addr", api, "--raft-addr", raftAddr, "--initial-cluster", "n1="+raftAddr, "--log-level", "warn", "--enable-pprof", "--write-timeout", "10m",
		"--max-watchers", strconv.Itoa(max(watchers, 10000)))
	t.Cleanup(func() {
		p.stop(syscall.SIGTERM)
		if t.Failed() {
			b, _ := os.ReadFile(p.LogPath)
			t.Logf("node log (last 3 KiB):\n%s", b[max(len(b)-3<<10, 0):])
		}
	})
	url := "http://" + api
	testutil.Eventually(t, 30*time.Second, "the node to become ready", func() (bool, string) {
		if p.Exited() {
			t.Fatalf("the node exited (log %s)", p.LogPath)
		}
		code, _ := readyz(url)
		return code == 200, fmt.Sprintf("readyz %d; log %s", code, p.LogPath)
	})

	// ~6,000 events with 1 KiB values: 8 elections, each won once and
	// proclaimed 749 times, from 8 clients at once.
	const elections, proclaims = 8, 749
	var wg sync.WaitGroup
	errs := make(chan error, elections)
	for e := range elections {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- proclaimMany(url, e, proclaims)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}

	liveBefore, before := live(t, url), settledRSS(t, p)
	// Open them all, then let every handler run into its client's full
	// socket buffer and every watcher fill its hand-off channel.
	conns := make([]net.Conn, watchers)
	var mu sync.Mutex
	var openErr error
	sem := make(chan struct{}, 32)
	for i := range conns {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := net.DialTimeout("tcp", api, 10*time.Second)
			if err == nil {
				_ = c.(*net.TCPConn).SetReadBuffer(4096) // keep the kernel's share small; it is not the node's RSS
				_, err = fmt.Fprintf(c, "GET /api/v1/watch?from_revision=1 HTTP/1.1\r\nHost: %s\r\n\r\n", api)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil && openErr == nil {
				openErr = err
			}
			conns[i] = c
		}()
	}
	wg.Wait()
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	if openErr != nil {
		t.Fatalf("open %d watches: %v", watchers, openErr)
	}
	testutil.Eventually(t, 60*time.Second, fmt.Sprintf("the node to serve %d watchers", watchers), func() (bool, string) {
		n, err := metric(url, "dlock_watchers")
		return err == nil && n == float64(watchers), fmt.Sprintf("%v watchers (%v)", n, err)
	})
	after := settledRSS(t, p)
	liveAfter := live(t, url)
	grown, liveGrown := int64(after)-int64(before), int64(liveAfter)-int64(liveBefore)
	t.Logf("%d SSE watchers from revision 1 of ~%d events, never read: node RSS %.1f → %.1f MiB (%+.1f MiB, %d bytes each); heap and stacks after GC %.1f → %.1f MiB (%+.1f MiB, %d bytes each)",
		watchers, elections*(proclaims+1), mib(before), mib(after), float64(grown)/(1<<20), grown/int64(watchers),
		mib(liveBefore), mib(liveAfter), float64(liveGrown)/(1<<20), liveGrown/int64(watchers))
	if grown >= 256<<20 && watchers <= 300 {
		t.Errorf("%d watchers grew the node's RSS by %.1f MiB; the issue allows less than 256 MiB", watchers, float64(grown)/(1<<20))
	}
	if limit := int64(watchers)*watcherBudget + liveSlack; liveGrown > limit {
		t.Errorf("%d watchers hold %.1f MiB after GC; the budget is %.1f MiB (%d bytes each + %d MiB)", watchers, float64(liveGrown)/(1<<20), float64(limit)/(1<<20), watcherBudget, liveSlack>>20)
	}
	if limit := int64(watchers)*watcherRSSBudget + rssSlack; grown > limit {
		t.Errorf("%d watchers grew the node's RSS by %.1f MiB; the budget is %.1f MiB (%d bytes each + %d MiB)", watchers, float64(grown)/(1<<20), float64(limit)/(1<<20), watcherRSSBudget, rssSlack>>20)
	}
}

// live is the node's heap in use and goroutine stacks after two forced
// collections (the profiler's ?gc=1 runs one).
func live(t *testing.T, url string) uint64 {
	t.Helper()
	for range 2 {
		// The collection runs before the profile is written: the status
		// is all this needs (a large profile's body is not read).
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/debug/pprof/heap?gc=1", nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("status %d (is --enable-pprof on?)", resp.StatusCode)
			}
		}
		cancel()
		if err != nil {
			t.Fatalf("force a collection on the node: %v", err)
		}
	}
	var sum float64
	for _, name := range []string{"go_memstats_heap_alloc_bytes", "go_memstats_stack_inuse_bytes"} {
		v, err := metric(url, name)
		if err != nil {
			t.Fatal(err)
		}
		sum += v
	}
	return uint64(sum)
}

// proclaimMany wins election e and proclaims n new values in it.
func proclaimMany(url string, e, n int) error {
	name := fmt.Sprintf("%s/api/v1/elections/mem-%d", url, e)
	cand := fmt.Sprintf("c%d", e)
	post := func(op string, body map[string]any, out any) error {
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			r, err := call("POST", name+"/"+op, body)
			if err == nil && r.Status == 200 {
				if out != nil {
					return r.decode(out)
				}
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s %s: %v %v", op, name, r, err)
			}
		}
	}
	var won struct {
		FencingToken uint64 `json:"fencing_token"`
		LeaseID      string `json:"lease_id"`
	}
	if err := post("campaign", map[string]any{"candidate_id": cand, "value": value(e, 0), "ttl_ms": 600000}, &won); err != nil {
		return err
	}
	for i := 1; i <= n; i++ {
		if err := post("proclaim", map[string]any{"candidate_id": cand, "fencing_token": won.FencingToken,
			"lease_id": won.LeaseID, "value": value(e, i)}, nil); err != nil {
			return err
		}
	}
	return nil
}

func value(e, i int) string { return fmt.Sprintf("%d-%d-", e, i) + strings.Repeat("v", 1000) }

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// settledRSS is the node's resident memory once it has stopped growing for a
// second (or after 30 s).
func settledRSS(t *testing.T, p *proc) uint64 {
	t.Helper()
	last := rss(t, p)
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		time.Sleep(time.Second)
		now := rss(t, p)
		if now < last+(1<<20) {
			return max(now, last)
		}
		last = now
	}
	return last
}

func rss(t *testing.T, p *proc) uint64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Pid()))
	if err != nil {
		t.Skipf("reading a process's RSS needs Linux /proc: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				t.Fatalf("VmRSS line %q", line)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", p.Pid())
	return 0
}

// metric reads one unlabelled gauge from the node's /metrics.
func metric(url, name string) (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := callCtx(ctx, "GET", url+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(strings.NewReader(r.String()))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == name {
			return strconv.ParseFloat(f[1], 64)
		}
	}
	return 0, fmt.Errorf("no %s in /metrics", name)
}

// raiseFileLimit makes room for n open files in this process (each watcher
// holds a connection) and in the node it starts, or skips.
func raiseFileLimit(t *testing.T, n int) {
	t.Helper()
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		t.Skipf("read RLIMIT_NOFILE: %v", err)
	}
	if l.Cur >= uint64(n) {
		return
	}
	if l.Max < uint64(n) {
		t.Skipf("%d watchers need %d open files, and RLIMIT_NOFILE's hard limit is %d (raise it: ulimit -Hn)", n-256, n, l.Max)
	}
	l.Cur = uint64(n)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		t.Skipf("raise RLIMIT_NOFILE to %d: %v", n, err)
	}
}

// plain is dlock built without the race detector, whose shadow memory
// would be most of what an RSS measurement sees.
var plain = &dproc.Binary{Pkg: "github.com/dlock/dlock/cmd/dlock"}

func plainBinary(t *testing.T) string {
	t.Helper()
	if !raceEnabled {
		return dlockBinary(t)
	}
	return plain.Path(t)
}
