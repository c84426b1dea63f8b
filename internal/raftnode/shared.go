// The etcd-engine base that several Raft groups on one node share: one
// pebble store, one raft port with its mux and 'E' transport, and one
// forwarding server that hands each forwarded request to its group's node.

package raftnode

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// SharedConfig is where the shared base lives: a node's data dir and raft
// port, as in Config.
type SharedConfig struct {
	DataDir       string
	RaftAddr      string
	RaftAdvertise string
	PeerTLS       *tls.Config
	Logger        *slog.Logger
}

// Shared is one node's store, raft port and transport, shared by every
// group that node runs (Config.Shared). Open the groups' nodes on it, shut
// them all down, then Close it.
type Shared struct {
	logger *slog.Logger
	dir    string
	mux    *Mux
	store  *multiStore
	trans  *etcdTransport
	fwd    *http.Server

	client *http.Client

	mu     sync.Mutex
	groups map[uint64]http.Handler
	route  http.Handler

	wg     sync.WaitGroup
	closed sync.Once
}

// groupHeader names the group a forwarded request is for; a request
// without it is for the default group (so a one-group node's peers need
// not send it).
const groupHeader = "X-Dlock-Group"

// OpenShared opens the data dir's etcd-engine store and listens on the
// raft port. The data dir must be (or become) an etcd-engine dir.
func OpenShared(cfg SharedConfig) (*Shared, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.RaftAdvertise == "" {
		cfg.RaftAdvertise = cfg.RaftAddr
	}
	if err := os.MkdirAll(cfg.DataDir, 0o750); err != nil {
		return nil, fmt.Errorf("create data dir %s: %w", cfg.DataDir, err)
	}
	if err := checkEngine(cfg.DataDir, EngineEtcd); err != nil {
		return nil, err
	}
	store, err := openDataDirStore(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	s := &Shared{logger: cfg.Logger, dir: cfg.DataDir, store: store, groups: map[uint64]http.Handler{}}
	// listen is the node's; a throwaway node carries its settings.
	tmp := &Node{cfg: Config{RaftAddr: cfg.RaftAddr, RaftAdvertise: cfg.RaftAdvertise, PeerTLS: cfg.PeerTLS}, logger: cfg.Logger}
	if err := tmp.listen(); err != nil {
		store.Close()
		return nil, err
	}
	s.mux = tmp.mux
	s.wg.Add(1)
	go func() { defer s.wg.Done(); tmp.wg.Wait() }()
	s.trans = newEtcdTransport(s.mux, cfg.Logger)
	s.client = &http.Client{Transport: &http.Transport{
		DialContext:         ForwardDialer(s.mux.Dialer),
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		// A routed call's body waits for the receiver's "100 Continue"
		// (Call); it is never sent unasked, however long that takes.
		ExpectContinueTimeout: routeContinueWait,
	}}
	s.fwd = &http.Server{Handler: http.HandlerFunc(s.serveForward), ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn)}
	limitForwardServer(s.fwd)
	s.wg.Add(1)
	go func() { defer s.wg.Done(); _ = s.fwd.Serve(s.mux.ForwardListener()) }()
	return s, nil
}

// serveForward hands a forwarded request to its group's node; a group this
// node does not run (yet, or any more) is a 503, which the sender retries.
func (s *Shared) serveForward(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, RoutePrefix) {
		s.mu.Lock()
		h := s.route
		s.mu.Unlock()
		if h == nil {
			http.Error(w, "this node does not serve routed calls yet", http.StatusServiceUnavailable)
			return
		}
		h.ServeHTTP(w, r)
		return
	}
	g := defaultGroup
	if v := r.Header.Get(groupHeader); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || n == 0 {
			http.Error(w, "bad "+groupHeader, http.StatusBadRequest)
			return
		}
		g = n
	}
	s.mu.Lock()
	h := s.groups[g]
	s.mu.Unlock()
	if h == nil {
		http.Error(w, fmt.Sprintf("group %d is not running on this node", g), http.StatusServiceUnavailable)
		return
	}
	h.ServeHTTP(w, r)
}

// RoutePrefix starts the paths of calls one node's shard router sends to
// another's (HandleRoute): calls for a shard the sender does not run.
const RoutePrefix = "/route/"

// HandleRoute serves the calls under RoutePrefix that other nodes send.
func (s *Shared) HandleRoute(h http.Handler) {
	s.mu.Lock()
	s.route = h
	s.mu.Unlock()
}

// Call posts body to path (under RoutePrefix) on the node whose raft port
// is addr, with the peers' TLS, and returns the answer (at most
// maxRouteBody bytes) and its status.
//
// The body leaves this node only once the receiving handler has started
// reading it (the request says "Expect: 100-continue", which Go's server
// answers when the handler first reads the body), so a node that is paused,
// cut off or not serving never gets a call it could run later. accept, when
// above zero, bounds that wait: dial, TLS handshake and the handler's start
// included. An error that wraps ErrNotSent means the body was never sent
// (and ErrNotAccepted that accept passed first): the receiver cannot have
// run the call. Any other error came after the body was sent.
func (s *Shared) Call(ctx context.Context, addr, path string, body []byte, accept time.Duration) ([]byte, int, error) {
	gate := &gatedBody{r: bytes.NewReader(body)}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := func() bool { return false }
	if accept > 0 {
		t := time.AfterFunc(accept, func() {
			if gate.state.CompareAndSwap(gateWaiting, gateAbandoned) {
				gate.timedOut.Store(true)
				cancel()
			}
		})
		stop = t.Stop
		defer t.Stop()
	}
	req, err := http.NewRequestWithContext(cctx, http.MethodPost, "http://"+addr+path, gate)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %w", ErrNotSent, err)
	}
	req.ContentLength = int64(len(body))
	req.Header.Set("Expect", "100-continue")
	res, err := s.client.Do(req)
	if err != nil {
		return nil, 0, gate.why(addr, accept, err)
	}
	// An answer came (after the body, or a refusal without reading it):
	// the bound is over.
	stop()
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, MaxRouteBody+1))
	if err != nil {
		return nil, 0, gate.why(addr, accept, err)
	}
	if len(b) > MaxRouteBody {
		return nil, 0, fmt.Errorf("the answer from %s is over %d bytes", addr, MaxRouteBody)
	}
	return b, res.StatusCode, nil
}

// ErrNotSent wraps a Call error after which the receiver cannot have run
// the call: its body never left this node. ErrNotAccepted (which also
// wraps ErrNotSent) is the case where the receiver did not start reading
// it within the accept bound.
var (
	ErrNotSent     = errors.New("the call was not sent")
	ErrNotAccepted = errors.New("the node did not accept the call in time")
)

// gatedBody is a call's body that is sent only if the receiver asks for it
// before the accept bound passes: the first Read and the bound's timer race
// for state, and exactly one wins.
type gatedBody struct {
	r        *bytes.Reader
	state    atomic.Int32
	timedOut atomic.Bool // the accept bound won
}

const (
	gateWaiting int32 = iota
	gateSending
	gateAbandoned
)

var errGateClosed = errors.New("the call was abandoned before its body was sent")

func (g *gatedBody) Read(p []byte) (int, error) {
	if !g.state.CompareAndSwap(gateWaiting, gateSending) && g.state.Load() != gateSending {
		return 0, errGateClosed
	}
	return g.r.Read(p)
}

func (g *gatedBody) Close() error { return nil }

// why classifies a failed call by whether its body was sent.
func (g *gatedBody) why(addr string, accept time.Duration, err error) error {
	// A failure before the first Read wins the gate: a late Read (the
	// transport still sending) is refused, so the body stays here.
	g.state.CompareAndSwap(gateWaiting, gateAbandoned)
	switch {
	case g.state.Load() == gateSending:
		return err
	case g.timedOut.Load():
		return fmt.Errorf("%w: %w: the node at %s did not start reading it within %s", ErrNotAccepted, ErrNotSent, addr, accept)
	}
	return fmt.Errorf("%w: %w", ErrNotSent, err)
}

// Stream posts body to path (under RoutePrefix) on the node whose raft
// port is addr, with the peers' TLS, and hands back the answer's body as
// it streams (a forwarded watch): the caller reads it and closes it, and
// cancelling ctx ends it. An answer other than 200 is an error carrying
// the start of its body.
func (s *Shared) Stream(ctx context.Context, addr, path string, body []byte) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	res, err := s.client.Do(req)
	if err != nil {
		return nil, err
	}
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(res.Body, 512))
		res.Body.Close()
		return nil, fmt.Errorf("node at %s answered %d: %s", addr, res.StatusCode, b)
	}
	return res.Body, nil
}

// routeContinueWait is longer than any call's deadline: in effect, a routed
// call's body is sent only when the receiver asks for it.
const routeContinueWait = 24 * time.Hour

// MaxRouteBody bounds a routed call and its answer (a page of a list is
// the largest).
const MaxRouteBody = 16 << 20

// DeleteGroup removes group g's log, snapshot and mark from this node's
// store: the group was moved off the node. Shut its node down first.
func (s *Shared) DeleteGroup(g uint64) error {
	s.mu.Lock()
	open := s.groups[g] != nil
	s.mu.Unlock()
	if open {
		return fmt.Errorf("group %d is still open on this node", g)
	}
	if err := s.store.db.DeleteRange(groupKey(g, 0, 0), groupKey(g+1, 0, 0), pebble.Sync); err != nil {
		return fmt.Errorf("delete group %d: %w", g, err)
	}
	s.store.lastMu.Lock()
	delete(s.store.last, g)
	s.store.lastMu.Unlock()
	s.store.snapMu.Lock()
	s.store.dropSnapFiles(g, "")
	s.store.snapMu.Unlock()
	return os.RemoveAll(filepath.Join(s.dir, etcdStoreDir+"-mark", strconv.FormatUint(g, 10)))
}

// GroupStored reports whether this node's store holds anything of group g.
func (s *Shared) GroupStored(g uint64) (bool, error) {
	it, err := s.store.db.NewIter(&pebble.IterOptions{LowerBound: groupKey(g, 0, 0), UpperBound: groupKey(g+1, 0, 0)})
	if err != nil {
		return false, err
	}
	defer it.Close()
	return it.First(), it.Error()
}

func (s *Shared) register(group uint64, h http.Handler) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.groups[group] != nil {
		return fmt.Errorf("group %d is already open on this node", group)
	}
	s.groups[group] = h
	return nil
}

func (s *Shared) unregister(group uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.groups, group)
}

// Close stops the forwarding server, transport and raft port and closes
// the store. Shut every group's node down first.
func (s *Shared) Close() error {
	var err error
	s.closed.Do(func() {
		_ = s.fwd.Close()
		s.client.CloseIdleConnections()
		s.trans.Close()
		_ = s.mux.Close()
		s.wg.Wait()
		err = s.store.Close()
	})
	return err
}
