package bench

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

func runDlock(ctx context.Context, cfg *Config, res *Result) error {
	var c lockAPI
	var leader string
	var ci *clusterInfo
	var err error
	switch cfg.Protocol {
	case "grpc":
		gc, gerr := newGRPCClient(cfg.GRPCEndpoints, cfg.GRPCConns)
		if gerr != nil {
			return gerr
		}
		defer gc.close()
		c = gc
		leader, ci, err = gc.waitLeader(ctx, 15*time.Second)
		res.Config["grpc_conns"] = fmt.Sprint(cfg.GRPCConns)
		res.Notes = append(res.Notes, fmt.Sprintf("requests go over gRPC (dlock.v1, HTTP/2, no TLS) to the leader's gRPC endpoint "+
			"(the --grpc-endpoints entry whose GetCluster node_id is its leader_id), spread call by call over %d connection(s)", cfg.GRPCConns))
		switch cfg.Workload {
		case "held":
			res.Notes = append(res.Notes, "memory is still read over HTTP, from /metrics at each member's API address (GetCluster)")
		case "watch":
			res.Notes = append(res.Notes, "acquires and releases go over gRPC; the watch streams are still SSE (HTTP), one per member's API address (GetCluster)")
		}
	default:
		hc := newDlockClient(cfg.Endpoints, cfg.Conns)
		defer hc.calls.close()
		hc.viaFollower = cfg.ViaFollower
		c = hc
		leader, ci, err = hc.waitLeader(ctx, 15*time.Second)
		if cfg.ViaFollower {
			res.Notes = append(res.Notes, "requests go to one follower's API address (the first member by id that is not the leader) over HTTP/1.1 keep-alive; it forwards writes to the leader")
		} else {
			res.Notes = append(res.Notes, "requests go to the leader's API address (GET /api/v1/cluster leader_api_addr) over HTTP/1.1 keep-alive")
		}
	}
	if err != nil {
		return err
	}
	res.Config["leader"] = leader
	if cfg.ViaFollower {
		delete(res.Config, "leader")
		res.Config["via_follower"] = leader
	}
	id := runID()
	logf(cfg, "dlock %s over %s: %d workers, calls to %s (leader node %s), run %s", cfg.Workload, cfg.Protocol, cfg.Workers, leader, ci.LeaderID, id)
	switch cfg.Workload {
	case "uncontended", "session", "contended", "semaphore", "readers":
		meter := startCPUMeter(ctx, cfg, metricsURLs(ci.memberURLs()))
		// A member the cluster names no API address for (it has not
		// registered one yet) cannot be read: say so rather than leave it
		// out of the sum unnoticed.
		for _, m := range ci.Members {
			if m.APIAddr == "" {
				meter.unreadable(m.ID, "the cluster names no API address for this member (not registered yet), so its CPU was not read")
			}
		}
		switch cfg.Workload {
		case "uncontended":
			err = dlockUncontended(ctx, cfg, res, c, id)
		case "session":
			err = dlockSession(ctx, cfg, res, c, id)
		case "semaphore":
			err = dlockSemaphore(ctx, cfg, res, c, id)
		case "readers":
			err = dlockReaders(ctx, cfg, res, c, id)
		default:
			err = dlockContended(ctx, cfg, res, c, id)
		}
		if err != nil {
			meter.abandon()
			return err
		}
		meter.finish(res)
		return nil
	case "held":
		return dlockHeld(ctx, cfg, res, c, ci, id)
	case "watch":
		return dlockWatch(ctx, cfg, res, c, ci, id)
	}
	return fmt.Errorf("workload %q is not implemented for dlock", cfg.Workload)
}

// afterFailure counts err and, for a retryable one, looks for the leader again
// and backs off briefly. It returns false when the run should stop.
func afterFailure(ctx, stop context.Context, c lockAPI, rec *recorder, op string, err error) bool {
	rec.fail(op, err)
	if retryable(err) {
		c.rediscover(ctx)
		return pause(stop, 10*time.Millisecond)
	}
	// A refusal (4xx) is counted; pause a little so a persistent one does not
	// turn into a busy loop against the server.
	return pause(stop, time.Millisecond)
}

// spread is worker w's name prefix under SpreadNames: a top-level segment
// of its own letter, so the workers' names cover the ranges of a sharded
// cluster evenly.
func spread(cfg *Config, w int) string {
	if !cfg.SpreadNames {
		return ""
	}
	return string(rune('a'+w%26)) + "/"
}

func dlockUncontended(ctx context.Context, cfg *Config, res *Result, c lockAPI, id string) error {
	rec := window(cfg)
	pace := newPacer(cfg.Rate)
	ttl := cfg.TTL.Milliseconds()
	runWorkers(ctx, cfg.Workers, rec, func(ctx, stop context.Context, w int) {
		name := spread(cfg, w) + fmt.Sprintf("bench/%s/u/w%d", id, w)
		cid := fmt.Sprintf("bench-%s-w%d", id, w)
		for pace.wait(stop) {
			if !lockCycle(ctx, stop, c, rec, name, cid, acquireReq{ClientID: cid, TTLms: ttl, Takeover: true}) {
				return
			}
		}
	})
	rec.fill(res, cfg.CDF)
	res.Throughput, res.ThroughputUnit = res.Ops["cycle"].PerSec, "cycles"
	res.Notes = append(res.Notes, fmt.Sprintf("each worker: acquire its own lock with ttl_ms=%d (an implicit per-acquire lease), then release; a cycle is both", ttl))
	return nil
}

func dlockSession(ctx context.Context, cfg *Config, res *Result, c lockAPI, id string) error {
	rec := window(cfg)
	pace := newPacer(cfg.Rate)
	var setupErr error
	var once sync.Once
	runWorkers(ctx, cfg.Workers, rec, func(ctx, stop context.Context, w int) {
		cid := fmt.Sprintf("bench-%s-w%d", id, w)
		var sid string
		var err error
		for try := 0; try < 50; try++ {
			if sid, err = c.createSession(ctx, cid, cfg.TTL); err == nil || !retryable(err) {
				break
			}
			c.rediscover(ctx)
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil {
			once.Do(func() { setupErr = fmt.Errorf("create session: %w", err) })
			return
		}
		kaDone := make(chan struct{})
		kaCtx, kaStop := context.WithCancel(ctx)
		go func() {
			defer close(kaDone)
			t := time.NewTicker(cfg.TTL / 3)
			defer t.Stop()
			for {
				select {
				case <-kaCtx.Done():
					return
				case <-t.C:
					if err := c.keepAlive(kaCtx, sid); err != nil && kaCtx.Err() == nil {
						rec.fail("keepalive", err)
					}
				}
			}
		}()
		defer func() {
			kaStop()
			<-kaDone
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			_ = c.deleteSession(dctx, sid)
			cancel()
		}()
		for j := 0; pace.wait(stop); j++ {
			name := spread(cfg, w) + fmt.Sprintf("bench/%s/s/w%d/k%d", id, w, j%cfg.Names)
			if !lockCycle(ctx, stop, c, rec, name, cid, acquireReq{ClientID: cid, SessionID: sid, Takeover: true}) {
				return
			}
		}
	})
	if setupErr != nil {
		return setupErr
	}
	rec.fill(res, cfg.CDF)
	res.Throughput, res.ThroughputUnit = res.Ops["cycle"].PerSec, "cycles"
	res.Notes = append(res.Notes, fmt.Sprintf("each worker: one session (ttl %s, keepalive every ttl/3), acquire+release %d names in turn with session_id", cfg.TTL, cfg.Names))
	return nil
}

func dlockContended(ctx context.Context, cfg *Config, res *Result, c lockAPI, id string) error {
	rec := window(cfg)
	contend(ctx, cfg, rec, c, fmt.Sprintf("bench/%s/c", id), id, func(int, int) (string, acquireReq) { return "acquire", acquireReq{} })
	rec.fill(res, cfg.CDF)
	res.Throughput, res.ThroughputUnit = res.Ops["acquire"].PerSec, "hand-offs"
	res.Notes = append(res.Notes, fmt.Sprintf("every worker on one lock: acquire with ttl_ms=%d and wait_timeout_ms=%d, release at once; "+
		"hand-offs/s counts grants; the acquire latency is the wait-time distribution", cfg.TTL.Milliseconds(), cfg.WaitTimeout.Milliseconds()))
	return nil
}

// contend runs every worker on one lock, waiting in line: acquire, release
// at once, again. kind says, for worker w's j-th cycle, the operation name
// its acquire is timed as and the acquire's limit and mode.
func contend(ctx context.Context, cfg *Config, rec *recorder, c lockAPI, name, id string, kind func(w, j int) (string, acquireReq)) {
	ttl, wait := cfg.TTL.Milliseconds(), cfg.WaitTimeout.Milliseconds()
	runWorkers(ctx, cfg.Workers, rec, func(ctx, stop context.Context, w int) {
		cid := fmt.Sprintf("bench-%s-w%d", id, w)
		for j := 0; stop.Err() == nil; j++ {
			op, req := kind(w, j)
			req.ClientID, req.TTLms, req.WaitTimeoutMs, req.Takeover = cid, ttl, wait, true
			t0 := time.Now()
			a, err := c.acquire(ctx, name, req)
			if err != nil {
				if !afterFailure(ctx, stop, c, rec, op, err) {
					return
				}
				continue
			}
			t1 := rec.observe(op, t0)
			if err := c.release(ctx, name, holderReq{ClientID: cid, FencingToken: a.FencingToken, LeaseID: a.LeaseID}); err != nil {
				if !afterFailure(ctx, stop, c, rec, "release", err) {
					return
				}
				continue
			}
			rec.observe("release", t1)
		}
	})
}

// dlockSemaphore is contended on a counting lock: Limit holders at once.
func dlockSemaphore(ctx context.Context, cfg *Config, res *Result, c lockAPI, id string) error {
	rec := window(cfg)
	limit := int64(cfg.Limit)
	contend(ctx, cfg, rec, c, fmt.Sprintf("bench/%s/sem", id), id, func(int, int) (string, acquireReq) {
		return "acquire", acquireReq{Limit: limit}
	})
	rec.fill(res, cfg.CDF)
	res.Config["limit"] = fmt.Sprint(cfg.Limit)
	res.Throughput, res.ThroughputUnit = res.Ops["acquire"].PerSec, "grants"
	res.Notes = append(res.Notes, fmt.Sprintf("every worker on one counting lock (limit %d): acquire with limit, ttl_ms=%d and wait_timeout_ms=%d, release at once; "+
		"grants/s counts grants; the acquire latency is the wait-time distribution", cfg.Limit, cfg.TTL.Milliseconds(), cfg.WaitTimeout.Milliseconds()))
	return nil
}

// dlockReaders is contended on a shared/exclusive lock: one acquire in ten
// (each worker's every tenth, staggered across workers) is exclusive.
func dlockReaders(ctx context.Context, cfg *Config, res *Result, c lockAPI, id string) error {
	rec := window(cfg)
	contend(ctx, cfg, rec, c, fmt.Sprintf("bench/%s/rw", id), id, func(w, j int) (string, acquireReq) {
		if (w+j)%10 == 0 {
			return "acquire_exclusive", acquireReq{}
		}
		return "acquire_shared", acquireReq{Mode: "shared"}
	})
	rec.fill(res, cfg.CDF)
	res.Throughput, res.ThroughputUnit = res.Ops["acquire_shared"].PerSec+res.Ops["acquire_exclusive"].PerSec, "grants"
	res.Notes = append(res.Notes, fmt.Sprintf("every worker on one lock, 90%% of acquires shared and 10%% exclusive (a worker's every tenth, staggered), ttl_ms=%d and wait_timeout_ms=%d, release at once; "+
		"grants/s counts both kinds; each acquire latency is its wait-time distribution", cfg.TTL.Milliseconds(), cfg.WaitTimeout.Milliseconds()))
	return nil
}

// heldLock is one lock of the held workload.
type heldLock struct {
	name  string
	cid   string
	token uint64
	lease string
}

func dlockHeld(ctx context.Context, cfg *Config, res *Result, c lockAPI, ci *clusterInfo, id string) error {
	metrics := metricsURLs(ci.memberURLs())
	hc := newHTTPClient(4, 30*time.Second)
	res.Memory = append(res.Memory, memoryOf(ctx, hc, "before", metrics)...)

	// Phase 1: take K locks, each with its own TTL lease, split over the workers.
	locks := make([]heldLock, cfg.Keys)
	ttl := cfg.HeldTTL.Milliseconds()
	acq := newRecorder(time.Now(), time.Now().Add(24*time.Hour))
	start := time.Now()
	lastLog := time.Now()
	var logMu sync.Mutex
	var wg sync.WaitGroup
	var failed error
	var failOnce sync.Once
	for w := range cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := w; j < cfg.Keys; j += cfg.Workers {
				hl := heldLock{name: fmt.Sprintf("bench/%s/h/k%d", id, j), cid: fmt.Sprintf("bench-%s-k%d", id, j)}
				for try := 0; ; try++ {
					t0 := time.Now()
					a, err := c.acquire(ctx, hl.name, acquireReq{ClientID: hl.cid, TTLms: ttl, Takeover: true})
					if err == nil {
						acq.observe("acquire", t0)
						hl.token, hl.lease = a.FencingToken, a.LeaseID
						break
					}
					acq.fail("acquire", err)
					if !retryable(err) || try > 100 || ctx.Err() != nil {
						failOnce.Do(func() { failed = fmt.Errorf("acquire %s: %w", hl.name, err) })
						return
					}
					c.rediscover(ctx)
					time.Sleep(20 * time.Millisecond)
				}
				locks[j] = hl
				if j%1000 == 0 {
					logMu.Lock()
					if time.Since(lastLog) > 5*time.Second {
						lastLog = time.Now()
						logf(cfg, "held: %d of %d locks taken (%.0f/s)", j, cfg.Keys, float64(j)/time.Since(start).Seconds())
					}
					logMu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if failed != nil {
		return failed
	}
	acqSecs := time.Since(start).Seconds()
	res.Memory = append(res.Memory, memoryOf(ctx, hc, "acquired", metrics)...)
	logf(cfg, "held: %d locks taken in %.1f s; renewing for %s", cfg.Keys, acqSecs, cfg.Duration)

	// Phase 2: renew round-robin for the duration (each of the rounds);
	// memory is read at 90 % of the last window, with renewals flowing.
	if err := gate(ctx, cfg.HeldGate, "ready"); err != nil {
		return err
	}
	rounds := max(cfg.HeldRounds, 1)
	var rec *recorder
	for r := 1; r <= rounds; r++ {
		if err := awaitGate(ctx, cfg.HeldGate, fmt.Sprintf("round-%d", r)); err != nil {
			return err
		}
		rec = window(cfg)
		memDone := make(chan []NodeMemory, 1)
		go func() {
			if r < rounds {
				memDone <- nil
				return
			}
			at := rec.start.Add(cfg.Duration * 9 / 10)
			time.Sleep(time.Until(at))
			memDone <- memoryOf(ctx, hc, "renewing", metrics)
		}()
		runWorkers(ctx, cfg.Workers, rec, func(ctx, stop context.Context, w int) {
			for j := w; stop.Err() == nil; j += cfg.Workers {
				if j >= cfg.Keys {
					j = w
					if j >= cfg.Keys {
						return
					}
				}
				hl := &locks[j]
				t0 := time.Now()
				err := c.renew(ctx, hl.name, holderReq{ClientID: hl.cid, FencingToken: hl.token, LeaseID: hl.lease})
				if err != nil {
					if !afterFailure(ctx, stop, c, rec, "renew", err) {
						return
					}
					continue
				}
				rec.observe("renew", t0)
			}
		})
		res.Memory = append(res.Memory, <-memDone...)
		if rounds > 1 {
			n := rec.hist("renew").Count()
			res.Rounds = append(res.Rounds, round3(float64(n)/cfg.Duration.Seconds()))
			logf(cfg, "held: round %d of %d: %.0f renewals/s", r, rounds, res.Rounds[len(res.Rounds)-1])
		}
		if err := gate(ctx, cfg.HeldGate, fmt.Sprintf("round-%d.done", r)); err != nil {
			return err
		}
	}
	rec.fill(res, cfg.CDF)
	res.Throughput, res.ThroughputUnit = res.Ops["renew"].PerSec, "renewals"
	s := acq.hist("acquire").Summarize(cfg.CDF)
	res.Ops["acquire (setup)"] = OpResult{PerSec: round3(float64(s.Count) / acqSecs), Summary: s}
	for k, v := range acq.errors {
		if res.Errors == nil {
			res.Errors = map[string]int64{}
		}
		res.Errors["setup "+k] += v
	}

	// Phase 3: release everything (timed), so the cluster is empty again.
	if cfg.HeldRelease {
		rel := newRecorder(time.Now(), time.Now().Add(24*time.Hour))
		start := time.Now()
		runWorkers(ctx, cfg.Workers, rel, func(ctx, _ context.Context, w int) {
			for j := w; j < cfg.Keys; j += cfg.Workers {
				hl := &locks[j]
				t0 := time.Now()
				if err := c.release(ctx, hl.name, holderReq{ClientID: hl.cid, FencingToken: hl.token, LeaseID: hl.lease}); err != nil {
					rel.fail("release", err)
					continue
				}
				rel.observe("release", t0)
			}
		})
		s := rel.hist("release").Summarize(cfg.CDF)
		res.Ops["release (teardown)"] = OpResult{PerSec: round3(float64(s.Count) / time.Since(start).Seconds()), Summary: s}
		for k, v := range rel.errors {
			if res.Errors == nil {
				res.Errors = map[string]int64{}
			}
			res.Errors["teardown "+k] += v
		}
	}
	res.Config["keys"] = fmt.Sprint(cfg.Keys)
	res.Config["held_ttl"] = cfg.HeldTTL.String()
	res.Notes = append(res.Notes, fmt.Sprintf("%d locks, each acquired with its own ttl_ms=%d lease, renewed round-robin by %d workers; "+
		"memory from each node's /metrics (process_resident_memory_bytes, go_memstats_heap_inuse_bytes)", cfg.Keys, ttl, cfg.Workers))
	return nil
}

// delivery matches grants with their watch events on every node.
type delivery struct {
	mu      sync.Mutex
	nodes   []string
	pending map[string]*grant
	rec     *recorder
}

type grant struct {
	ack    time.Time
	hasAck bool
	events map[string]time.Time
}

func newDelivery(nodes []string, rec *recorder) *delivery {
	return &delivery{nodes: nodes, pending: map[string]*grant{}, rec: rec}
}

func (d *delivery) get(key string) *grant {
	g := d.pending[key]
	if g == nil {
		g = &grant{events: map[string]time.Time{}}
		d.pending[key] = g
	}
	return g
}

// acked records the arrival of a grant's acquire answer.
func (d *delivery) acked(key string, at time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	g := d.get(key)
	g.ack, g.hasAck = at, true
	d.check(key, g)
}

// event records a grant's event arriving at a node's watcher.
func (d *delivery) event(node, key string, at time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	g := d.get(key)
	if _, dup := g.events[node]; !dup {
		g.events[node] = at
	}
	d.check(key, g)
}

func (d *delivery) check(key string, g *grant) {
	if !g.hasAck || len(g.events) < len(d.nodes) {
		return
	}
	delete(d.pending, key)
	if !d.rec.in(g.ack) {
		return
	}
	var worst time.Duration
	for node, at := range g.events {
		lag := at.Sub(g.ack)
		if lag < 0 {
			d.rec.countAlways("event before acquire answer ("+node+")", 1)
			lag = 0
		}
		worst = max(worst, lag)
		d.rec.hist("delivery " + node).Record(lag)
	}
	d.rec.hist("delivery (all nodes)").Record(worst)
}

// finish counts grants inside the window whose events never all arrived.
func (d *delivery) finish() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, g := range d.pending {
		if g.hasAck && d.rec.in(g.ack) {
			d.rec.countAlways("grants with events missing", 1)
		}
	}
}

func (d *delivery) outstanding() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, g := range d.pending {
		if g.hasAck && d.rec.in(g.ack) {
			n++
		}
	}
	return n
}

func dlockWatch(ctx context.Context, cfg *Config, res *Result, c lockAPI, ci *clusterInfo, id string) error {
	members := ci.memberURLs()
	if len(members) == 0 {
		return fmt.Errorf("GET /api/v1/cluster lists no member API addresses")
	}
	nodes := sortedKeys(members)
	prefix := fmt.Sprintf("bench/%s/watch/", id)
	rec := window(cfg)
	dl := newDelivery(nodes, rec)
	// A streaming client: no overall timeout.
	hcw := &http.Client{Transport: newHTTPClient(len(nodes)+1, 0).Transport}
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	var ready sync.WaitGroup
	errCh := make(chan error, len(nodes))
	for _, node := range nodes {
		ready.Add(1)
		var once sync.Once
		go func() {
			// However the watch ends, the run must not wait for it to open.
			defer once.Do(ready.Done)
			err := watchSSE(wctx, hcw, members[node], prefix, func() { once.Do(ready.Done) }, func(at time.Time, ev *sseEvent) {
				if ev.Type == "acquired" {
					dl.event(node, fmt.Sprintf("%s#%d", ev.Name, ev.FencingToken), at)
				}
			})
			if err != nil {
				errCh <- err
			}
		}()
	}
	ready.Wait()
	select {
	case err := <-errCh:
		return err
	default:
	}
	// The window was set before the watchers connected; start it now.
	rec = window(cfg)
	dl.mu.Lock()
	dl.rec = rec
	dl.mu.Unlock()
	pace := newPacer(cfg.Rate)
	ttl := cfg.TTL.Milliseconds()
	runWorkers(ctx, cfg.Workers, rec, func(ctx, stop context.Context, w int) {
		name := fmt.Sprintf("%sw%d", prefix, w)
		cid := fmt.Sprintf("bench-%s-w%d", id, w)
		for pace.wait(stop) {
			t0 := time.Now()
			a, err := c.acquire(ctx, name, acquireReq{ClientID: cid, TTLms: ttl, Takeover: true})
			if err != nil {
				if !afterFailure(ctx, stop, c, rec, "acquire", err) {
					return
				}
				continue
			}
			t1 := rec.observe("acquire", t0)
			dl.acked(fmt.Sprintf("%s#%d", name, a.FencingToken), t1)
			if err := c.release(ctx, name, holderReq{ClientID: cid, FencingToken: a.FencingToken, LeaseID: a.LeaseID}); err != nil {
				if !afterFailure(ctx, stop, c, rec, "release", err) {
					return
				}
				continue
			}
			rec.observe("release", t1)
		}
	})
	// Give the last events up to 2 s to arrive.
	for deadline := time.Now().Add(2 * time.Second); dl.outstanding() > 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	stopWatch()
	dl.finish()
	rec.fill(res, cfg.CDF)
	res.Throughput, res.ThroughputUnit = res.Ops["acquire"].PerSec, "grants"
	res.Config["watch_nodes"] = fmt.Sprint(len(nodes))
	res.Notes = append(res.Notes,
		"delivery = arrival of the grant's `acquired` SSE event at a watcher minus arrival of the acquire answer at the client; "+
			"the answer's arrival is the proxy for the commit time (the grant commits slightly earlier, so this under-states the true lag by "+
			"the answer's trip; events that beat the answer count as 0 and are counted)",
		fmt.Sprintf("one GET /api/v1/watch stream per node (%d nodes); `delivery (all nodes)` is the slowest node per grant", len(nodes)))
	return nil
}

// metricsURLs maps each member's API URL to its Prometheus /metrics page.
func metricsURLs(apiURLs map[string]string) map[string]string {
	out := make(map[string]string, len(apiURLs))
	for id, u := range apiURLs {
		out[id] = strings.TrimRight(u, "/") + "/metrics"
	}
	return out
}

// lockCycle is one acquire and release of name, timed as "acquire",
// "release" and "cycle". It reports whether the worker should go on (a
// failure it can carry on after counts as done).
func lockCycle(ctx, stop context.Context, c lockAPI, rec *recorder, name, cid string, req acquireReq) bool {
	t0 := time.Now()
	a, err := c.acquire(ctx, name, req)
	if err != nil {
		return afterFailure(ctx, stop, c, rec, "acquire", err)
	}
	t1 := rec.observe("acquire", t0)
	if err := c.release(ctx, name, holderReq{ClientID: cid, FencingToken: a.FencingToken, LeaseID: a.LeaseID}); err != nil {
		return afterFailure(ctx, stop, c, rec, "release", err)
	}
	t2 := rec.observe("release", t1)
	rec.record("cycle", t2, t2.Sub(t0))
	return true
}

// gate creates the file name in dir (nothing without a dir): a script
// taking turns between runs waits for it (Config.HeldGate).
func gate(_ context.Context, dir, name string) error {
	if dir == "" {
		return nil
	}
	return os.WriteFile(filepath.Join(dir, name), nil, 0o644)
}

// awaitGate waits until the file name exists in dir, or ctx ends.
func awaitGate(ctx context.Context, dir, name string) error {
	if dir == "" {
		return nil
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s in %s: %w", name, dir, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
