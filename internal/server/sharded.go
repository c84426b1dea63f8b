package server

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/dlock/dlock/internal/metrics"
	"github.com/dlock/dlock/internal/raftnode"
	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/shard"
	"github.com/dlock/dlock/internal/watch"
)

// startSharded opens a node of a sharded cluster: one Raft group per shard
// on one shared store and raft port, a service per group, and the router
// in front of them (docs/architecture.md, Shards).
func startSharded(cfg Config) (*Server, error) {
	m := *cfg.Shards
	switch {
	case cfg.Raft.Engine != raftnode.EngineEtcd:
		return nil, fmt.Errorf("--shards %d needs --raft-engine etcd (many groups share one log and one raft port only on that engine)", m.N())
	case cfg.ACL:
		return nil, errors.New("ACLs are not available on a sharded cluster yet; run without --acl or with --shards 1")
	case len(cfg.Join) > 0 || cfg.LeaveOnShutdown:
		return nil, errors.New("joining or leaving a sharded cluster is not available yet; start every node with --initial-cluster")
	}
	if err := shard.CheckDataDir(cfg.Raft.DataDir, m); err != nil {
		return nil, err
	}
	ln, grpcLn, rc, err := listenAPI(cfg)
	if err != nil {
		return nil, err
	}
	s := &Server{ln: ln, done: make(chan struct{}), logger: cfg.Logger.With("node", rc.ID), cfg: cfg, joined: make(chan struct{})}
	ok := false
	defer func() {
		if ok {
			return
		}
		for _, n := range s.nodes {
			_ = n.Shutdown()
		}
		for _, svc := range s.svcs {
			svc.Close()
		}
		if s.shared != nil {
			_ = s.shared.Close()
		}
		ln.Close()
		if grpcLn != nil {
			grpcLn.Close()
		}
	}()
	s.shared, err = raftnode.OpenShared(raftnode.SharedConfig{DataDir: rc.DataDir, RaftAddr: rc.RaftAddr,
		RaftAdvertise: rc.RaftAdvertise, PeerTLS: rc.PeerTLS, Logger: rc.Logger})
	if err != nil {
		return nil, err
	}
	mtr := metrics.New()
	for k := 0; k < m.N(); k++ {
		hub := watch.NewHub(cfg.WatchHistory, cfg.WatchBuffer)
		gc := rc
		gc.Shared, gc.Group = s.shared, m.Group(k)
		gc.Logger = rc.Logger.With("shard", k)
		gc.Observers = append(rc.Observers[:len(rc.Observers):len(rc.Observers)], hub)
		if k == 0 {
			// The state gauges of /metrics are shard 0's; every shard's
			// requests count in the request metrics.
			gc.Observers = append(gc.Observers, mtr)
		}
		node, err := raftnode.Open(gc)
		if err != nil {
			return nil, fmt.Errorf("shard %d: %w", k, err)
		}
		svc := service.New(node, hub, cfg.Logger.With("shard", strconv.Itoa(k)))
		svc.SetRecorder(mtr)
		svc.SetLimits(cfg.Limits.Service)
		svc.SetBrowserHosts(cfg.BrowserHosts)
		if k == 0 {
			mtr.Attach(metricsSource{node, hub})
		}
		s.nodes, s.svcs = append(s.nodes, node), append(s.svcs, svc)
	}
	s.Node, s.Service = s.nodes[0], s.svcs[0]
	s.router = shard.NewRouter(m, s.svcs)
	s.serveAPI(s.router, s.svcs[0], mtr, ln, grpcLn)
	ctx, cancel := context.WithCancel(context.Background())
	s.stop = cancel
	close(s.joined)
	groups := make([]shard.Group, len(s.nodes))
	for k, n := range s.nodes {
		groups[k] = n
	}
	s.balanced = make(chan struct{})
	go func() { defer close(s.balanced); shard.Balance(ctx, groups, s.logger) }()
	ok = true
	return s, nil
}

// Shards is a sharded node's groups, shard k at k (one entry on a
// one-group node).
func (s *Server) Shards() []*raftnode.Node { return s.allNodes() }

func (s *Server) allNodes() []*raftnode.Node {
	if s.nodes != nil {
		return s.nodes
	}
	return []*raftnode.Node{s.Node}
}

func (s *Server) allServices() []*service.Service {
	if s.svcs != nil {
		return s.svcs
	}
	return []*service.Service{s.Service}
}
