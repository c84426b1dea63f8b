package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock/dlock/internal/loopback"
)

// procNode is one server process started by the failover workload.
type procNode struct {
	id, client, peer, dir, logPath string
	cmd                            *exec.Cmd
	done                           chan struct{}
}

func (n *procNode) url() string { return "http://" + n.client }

func (n *procNode) running() bool {
	if n.done == nil {
		return false
	}
	select {
	case <-n.done:
		return false
	default:
		return true
	}
}

// system is what the failover workload needs to know about the servers.
type system interface {
	// args are a node's command-line arguments; first is its first start.
	args(n *procNode, first bool) []string
	// leader checks that every node is running and ready and that they agree
	// on a leader, which it returns.
	leader(ctx context.Context, nodes []*procNode) (*procNode, error)
	// warm prepares clients for the survivors before the kill.
	warm(ctx context.Context, survivors []*procNode) error
	// probe tries one acquire through n.
	probe(ctx context.Context, n *procNode, name string) error
	close()
}

// procCluster is a cluster of real server processes on loopback.
type procCluster struct {
	bin   string
	nodes []*procNode
	sys   system
}

func (pc *procCluster) start(n *procNode, first bool) error {
	args := pc.sys.args(n, first)
	f, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	fmt.Fprintf(f, "=== %s: %s %s\n", time.Now().Format(time.RFC3339Nano), filepath.Base(pc.bin), strings.Join(args, " "))
	cmd := exec.Command(pc.bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s %s: %w", pc.bin, n.id, err)
	}
	n.cmd, n.done = cmd, make(chan struct{})
	done := n.done
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	return nil
}

// kill SIGKILLs a node and waits until it is reaped.
func (pc *procCluster) kill(n *procNode) error {
	if err := n.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	select {
	case <-n.done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s still running 10 s after SIGKILL", n.id)
	}
}

// stop ends every running node: SIGTERM, SIGKILL after 10 s.
func (pc *procCluster) stop() {
	var wg sync.WaitGroup
	for _, n := range pc.nodes {
		if !n.running() {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = n.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-n.done:
			case <-time.After(10 * time.Second):
				_ = n.cmd.Process.Kill()
				<-n.done
			}
		}()
	}
	wg.Wait()
}

// waitHealthy polls sys.leader until it succeeds or within passes.
func (pc *procCluster) waitHealthy(ctx context.Context, within time.Duration) (*procNode, error) {
	deadline := time.Now().Add(within)
	for {
		for _, n := range pc.nodes {
			if !n.running() {
				return nil, fmt.Errorf("%s exited (see %s)", n.id, n.logPath)
			}
		}
		l, err := pc.sys.leader(ctx, pc.nodes)
		if err == nil {
			return l, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("cluster not healthy within %s: %w", within, err)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// dlockSystem runs `dlock serve` processes.
type dlockSystem struct {
	initial string
	extra   []string
	c       *dlockClient
	probeC  *dlockClient
}

func (d *dlockSystem) args(n *procNode, first bool) []string {
	a := []string{"serve", "--id", n.id, "--data-dir", n.dir, "--api-addr", n.client, "--raft-addr", n.peer,
		"--grpc-addr=", "--log-level", "warn"}
	if first {
		a = append(a, "--initial-cluster", d.initial)
	}
	return append(a, d.extra...)
}

func (d *dlockSystem) leader(ctx context.Context, nodes []*procNode) (*procNode, error) {
	leader := ""
	for _, n := range nodes {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		err := d.c.do(cctx, http.MethodGet, n.url()+"/readyz", nil, nil)
		var ci *clusterInfo
		if err == nil {
			ci, err = d.c.cluster(cctx, n.url())
		}
		cancel()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", n.id, err)
		}
		if ci.LeaderID == "" || ci.LeaderAPI == "" || (leader != "" && ci.LeaderID != leader) {
			return nil, fmt.Errorf("%s names leader %q (api %q), others %q", n.id, ci.LeaderID, ci.LeaderAPI, leader)
		}
		leader = ci.LeaderID
	}
	for _, n := range nodes {
		if n.id == leader {
			return n, nil
		}
	}
	return nil, fmt.Errorf("leader %q is not one of the started nodes", leader)
}

func (d *dlockSystem) warm(ctx context.Context, survivors []*procNode) error {
	d.probeC.calls.close()
	for _, n := range survivors {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		err := d.probeC.do(cctx, http.MethodGet, n.url()+"/healthz", nil, nil)
		cancel()
		if err != nil {
			return err
		}
	}
	return nil
}

func (d *dlockSystem) probe(ctx context.Context, n *procNode, name string) error {
	return d.probeC.do(ctx, http.MethodPost, lockURL(n.url(), name, "acquire"),
		acquireReq{ClientID: "bench-" + strings.ReplaceAll(name, "/", "-"), TTLms: 10000}, nil)
}

func (d *dlockSystem) close() {}

func runFailover(ctx context.Context, cfg *Config, res *Result) error {
	bin := cfg.DlockBin
	if cfg.Target == "etcd" {
		bin = cfg.EtcdBin
		if bin == "" {
			bin = "etcd"
		}
		p, err := exec.LookPath(bin)
		if err != nil {
			return fmt.Errorf("find the etcd binary (give --etcd-bin): %w", err)
		}
		bin = p
	} else if bin == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("find the dlock binary (give --dlock-bin): %w", err)
		}
		bin = exe
	}
	dir, err := os.MkdirTemp("", "bench-failover-"+cfg.Target+"-")
	if err != nil {
		return err
	}
	keep := false
	defer func() {
		if !keep {
			os.RemoveAll(dir)
		}
	}()
	base, err := loopback.FreeBase([]string{"127.0.0.1"}, loopback.Span(10*cfg.Nodes), rand.IntN)
	if err != nil {
		return err
	}
	pc := &procCluster{bin: bin}
	var initial []string
	for i := range cfg.Nodes {
		n := &procNode{id: fmt.Sprintf("n%d", i+1), client: fmt.Sprintf("127.0.0.1:%d", base+10*i),
			peer: fmt.Sprintf("127.0.0.1:%d", base+10*i+1), dir: filepath.Join(dir, fmt.Sprintf("n%d", i+1)),
			logPath: filepath.Join(dir, fmt.Sprintf("n%d.log", i+1))}
		pc.nodes = append(pc.nodes, n)
		if cfg.Target == "etcd" {
			initial = append(initial, n.id+"=http://"+n.peer)
		} else {
			initial = append(initial, n.id+"="+n.peer)
		}
	}
	if cfg.Target == "etcd" {
		pc.sys = &etcdSystem{initial: strings.Join(initial, ","), extra: cfg.ServeFlags, token: "bench-" + runID(), clients: map[string]*clientv3.Client{}}
	} else {
		c := newDlockClient([]string{pc.nodes[0].url()}, 16)
		c.calls.timeout = time.Second
		pc.sys = &dlockSystem{initial: strings.Join(initial, ","), extra: cfg.ServeFlags, c: c, probeC: &dlockClient{calls: newHTTPCaller(128, time.Second)}}
	}
	defer pc.sys.close()
	defer pc.stop()
	for _, n := range pc.nodes {
		if err := pc.start(n, true); err != nil {
			return err
		}
	}
	logf(cfg, "failover: %d %s processes (%s), logs in %s", cfg.Nodes, cfg.Target, bin, dir)
	fail := func(err error) error {
		keep = true
		return fmt.Errorf("%w (node logs kept in %s)", err, dir)
	}
	if _, err := pc.waitHealthy(ctx, 30*time.Second); err != nil {
		return fail(err)
	}
	id := runID()
	h := NewHistogram()
	for rep := range cfg.Repeat {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		leader, err := pc.waitHealthy(ctx, 60*time.Second)
		if err != nil {
			return fail(fmt.Errorf("before repetition %d: %w", rep+1, err))
		}
		var survivors []*procNode
		for _, n := range pc.nodes {
			if n != leader {
				survivors = append(survivors, n)
			}
		}
		if err := pc.sys.warm(ctx, survivors); err != nil {
			return fail(fmt.Errorf("repetition %d: connect to the survivors: %w", rep+1, err))
		}
		// One acquire through each survivor first, so the kill does not also
		// time connection or session set-up.
		for _, n := range survivors {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := pc.sys.probe(cctx, n, fmt.Sprintf("bench/%s/failover/r%d/warm-%s", id, rep, n.id))
			cancel()
			if err != nil {
				return fail(fmt.Errorf("repetition %d: warm-up acquire through %s: %w", rep+1, n.id, err))
			}
		}
		d, answeredBy, err := measureFailover(ctx, pc, leader, survivors, id, rep)
		if err != nil {
			return fail(fmt.Errorf("repetition %d: %w", rep+1, err))
		}
		h.Record(d)
		res.Samples = append(res.Samples, round3(float64(d)/float64(time.Millisecond)))
		logf(cfg, "failover %d/%d: killed leader %s, next acquire after %s (answered by %s)", rep+1, cfg.Repeat, leader.id, d.Round(time.Millisecond), answeredBy)
		if err := pc.start(leader, false); err != nil {
			return fail(err)
		}
	}
	s := h.Summarize(cfg.CDF)
	res.Ops = map[string]OpResult{"failover": {Summary: s}}
	res.Workers = 0
	res.Config["nodes"] = fmt.Sprint(cfg.Nodes)
	res.Config["repeat"] = fmt.Sprint(cfg.Repeat)
	if len(cfg.ServeFlags) > 0 {
		res.Config["serve_flags"] = strings.Join(cfg.ServeFlags, " ")
	}
	what := "an acquire (ttl_ms=10000)"
	if cfg.Target == "etcd" {
		what = "an acquire (NewSession with a 10 s lease + Mutex.Lock, through a client connected to that survivor only)"
	}
	res.Notes = append(res.Notes,
		"time from just before SIGKILL of the leader's process to the arrival of the first successful acquire answer through a survivor; "+
			"a new attempt, "+what+" with a 1 s timeout, is started every 10 ms, alternating the survivors; the killed node is restarted "+
			"from its data dir and the cluster is back to all-ready with one agreed leader before the next repetition")
	return nil
}

// measureFailover kills leader and returns the time to the first successful
// acquire through a survivor, and the id of the node that answered.
func measureFailover(ctx context.Context, pc *procCluster, leader *procNode, survivors []*procNode, id string, rep int) (time.Duration, string, error) {
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type win struct {
		at   time.Time
		node string
	}
	won := make(chan win, 1)
	var wg sync.WaitGroup
	t0 := time.Now()
	if err := pc.kill(leader); err != nil {
		return 0, "", err
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	timeout := time.NewTimer(60 * time.Second)
	defer timeout.Stop()
	defer wg.Wait()
	for attempt := 0; ; attempt++ {
		n := survivors[attempt%len(survivors)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			actx, acancel := context.WithTimeout(pctx, time.Second)
			defer acancel()
			if pc.sys.probe(actx, n, fmt.Sprintf("bench/%s/failover/r%d/a%d", id, rep, attempt)) == nil {
				select {
				case won <- win{time.Now(), n.id}:
				default:
				}
			}
		}()
		select {
		case w := <-won:
			cancel()
			return w.at.Sub(t0), w.node, nil
		case <-timeout.C:
			cancel()
			return 0, "", errors.New("no successful acquire within 60 s of the kill")
		case <-ctx.Done():
			cancel()
			return 0, "", ctx.Err()
		case <-tick.C:
		}
	}
}
