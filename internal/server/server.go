// Package server assembles one dlock node: the Raft node, the service layer and
// the HTTP API listener, with an orderly start and shutdown. cmd/dlock and the
// in-process cluster tests both use it, so tests run exactly what ships.
package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"

	"github.com/dlock/dlock/internal/console"
	"github.com/dlock/dlock/internal/grpcapi"
	"github.com/dlock/dlock/internal/httpapi"
	"github.com/dlock/dlock/internal/metrics"
	"github.com/dlock/dlock/internal/raftnode"
	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/shard"
	"github.com/dlock/dlock/internal/state"
	"github.com/dlock/dlock/internal/tlsconfig"
	"github.com/dlock/dlock/internal/watch"
	"github.com/dlock/dlock/internal/wsapi"
)

// Config is a node's raft settings plus where to serve the client API.
type Config struct {
	Raft raftnode.Config
	// APIAddr is the HTTP listen address; Raft.APIAddr (advertised) defaults to it.
	APIAddr string
	// GRPCAddr is the gRPC listen address; empty serves no gRPC.
	GRPCAddr string
	// MaxBodyBytes bounds request bodies, gRPC and WebSocket messages
	// (default 64 KiB).
	MaxBodyBytes int64
	// Join lists API URLs of existing members; a node given Join (and no
	// initial cluster) asks them to add it, retrying until it is a member.
	Join []string
	// LeaveOnShutdown removes the node from the cluster on graceful shutdown.
	LeaveOnShutdown bool
	// EnablePprof serves Go's profiler at /debug/pprof/ on the API port.
	EnablePprof bool
	// DisableConsole turns off the web console at /ui/ (docs/console.md).
	DisableConsole bool
	// BrowserHosts are names, besides IP addresses, localhost and members'
	// API addresses, under which browser pages may reach the API (a reverse
	// proxy's name): see service.BrowserHost.
	BrowserHosts []string
	// TLS, when set, serves the HTTP and gRPC APIs over TLS (build it with
	// tlsconfig.API); JoinTLS is the client side of Join requests to https
	// URLs (tlsconfig.JoinClient; nil trusts the system roots). Peer mTLS
	// is Raft.PeerTLS.
	TLS, JoinTLS *tls.Config
	// WatchHistory is how many events each node keeps for watches that resume
	// from a revision, and so how far a watcher may fall behind; WatchBuffer
	// is each watcher's hand-off channel, in events (0: the defaults).
	WatchHistory, WatchBuffer int
	// Limits are the abuse limits and listener timeouts (limits.go).
	Limits Limits
	// ACL enforces ACL tokens on every API call (docs/security.md);
	// ACLToken is this node's own token, sent when it joins a cluster.
	ACL      bool
	ACLToken string
	Logger   *slog.Logger
	// Shards, when it has more than one range, runs the node as one member
	// of a sharded cluster (sharded.go); nil or one range is one group.
	Shards *shard.Map
}

// Server is one running node.
type Server struct {
	Node    *raftnode.Node
	Service *service.Service
	http    *http.Server
	ln      net.Listener
	done    chan struct{}
	grpc    *grpcapi.Server
	grpcLn  net.Listener
	ws      *wsapi.Handler
	logger  *slog.Logger
	cfg     Config
	stop    context.CancelFunc
	joined  chan struct{}

	// A sharded node's groups (Node and Service are shard 0's), their
	// shared store and raft port, and its router.
	shards *shardSet
	shared *raftnode.Shared
	router *shard.Router
	// balanced is closed when the shard balancer has stopped (nil unsharded).
	balanced chan struct{}
	// stopped is closed when a sharded node stopped itself: a group's
	// storage failed, or it was removed from the cluster (nil unsharded).
	stopped chan struct{}
}

// Ready is what /readyz answers: the node's service, or on a sharded
// cluster the router's (every shard, and the start-up gate).
func (s *Server) Ready() error {
	if s.router != nil {
		return s.router.Ready()
	}
	return s.Service.Ready()
}

// Stopped is closed when the node stopped itself and its process should
// exit: its storage failed (Node.Err says so), or, on a sharded cluster,
// it was removed from the cluster.
func (s *Server) Stopped() <-chan struct{} {
	if s.stopped != nil {
		return s.stopped
	}
	return s.Node.Failed()
}

// listenAPI opens the API's listeners (TLS if configured) and completes the
// Raft config with the API address and logger.
func listenAPI(cfg Config) (ln, grpcLn net.Listener, rc raftnode.Config, err error) {
	ln, err = net.Listen("tcp", cfg.APIAddr)
	if err != nil {
		return nil, nil, rc, fmt.Errorf("listen for the API on %s: %w (is the port in use?)", cfg.APIAddr, err)
	}
	if cfg.GRPCAddr != "" {
		if grpcLn, err = net.Listen("tcp", cfg.GRPCAddr); err != nil {
			ln.Close()
			return nil, nil, rc, fmt.Errorf("listen for gRPC on %s: %w (is the port in use?)", cfg.GRPCAddr, err)
		}
	}
	ln, grpcLn = apiTLS(ln, grpcLn, cfg.TLS)
	rc = cfg.Raft
	if rc.APIAddr == "" {
		rc.APIAddr = ln.Addr().String()
	}
	if rc.Logger == nil {
		rc.Logger = cfg.Logger
	}
	return ln, grpcLn, rc, nil
}

// Start opens the node and begins serving the API.
func Start(cfg Config) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Limits = cfg.Limits.withDefaults()
	if cfg.Shards != nil && cfg.Shards.N() > 1 {
		return startSharded(cfg)
	}
	if err := shard.CheckOneGroup(cfg.Raft.DataDir); err != nil {
		return nil, err
	}
	warnACLWithoutPeerTLS(cfg)
	ln, grpcLn, rc, err := listenAPI(cfg)
	if err != nil {
		return nil, err
	}
	hub := watch.NewHub(cfg.WatchHistory, cfg.WatchBuffer)
	mtr := metrics.New()
	rc.Observers = append(rc.Observers, hub, mtr)
	node, err := raftnode.Open(rc)
	if err != nil {
		ln.Close()
		if grpcLn != nil {
			grpcLn.Close()
		}
		return nil, err
	}
	svc := service.New(node, hub, cfg.Logger)
	svc.EnableACL(cfg.ACL)
	svc.SetRecorder(mtr)
	svc.SetLimits(cfg.Limits.Service)
	svc.SetBrowserHosts(cfg.BrowserHosts)
	mtr.Attach(metricsSource{node, hub})
	s := &Server{Node: node, Service: svc, ln: ln, done: make(chan struct{}), logger: cfg.Logger.With("node", rc.ID),
		cfg: cfg, joined: make(chan struct{})}
	s.serveAPI(svc, svc, mtr, ln, grpcLn)
	ctx, cancel := context.WithCancel(context.Background())
	s.stop = cancel
	if len(cfg.Join) > 0 {
		go s.join(ctx, rc.ID, rc.RaftAdvertise)
	} else {
		close(s.joined)
	}
	return s, nil
}

// frontend is what the API listeners serve: one node's service, or the
// shard router over several.
type frontend interface {
	httpapi.Service
	grpcapi.Service
	wsapi.Service
}

// serveAPI starts the HTTP (with WebSocket) and gRPC listeners on front;
// svc is the (first) service, for origins and the console.
func (s *Server) serveAPI(front frontend, svc *service.Service, mtr *metrics.Metrics, ln, grpcLn net.Listener) {
	api := httpapi.New(front, s.cfg.Logger.With("node", s.cfg.Raft.ID), httpapi.Options{MaxBodyBytes: s.cfg.MaxBodyBytes, Metrics: mtr.Handler(), Debug: pprofHandler(s.cfg.EnablePprof),
		WriteTimeout: s.cfg.Limits.WriteTimeout, AllowOrigin: svc.MemberOrigin, TrustHost: svc.BrowserHost, Console: consoleHandler(s.cfg.DisableConsole, svc)})
	wsOpts := wsapi.Options{MaxMessageBytes: s.cfg.MaxBodyBytes, MaxWatches: s.cfg.Limits.wsWatches(), Limited: mtr.Limited,
		AllowOrigin: svc.MemberOrigin, AuthTimeout: s.cfg.Limits.WSAuthTimeout, MaxUnauthenticatedPerIP: s.cfg.Limits.MaxUnauthenticatedPerIP}
	if s.cfg.ACL {
		wsOpts.Authenticate = svc.Authenticate
	}
	s.ws = wsapi.New(front, s.logger, wsOpts)
	s.http = &http.Server{
		// The WebSocket endpoint is matched on the exact escaped path, so
		// httpapi keeps its own routing (no ServeMux path cleaning).
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.EscapedPath() == wsapi.Path {
				if httpapi.CheckBrowserHost(r, svc.BrowserHost) != nil {
					api.ServeHTTP(w, r) // refused there, before routing
					return
				}
				s.ws.ServeHTTP(w, r)
				return
			}
			api.ServeHTTP(w, r)
		}),
		ErrorLog: slog.NewLogLogger(s.cfg.Logger.Handler(), slog.LevelWarn),
	}
	s.cfg.Limits.applyHTTP(s.http)
	go func() {
		defer close(s.done)
		if err := s.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.logger.Error("API server stopped", "err", err)
		}
	}()
	if grpcLn != nil {
		s.grpcLn = grpcLn
		gopts := grpcapi.Options{MaxMessageBytes: int(s.cfg.MaxBodyBytes), Limits: s.cfg.Limits.grpc(), SendTimeout: s.cfg.Limits.WriteTimeout}
		if s.cfg.TLS != nil {
			pn := &peerNames{Listener: grpcLn}
			grpcLn, gopts.PeerIdentity = pn, pn.name
		}
		s.grpc = grpcapi.New(front, s.logger, gopts)
		go func() {
			if err := s.grpc.Serve(grpcLn); err != nil {
				s.logger.Error("gRPC server stopped", "err", err)
			}
		}()
	}
}

// join asks the listed members to add this node, until one succeeds or the
// server stops. Joining an existing member again is a no-op, so a restarted
// node may keep its --join flag.
func (s *Server) join(ctx context.Context, id, raftAddr string) {
	defer close(s.joined)
	if raftAddr == "" {
		raftAddr = s.cfg.Raft.RaftAddr
	}
	body, _ := json.Marshal(service.MemberRequest{ID: id, RaftAddr: raftAddr})
	client := &http.Client{Timeout: 30 * time.Second, Transport: tlsconfig.HTTPTransport(s.cfg.JoinTLS)}
	backoff := 200 * time.Millisecond
	for attempt := 0; ; attempt++ {
		for _, base := range s.cfg.Join {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(base, "/")+"/api/v1/cluster/members", bytes.NewReader(body))
			if err != nil {
				s.logger.Error("bad --join URL", "url", base, "err", err)
				continue
			}
			req.Header.Set("Content-Type", "application/json")
			if s.cfg.ACLToken != "" {
				req.Header.Set("Authorization", "Bearer "+s.cfg.ACLToken)
			}
			res, err := client.Do(req)
			if err == nil {
				msg, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
				res.Body.Close()
				if res.StatusCode == http.StatusOK {
					s.logger.Info("joined the cluster", "via", base)
					return
				}
				err = fmt.Errorf("status %d: %s", res.StatusCode, bytes.TrimSpace(msg))
			}
			if attempt%10 == 0 {
				s.logger.Warn("join attempt failed; retrying", "via", base, "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// warnACLWithoutPeerTLS says at start-up what ACLs do not cover: the raft
// port authenticates peers only by TLS, so without it anyone who reaches that
// port can forward writes that no ACL check sees (docs/security.md).
func warnACLWithoutPeerTLS(cfg Config) {
	if cfg.ACL && cfg.Raft.PeerTLS == nil {
		cfg.Logger.Warn("ACLs are on but the raft port has no peer TLS: anyone who can reach "+cfg.Raft.RaftAddr+
			" can forge forwarded writes (take locks, revoke tokens) past every ACL check; give --peer-cert, --peer-key and --peer-ca, or firewall the raft port to the cluster's nodes",
			"raft_addr", cfg.Raft.RaftAddr)
	}
}

// Joined is closed once a --join has succeeded (at once without --join).
func (s *Server) Joined() <-chan struct{} { return s.joined }

// APIAddr is the address the API listens on.
func (s *Server) APIAddr() string { return s.ln.Addr().String() }

// GRPCAddr is the address gRPC listens on, or "" without gRPC.
func (s *Server) GRPCAddr() string {
	if s.grpcLn == nil {
		return ""
	}
	return s.grpcLn.Addr().String()
}

// Shutdown stops accepting requests, lets open ones finish until ctx ends,
// then stops the node.
func (s *Server) Shutdown(ctx context.Context) error {
	s.stop()
	if s.balanced != nil {
		<-s.balanced
	}
	if s.cfg.LeaveOnShutdown {
		if err := s.Node.Leave(ctx); err != nil {
			s.logger.Warn("could not leave the cluster cleanly; remove this node by hand", "err", err)
		}
	} else {
		// A planned stop of the leader hands leadership on first, so clients
		// see no election timeout.
		for _, n := range s.allNodes() {
			n.HandOffLeadership()
		}
	}
	for _, svc := range s.allServices() {
		svc.Close()
	}
	if s.router != nil {
		// Watches forwarded to or from other nodes end as a local one does
		// when its service closes.
		s.router.CloseStreams()
	}
	// WebSocket connections are hijacked, so http.Shutdown would not end
	// them; closing them withdraws their waits while the node still runs.
	s.ws.Close()
	gerr := make(chan error, 1)
	go func() {
		if s.grpc == nil {
			gerr <- nil
			return
		}
		gerr <- s.grpc.Shutdown(ctx)
	}()
	herr := s.http.Shutdown(ctx)
	if herr != nil {
		_ = s.http.Close()
	}
	<-s.done
	herr = errors.Join(herr, <-gerr)
	var nerr error
	for _, n := range s.allNodes() {
		nerr = errors.Join(nerr, n.Shutdown())
	}
	if s.shared != nil {
		nerr = errors.Join(nerr, s.shared.Close())
	}
	return errors.Join(herr, nerr)
}

// Kill stops the node abruptly, as a crash would (tests): open connections are
// cut and Raft stops without a graceful hand-over.
func (s *Server) Kill() {
	s.stop()
	if s.balanced != nil {
		<-s.balanced
	}
	// Raft first: a crashed node commits nothing more, not even the clean-up of
	// the requests its dying connections abandon.
	for _, n := range s.allNodes() {
		_ = n.Shutdown()
	}
	if s.shared != nil {
		_ = s.shared.Close()
	}
	if s.router != nil {
		// After the raft port closed: the watches this node served for
		// other nodes are cut, as a crash cuts them.
		s.router.CloseStreams()
	}
	for _, svc := range s.allServices() {
		svc.Close()
	}
	if s.grpc != nil {
		s.grpc.Stop()
	}
	s.ws.Close()
	_ = s.http.Close()
	<-s.done
}

// metricsSource is what the metrics read from a running node.
type metricsSource struct {
	node *raftnode.Node
	hub  *watch.Hub
}

func (m metricsSource) Status() raftnode.Status    { return m.node.Status() }
func (m metricsSource) Read(fn func(*state.State)) { m.node.FSM().Read(fn) }
func (m metricsSource) Watchers() int              { return m.hub.Watchers() }

// consoleHandler serves the web console unless it is turned off (nil).
func consoleHandler(disabled bool, svc *service.Service) http.Handler {
	if disabled {
		return nil
	}
	return console.Handler(console.Options{MemberOrigins: svc.MemberOrigins})
}

// pprofHandler serves net/http/pprof when enabled (nil otherwise).
func pprofHandler(enabled bool) http.Handler {
	if !enabled {
		return nil
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}
