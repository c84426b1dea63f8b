// Package testcluster starts real dlock nodes in one process for tests: real
// Raft over loopback TCP, real on-disk log stores with fsync, real HTTP API
// servers. Nodes can be killed and restarted from their data dirs.
package testcluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/loopback"
	"github.com/dlock/dlock/internal/raftnode"
	"github.com/dlock/dlock/internal/server"
	"github.com/dlock/dlock/internal/shard"
)

// Cluster is a set of in-process nodes.
type Cluster struct {
	t       testing.TB
	dir     string
	ids     []string
	raft    map[string]string
	api     map[string]string
	grpc    map[string]string
	servers map[string]*server.Server
	logger  *slog.Logger
	// Tune adjusts each node's raft config before start.
	Tune func(*raftnode.Config)
	// Client is the HTTP client tests use.
	Client *http.Client
	opts   Options
	// joiners started with --join instead of the initial cluster.
	joiners map[string]bool
	// mu guards the maps and ids: tests read them from client goroutines
	// while the cluster changes.
	mu sync.Mutex
}

// FreePort returns a loopback address with a port that was free a moment ago.
// It comes from outside the kernel's ephemeral range and is never handed out
// twice in one process (loopback.FreeAddr).
func FreePort(t testing.TB) string {
	t.Helper()
	addr, err := loopback.FreeAddr()
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	return addr
}

// Options tunes a test cluster.
type Options struct {
	// WatchHistory is each node's kept event count (how far one watcher may
	// fall behind), WatchBuffer each watcher's hand-off channel (0: the
	// defaults).
	WatchHistory, WatchBuffer int
	// Limits are each node's abuse limits and timeouts (zero values: the
	// defaults).
	Limits server.Limits
	// Prepare runs before a node's first start with its data dir and the
	// cluster's raft addresses (to seed it, e.g. from a snapshot).
	Prepare func(id, dataDir string, raftAddrs map[string]string)
	// TLS, when set, serves every API over TLS and puts the raft ports
	// behind mutual TLS (see NewTLS); URL then gives https URLs and Client
	// trusts the CA.
	TLS *TLS
	// ACL runs every node with --acl (tokens required; docs/security.md).
	ACL bool
	// Engine, when set, is the replication engine instead of Engine()'s:
	// for a test about one engine's files on disk.
	Engine raftnode.EngineKind
	// Shards, with more than one range, runs a sharded cluster (on the etcd
	// engine, whatever DLOCK_TEST_RAFT_ENGINE says).
	Shards *shard.Map
	// BrowserHosts is each node's --browser-hosts.
	BrowserHosts []string
}

// New starts n nodes and waits for a leader. They stop at test cleanup.
func New(t testing.TB, n int) *Cluster { return NewWith(t, n, Options{}) }

// NewWith is New with options.
func NewWith(t testing.TB, n int, opts Options) *Cluster {
	t.Helper()
	c := &Cluster{t: t, opts: opts, dir: t.TempDir(), raft: map[string]string{}, api: map[string]string{}, grpc: map[string]string{}, servers: map[string]*server.Server{},
		Client: &http.Client{Timeout: 60 * time.Second, Transport: opts.TLS.transport()}}
	level := slog.LevelWarn
	if os.Getenv("DLOCK_TEST_LOG") != "" {
		level = slog.LevelDebug
	}
	c.logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("n%d", i+1)
		c.ids = append(c.ids, id)
		c.raft[id] = FreePort(t)
		c.api[id] = FreePort(t)
		c.grpc[id] = FreePort(t)
	}
	for _, id := range c.ids {
		if opts.Prepare != nil {
			opts.Prepare(id, c.DataDir(id), c.raft)
		}
		c.Start(id)
	}
	t.Cleanup(c.Stop)
	leader := c.WaitLeader(20 * time.Second)
	// Let every node register its API address, and every node see every
	// registration, so tests start from a quiet log and any node's cluster
	// view names every member's address (a test that reads the members
	// through a follower right away would otherwise race its apply). A node
	// that never registers leaves clients without its API address
	// (forwarding, leader redirects): that is a broken start, not a quiet one.
	deadline := time.Now().Add(20 * time.Second)
	for fewest := 0; fewest != n; {
		if time.Now().After(deadline) {
			t.Fatalf("a node sees only %d of %d nodes' API addresses after 20s (leader %s)", fewest, n, leader)
		}
		time.Sleep(20 * time.Millisecond)
		fewest = n
		for _, id := range c.IDs() {
			registered := 0
			for _, m := range c.Server(id).MembersNode().Status().Servers {
				if m.APIAddr != "" {
					registered++
				}
			}
			fewest = min(fewest, registered)
		}
	}
	return c
}

// Engine is the replication engine test clusters run on:
// DLOCK_TEST_RAFT_ENGINE (hashicorp or etcd), else the default.
func Engine() raftnode.EngineKind {
	k, err := raftnode.ParseEngine(os.Getenv("DLOCK_TEST_RAFT_ENGINE"))
	if err != nil {
		panic(err)
	}
	return k
}

// IDs lists the node ids.
func (c *Cluster) IDs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.ids...)
}

// Start starts (or restarts from its data dir) one node.
func (c *Cluster) Start(id string) {
	c.t.Helper()
	c.mu.Lock()
	rc := raftnode.Config{ID: id, DataDir: filepath.Join(c.dir, id), RaftAddr: c.raft[id], InitialCluster: c.initial(),
		RaftLogLevel: raftLevel(), Logger: c.logger, Engine: Engine()}
	if c.opts.Engine != "" {
		rc.Engine = c.opts.Engine
	}
	var join []string
	if c.joiners[id] {
		rc.InitialCluster = nil
		for _, other := range c.runningLocked() {
			join = append(join, c.scheme()+c.api[other])
		}
	}
	// Every port comes from FreePort, outside the kernel's ephemeral range:
	// a restart listens on the same ports, and a port from that range could
	// meanwhile be an outgoing connection's local port.
	apiAddr, grpcAddr := c.api[id], c.grpc[id]
	c.mu.Unlock()
	if c.opts.TLS != nil {
		rc.PeerTLS = c.opts.TLS.Peer(id)
	}
	if c.opts.Shards != nil && c.opts.Shards.N() > 1 {
		rc.Engine = raftnode.EngineEtcd
	}
	if c.Tune != nil {
		c.Tune(&rc)
	}
	cfg := server.Config{Shards: c.opts.Shards, Raft: rc, APIAddr: apiAddr, GRPCAddr: grpcAddr, Logger: c.logger, WatchHistory: c.opts.WatchHistory, WatchBuffer: c.opts.WatchBuffer, Join: join, ACL: c.opts.ACL, BrowserHosts: c.opts.BrowserHosts}
	cfg.Limits = c.opts.Limits
	if c.opts.TLS != nil {
		cfg.TLS, cfg.JoinTLS = c.opts.TLS.API, c.opts.TLS.Join
	}
	var s *server.Server
	var err error
	// A just-freed port can linger briefly; retry a few times.
	for try := 0; try < 50; try++ {
		s, err = server.Start(cfg)
		if err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		c.t.Fatalf("start %s: %v", id, err)
	}
	c.mu.Lock()
	c.servers[id] = s
	c.mu.Unlock()
}

// DataDir is a node's data directory.
func (c *Cluster) DataDir(id string) string { return filepath.Join(c.dir, id) }

// RaftAddr is a node's raft address.
func (c *Cluster) RaftAddr(id string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.raft[id]
}

// initial is the bootstrap configuration: the nodes created by New.
func (c *Cluster) initial() map[string]string {
	m := map[string]string{}
	for id, addr := range c.raft {
		if !c.joiners[id] {
			m[id] = addr
		}
	}
	return m
}

// Join starts a new node that joins the running cluster through its API (as
// `dlock serve --join` does) and returns its id.
func (c *Cluster) Join() string {
	c.t.Helper()
	c.mu.Lock()
	if c.joiners == nil {
		c.joiners = map[string]bool{}
	}
	id := fmt.Sprintf("n%d", len(c.ids)+1)
	c.ids = append(c.ids, id)
	c.raft[id] = FreePort(c.t)
	c.api[id] = FreePort(c.t)
	c.grpc[id] = FreePort(c.t)
	c.joiners[id] = true
	c.mu.Unlock()
	c.Start(id)
	return id
}

// Kill stops a node abruptly (no graceful hand-over), keeping its data dir.
func (c *Cluster) Kill(id string) {
	c.mu.Lock()
	s := c.servers[id]
	delete(c.servers, id)
	c.mu.Unlock()
	if s != nil {
		s.Kill()
	}
}

// Stop shuts every running node down.
func (c *Cluster) Stop() {
	c.mu.Lock()
	servers := c.servers
	c.servers = map[string]*server.Server{}
	c.mu.Unlock()
	for _, s := range servers {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = s.Shutdown(ctx)
		cancel()
	}
}

// Server returns a running node.
func (c *Cluster) Server(id string) *server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.servers[id]
}

// GRPCAddr is a node's gRPC address (host:port).
func (c *Cluster) GRPCAddr(id string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.grpc[id]
}

// Running lists running node ids.
func (c *Cluster) Running() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runningLocked()
}

func (c *Cluster) runningLocked() []string {
	var out []string
	for _, id := range c.ids {
		if c.servers[id] != nil {
			out = append(out, id)
		}
	}
	return out
}

// URL is a node's API base URL.
func (c *Cluster) URL(id string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.scheme() + c.api[id]
}

func (c *Cluster) scheme() string {
	if c.opts.TLS != nil {
		return "https://"
	}
	return "http://"
}

// WaitLeader waits until some running node is the ready leader and returns it.
func (c *Cluster) WaitLeader(timeout time.Duration) string {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		c.mu.Lock()
		servers := make(map[string]*server.Server, len(c.servers))
		for id, s := range c.servers {
			servers[id] = s
		}
		c.mu.Unlock()
		for id, s := range servers {
			if s.Node.IsLeader() {
				return id
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.t.Fatalf("no leader within %s", timeout)
	return ""
}

// Follower returns a running node that is not the leader.
func (c *Cluster) Follower() string {
	leader := c.WaitLeader(20 * time.Second)
	for _, id := range c.Running() {
		if id != leader {
			return id
		}
	}
	c.t.Fatalf("no follower running")
	return ""
}

// Do sends a JSON request and decodes the JSON answer into out (if non-nil).
func (c *Cluster) Do(ctx context.Context, method, url string, body any, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := c.Client.Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		return res.StatusCode, err
	}
	if out != nil && len(data) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			return res.StatusCode, fmt.Errorf("decode %s: %w", data, err)
		}
	}
	return res.StatusCode, nil
}

func raftLevel() string {
	if os.Getenv("DLOCK_TEST_LOG") != "" {
		return "debug"
	}
	return "off"
}
