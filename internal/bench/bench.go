// Package bench is dlock's load generator (`dlock bench`): it drives a dlock
// cluster over its plain HTTP/JSON API (dlockClient) or its gRPC API dlock.v1
// (grpcClient, Config.Protocol "grpc"), exactly like a client would, or an etcd
// cluster through go.etcd.io/etcd/client/v3 and concurrency.Mutex, with the same
// workloads, and reports throughput and HDR-histogram latencies per operation.
//
// The dlock workloads call a lockAPI, so both protocols run the same code:
// every call goes to the leader (HTTP: GET /api/v1/cluster leader_api_addr;
// gRPC: the endpoint whose GetCluster node_id is its leader_id), and refusals
// become *apiError with the dlock code and its HTTP status either way. Over
// gRPC, held still reads memory from each node's HTTP /metrics and watch still
// watches over SSE; failover is HTTP only.
//
// Workloads:
//
//   - uncontended: each worker acquires its own lock and releases it. dlock:
//     acquire with ttl_ms (an implicit per-acquire lease). etcd: one session
//     (lease) per worker, Mutex.Lock/Unlock. With TTLPerAcquire, every etcd
//     acquire grants its own lease (Grant + Lock, Unlock + Revoke).
//   - session: one session per worker; lock/unlock a rotating set of names.
//   - contended: every worker on one lock, waiting in line; hand-offs/s and
//     the wait-time distribution.
//   - semaphore: contended on one counting lock of Limit places (dlock only).
//   - readers: every worker on one lock, 90 % of acquires shared and 10 %
//     exclusive, waiting in line (dlock only).
//   - held: hold K locks (each with its own TTL lease), renew them round-robin;
//     renewal throughput and each node's memory from /metrics.
//   - watch: watchers on every node; the time from a grant (its acquire
//     answer's arrival, a proxy for the commit) to its event on each watcher.
//   - failover: start real `dlock serve` (or etcd) processes, kill -9 the
//     leader, time to the next successful acquire through the survivors.
//
// For uncontended, session and contended the result also has each process's
// CPU time over the window and per operation (cpuMeter): the servers' from
// their /metrics, the load generator's from getrusage.
package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Workloads lists the workload names.
var Workloads = []string{"uncontended", "session", "contended", "semaphore", "readers", "held", "watch", "failover"}

// Config is one benchmark run.
type Config struct {
	Target   string // "dlock" or "etcd"
	Workload string

	// Protocol is how the dlock workloads call dlock: "http" (HTTP/1.1
	// JSON, the default) or "grpc" (dlock.v1). Watch streams and memory
	// scrapes are HTTP either way; failover is HTTP only.
	Protocol string
	// Endpoints are dlock API URLs; the leader is found through any of them.
	Endpoints []string
	// GRPCEndpoints are dlock gRPC addresses (host:port), one per node: the
	// leader's must be among them (--protocol grpc).
	GRPCEndpoints []string
	// GRPCConns is how many gRPC connections the workers share (0: one per
	// 32 workers), all to the leader.
	GRPCConns int
	// EtcdEndpoints are etcd client URLs.
	EtcdEndpoints []string
	// EtcdAllEndpoints lets the etcd client balance over every endpoint;
	// by default it talks to the leader only, as dlock's client does.
	EtcdAllEndpoints bool
	// EtcdClients is how many etcd clients (gRPC connections) the workers
	// share; 0 picks one per 32 workers.
	EtcdClients int
	// ViaFollower sends every call to one follower instead of the leader
	// (dlock over HTTP: the follower forwards writes to the leader and
	// answers with the leader's answer; etcd: the client talks to one
	// follower member), as a client that happens to reach a follower does.
	ViaFollower bool

	Workers  int
	Duration time.Duration
	Warmup   time.Duration

	// TTL is the lock (or session) TTL; etcd rounds it to whole seconds.
	TTL time.Duration
	// TTLPerAcquire: every etcd acquire grants its own lease (uncontended).
	TTLPerAcquire bool
	// SpreadNames starts each worker's lock names with its own letter
	// (uncontended, session), so they spread over a sharded cluster's
	// ranges instead of all falling in the shard of "bench".
	SpreadNames bool
	// WaitTimeout bounds a contended acquire's wait.
	WaitTimeout time.Duration
	// Limit is the semaphore workload's limit (default 4).
	Limit int
	// Names is how many lock names each session worker rotates over.
	Names int
	// Keys is how many locks the held workload holds; HeldTTL their TTL.
	Keys    int
	HeldTTL time.Duration
	// HeldRelease releases the held locks at the end (timed as "release").
	HeldRelease bool
	// HeldRounds splits the renewal phase into that many windows of
	// Duration each (0 or 1: one), each window's rate in Result.Rounds.
	HeldRounds int
	// HeldGate, if set, is a directory through which a script takes turns
	// between runs (two clusters measured alternately on one machine): the
	// run creates ready there once its locks are taken, waits for round-N
	// before window N and creates round-N.done after it.
	HeldGate string
	// Rate caps the total acquire rate (per second); 0 is unlimited.
	Rate float64

	// Failover: cluster size, repetitions, the dlock binary to start and
	// extra `dlock serve` flags.
	Nodes      int
	Repeat     int
	DlockBin   string
	EtcdBin    string
	ServeFlags []string

	// Conns is the idle keep-alive connections kept per host (0: workers+16).
	Conns int
	// Label is copied into the result.
	Label string
	// CDF adds latency CDF points to the result.
	CDF bool
	// Log receives progress lines (nil: discarded).
	Log io.Writer
}

func (c *Config) defaults() {
	if c.Target == "" {
		c.Target = "dlock"
	}
	if c.Protocol == "" {
		c.Protocol = "http"
	}
	if c.Workers <= 0 {
		c.Workers = 1
	}
	if c.Duration <= 0 {
		c.Duration = 10 * time.Second
	}
	if c.TTL <= 0 {
		c.TTL = 10 * time.Second
	}
	if c.WaitTimeout <= 0 {
		c.WaitTimeout = 60 * time.Second
	}
	if c.Limit <= 0 {
		c.Limit = 4
	}
	if c.Names <= 0 {
		c.Names = 16
	}
	if c.Keys <= 0 {
		c.Keys = 10000
	}
	if c.HeldTTL <= 0 {
		c.HeldTTL = 60 * time.Second
	}
	if c.Nodes <= 0 {
		c.Nodes = 3
	}
	if c.Repeat <= 0 {
		c.Repeat = 20
	}
	if c.Conns <= 0 {
		c.Conns = c.Workers + 16
	}
	if c.EtcdClients <= 0 {
		c.EtcdClients = (c.Workers + 31) / 32
	}
	if c.GRPCConns <= 0 {
		c.GRPCConns = (c.Workers + 31) / 32
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
}

// Validate checks the configuration.
func (c *Config) Validate() error {
	if !slices.Contains(Workloads, c.Workload) {
		return fmt.Errorf("workload %q: use one of %v", c.Workload, Workloads)
	}
	switch c.Target {
	case "dlock", "":
		switch c.Protocol {
		case "http", "":
			if len(c.Endpoints) == 0 && c.Workload != "failover" {
				return errors.New("no dlock endpoints")
			}
		case "grpc":
			if c.Workload == "failover" {
				return errors.New("--protocol grpc: the failover workload drives dlock over HTTP only; leave --protocol at http")
			}
			if len(c.GRPCEndpoints) == 0 {
				return errors.New("--protocol grpc: no dlock gRPC endpoints (--grpc-endpoints)")
			}
		default:
			return fmt.Errorf("protocol %q: use http or grpc", c.Protocol)
		}
	case "etcd":
		if c.Protocol == "grpc" {
			return errors.New("--protocol applies to --target dlock (the etcd client always speaks gRPC)")
		}
		if len(c.EtcdEndpoints) == 0 && c.Workload != "failover" {
			return errors.New("no etcd endpoints")
		}
	default:
		return fmt.Errorf("target %q: use dlock or etcd", c.Target)
	}
	if c.ViaFollower {
		switch {
		case c.Target != "etcd" && c.Protocol == "grpc":
			return errors.New("--via-follower: dlock is driven through a follower over HTTP only; leave --protocol at http")
		case c.Workload == "failover" || c.Workload == "held":
			return fmt.Errorf("--via-follower does not apply to the %s workload", c.Workload)
		case c.Target == "etcd" && c.EtcdAllEndpoints:
			return errors.New("--via-follower and --etcd-all-endpoints contradict each other")
		}
	}
	if c.Target == "etcd" && (c.Workload == "semaphore" || c.Workload == "readers") {
		return fmt.Errorf("the %s workload is dlock's alone (etcd's client has no semaphore or shared lock)", c.Workload)
	}
	if c.TTLPerAcquire && c.Workload != "uncontended" {
		return errors.New("--ttl-per-acquire applies to the uncontended workload only")
	}
	if c.Target == "etcd" && c.TTL%time.Second != 0 {
		return fmt.Errorf("etcd leases have whole-second TTLs; --ttl %s is not one", c.TTL)
	}
	if c.Nodes != 0 && c.Nodes < 3 {
		return errors.New("--nodes must be at least 3 (a failover needs a surviving majority)")
	}
	return nil
}

// Run runs one benchmark and returns its result.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	cfg.defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	res := &Result{Target: cfg.Target, Workload: cfg.Workload, Workers: cfg.Workers, Label: cfg.Label}
	if cfg.TTLPerAcquire {
		res.Variant = "ttl-per-acquire"
	}
	res.Config = map[string]string{
		"duration": cfg.Duration.String(), "warmup": cfg.Warmup.String(), "ttl": cfg.TTL.String(),
	}
	if cfg.Target == "dlock" {
		res.Config["protocol"] = cfg.Protocol
	}
	if cfg.Rate > 0 {
		res.Config["rate"] = strconv.FormatFloat(cfg.Rate, 'f', -1, 64)
	}
	var err error
	switch {
	case cfg.Workload == "failover":
		err = runFailover(ctx, &cfg, res)
	case cfg.Target == "etcd":
		err = runEtcd(ctx, &cfg, res)
	default:
		err = runDlock(ctx, &cfg, res)
	}
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		// Interrupted: the counts cover part of the window but the rates
		// would be divided by all of it. No result beats a wrong one.
		return nil, fmt.Errorf("the run was interrupted before its %v were up, so it has no result: %w", cfg.Duration, err)
	}
	return res, nil
}

// runID is a short random tag that keeps each run's lock names apart.
func runID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// window returns the measured window that starts after the warm-up.
func window(cfg *Config) *recorder {
	start := time.Now().Add(cfg.Warmup)
	return newRecorder(start, start.Add(cfg.Duration))
}

// runWorkers runs fn on n goroutines and waits for all of them. stop ends
// when the recorder's window ends: workers check it between operations and
// send their requests with ctx, so an operation in flight at the end
// finishes (uncounted) instead of being cut off and leaving a lock behind.
func runWorkers(ctx context.Context, n int, rec *recorder, fn func(ctx, stop context.Context, w int)) {
	stop, cancel := context.WithDeadline(ctx, rec.end)
	defer cancel()
	var wg sync.WaitGroup
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn(ctx, stop, w)
		}()
	}
	wg.Wait()
}

// pacer spaces operations to a total rate (no-op when rate is 0).
type pacer struct {
	mu       sync.Mutex
	interval time.Duration
	next     time.Time
}

func newPacer(rate float64) *pacer {
	if rate <= 0 {
		return &pacer{}
	}
	return &pacer{interval: time.Duration(float64(time.Second) / rate)}
}

// wait blocks until the caller's slot; false if ctx ended first.
func (p *pacer) wait(ctx context.Context) bool {
	if p.interval == 0 {
		return ctx.Err() == nil
	}
	p.mu.Lock()
	now := time.Now()
	if p.next.Before(now) {
		p.next = now
	}
	slot := p.next
	p.next = p.next.Add(p.interval)
	p.mu.Unlock()
	d := time.Until(slot)
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// pause sleeps for d (a back-off after a retryable failure, or until a
// moment); false if ctx ended first.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

func logf(cfg *Config, format string, args ...any) {
	fmt.Fprintf(cfg.Log, "bench: "+format+"\n", args...)
}
