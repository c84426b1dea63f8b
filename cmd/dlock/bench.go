package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/dlock/dlock/internal/bench"
)

const (
	benchDefaultEndpoints     = "http://127.0.0.1:7070,http://127.0.0.1:7080,http://127.0.0.1:7090"
	benchDefaultGRPCEndpoints = "127.0.0.1:7072,127.0.0.1:7082,127.0.0.1:7092" // what `dlock dev` serves
)

const benchLong = `Drives a dlock cluster (over HTTP/JSON or, with --protocol grpc, its gRPC API, like
a client) or an etcd cluster (v3 API, concurrency.Mutex) with N workers for a fixed
time and prints throughput and latency p50/p90/p99/max per operation (HDR histograms).

With --protocol grpc, acquires, releases, renewals and sessions go over gRPC to the
leader's --grpc-endpoints entry (found with GetCluster, so list every node's), on
--grpc-conns connections; held still reads memory from /metrics and watch still
watches over SSE (HTTP). failover is http only.

Workloads:
  uncontended  each worker acquires its own lock (ttl) and releases it
  session      one session per worker; lock/unlock many names under it
  contended    all workers on one lock, waiting in line: hand-offs/s, wait times
  semaphore    all workers on one counting lock of --limit places (dlock only)
  readers      all workers on one lock, 90% shared and 10% exclusive (dlock only)
  held         hold --keys locks with their own TTL, renew them round-robin;
               renewals/s and every node's RSS and Go heap from /metrics
  watch        watchers on every node; grant-to-event delivery latency
  failover     start --nodes real 'dlock serve' (or etcd) processes, kill -9 the
               leader, time to the next successful acquire; --repeat times`

const benchExample = `  dlock bench --workers 64 --duration 10s
  dlock bench --protocol grpc --workload session --workers 64
  dlock bench --target etcd --etcd-endpoints http://127.0.0.1:2379 --workload contended --workers 8
  dlock bench --workload failover --nodes 5 --repeat 20 -o json`

// newBenchCmd is `dlock bench`: the load generator (internal/bench).
func newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:               "bench [flags]",
		Short:             "load generator: throughput and latency of dlock or etcd",
		Long:              benchLong,
		Example:           benchExample,
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
	}
	fs := cmd.Flags()
	var cfg bench.Config
	endpoints := fs.String("endpoints", benchEnvOr("DLOCK_ENDPOINTS", benchDefaultEndpoints), "dlock API URLs, comma-separated; writes go to the leader found through any of them (env DLOCK_ENDPOINTS)")
	grpcEndpoints := fs.String("grpc-endpoints", benchEnvOr("DLOCK_GRPC_ENDPOINTS", benchDefaultGRPCEndpoints), "dlock gRPC addresses (host:port), comma-separated, one per node: writes go to the one that is the leader (--protocol grpc; env DLOCK_GRPC_ENDPOINTS)")
	fs.StringVar(&cfg.Protocol, "protocol", "http", "how to call dlock: http (HTTP/1.1 JSON) or grpc (dlock.v1); watch streams and memory scrapes use HTTP either way, failover is http only")
	etcdEndpoints := fs.String("etcd-endpoints", "http://127.0.0.1:2379", "etcd client URLs, comma-separated (--target etcd)")
	fs.StringVar(&cfg.Target, "target", "dlock", "system under test: dlock or etcd")
	fs.StringVar(&cfg.Workload, "workload", "uncontended", "workload: "+strings.Join(bench.Workloads, ", "))
	fs.IntVar(&cfg.Workers, "workers", 8, "concurrent workers (clients)")
	fs.IntVar(&cfg.Limit, "limit", 4, "semaphore: the counting lock's limit")
	fs.DurationVar(&cfg.Duration, "duration", 10*time.Second, "measured time (held: the renewal phase)")
	fs.DurationVar(&cfg.Warmup, "warmup", time.Second, "unmeasured warm-up before the measured time")
	fs.DurationVar(&cfg.TTL, "ttl", 10*time.Second, "lock TTL (ttl_ms) or session TTL; whole seconds for etcd")
	fs.BoolVar(&cfg.TTLPerAcquire, "ttl-per-acquire", false, "uncontended: every etcd acquire grants its own lease (dlock's acquire with ttl_ms already does)")
	fs.BoolVar(&cfg.SpreadNames, "spread-names", false, "uncontended and session: start each worker's lock names with its own letter (a/, b/, …), so they spread over a sharded cluster's ranges")
	fs.DurationVar(&cfg.WaitTimeout, "wait", 60*time.Second, "contended: how long one acquire may wait in line")
	fs.IntVar(&cfg.Names, "names", 16, "session: lock names each worker rotates over")
	fs.IntVar(&cfg.Keys, "keys", 10000, "held: number of locks held at once")
	fs.DurationVar(&cfg.HeldTTL, "held-ttl", 60*time.Second, "held: TTL of each held lock")
	fs.BoolVar(&cfg.HeldRelease, "held-release", true, "held: release every lock at the end (timed)")
	fs.IntVar(&cfg.HeldRounds, "held-rounds", 1, "held: renewal windows of --duration each, each one's rate reported (rounds_per_sec)")
	fs.StringVar(&cfg.HeldGate, "held-gate", "", "held: a `DIR` through which a script takes turns between runs: ready once the locks are taken, then wait for round-N before window N, round-N.done after it")
	fs.Float64Var(&cfg.Rate, "rate", 0, "cap on total acquires per second (0: as fast as the workers go)")
	fs.IntVar(&cfg.Nodes, "nodes", 3, "failover: number of dlock serve processes to start (3 or 5)")
	fs.IntVar(&cfg.Repeat, "repeat", 20, "failover: how many leader kills")
	fs.StringVar(&cfg.DlockBin, "dlock-bin", "", "failover: the dlock binary to start (default: this one)")
	fs.StringVar(&cfg.EtcdBin, "etcd-bin", "etcd", "failover --target etcd: the etcd binary to start")
	serveFlags := fs.String("serve-flags", "", "failover: extra server flags, space-separated (e.g. \"--heartbeat-timeout 200ms\")")
	fs.IntVar(&cfg.Conns, "conns", 0, "idle keep-alive connections per host (default workers+16)")
	fs.IntVar(&cfg.GRPCConns, "grpc-conns", 0, "--protocol grpc: gRPC connections to the leader shared by the workers (default one per 32 workers)")
	fs.IntVar(&cfg.EtcdClients, "etcd-clients", 0, "etcd clients (gRPC connections) shared by the workers (default one per 32 workers)")
	fs.BoolVar(&cfg.ViaFollower, "via-follower", false, "send every call to one follower instead of the leader (dlock over http: it forwards writes; etcd: a follower member); not for held or failover")
	fs.BoolVar(&cfg.EtcdAllEndpoints, "etcd-all-endpoints", false, "let the etcd client balance over all endpoints instead of talking to the leader only")
	fs.StringVar(&cfg.Label, "label", "", "free text copied into the result")
	cdf := fs.Bool("cdf", false, "add latency CDF points to the JSON output")
	output := fs.StringP("output", "o", "text", "output `FORMAT`: text or json")
	quiet := fs.BoolP("quiet", "q", false, "no progress lines on stderr")
	cpuProfile := fs.String("cpu-profile", "", "write a CPU profile of the load generator itself to this file (go tool pprof)")
	completeWords(cmd, "output", "text", "json")
	completeWords(cmd, "workload", bench.Workloads...)
	completeWords(cmd, "target", "dlock", "etcd")
	completeWords(cmd, "protocol", "http", "grpc")
	cmd.RunE = func(_ *cobra.Command, _ []string) error {
		if *output != "text" && *output != "json" {
			return fmt.Errorf("-o %q: use text or json", *output)
		}
		cfg.Endpoints = benchSplitList(*endpoints)
		cfg.GRPCEndpoints = benchSplitList(*grpcEndpoints)
		cfg.EtcdEndpoints = benchSplitList(*etcdEndpoints)
		cfg.ServeFlags = strings.Fields(*serveFlags)
		cfg.CDF = *cdf
		if !*quiet {
			cfg.Log = os.Stderr
		}
		if *cpuProfile != "" {
			// The load generator shares the machine's cores with the servers in
			// our benchmarks, so its own cost is worth seeing.
			f, err := os.Create(*cpuProfile)
			if err != nil {
				return fmt.Errorf("--cpu-profile: %w", err)
			}
			defer f.Close()
			if err := pprof.StartCPUProfile(f); err != nil {
				return fmt.Errorf("--cpu-profile: %w", err)
			}
			defer pprof.StopCPUProfile()
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		res, err := bench.Run(ctx, cfg)
		if err != nil {
			return err
		}
		if *output == "json" {
			return res.WriteJSON(os.Stdout)
		}
		return res.WriteText(os.Stdout)
	}
	return cmd
}

func benchSplitList(s string) []string {
	var out []string
	for part := range strings.SplitSeq(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

func benchEnvOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
