package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/dlock/dlock/fence"
	"github.com/dlock/dlock/internal/proc"
)

// --- configuration ---

func envEnabled() bool { return os.Getenv("DLOCK_CHAOS") == "1" }

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if v := os.Getenv(name); v != "" {
		if d, err := time.ParseDuration(v); err == nil && d > 0 {
			return d
		}
	}
	return def
}

// ciSeeds are the fixed seeds of the CI run (DLOCK_CHAOS_SEEDS=1,2 overrides).
var ciSeeds = []uint64{1, 2, 3}

func seedsFromEnv() []uint64 {
	v := os.Getenv("DLOCK_CHAOS_SEEDS")
	if v == "" {
		return ciSeeds
	}
	var out []uint64
	for _, s := range strings.Split(v, ",") {
		if n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64); err == nil {
			out = append(out, n)
		}
	}
	return out
}

type runConfig struct {
	seed     uint64
	duration time.Duration
	nodes    int
	implicit int // implicit-lease clients
	sessions int // session clients
	keep     bool
	dense    bool // shorter gaps and holds: about three times the faults
	// shards is --shards of every node (1: one Raft group); more runs on
	// the etcd engine (docs/reliability.md, "Sharded clusters").
	shards int
	// replicas is --shard-replicas (0: every shard on every node); below
	// nodes, the nemesis moves replicas (move-replica).
	replicas int
	// spare adds a node slot beyond nodes, out of the cluster at first,
	// which the member cycle joins, moves replicas onto and off, removes
	// and joins again (runs that move replicas only; members_test.go).
	spare bool
}

// members reports whether the run changes the membership (member cycle).
func (cfg runConfig) members() bool { return cfg.moves() && cfg.spare }

// moves reports whether the run moves replicas: its shards run on some
// of the nodes, so each has a node to move to.
func (cfg runConfig) moves() bool {
	return cfg.shards > 1 && cfg.replicas > 0 && cfg.replicas < cfg.nodes
}

func configFromEnv(seed uint64, d time.Duration) runConfig {
	return runConfig{
		seed: seed, duration: d,
		nodes:    envInt("DLOCK_CHAOS_NODES", 3),
		implicit: envInt("DLOCK_CHAOS_CLIENTS", 6),
		sessions: envInt("DLOCK_CHAOS_SESSION_CLIENTS", 2),
		keep:     os.Getenv("DLOCK_CHAOS_KEEP") == "1",
		dense:    os.Getenv("DLOCK_CHAOS_PACE") == "dense",
		shards:   envInt("DLOCK_CHAOS_SHARDS", 1),
		replicas: envInt("DLOCK_CHAOS_SHARD_REPLICAS", 0),
		spare:    os.Getenv("DLOCK_CHAOS_SPARE") == "1",
	}
}

// replayCommand is the one command that replays a run's schedule.
func replayCommand(cfg runConfig) string {
	pace := "normal"
	if cfg.dense {
		pace = "dense"
	}
	s := fmt.Sprintf("scripts/chaos.sh --duration %s --seed %d --nodes %d --clients %d --pace %s", cfg.duration, cfg.seed, cfg.nodes, cfg.implicit, pace)
	if cfg.shards > 1 {
		s += fmt.Sprintf(" --shards %d --raft-engine etcd", cfg.shards)
		if cfg.replicas > 0 {
			s += fmt.Sprintf(" --shard-replicas %d", cfg.replicas)
		}
		if cfg.spare {
			s += " --spare"
		}
	}
	return s
}

func skipUnlessEnabled(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("chaos runs are skipped under -short")
	}
	if !envEnabled() {
		t.Skip("set DLOCK_CHAOS=1 to run the fault-injection suite (see docs/reliability.md)")
	}
	if runtime.GOOS != "linux" {
		t.Skip("the chaos suite needs Linux (one loopback IP per node in 127.0.0.0/8)")
	}
}

// TestChaosCI is the short randomized run of CI: a fixed set of seeds, each
// for DLOCK_CHAOS_CI_DURATION (default 30 s) of faults.
func TestChaosCI(t *testing.T) {
	skipUnlessEnabled(t)
	d := envDuration("DLOCK_CHAOS_CI_DURATION", 30*time.Second)
	for _, seed := range seedsFromEnv() {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			runChaos(t, configFromEnv(seed, d))
		})
	}
}

// TestChaosSoak is the long run: DLOCK_CHAOS_DURATION (default 30m),
// DLOCK_CHAOS_SEED (default: drawn and printed). scripts/chaos.sh runs it.
func TestChaosSoak(t *testing.T) {
	skipUnlessEnabled(t)
	if os.Getenv("DLOCK_CHAOS_SOAK") != "1" {
		t.Skip("set DLOCK_CHAOS_SOAK=1 (scripts/chaos.sh does) for the long soak")
	}
	seed := uint64(time.Now().UnixNano() % 1_000_000_000)
	if v := os.Getenv("DLOCK_CHAOS_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("DLOCK_CHAOS_SEED=%q: %v", v, err)
		}
		seed = n
	}
	runChaos(t, configFromEnv(seed, envDuration("DLOCK_CHAOS_DURATION", 30*time.Minute)))
}

// --- the dlock binary ---

// dlock is built once, without -race: the suite is about timing, and the
// race detector slows the nodes several-fold.
var dlock = &proc.Binary{Pkg: "github.com/dlock/dlock/cmd/dlock"}

func TestMain(m *testing.M) {
	code := m.Run()
	dlock.Cleanup()
	os.Exit(code)
}

// dlockBinary returns the dlock binary to run. DLOCK_CHAOS_BIN runs a
// prebuilt one instead (to try a fix without touching the tree, or to
// bisect).
func dlockBinary(t testing.TB) string {
	t.Helper()
	if b := os.Getenv("DLOCK_CHAOS_BIN"); b != "" {
		return b
	}
	return dlock.Path(t)
}

// --- the probe: write availability ---

type probeSample struct {
	at int64
	ok bool
}

// probe keeps a session alive every 100 ms through every node at once (1 s
// timeout) and records whether the write went through somewhere.
type probe struct {
	api     *apiClient
	clk     *clock
	sid     string
	mu      sync.Mutex
	wg      sync.WaitGroup
	samples []probeSample
	stop    chan struct{}
	done    chan struct{}
}

func startProbe(api *apiClient, clk *clock, seed uint64) (*probe, error) {
	p := &probe{api: api, clk: clk, stop: make(chan struct{}), done: make(chan struct{})}
	rng := rand.New(rand.NewPCG(seed, 99)) // only for the session create
	op := &Op{Client: "probe", Kind: kSessCreate, TTL: int64(longTTL), ReqID: "probe-create"}
	h := newHistory(clk) // the probe's operations stay out of the checked history
	a := newAPIClient(api.c, h)
	a.createSession(op, rng, callOpts{attempt: 2 * time.Second, overall: 30 * time.Second})
	if op.Out != oOK {
		return nil, fmt.Errorf("probe session: %s %s", op.Out, op.Err)
	}
	p.sid = op.Session
	go func() {
		defer close(p.done)
		for {
			select {
			case <-p.stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			// The same keepalive to every node at once: the sample succeeds if
			// any node committed it within 1 s (a client that can reach every
			// node could write). Ticks do not wait for slow nodes.
			at := clk.now()
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				oks := make(chan bool, len(api.c.nodes))
				for node := range api.c.nodes {
					go func() {
						ctx, cancel := context.WithTimeout(context.Background(), time.Second)
						defer cancel()
						status, _, err := api.send(ctx, node, "POST", "/api/v1/sessions/"+p.sid+"/keepalive", sessionBody{ClientID: "probe", RequestID: fmt.Sprintf("probe-%d-%d", at, node)})
						oks <- err == nil && status == 200
					}()
				}
				ok := false
				for range api.c.nodes {
					ok = <-oks || ok
				}
				p.mu.Lock()
				p.samples = append(p.samples, probeSample{at: at, ok: ok})
				p.mu.Unlock()
			}()
		}
	}()
	return p, nil
}

func (p *probe) halt() []probeSample {
	close(p.stop)
	<-p.done
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	out := append([]probeSample(nil), p.samples...)
	sort.Slice(out, func(i, j int) bool { return out[i].at < out[j].at })
	return out
}

// outages are the periods with no successful probe write for longer than 500 ms.
func outages(s []probeSample) [][2]int64 {
	var out [][2]int64
	lastOK := int64(-1)
	for _, x := range s {
		if !x.ok {
			continue
		}
		if lastOK >= 0 && x.at-lastOK > int64(500*time.Millisecond) {
			out = append(out, [2]int64{lastOK, x.at})
		}
		lastOK = x.at
	}
	return out
}

// --- one run ---

type runReport struct {
	cfg         runConfig
	dir         string
	elapsed     time.Duration
	ops         []Op
	writes      []write
	holds       []hold
	faults      []faultEvent
	storage     []string // how storage faults ended (nemesis.note)
	anomalies   []anomaly
	notes       []string
	lin         []linResult
	fence       fenceStats
	watch       watchStats
	observe     obsStats
	probes      []probeSample
	expiryLags  []time.Duration
	waiterTimes []time.Duration
	// modelFIFO says what livenessModelFIFO saw, when it passed.
	modelFIFO    string
	line         lineStats
	healToReady  time.Duration
	maxToken     uint64
	proofs       int // grants whose token_proof verified
	retries      [4]int64
	pauses       int64
	crashes      int64
	finalHealthy bool

	// moves are the replica moves the nemesis asked for (runs with
	// --shard-replicas below the node count); anchor is the node kept a
	// replica of every shard for the merged watches ("": none needed).
	moves     moveStats
	moveList  []moveRec
	anchor    string
	moveStuck string
	// members are the member cycle's joins, moves and removals (runs
	// with a spare node).
	members memberStats

	// multiLeaderFaults counts the cluster faults that took two or more
	// shards' leaders at once (sharded runs).
	multiLeaderFaults int
}

type runner struct {
	t   *testing.T
	cfg runConfig
	rep *runReport
	clk *clock
	c   *cluster
	h   *history
	api *apiClient
	sm  shardMap // where each name lives (one shard unless cfg.shards > 1)
	mu  sync.Mutex
	log []string
}

func (r *runner) logf(format string, args ...any) {
	s := fmt.Sprintf("%s "+format, append([]any{fmtT(r.clk.now())}, args...)...)
	r.mu.Lock()
	r.log = append(r.log, s)
	r.mu.Unlock()
	if testing.Verbose() {
		r.t.Log(s)
	}
}

func (r *runner) anomaly(a anomaly) {
	r.mu.Lock()
	r.rep.anomalies = append(r.rep.anomalies, a)
	r.mu.Unlock()
	r.logf("ANOMALY %s", a.What)
}

func runChaos(t *testing.T, cfg runConfig) *runReport {
	bin := dlockBinary(t)
	dir, err := os.MkdirTemp("", fmt.Sprintf("dlock-chaos-seed%d-", cfg.seed))
	if err != nil {
		t.Fatal(err)
	}
	// A clean run's artifacts go last, once the nodes are stopped and their
	// disks unmounted (deferred below, so run before this).
	clean := false
	defer func() {
		if clean {
			_ = os.RemoveAll(dir)
		}
	}()
	rep := &runReport{cfg: cfg, dir: dir}
	r := &runner{t: t, cfg: cfg, rep: rep, clk: &clock{start: time.Now()}, sm: oneShard}
	t.Logf("chaos run: seed=%d duration=%s nodes=%d shards=%d replicas=%d clients=%d+%d sessions; artifacts in %s",
		cfg.seed, cfg.duration, cfg.nodes, max(1, cfg.shards), cfg.replicas, cfg.implicit, cfg.sessions, dir)
	t.Logf("replay: %s", replayCommand(cfg))

	rng := rand.New(rand.NewPCG(cfg.seed, 1))
	slots := cfg.nodes
	if cfg.members() {
		slots++ // the spare
	}
	c, err := newCluster(bin, dir, slots, rng)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.members() {
		c.makeSpare(cfg.nodes)
	}
	r.c = c
	c.shards = cfg.shards
	if cfg.shards > 1 {
		c.replicas = cfg.replicas
	}
	disks := c.mountDisks()
	if disks != nil {
		r.logf("disk faults off: %v", disks)
	} else {
		defer c.unmountDisks() // after shutdown (defers run in reverse)
	}
	defer c.shutdown()
	for i := range c.nodes {
		if err := c.start(i); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.waitHealthy(30*time.Second, nil); err != nil {
		t.Fatalf("the cluster did not come up: %v\n%s", err, c.logTails(40))
	}
	if r.sm, err = c.shardMapOf(cfg.shards); err != nil {
		t.Fatalf("shards: %v", err)
	}
	if cfg.moves() {
		if rep.anchor, err = r.anchorWatches(); err != nil {
			t.Fatalf("replica moves: %v\n%s", err, c.logTails(40))
		}
		if rep.anchor != "" {
			r.logf("watches are not forwarded between nodes: %s runs every shard and keeps doing so (the nemesis moves no replica off it)", rep.anchor)
		}
	}
	r.h = newHistory(r.clk)
	if err := r.h.useFence(filepath.Join(dir, "fenced-registers.db")); err != nil {
		t.Fatalf("open the fenced registers: %v", err)
	}
	defer r.h.closeFence()
	r.api = newAPIClient(c, r.h)
	if binHasFlag(bin, "grpc-addr") {
		g, err := newGRPCConns(c)
		if err != nil {
			t.Fatalf("gRPC connections: %v", err)
		}
		defer g.close()
		r.api.grpc = g
	}
	pr, err := startProbe(r.api, r.clk, cfg.seed)
	if err != nil {
		t.Fatalf("%v\n%s", err, c.logTails(40))
	}

	watchers := r.startWatchers()
	w := newWorkload(r.clk, r.h, r.api, cfg.seed, cfg.implicit, cfg.sessions, cfg.shards)
	observers := r.startObservers(w.elections())
	if cfg.shards > 1 {
		if err := workloadCoverage(r.sm, w); err != nil {
			t.Fatal(err)
		}
	}
	nem := newNemesis(c, w, r.clk, cfg.seed, r.logf)
	if cfg.shards > 1 {
		nem.faults = shardedFaults
		nem.points = splitPoints(w)
	}
	if cfg.moves() {
		nem.faults = shardedMoveFaults
		nem.moves = newMoveSet()
		nem.moves.anchor = rep.anchor
	}
	if cfg.members() {
		nem.members = newMemberCycle(nem, cfg.nodes, cfg.seed)
	}
	nem.disks = disks == nil
	if cfg.dense {
		nem.dense()
	}
	w.start()
	ln := r.startLine()
	nem.start()
	r.logf("workload, line and nemesis started")

	time.Sleep(cfg.duration)

	// Heal everything and let the cluster settle.
	r.logf("stopping the nemesis")
	nem.halt()
	for _, e := range c.healAll() {
		r.anomaly(anomaly{Kind: "harness", What: "heal: " + e.Error()})
	}
	healedAt := r.clk.now()
	took, err := c.waitHealthy(30*time.Second, nil)
	// The probe's writes would keep the replicas moving during the final
	// convergence check: it stops once the faults have.
	rep.probes = pr.halt()
	rep.healToReady = took
	if err != nil {
		r.anomaly(anomaly{Kind: "liveness:no-recovery", What: fmt.Sprintf("30 s after healing every fault: %v", err)})
	} else {
		rep.finalHealthy = true
		r.logf("cluster healthy %s after the final heal", took.Round(time.Millisecond))
	}
	if cfg.members() {
		// The member cycle finishes its step (a node joined is drained and
		// removed) against the healed cluster.
		within := 5 * time.Minute
		if !rep.finalHealthy {
			within = time.Minute // the run has failed already: do not wait long for it
		}
		nem.finishMembers(within)
		rep.members = nem.memberStats()
		r.logf("membership changes: %s", rep.members)
		if rep.members.onNonMember != "" {
			r.anomaly(anomaly{Kind: "membership:replica-on-non-member", What: rep.members.onNonMember})
		}
	}
	if cfg.moves() {
		// The moves still in flight finish against the healed cluster, and
		// then no shard may be left moving.
		nem.finishMoves(90 * time.Second)
		rep.moves, rep.moveList = nem.moveStats(healedAt)
		r.logf("replica moves: %s", rep.moves)
		if rep.finalHealthy {
			if stuck := c.movesSettled(30 * time.Second); stuck != "" {
				rep.moveStuck = stuck
				r.anomaly(anomaly{Kind: "liveness:move-stuck", What: "30 s after the moves the harness asked for ended, a move is still in flight: " + stuck})
			}
			if _, err := c.waitHealthy(30*time.Second, nil); err != nil {
				r.anomaly(anomaly{Kind: "liveness:no-recovery", What: fmt.Sprintf("after the moves settled: %v", err)})
			}
		}
	}
	if cfg.members() && rep.finalHealthy {
		if what := c.replicasOnNonMembers(); what != "" {
			r.anomaly(anomaly{Kind: "membership:replica-on-non-member", What: what})
		}
	}

	// Stop the clients: each finishes its current operation (retrying until a
	// definitive answer), releases its long locks and abandons some others.
	// The lock table is watched from now on, to time the expiries.
	var keys *fence.KeySet // read once the cluster is healthy again
	fw := r.watchFree()
	stuck := w.stop(90 * time.Second)
	if !ln.halt(90 * time.Second) {
		stuck = append(stuck, "line")
	}
	rep.line = ln.stats
	stoppedAt := r.clk.now()
	if len(stuck) > 0 {
		r.anomaly(anomaly{Kind: "liveness:client-stuck", What: fmt.Sprintf("clients %v did not finish within 90 s of the heal", stuck)})
	}
	r.logf("clients stopped")
	if cfg.shards > 1 {
		// The checkers group names by the map the cluster ends with (as
		// any node reports it, healthy or not: after a split, grouping by
		// the first map would take the two halves' tokens for one counter).
		if m, err := c.currentShardMap(); err != nil {
			r.anomaly(anomaly{Kind: "harness", What: "read the final shard map: " + err.Error()})
		} else {
			r.sm = m
			r.logf("shard map after the run: %d shards, starting at %q (ids %v)", m.n(), m.starts, m.ids)
		}
	}

	if rep.finalHealthy {
		r.livenessExpiry(stoppedAt, fw)
		r.livenessWaiters()
		r.durability()
		r.grantHistory()
		keys = r.tokenKeys()
	}
	fw.halt()
	watchersChecked := false
	if rep.finalHealthy && len(watchers.ws) > 0 {
		final, err := r.listRevisions(10 * time.Second)
		if err != nil {
			r.anomaly(anomaly{Kind: "harness", What: "final revision for the watchers: " + err.Error()})
		} else {
			watchers.halt(final, 30*time.Second)
			watchersChecked = true
		}
	}
	if !watchersChecked {
		watchers.halt(nil, 0)
	}
	if observers != nil {
		var finals map[string]obsView
		if rep.finalHealthy {
			var err error
			if finals, err = r.finalElections(c.leaderOrZero(), w.elections()); err != nil {
				r.anomaly(anomaly{Kind: "harness", What: "final elections for the observers: " + err.Error()})
			}
		}
		observers.halt(finals, 30*time.Second)
	}
	rep.faults = nem.schedule()
	for _, f := range rep.faults {
		if f.LeadersHit >= 2 {
			rep.multiLeaderFaults++
		}
	}
	rep.storage = nem.storageOutcomes()
	rep.pauses, rep.crashes = w.pauses.Load(), w.crashes.Load()
	rep.retries = [4]int64{r.api.retries503.Load(), r.api.retries5xx.Load(), r.api.retriesNet.Load(), r.api.internal500.Load()}
	c.shutdown()
	for _, p := range c.logProblems() {
		if strings.Contains(p, "panic:") || strings.Contains(p, "fatal error:") || strings.Contains(p, "DATA RACE") {
			r.anomaly(anomaly{Kind: "crash", What: p})
		} else {
			rep.notes = append(rep.notes, p)
		}
	}

	// Check the history.
	rep.ops, rep.writes, rep.holds = r.h.snapshot()
	rep.anomalies = append(rep.anomalies, checkHolds(rep.ops, rep.holds)...)
	rep.anomalies = append(rep.anomalies, checkModelHolds(rep.ops, rep.holds)...)
	rep.anomalies = append(rep.anomalies, checkTokens(rep.ops, r.sm)...)
	if cfg.moves() && rep.moves.finished == 0 {
		// A run that should move replicas but finished no move did not
		// test what it is for.
		rep.anomalies = append(rep.anomalies, anomaly{Kind: "harness:no-move", What: fmt.Sprintf("the run moves replicas but finished no move (%s)", rep.moves)})
	}
	if cfg.members() && (rep.members.joined == 0 || rep.members.onto == 0 || rep.members.removed == 0) {
		// A run with a spare that never joined it, moved a replica onto
		// it and removed it did not test what it is for.
		rep.anomalies = append(rep.anomalies, anomaly{Kind: "harness:no-member-cycle", What: fmt.Sprintf("the run changes the membership but did not join, move onto and remove a node (%s)", rep.members)})
	}
	if keys != nil {
		pa, n := checkProofs(rep.ops, keys)
		rep.anomalies = append(rep.anomalies, pa...)
		rep.proofs = n
	}
	fa, fs := checkFence(rep.ops, rep.writes)
	rep.anomalies = append(rep.anomalies, fa...)
	rep.fence = fs
	rep.anomalies = append(rep.anomalies, checkSessions(rep.ops)...)
	rep.anomalies = append(rep.anomalies, checkConflictHolders(rep.ops)...)
	rep.anomalies = append(rep.anomalies, checkAPI(rep.ops, healedAt, rep.retries[3])...)
	if watchersChecked {
		wa, ws := checkWatchers(watchers, rep.ops, r.sm)
		rep.anomalies = append(rep.anomalies, wa...)
		rep.watch = ws
	}
	if observers != nil && observers.finals != nil {
		oa, ost := observers.check(rep.ops)
		rep.anomalies = append(rep.anomalies, oa...)
		rep.observe = ost
	}
	perLock := envDuration("DLOCK_CHAOS_LIN_TIMEOUT", 60*time.Second)
	rep.lin = checkLinearizable(rep.ops, perLock, dir)
	for _, l := range rep.lin {
		if l.result == porcupine.Illegal {
			d := l.detail
			if l.html != "" {
				d += "  visualization: " + l.html + "\n"
			}
			rep.anomalies = append(rep.anomalies, anomaly{Kind: "safety:not-linearizable",
				What: fmt.Sprintf("the history of %s (%d operations) is not linearizable against the design.md §3 model", l.lock, l.ops), Detail: d})
		}
	}
	rep.elapsed = time.Duration(r.clk.now())
	if err := dumpJSON(filepath.Join(dir, "history.jsonl"), rep.ops, rep.writes, rep.holds, rep.faults); err != nil {
		t.Logf("write history: %v", err)
	}
	summary := r.summary()
	_ = os.WriteFile(filepath.Join(dir, "report.txt"), []byte(summary), 0o644)
	t.Log("\n" + summary)
	if len(rep.anomalies) > 0 {
		var b strings.Builder
		fmt.Fprintf(&b, "chaos run with seed %d found %d anomalies (artifacts kept in %s; replay: %s):\n", cfg.seed, len(rep.anomalies), dir, replayCommand(cfg))
		for i, a := range rep.anomalies {
			if i == 25 {
				fmt.Fprintf(&b, "... and %d more (see %s/report.txt)\n", len(rep.anomalies)-i, dir)
				break
			}
			fmt.Fprintf(&b, "%d. %s\n", i+1, a.String())
		}
		b.WriteString("nemesis schedule:\n")
		for _, f := range rep.faults {
			fmt.Fprintf(&b, "  %s\n", f.String())
		}
		b.WriteString(c.logTails(30))
		t.Errorf("%s", b.String())
	} else if !cfg.keep {
		clean = true
	}
	return rep
}

// freeWatcher polls the lock table (every 100 ms, through the leader) and
// remembers, per lock, when it was last seen held and first seen free after
// that.
type freeWatcher struct {
	mu       sync.Mutex
	lastHeld map[string]int64
	freeAt   map[string]int64
	current  []string // the last answer's held/waited locks, described
	empty    bool     // the last answer listed nothing
	polled   int64    // when the last answer came
	stop     chan struct{}
	done     chan struct{}
}

func (r *runner) watchFree() *freeWatcher {
	fw := &freeWatcher{lastHeld: map[string]int64{}, freeAt: map[string]int64{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(fw.done)
		for {
			var ans struct {
				Locks []struct {
					Name    string      `json:"name"`
					Held    bool        `json:"held"`
					Holder  *holderJSON `json:"holder"`
					Waiters int         `json:"waiters"`
				} `json:"locks"`
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			code, err := getJSON(ctx, r.c.nodes[r.c.leaderOrZero()].url()+"/api/v1/locks?limit=10000", &ans)
			cancel()
			now := r.clk.now()
			if err == nil && code == 200 {
				fw.mu.Lock()
				still := map[string]bool{}
				fw.current = fw.current[:0]
				for _, l := range ans.Locks {
					still[l.Name] = true
					fw.lastHeld[l.Name] = now
					delete(fw.freeAt, l.Name)
					desc := fmt.Sprintf("%s (held=%v waiters=%d", l.Name, l.Held, l.Waiters)
					if l.Holder != nil {
						desc += fmt.Sprintf(" holder %s token %d", l.Holder.ClientID, l.Holder.FencingToken)
					}
					fw.current = append(fw.current, desc+")")
				}
				for name := range fw.lastHeld {
					if _, ok := fw.freeAt[name]; !ok && !still[name] {
						fw.freeAt[name] = now
					}
				}
				fw.empty = len(ans.Locks) == 0
				fw.polled = now
				fw.mu.Unlock()
			}
			select {
			case <-fw.stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return fw
}

func (fw *freeWatcher) halt() {
	select {
	case <-fw.stop:
	default:
		close(fw.stop)
	}
	<-fw.done
}

// livenessExpiry: once the clients are gone, every lock whose holder
// abandoned it is free within its TTL plus 5 s of the holder's bound (the
// lease's earliest possible end), and nothing is left waiting.
func (r *runner) livenessExpiry(stoppedAt int64, fw *freeWatcher) {
	ops := r.h.snapshotOps()
	lb := computeLeaseBounds(ops)
	type last struct {
		op    Op
		bound int64
		ttl   int64
	}
	lastGrant := map[string]last{}
	released := map[string]bool{}
	for _, o := range ops {
		if o.Kind == kRelease && o.Out == oOK {
			released[o.Lease] = true
		}
	}
	for _, o := range ops {
		if o.Kind != kAcquire || o.Out != oOK {
			continue
		}
		b, ttl := lb.implicit[o.OutLease], o.TTL
		if o.Session != "" {
			b = lb.session[o.Session]
			ttl = int64(4 * time.Second)
		}
		if prev, ok := lastGrant[o.Lock]; !ok || o.OutToken > prev.op.OutToken {
			lastGrant[o.Lock] = last{op: o, bound: b, ttl: ttl}
		}
	}
	deadline := time.Now().Add(4*time.Second + 10*time.Second)
	for {
		fw.mu.Lock()
		empty, polled, current := fw.empty, fw.polled, append([]string(nil), fw.current...)
		fw.mu.Unlock()
		if empty && polled > stoppedAt {
			break
		}
		if time.Now().After(deadline) {
			r.anomaly(anomaly{Kind: "liveness:lock-stays-held",
				What: fmt.Sprintf("14 s after the clients stopped (%s) these locks are still held or waited for: %s", fmtT(stoppedAt), strings.Join(current, ", "))})
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	fw.halt()
	// Elections are not in the lock list: their seats must empty too.
	checked := map[string]bool{}
	for _, o := range ops {
		if !isElection(o.Lock) || o.Kind != kAcquire || checked[o.Lock] {
			continue
		}
		checked[o.Lock] = true
		var v string
		for time.Now().Before(deadline) {
			var err error
			if v, err = r.readKey(r.c.leaderOrZero(), o.Lock, false); err == nil && strings.HasPrefix(v, "no leader campaigners=0") {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if !strings.HasPrefix(v, "no leader campaigners=0") {
			r.anomaly(anomaly{Kind: "liveness:lock-stays-held", What: fmt.Sprintf("election %s still has %s 14 s after the clients stopped", realName(o.Lock), v)})
		}
	}
	fw.mu.Lock()
	defer fw.mu.Unlock()
	for name, g := range lastGrant {
		f, ok := fw.freeAt[name]
		if !ok || g.bound == 0 {
			continue
		}
		// Only leases that ended by expiry (or a session delete) say
		// something about expiry, and only if the lock was still held when
		// the watch began.
		if released[g.op.OutLease] || g.op.TTL == int64(longTTL) {
			continue
		}
		if _, seenHeld := fw.lastHeld[name]; !seenHeld {
			continue
		}
		lag := time.Duration(f - g.bound)
		r.rep.expiryLags = append(r.rep.expiryLags, lag)
		if lag > time.Duration(g.ttl)+5*time.Second {
			r.anomaly(anomaly{Kind: "liveness:slow-expiry",
				What: fmt.Sprintf("%s was freed %s after its holder's bound (%s), more than its TTL + 5 s", name, lag.Round(time.Millisecond), fmtT(g.bound))})
		}
		if lag < -int64ms(200) {
			// Freed before the holder's bound: the model checks this
			// precisely; here it is only noted.
			r.logf("%s seen free %s before its holder's bound", name, (-lag).Round(time.Millisecond))
		}
	}
}

func int64ms(n int64) time.Duration { return time.Duration(n) * time.Millisecond }

func (h *history) snapshotOps() []Op {
	ops, _, _ := h.snapshot()
	return ops
}

func (c *cluster) leaderOrZero() int {
	if l := c.leader(); l >= 0 {
		return l
	}
	return 0
}

// livenessWaiters: live waiters are served — after a lease expires, after a
// release, and in FIFO order. Their operations join the checked history.
func (r *runner) livenessWaiters() {
	rng := rand.New(rand.NewPCG(r.cfg.seed, 77))
	base := 100
	opts := callOpts{attempt: 3 * time.Second, overall: 30 * time.Second}
	mk := func(proc int, client, kind, lock string) *Op {
		return &Op{Proc: base + proc, Client: client, Kind: kind, Lock: lock, ReqID: fmt.Sprintf("%s-%s-%d", client, kind, r.clk.now())}
	}
	acquire := func(proc int, client, lock string, ttl, wait time.Duration) *Op {
		op := mk(proc, client, kAcquire, lock)
		op.TTL, op.Wait = int64(ttl), int64(wait)
		o := opts
		if wait > 0 {
			o.attempt = 2 * time.Second
		}
		r.api.acquire(op, rng, o)
		return op
	}
	release := func(proc int, g *Op) *Op {
		op := mk(proc, g.Client, kRelease, g.Lock)
		op.Token, op.Lease = g.OutToken, g.OutLease
		r.api.releaseOrRenew(op, rng, opts)
		return op
	}

	// 1. Holders that go away (TTL 1, 2, 4 s): their waiters get the locks
	// once the leases expire — not before the holders' bounds (the model
	// checks that), and at most 5 s after.
	var wg1 sync.WaitGroup
	var mu1 sync.Mutex
	for k, ttl := range []time.Duration{time.Second, time.Second, 2 * time.Second, 2 * time.Second, 4 * time.Second, 4 * time.Second} {
		wg1.Add(1)
		go func() {
			defer wg1.Done()
			lock := fmt.Sprintf("live/expire/%d", k)
			h := acquire(20+2*k, fmt.Sprintf("live-h%d", k), lock, ttl, 0)
			if h.Out != oOK {
				r.anomaly(anomaly{Kind: "liveness:waiter", What: lock + ": the holder's acquire failed: " + h.String()})
				return
			}
			w := acquire(21+2*k, fmt.Sprintf("live-w%d", k), lock, 10*time.Second, 20*time.Second)
			if w.Out != oOK {
				r.anomaly(anomaly{Kind: "liveness:waiter", What: lock + ": the waiter was not served after the holder went away: " + w.String()})
				return
			}
			served := time.Duration(w.Return - (h.Call + h.TTL))
			mu1.Lock()
			r.rep.waiterTimes = append(r.rep.waiterTimes, served)
			r.rep.expiryLags = append(r.rep.expiryLags, served)
			mu1.Unlock()
			if served > 5*time.Second {
				r.anomaly(anomaly{Kind: "liveness:waiter", What: fmt.Sprintf("%s: the waiter was served only %s after the holder's bound (TTL %s)", lock, served, ttl)})
			}
			release(21+2*k, w)
		}()
	}
	wg1.Wait()

	// 2. A holder that releases: its waiter gets the lock at once.
	h2 := acquire(2, "live-h2", "live/release", longTTL, 0)
	if h2.Out == oOK {
		done := make(chan *Op, 1)
		go func() { done <- acquire(3, "live-w2", "live/release", longTTL, 20*time.Second) }()
		time.Sleep(500 * time.Millisecond)
		rel := release(2, h2)
		w2 := <-done
		if w2.Out != oOK {
			r.anomaly(anomaly{Kind: "liveness:waiter", What: "live/release: the waiter was not served after the release: " + w2.String()})
		} else {
			served := time.Duration(w2.Return - rel.Return)
			r.rep.waiterTimes = append(r.rep.waiterTimes, served)
			if served > 3*time.Second {
				r.anomaly(anomaly{Kind: "liveness:waiter", What: fmt.Sprintf("live/release: the waiter was served %s after the release was answered", served)})
			}
			release(3, w2)
		}
	}

	// 3. FIFO: three waiters queued one after the other get the lock in order.
	h3 := acquire(4, "live-h3", "live/fifo", longTTL, 0)
	if h3.Out != oOK {
		return
	}
	type res struct {
		i  int
		op *Op
	}
	got := make(chan res, 3)
	var fifoWG sync.WaitGroup
	defer fifoWG.Wait() // the releases finish before the durability checks
	for i := range 3 {
		fifoWG.Add(1)
		go func() {
			defer fifoWG.Done()
			op := acquire(5+i, fmt.Sprintf("live-f%d", i), "live/fifo", longTTL, 20*time.Second)
			got <- res{i, op}
			if op.Out == oOK {
				time.Sleep(100 * time.Millisecond)
				release(5+i, op)
			}
		}()
		// Wait until it is queued before starting the next one.
		r.api.get(mk(9, "live-reader", kGet, "live/fifo"), rng, opts)
		r.waitQueued("live/fifo", i+1, r.c.leaderOrZero(), 5*time.Second, nil)
	}
	release(4, h3)
	var order []res
	for range 3 {
		select {
		case x := <-got:
			order = append(order, x)
		case <-time.After(30 * time.Second):
			r.anomaly(anomaly{Kind: "liveness:waiter", What: "live/fifo: a waiter got no answer within 30 s"})
			return
		}
	}
	sort.Slice(order, func(a, b int) bool { return order[a].op.OutToken < order[b].op.OutToken })
	for k, x := range order {
		if x.op.Out != oOK || x.i != k {
			var desc []string
			for _, y := range order {
				desc = append(desc, y.op.String())
			}
			r.anomaly(anomaly{Kind: "liveness:fifo", What: "live/fifo: waiters were not served in the order they queued:\n    " + strings.Join(desc, "\n    ")})
			break
		}
	}
	r.livenessModelFIFO(rng, acquire, release)
}

// livenessModelFIFO: the line holds through the lock model, in a quiet
// cluster. A subtree request waiting for a holder inside its subtree gets
// the lock when that holder releases, before a later request inside the
// subtree (which waits behind it though nothing holds its name); and a
// shared request that comes after a waiting exclusive one is served after
// it.
func (r *runner) livenessModelFIFO(rng *rand.Rand, acquire func(proc int, client, lock string, ttl, wait time.Duration) *Op, release func(proc int, g *Op) *Op) {
	opts := callOpts{attempt: 3 * time.Second, overall: 30 * time.Second}
	kinded := func(proc int, client, lock string, shared, subtree bool) chan *Op {
		ch := make(chan *Op, 1)
		go func() {
			op := &Op{Proc: 100 + proc, Client: client, Kind: kAcquire, Lock: lock, ReqID: fmt.Sprintf("%s-%s-%d", client, kAcquire, r.clk.now()),
				TTL: int64(longTTL), Wait: int64(20 * time.Second), Shared: shared, Subtree: subtree}
			a := opts
			a.attempt = 2 * time.Second
			r.api.acquire(op, rng, a)
			ch <- op
		}()
		return ch
	}
	queued := func(lock string, n int) { r.waitQueued(lock, n, r.c.leaderOrZero(), 5*time.Second, nil) }
	fail := func(what string, ops ...*Op) {
		var desc []string
		for _, o := range ops {
			desc = append(desc, o.String())
		}
		r.anomaly(anomaly{Kind: "liveness:fifo", What: what + ":\n    " + strings.Join(desc, "\n    ")})
	}
	wait := func(ch chan *Op) *Op {
		select {
		case op := <-ch:
			return op
		case <-time.After(30 * time.Second):
			return &Op{Out: oUnknown}
		}
	}

	// A subtree waiter, then a request inside the subtree behind it.
	h := acquire(40, "live-tree-h", "live/tree/a", longTTL, 0)
	if h.Out != oOK {
		fail("live/tree: the holder inside the subtree was not granted", h)
		return
	}
	sub := kinded(41, "live-tree-sub", "live/tree", false, true)
	queued("live/tree", 1)
	in := kinded(42, "live-tree-in", "live/tree/b", false, false)
	queued("live/tree/b", 1)
	release(40, h)
	s := wait(sub)
	select {
	case op := <-in:
		fail("live/tree: a request inside the subtree was served while the subtree waiter held it", s, op)
		return
	case <-time.After(300 * time.Millisecond):
	}
	if s.Out != oOK {
		fail("live/tree: the subtree waiter was not served after the holder inside released", h, s)
		return
	}
	relS := release(41, s)
	i := wait(in)
	if i.Out != oOK || i.OutToken <= s.OutToken || i.Return < relS.Call {
		fail("live/tree: the request inside the subtree was not served after the subtree holder, in turn", s, relS, i)
		return
	}
	release(42, i)

	// A reader holds; a writer waits; a later reader waits behind the writer.
	rd := kinded(43, "live-rw-r1", "live/rw", true, false)
	r1 := wait(rd)
	if r1.Out != oOK {
		fail("live/rw: the first reader was not granted", r1)
		return
	}
	wr := kinded(44, "live-rw-w", "live/rw", false, false)
	queued("live/rw", 1)
	late := kinded(45, "live-rw-r2", "live/rw", true, false)
	queued("live/rw", 2)
	release(43, r1)
	w := wait(wr)
	select {
	case op := <-late:
		fail("live/rw: the later reader was served while the writer ahead of it held the lock", w, op)
		return
	case <-time.After(300 * time.Millisecond):
	}
	if w.Out != oOK {
		fail("live/rw: the writer was not served after the reader released", r1, w)
		return
	}
	relW := release(44, w)
	r2 := wait(late)
	if r2.Out != oOK || r2.OutToken <= w.OutToken || r2.Return < relW.Call {
		fail("live/rw: the later reader was not served after the writer", w, relW, r2)
		return
	}
	release(45, r2)
	r.rep.modelFIFO = fmt.Sprintf("subtree waiter (token %d) served before the later request inside it (token %d); writer (token %d) before the later reader (token %d)",
		s.OutToken, i.OutToken, w.OutToken, r2.OutToken)
}

// durability: after healing, the replicas converge (same applied index, same
// last fencing token, same lock table), no acknowledged token is above the
// cluster's counter, and a new grant gets a token above every one ever
// acknowledged.
// tokenKeys reads the published token keys, which verify every grant's
// proof offline (checkProofs); a failure is a harness anomaly.
func (r *runner) tokenKeys() *fence.KeySet {
	var errs []string
	for i := range r.c.nodes {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ks, err := fence.FetchKeySet(ctx, nil, r.c.nodes[i].url())
		cancel()
		if err == nil {
			return ks
		}
		errs = append(errs, err.Error())
	}
	r.anomaly(anomaly{Kind: "harness", What: "read the token keys: " + strings.Join(errs, "; ")})
	return nil
}

func (r *runner) durability() {
	// Each shard counts its own tokens: the highest acknowledged per shard.
	maxTok := make([]uint64, r.sm.n())
	for _, o := range r.h.snapshotOps() {
		if o.Kind == kAcquire && o.Out == oOK {
			k := r.sm.of(o.Lock)
			maxTok[k] = max(maxTok[k], o.OutToken)
			r.rep.maxToken = max(r.rep.maxToken, o.OutToken)
		}
	}
	if d := r.c.checkpointDivergence(); d != "" {
		r.anomaly(anomaly{Kind: "durability:replicas-diverge", What: "FSM checkpoints differ (first divergence): " + d})
	}
	var views []clusterView
	deadline := time.Now().Add(15 * time.Second)
	for {
		views = views[:0]
		same := true
		for i := range r.c.nodes {
			if !r.c.in(i) {
				continue // a spare out of the cluster
			}
			v, err := r.c.view(i, time.Second)
			if err != nil {
				same = false
				break
			}
			if len(views) > 0 && !sameState(v, views[0]) {
				same = false
			}
			views = append(views, v)
		}
		if same {
			break
		}
		if time.Now().After(deadline) {
			r.anomaly(anomaly{Kind: "durability:replicas-diverge", What: fmt.Sprintf("15 s after healing the replicas still differ: %+v", views)})
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	groups := views[0].groupViews()
	if len(groups) != r.sm.n() {
		r.anomaly(anomaly{Kind: "harness", What: fmt.Sprintf("the cluster reports %d groups, the harness routes over %d shards", len(groups), r.sm.n())})
		return
	}
	for k, g := range groups {
		if g.LastToken < maxTok[k] {
			r.anomaly(anomaly{Kind: "durability:token-lost", What: fmt.Sprintf("%sthe last fencing token is %d but token %d was acknowledged", shardPrefix(r.sm, k), g.LastToken, maxTok[k])})
		}
	}
	// Every replica's own (stale) view of every lock equals the leader's
	// linearizable one.
	var names []string
	seen := map[string]bool{}
	for _, o := range r.h.snapshotOps() {
		if o.Lock != "" && !seen[o.Lock] {
			seen[o.Lock] = true
			names = append(names, o.Lock)
		}
	}
	sort.Strings(names)
	leader := r.c.leaderOrZero()
	for _, name := range names {
		ref, err := r.readKey(leader, name, false)
		if err != nil {
			continue
		}
		for i := range r.c.nodes {
			if !r.c.in(i) {
				continue
			}
			// A follower may lag a moment behind the leader: retry for 2 s.
			var v string
			for try := 0; try < 20; try++ {
				if try > 0 {
					time.Sleep(100 * time.Millisecond)
				}
				if v, err = r.readKey(i, name, true); err == nil && v == ref {
					break
				}
			}
			if v != ref {
				r.anomaly(anomaly{Kind: "durability:replicas-diverge", What: fmt.Sprintf("%s on %s (stale read): %s; leader's linearizable read: %s", name, r.c.nodes[i].id, v, ref)})
			}
		}
	}
	// A fresh grant is above everything acknowledged (on each shard, above
	// everything that shard acknowledged).
	rng := rand.New(rand.NewPCG(r.cfg.seed, 88))
	for k := range r.sm.n() {
		name, err := r.sm.nameIn(k, "final", "token")
		if err != nil {
			r.anomaly(anomaly{Kind: "harness", What: err.Error()})
			continue
		}
		op := &Op{Proc: 120, Client: "final", Kind: kAcquire, Lock: name, TTL: int64(time.Second), ReqID: fmt.Sprintf("final-%d", k+1)}
		r.api.acquire(op, rng, callOpts{attempt: 3 * time.Second, overall: 20 * time.Second})
		if op.Out != oOK {
			r.anomaly(anomaly{Kind: "liveness:final-acquire", What: shardPrefix(r.sm, k) + "a fresh acquire after healing failed: " + op.String()})
		} else if op.OutToken <= maxTok[k] {
			r.anomaly(anomaly{Kind: "safety:token-order", What: fmt.Sprintf("%sa fresh grant after healing got token %d, not above the highest acknowledged %d", shardPrefix(r.sm, k), op.OutToken, maxTok[k])})
		}
	}
}

// shardPrefix starts a message about shard k of a sharded cluster.
func shardPrefix(m shardMap, k int) string {
	if m.n() <= 1 {
		return ""
	}
	return fmt.Sprintf("shard %d: ", m.id(k))
}

// listRevisions reads, through the nodes in turn, the revision of every
// group from a linearizable list of everything: per shard on a sharded
// cluster, the one revision otherwise.
func (r *runner) listRevisions(within time.Duration) ([]uint64, error) {
	deadline := time.Now().Add(within)
	var lastErr error
	for try := 0; ; try++ {
		base := r.c.nodes[(r.c.leaderOrZero()+try)%len(r.c.nodes)].url()
		revs, err := listRevisionsAt(base, r.sm.n(), time.Second)
		if err == nil {
			return revs, nil
		}
		lastErr = err
		if time.Now().After(deadline) {
			return nil, lastErr
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// listRevisionsAt lists one lock through base and returns the revision of
// each group the answer was read at, by shard id: at least n of them.
func listRevisionsAt(base string, n int, d time.Duration) ([]uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var ans struct {
		Revision  uint64            `json:"revision"`
		Revisions map[string]uint64 `json:"revisions"`
	}
	code, err := getJSON(ctx, base+"/api/v1/locks?limit=1", &ans)
	if err == nil && code != 200 {
		err = fmt.Errorf("status %d", code)
	}
	if err != nil {
		return nil, fmt.Errorf("list through %s: %w", base, err)
	}
	if n <= 1 {
		return []uint64{ans.Revision}, nil
	}
	out := make([]uint64, max(n, len(ans.Revisions)))
	for k := range out {
		v, ok := ans.Revisions[strconv.Itoa(k)]
		if !ok {
			return nil, fmt.Errorf("list through %s: no revision for shard %d in %v", base, k, ans.Revisions)
		}
		out[k] = v
	}
	return out, nil
}

// readKey reads a lock or an election on one node and renders what matters
// for comparing replicas.
func (r *runner) readKey(node int, key string, stale bool) (string, error) {
	url := r.c.nodes[node].url() + lockPath(key, "")
	if stale {
		url += "?stale=true"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var v struct {
		Held        bool        `json:"held"`
		Holder      *holderJSON `json:"holder"`
		Waiters     int         `json:"waiters"`
		Leader      *leaderJSON `json:"leader"`
		Campaigners int         `json:"campaigners"`
	}
	code, err := getJSON(ctx, url, &v)
	if err == nil && code != 200 {
		err = fmt.Errorf("status %d", code)
	}
	if err != nil {
		return "", err
	}
	switch {
	case isElection(key) && v.Leader != nil:
		return fmt.Sprintf("leader %s/%d %q campaigners=%d", v.Leader.CandidateID, v.Leader.FencingToken, v.Leader.Value, v.Campaigners), nil
	case isElection(key):
		return fmt.Sprintf("no leader campaigners=%d", v.Campaigners), nil
	case v.Holder != nil:
		return fmt.Sprintf("held=%v %s/%d waiters=%d", v.Held, v.Holder.ClientID, v.Holder.FencingToken, v.Waiters), nil
	}
	return fmt.Sprintf("held=%v waiters=%d", v.Held, v.Waiters), nil
}

// --- the report ---

func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

func (r *runner) summary() string {
	rep := r.rep
	var b strings.Builder
	pace := "normal"
	if rep.cfg.dense {
		pace = "dense"
	}
	shards := ""
	if rep.cfg.shards > 1 {
		shards = fmt.Sprintf(", %d shards (etcd engine)", rep.cfg.shards)
	}
	fmt.Fprintf(&b, "=== dlock chaos report: seed %d, %s of faults (%s pace), %s in all, %d nodes%s, %d+%d clients\n",
		rep.cfg.seed, rep.cfg.duration, pace, rep.elapsed.Round(time.Second), rep.cfg.nodes, shards, rep.cfg.implicit, rep.cfg.sessions)
	// operations
	type kk struct{ kind, out string }
	counts := map[kk]int{}
	for _, o := range rep.ops {
		counts[kk{o.Kind, o.Out}]++
	}
	var keys []kk
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].kind != keys[j].kind {
			return keys[i].kind < keys[j].kind
		}
		return keys[i].out < keys[j].out
	})
	var viaGRPC [3]int // lock, election and session calls
	viaWS := 0
	for _, o := range rep.ops {
		if len(o.Via) > 0 {
			switch last := o.Via[len(o.Via)-1]; {
			case strings.HasSuffix(last, "/grpc"):
				switch {
				case o.Kind == kSessCreate || o.Kind == kKeepAlive || o.Kind == kSessDelete:
					viaGRPC[2]++
				case isElection(o.Lock):
					viaGRPC[1]++
				default:
					viaGRPC[0]++
				}
			case strings.HasSuffix(last, "/ws"):
				viaWS++
			}
		}
	}
	fmt.Fprintf(&b, "operations: %d (over gRPC: %d lock, %d election and %d session calls; over WebSocket %d lock calls; the rest HTTP)\n",
		len(rep.ops), viaGRPC[0], viaGRPC[1], viaGRPC[2], viaWS)
	for _, k := range keys {
		fmt.Fprintf(&b, "  %-15s %-18s %d\n", k.kind, k.out, counts[k])
	}
	fmt.Fprintf(&b, "retries: %d on 503/429, %d on other 5xx (%d were 500), %d on connection errors/timeouts\n", rep.retries[0], rep.retries[1], rep.retries[3], rep.retries[2])
	fmt.Fprintf(&b, "token proofs verified: %d\n", rep.proofs)
	fmt.Fprintf(&b, "holds: %d; fenced writes: %d (accepted %d, rejected %d); GC-pause writes: %d (rejected %d, accepted after a newer grant because its holder had not written yet %d)\n",
		len(rep.holds), rep.fence.writes, rep.fence.accepted, rep.fence.rejected, rep.fence.pausedWrites, rep.fence.pausedRejected, rep.fence.pausedAcceptedAfterNewerGrant)
	fmt.Fprintf(&b, "lock-model holds: %s\n", modelStats(rep.holds))
	fmt.Fprintf(&b, "watches: %s\n", rep.watch)
	if rep.observe.observers > 0 {
		fmt.Fprintf(&b, "election observers: %s\n", rep.observe)
	}
	fmt.Fprintf(&b, "highest token acknowledged: %d\n", rep.maxToken)
	if rep.cfg.shards > 1 {
		// Per shard: grants and the names they were on.
		grants := make([]int, r.sm.n())
		names := make([]map[string]bool, r.sm.n())
		for _, o := range rep.ops {
			if o.Kind == kAcquire && o.Out == oOK {
				k := r.sm.of(o.Lock)
				grants[k]++
				if names[k] == nil {
					names[k] = map[string]bool{}
				}
				names[k][o.Lock] = true
			}
		}
		var per []string
		for k := range grants {
			per = append(per, fmt.Sprintf("shard %d: %d grants on %d names", r.sm.id(k), grants[k], len(names[k])))
		}
		fmt.Fprintf(&b, "per shard: %s\n", strings.Join(per, "; "))
		fmt.Fprintf(&b, "cluster faults that took two or more shard leaders at once: %d of %d\n", rep.multiLeaderFaults, rep.clusterFaults())
		if rep.cfg.moves() {
			anchor := "every node may lose a replica (watches forward)"
			if rep.anchor != "" {
				anchor = rep.anchor + " kept a replica of every shard, for the merged watches (watches are not forwarded)"
			}
			fmt.Fprintf(&b, "replica moves (each shard on %d of %d nodes; %s): %s\n", rep.cfg.replicas, rep.cfg.nodes, anchor, rep.moves)
			if rep.cfg.members() {
				fmt.Fprintf(&b, "membership changes (a spare node %s joined, filled, drained and removed over and over): %s\n", fmt.Sprintf("n%d", rep.cfg.nodes+1), rep.members)
			}
			var reps []string
			for k := range r.sm.n() {
				reps = append(reps, fmt.Sprintf("%d=%s", r.sm.id(k), strings.Join(r.sm.hosts(k), ",")))
			}
			fmt.Fprintf(&b, "replicas at the end: %s\n", strings.Join(reps, " "))
		}
	}
	// faults
	var clusterFaultsN int
	var recov []time.Duration
	recovByKind := map[string][]time.Duration{}
	for _, f := range rep.faults {
		if f.Kind != fClientPause && f.Kind != fClientCrash {
			clusterFaultsN++
			if f.Healthy > 0 {
				d := time.Duration(f.Healthy - f.Heal)
				recov = append(recov, d)
				recovByKind[f.Kind] = append(recovByKind[f.Kind], d)
			}
		}
	}
	fmt.Fprintf(&b, "faults: %d (%d cluster, %d client); by kind: %s\n", len(rep.faults), clusterFaultsN, len(rep.faults)-clusterFaultsN, strings.Join(countByKind(rep.faults), " "))
	if len(rep.storage) > 0 {
		fmt.Fprintf(&b, "storage faults ended: %s\n", strings.Join(rep.storage, "; "))
	}
	fmt.Fprintf(&b, "client pauses past the TTL taken while holding: %d; client crashes: %d\n", rep.pauses, rep.crashes)
	fmt.Fprintf(&b, "recovery (heal → every node ready, one leader): p50 %s, p99 %s, max %s\n",
		pct(recov, 0.5).Round(time.Millisecond), pct(recov, 0.99).Round(time.Millisecond), pct(recov, 1).Round(time.Millisecond))
	var kinds []string
	for k := range recovByKind {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		fmt.Fprintf(&b, "  %-30s n=%-3d p50 %-8s max %s\n", k, len(recovByKind[k]), pct(recovByKind[k], 0.5).Round(time.Millisecond), pct(recovByKind[k], 1).Round(time.Millisecond))
	}
	// Per fault: the longest stretch without a successful write between the
	// fault and the cluster being healthy again.
	outByKind := map[string][]time.Duration{}
	for _, f := range rep.faults {
		if f.Kind == fClientPause || f.Kind == fClientCrash {
			continue
		}
		end := f.Healthy
		if end == 0 {
			end = f.Heal + int64(20*time.Second)
		}
		last := int64(-1)
		var worst time.Duration
		for _, x := range rep.probes {
			if !x.ok {
				continue
			}
			if x.at > end {
				if last >= 0 {
					worst = max(worst, time.Duration(x.at-last))
				}
				break
			}
			if x.at >= f.Start && last >= 0 {
				worst = max(worst, time.Duration(x.at-last))
			}
			last = x.at
		}
		outByKind[f.Kind] = append(outByKind[f.Kind], worst)
	}
	b.WriteString("longest write outage per fault (fault start → healthy; the probe ticks every 100 ms):\n")
	var okinds []string
	for k := range outByKind {
		okinds = append(okinds, k)
	}
	sort.Strings(okinds)
	for _, k := range okinds {
		fmt.Fprintf(&b, "  %-30s n=%-3d p50 %-8s max %s\n", k, len(outByKind[k]), pct(outByKind[k], 0.5).Round(time.Millisecond), pct(outByKind[k], 1).Round(time.Millisecond))
	}
	outs := outages(rep.probes)
	var od []time.Duration
	var total time.Duration
	for _, o := range outs {
		d := time.Duration(o[1] - o[0])
		od = append(od, d)
		total += d
	}
	okN := 0
	for _, s := range rep.probes {
		if s.ok {
			okN++
		}
	}
	fmt.Fprintf(&b, "write probe: %d of %d keepalives (sent to every node, 1 s timeout) succeeded somewhere; %d gaps > 500 ms without a successful write, total %s, longest %s\n",
		okN, len(rep.probes), len(outs), total.Round(time.Millisecond), pct(od, 1).Round(time.Millisecond))
	fmt.Fprintf(&b, "final heal → healthy: %s\n", rep.healToReady.Round(time.Millisecond))
	fmt.Fprintf(&b, "expiry after the holder left (freed − holder's bound), %d locks: p50 %s, max %s\n", len(rep.expiryLags),
		pct(rep.expiryLags, 0.5).Round(time.Millisecond), pct(rep.expiryLags, 1).Round(time.Millisecond))
	fmt.Fprintf(&b, "line under faults: %s\n", rep.line)
	if len(rep.waiterTimes) > 0 {
		fmt.Fprintf(&b, "live waiters served after the lock was free: %v\n", rep.waiterTimes)
		if rep.modelFIFO != "" {
			fmt.Fprintf(&b, "lock-model line: %s\n", rep.modelFIFO)
		}
	}
	// linearizability
	lin := map[porcupine.CheckResult]int{}
	var linOps int
	var slow []string
	for _, l := range rep.lin {
		lin[l.result]++
		linOps += l.ops
		if l.result == porcupine.Unknown {
			slow = append(slow, l.lock)
		}
	}
	fmt.Fprintf(&b, "linearizability (porcupine, per lock): %d locks, %d operations: ok %d, illegal %d, timed out %d %v\n",
		len(rep.lin), linOps, lin[porcupine.Ok], lin[porcupine.Illegal], lin[porcupine.Unknown], slow)
	if rep.cfg.shards > 1 {
		okBy := make([]int, r.sm.n())
		allBy := make([]int, r.sm.n())
		for _, l := range rep.lin {
			k := r.sm.of(l.lock)
			allBy[k]++
			if l.result == porcupine.Ok {
				okBy[k]++
			}
		}
		var per []string
		for k := range okBy {
			per = append(per, fmt.Sprintf("shard %d: %d of %d", r.sm.id(k), okBy[k], allBy[k]))
		}
		fmt.Fprintf(&b, "  linearizable per shard: %s\n", strings.Join(per, ", "))
	}
	fmt.Fprintf(&b, "anomalies: %d\n", len(rep.anomalies))
	for _, a := range rep.anomalies {
		fmt.Fprintf(&b, "  %s\n", strings.ReplaceAll(a.String(), "\n", "\n  "))
	}
	if len(rep.notes) > 0 {
		fmt.Fprintf(&b, "notes from node logs (not failures): %d\n", len(rep.notes))
		for _, n := range rep.notes {
			first, _, _ := strings.Cut(n, "\n")
			fmt.Fprintf(&b, "  %s\n", first)
		}
	}
	b.WriteString("nemesis schedule:\n")
	for _, f := range rep.faults {
		fmt.Fprintf(&b, "  %s\n", f.String())
	}
	return b.String()
}
