package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/dlock/dlock/internal/buildinfo"
	"github.com/dlock/dlock/internal/raftnode"
	"github.com/dlock/dlock/internal/server"
	"github.com/dlock/dlock/internal/state"
)

// raftFlags are the Raft tuning flags shared by serve and dev.
type raftFlags struct {
	engine            string
	logStore          string
	snapshotThreshold uint64
	snapshotInterval  time.Duration
	trailingLogs      uint64
	snapshotRetain    int
	heartbeat         time.Duration
	election          time.Duration
	leaderLease       time.Duration
	raftLogLevel      string
	logLevel          string
	logFormat         string
	maxBody           int64
	pprof             bool
	ui                bool
	browserHosts      []string
	minFreeDisk       string
	// the grant history's retention, committed by whichever node leads
	historyPerName, historyMaxEntries int64
	historyMaxBytes                   string
	historyMaxAge                     time.Duration
}

func (f *raftFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.engine, "raft-engine", "", "replication engine of a new data dir: hashicorp (default) or etcd (go.etcd.io/raft/v3); an existing data dir keeps its own")
	fs.StringVar(&f.logStore, "log-store", string(raftnode.DefaultLogStore), "Raft log store: wal (hashicorp/raft-wal) or bolt (raft-boltdb/v2); both fsync every write")
	fs.Uint64Var(&f.snapshotThreshold, "snapshot-threshold", 16384, "take a snapshot after this many new log entries")
	fs.DurationVar(&f.snapshotInterval, "snapshot-interval", 30*time.Second, "how often to check whether a snapshot is due")
	fs.Uint64Var(&f.trailingLogs, "trailing-logs", 10240, "log entries kept after a snapshot, so slow followers catch up without one")
	fs.IntVar(&f.snapshotRetain, "snapshot-retain", 2, "snapshots kept on disk (more helps forensics after a fault)")
	fs.DurationVar(&f.heartbeat, "heartbeat-timeout", raftnode.DefaultHeartbeatTimeout, "Raft heartbeat timeout (a follower without contact this long starts an election)")
	fs.DurationVar(&f.election, "election-timeout", raftnode.DefaultElectionTimeout, "Raft election timeout")
	fs.DurationVar(&f.leaderLease, "leader-lease-timeout", raftnode.DefaultLeaderLeaseTimeout, "a leader without quorum contact this long steps down (must be <= heartbeat timeout)")
	fs.StringVar(&f.raftLogLevel, "raft-log-level", "warn", "log level of Raft's own messages")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&f.logFormat, "log-format", "text", "log format: text or json")
	fs.Int64Var(&f.maxBody, "max-body-bytes", 64<<10, "largest accepted request body")
	fs.StringVar(&f.minFreeDisk, "min-free-disk", "64MiB", "free space kept in reserve on the data dir's disk: below it the leader refuses writes (503 disk_full) until space returns; 0 turns the check off (sizes: bytes, or with KiB, MiB, GiB)")
	fs.StringSliceVar(&f.browserHosts, "browser-hosts", nil, "host names (comma-separated, host or host:port) under which browsers may reach the API besides IP addresses, localhost and members' API addresses, e.g. a reverse proxy's; other names are refused to browser pages (DNS rebinding)")
	fs.BoolVar(&f.ui, "ui", true, "serve the web console at /ui/ on the API port (same TLS and ACL tokens as the API; --ui=false turns it off)")
	fs.BoolVar(&f.pprof, "enable-pprof", false, "serve Go's profiler at /debug/pprof/ on the API port (for diagnosis; off in production)")
	fs.Int64Var(&f.historyPerName, "history-per-name", state.DefaultHistoryPerName, "ended grants kept in each lock's history (dlock history); 0 keeps none. The leader's value applies to the whole cluster: give every node the same")
	fs.Int64Var(&f.historyMaxEntries, "history-max-entries", state.DefaultHistoryMaxEntries, "ended grants kept in all locks' histories together, oldest dropped first")
	fs.StringVar(&f.historyMaxBytes, "history-max-bytes", "64MiB", "memory budget of the grant history (each record counts 240 bytes plus its lock name, client id, value and reason: about what it takes), oldest dropped first")
	fs.DurationVar(&f.historyMaxAge, "history-max-age", time.Duration(state.DefaultHistoryMaxAgeMs)*time.Millisecond, "drop an ended grant from the history this long after it ended (on the leader's lease clock)")
}

// complete offers the values of the flags that take one of a few words.
func (f *raftFlags) complete(cmd *cobra.Command) {
	completeWords(cmd, "raft-engine", "hashicorp", "etcd")
	completeWords(cmd, "log-store", "wal", "bolt")
	completeWords(cmd, "log-level", "debug", "info", "warn", "error")
	completeWords(cmd, "raft-log-level", "debug", "info", "warn", "error")
	completeWords(cmd, "log-format", "text", "json")
}

func (f *raftFlags) apply(c *raftnode.Config) error {
	if f.engine != "" {
		k, err := raftnode.ParseEngine(f.engine)
		if err != nil {
			return fmt.Errorf("--raft-engine: %w", err)
		}
		c.Engine = k
	}
	switch raftnode.LogStoreKind(f.logStore) {
	case raftnode.LogStoreWAL, raftnode.LogStoreBolt:
	default:
		return fmt.Errorf("--log-store %q: use wal or bolt", f.logStore)
	}
	if f.leaderLease > f.heartbeat {
		return fmt.Errorf("--leader-lease-timeout (%s) must not exceed --heartbeat-timeout (%s)", f.leaderLease, f.heartbeat)
	}
	c.LogStore = raftnode.LogStoreKind(f.logStore)
	c.SnapshotThreshold = f.snapshotThreshold
	c.SnapshotInterval = f.snapshotInterval
	c.TrailingLogs = f.trailingLogs
	if f.snapshotRetain < 1 {
		return fmt.Errorf("--snapshot-retain %d: keep at least 1 snapshot", f.snapshotRetain)
	}
	c.SnapshotRetain = f.snapshotRetain
	c.HeartbeatTimeout = f.heartbeat
	c.ElectionTimeout = f.election
	c.LeaderLeaseTimeout = f.leaderLease
	c.RaftLogLevel = f.raftLogLevel
	minFree, err := parseSize(f.minFreeDisk)
	if err != nil {
		return fmt.Errorf("--min-free-disk %q: %w", f.minFreeDisk, err)
	}
	c.MinFreeDisk = minFree
	if minFree == 0 {
		c.MinFreeDisk = -1 // off
	}
	histBytes, err := parseSize(f.historyMaxBytes)
	if err != nil {
		return fmt.Errorf("--history-max-bytes %q: %w", f.historyMaxBytes, err)
	}
	rt := state.HistoryRetention{PerName: f.historyPerName, MaxEntries: f.historyMaxEntries, MaxBytes: histBytes, MaxAgeMs: f.historyMaxAge.Milliseconds()}
	if !rt.Valid() {
		return fmt.Errorf("history retention out of range: --history-per-name 0..%d, --history-max-entries 0..%d, --history-max-bytes up to %d, --history-max-age 1s..%s",
			state.MaxHistoryPerName, state.MaxHistoryMaxEntries, int64(state.MaxHistoryMaxBytes), time.Duration(state.MaxHistoryMaxAgeMs)*time.Millisecond)
	}
	c.HistoryRetention = &rt
	return nil
}

// parseSize reads a byte count: a number, optionally with KiB, MiB or GiB.
func parseSize(s string) (int64, error) {
	s = strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"B", 1}} {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/mult {
		return 0, errors.New("want a size such as 64MiB, 1GiB or a number of bytes")
	}
	return n * mult, nil
}

// parseCluster parses id=host:port,id=host:port.
func parseCluster(s string) (map[string]string, error) {
	out := map[string]string{}
	if s == "" {
		return out, nil
	}
	for part := range strings.SplitSeq(s, ",") {
		id, addr, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || id == "" || addr == "" {
			return nil, fmt.Errorf("--initial-cluster entry %q: want id=host:port", part)
		}
		if _, dup := out[id]; dup {
			return nil, fmt.Errorf("--initial-cluster names %q twice", id)
		}
		out[id] = addr
	}
	return out, nil
}

// configHelp closes the help of serve and dev.
const configHelp = `

Every flag can also be set as DLOCK_<FLAG> (upper case, dashes as
underscores: --data-dir is DLOCK_DATA_DIR) and in the YAML file named by
--config (keys are the flag names); a flag wins over the environment, which
wins over the file.`

func newServeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve --id ID --data-dir DIR [flags]",
		Short: "run one node of a cluster",
		Long: `Runs one node. On first start, --initial-cluster bootstraps the cluster;
later starts recover everything from --data-dir.` + configHelp,
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
	}
	fs := cmd.Flags()
	var rf raftFlags
	id := fs.String("id", "", "this node's id, unique in the cluster (required)")
	dataDir := fs.String("data-dir", "", "`DIR` for the Raft log, stable store and snapshots (required)")
	apiAddr := fs.String("api-addr", "127.0.0.1:7070", "HTTP API listen address")
	// Off unless asked for: a fixed default port would make several nodes on
	// one host (tests, the README's three processes) fight over it.
	grpcAddr := fs.String("grpc-addr", "", "gRPC API listen address, e.g. 127.0.0.1:7072 (default: no gRPC)")
	apiAdvertise := fs.String("api-advertise", "", "API address other nodes and clients should use (default: --api-addr)")
	raftAddr := fs.String("raft-addr", "127.0.0.1:7071", "Raft (and node-to-node forwarding) listen address")
	raftAdvertise := fs.String("raft-advertise", "", "Raft address peers should dial (default: --raft-addr)")
	initial := fs.String("initial-cluster", "", "first start only: every initial member as id=raft-host:port, comma-separated (must include this node)")
	join := fs.String("join", "", "join an existing cluster through any member's API `URL` (comma-separated list allowed), instead of --initial-cluster")
	leave := fs.Bool("leave-on-shutdown", false, "on SIGINT/SIGTERM, remove this node from the cluster before stopping (for scale-down, not restarts)")
	acl := fs.Bool("acl", false, "require an ACL token on every API call (docs/security.md); bootstrap the first token with dlock acl bootstrap")
	aclToken := fs.String("acl-token", os.Getenv("DLOCK_ACL_TOKEN"), "this node's ACL token `SECRET` (admin), sent when it --joins an ACL cluster (env DLOCK_ACL_TOKEN)")
	var tf tlsFlags
	tf.register(fs)
	rf.register(fs)
	var sf shardFlags
	sf.register(fs)
	var lf limitFlags
	lf.register(fs)
	configPath := registerConfig(fs)
	rf.complete(cmd)
	_ = cmd.MarkFlagDirname("data-dir")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := applyConfig(fs, *configPath, cmd.CommandPath()); err != nil {
			return &usageError{err.Error()}
		}
		if *id == "" || *dataDir == "" {
			return usageErrorf("--id and --data-dir are required")
		}
		cluster, err := parseCluster(*initial)
		if err != nil {
			return err
		}
		var joinURLs []string
		if *join != "" {
			if len(cluster) > 0 {
				return fmt.Errorf("give --initial-cluster (to form a new cluster) or --join (to join one), not both")
			}
			for u := range strings.SplitSeq(*join, ",") {
				if u = strings.TrimSpace(u); u != "" {
					if !strings.Contains(u, "://") {
						u = tf.joinScheme() + u
					}
					joinURLs = append(joinURLs, u)
				}
			}
		}
		logger, err := newLogger(rf.logLevel, rf.logFormat)
		if err != nil {
			return err
		}
		rc := raftnode.Config{ID: *id, DataDir: *dataDir, RaftAddr: *raftAddr, RaftAdvertise: *raftAdvertise,
			APIAddr: *apiAdvertise, InitialCluster: cluster, Logger: logger}
		if err := rf.apply(&rc); err != nil {
			return err
		}
		shards, err := sf.apply(&rc)
		if err != nil {
			return err
		}
		apiTLS, peerTLS, joinTLS, err := tf.load(logger)
		if err != nil {
			return err
		}
		rc.PeerTLS = peerTLS
		limits, err := lf.limits()
		if err != nil {
			return err
		}
		srv, err := server.Start(server.Config{Raft: rc, TLS: apiTLS, JoinTLS: joinTLS, APIAddr: *apiAddr, GRPCAddr: *grpcAddr, MaxBodyBytes: rf.maxBody, Logger: logger, EnablePprof: rf.pprof, DisableConsole: !rf.ui, BrowserHosts: rf.browserHosts,
			Join: joinURLs, LeaveOnShutdown: *leave, ACL: *acl, ACLToken: *aclToken, Limits: limits, Shards: shards})
		if err != nil {
			return err
		}
		logger.Info("dlock node started", "id", *id, "api", srv.APIAddr(), "grpc", srv.GRPCAddr(), "raft", *raftAddr, "data_dir", *dataDir, "version", buildinfo.Get().Version, "commit", buildinfo.Get().Commit)
		readyCtx, stopNotify := context.WithCancel(context.Background())
		notified := make(chan struct{})
		go func() { defer close(notified); notifyReady(readyCtx, srv, logger) }()
		err = waitForSignalOr(srv.Stopped(), func(ctx context.Context) error {
			stopNotify()
			<-notified
			notifyStopping()
			return srv.Shutdown(ctx)
		}, logger.Info)
		if ferr := srv.Node.Err(); ferr != nil {
			// Exit non-zero: a supervisor must not take a node whose storage
			// failed for one that stopped cleanly.
			return fmt.Errorf("node %s stopped because its storage failed: %w (fix the disk, then restart it; if it refuses its data dir, see docs/operations.md)", *id, ferr)
		}
		return err
	}
	return cmd
}

// waitForSignal blocks until SIGINT/SIGTERM, then shuts down within 10 s; a
// second signal exits at once.
func waitForSignal(shutdown func(context.Context) error, info func(string, ...any)) error {
	return waitForSignalOr(nil, shutdown, info)
}

// waitForSignalOr is waitForSignal that also shuts down once stop is closed
// (the node stopped itself).
func waitForSignalOr(stop <-chan struct{}, shutdown func(context.Context) error, info func(string, ...any)) error {
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	select {
	case s := <-sig:
		info("shutting down", "signal", s.String())
	case <-stop:
		info("shutting down: the node stopped itself")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- shutdown(ctx) }()
	select {
	case err := <-done:
		return err
	case <-sig:
		return errors.New("second signal: exiting without finishing shutdown")
	}
}
