// Node lifecycle: open the stores, start Raft, bootstrap on first start, follow
// leadership (barrier, then promote the reaper), and shut down in order.

package raftnode

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/buildinfo"
	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/expiry"
	"github.com/dlock/dlock/internal/fsm"
	"github.com/dlock/dlock/internal/state"
)

// Config configures one node.
type Config struct {
	ID      string
	DataDir string
	// RaftAddr is where the node listens for Raft and forwarding traffic.
	RaftAddr string
	// RaftAdvertise is the address peers dial (defaults to RaftAddr).
	RaftAdvertise string
	// APIAddr is the client API address this node advertises to the cluster.
	APIAddr string
	// InitialCluster maps node id to raft address; used only on first start.
	InitialCluster map[string]string
	// PeerTLS, when set, puts the raft port (Raft and forwarding) behind
	// mutual TLS, for accepting and dialling alike; see securePeers. Build
	// it with tlsconfig.Peer. Nil means plaintext.
	PeerTLS *tls.Config

	// Engine is the replication engine; a data dir keeps the engine it was
	// created with, and "" means that one (DefaultEngine for a new dir).
	Engine            EngineKind
	LogStore          LogStoreKind
	SnapshotThreshold uint64
	SnapshotInterval  time.Duration
	TrailingLogs      uint64
	SnapshotRetain    int

	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	// ApplyTimeout bounds a write whose context has no deadline.
	ApplyTimeout time.Duration
	// PackInFlight bounds the log entries the leader has under commit at
	// once; writes that find it busy are packed into the next entry
	// (default DefaultPackInFlight; 1 packs the most).
	PackInFlight int
	// PackLinger is how long a lone write waits for a second to share its
	// log entry when lone writes have lately come in pairs (default
	// DefaultPackLinger; negative never waits; see packer.linger).
	PackLinger time.Duration
	// CommitNoticeDelay is how long the leader lets its last commit go
	// unannounced to the followers before it appends a barrier to announce
	// it (default DefaultCommitNoticeDelay; see packer.notice).
	CommitNoticeDelay time.Duration
	// CommitTimeout is hashicorp/raft's: how long a follower may go without
	// an AppendEntries (and so without news of commits) while no entries
	// flow, before the leader sends an empty one. Default Raft's 50 ms; the
	// commit notice makes it a fallback.
	CommitTimeout time.Duration
	// RaftLogLevel is hclog's level for Raft's own logs (default "warn").
	RaftLogLevel string
	Logger       *slog.Logger
	// Observers see every applied event from the very first entry replayed at
	// start-up (they are registered before Raft starts).
	Observers []fsm.Observer
	// MinFreeDisk is the free space (bytes) the data dir's disk keeps in
	// reserve: below it the leader refuses new writes with disk_full. 0
	// means DefaultMinFreeDisk, negative turns the guard off.
	MinFreeDisk int64
	// FreeSpace reports the free space under a dir (nil: statfs); tests
	// inject a full disk with it.
	FreeSpace func(dir string) (uint64, error)

	// Shared, when set, runs this node as one group (Group; 0 means the
	// default group) on a base other groups share: its store, raft port and
	// transport (etcd engine only). The node neither opens nor closes them.
	Shared *Shared
	Group  uint64
	// InitialState, when set on a group this node has never stored, starts
	// the group from that state snapshot at InitialIndex, with
	// InitialCluster as its voters, instead of empty: a split-off shard
	// (etcd engine only). A group already stored ignores it.
	InitialState []byte
	InitialIndex uint64
	// SnapshotHold, when set, is asked before the group snapshots its state
	// (and so compacts the log behind it): a non-nil answer holds the
	// snapshot back, and a requested one fails with it. A source shard holds
	// its snapshots while a split's new group is not stored on this node
	// yet, so the split entry is replayed after a crash (etcd engine only).
	// It runs on the apply goroutine: it must not block or read the FSM.
	SnapshotHold func() error

	// HistoryRetention, when set, is what this node commits as the grant
	// history's bounds while it leads (nil leaves the state's bounds).
	HistoryRetention *state.HistoryRetention

	// wrapLogStore, set only by tests, wraps the log store under the
	// checksumming layer to inject faults.
	wrapLogStore func(LogAndStableStore) LogAndStableStore
	// etcdWriteHook, set only by tests, sees every etcd-engine log write
	// before it reaches the store and may fail it.
	etcdWriteHook func(group uint64, snapshot bool) error
	// etcdLogBytes, set only by tests, replaces the etcd engine's 64 MiB
	// byte bounds of its in-memory log.
	etcdLogBytes uint64
	// raftIOTimeout, set only by tests, replaces the hashicorp transport's
	// I/O timeout (raftIOTimeout below).
	raftIOTimeout time.Duration
}

// Defaults fills unset fields with the documented defaults.
func (c *Config) Defaults() {
	if c.LogStore == "" {
		c.LogStore = DefaultLogStore
	}
	if c.SnapshotThreshold == 0 {
		c.SnapshotThreshold = 16384
	}
	if c.SnapshotInterval == 0 {
		c.SnapshotInterval = 30 * time.Second
	}
	if c.TrailingLogs == 0 {
		c.TrailingLogs = 10240
	}
	if c.SnapshotRetain == 0 {
		c.SnapshotRetain = 2
	}
	if c.HeartbeatTimeout == 0 {
		c.HeartbeatTimeout = DefaultHeartbeatTimeout
	}
	if c.ElectionTimeout == 0 {
		c.ElectionTimeout = DefaultElectionTimeout
	}
	if c.LeaderLeaseTimeout == 0 {
		c.LeaderLeaseTimeout = DefaultLeaderLeaseTimeout
	}
	if c.ApplyTimeout == 0 {
		c.ApplyTimeout = 10 * time.Second
	}
	if c.PackInFlight <= 0 {
		c.PackInFlight = DefaultPackInFlight
	}
	if c.PackLinger == 0 {
		c.PackLinger = DefaultPackLinger
	}
	if c.CommitNoticeDelay <= 0 {
		c.CommitNoticeDelay = DefaultCommitNoticeDelay
	}
	if c.RaftLogLevel == "" {
		c.RaftLogLevel = "warn"
	}
	if c.RaftAdvertise == "" {
		c.RaftAdvertise = c.RaftAddr
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Raft timing defaults, tuned for a LAN: a follower that hears nothing from
// the leader for 150-300 ms starts a (pre-)vote, so a dead leader is replaced
// in well under half a second (docs/benchmarks.md). Timing never affects lock
// safety — expiry is decided by the leader through committed commands, and a
// new leader counts each lease's remaining time again from its takeover — it
// only trades failover speed against spurious elections on a stalled machine;
// shorter timeouts also extend leases less at each failover.
const (
	DefaultHeartbeatTimeout   = 150 * time.Millisecond
	DefaultElectionTimeout    = 150 * time.Millisecond
	DefaultLeaderLeaseTimeout = 100 * time.Millisecond
)

// LogCacheEntries is how many of the newest log entries a node keeps in
// memory in front of its log store: several MaxAppendEntries batches, so
// replication and the followers' apply find what was just written.
const LogCacheEntries = 4096

// Node is one running dlock Raft node.
type Node struct {
	cfg    Config
	logger *slog.Logger

	raft      Engine
	packer    *packer
	fsm       *fsm.FSM
	reaper    *expiry.Reaper
	mux       *Mux
	trans     *serialTransport
	closeLogs func() error
	disk      *diskGuard
	// setFatal hands the log store the node's fail (hashicorp engine).
	setFatal func(func(error))
	// hlogs is hashicorp/raft's log (nil on the etcd engine): a read index
	// looks up which entries its FSM never sees.
	hlogs raft.LogStore
	// The etcd engine's transport and store (nil on hashicorp).
	etcdTrans *etcdTransport
	etcdStore *multiStore

	// fatal is the storage failure that stopped this node; failed is
	// closed when it is set.
	fatal  atomic.Pointer[error]
	failed chan struct{}
	// stopped is closed when Shutdown has finished.
	stopped chan struct{}

	fwdServer *http.Server
	fwdClient *http.Client
	// endorser, once the service has set it, adds to this leader's answers
	// to forwarded writes (SetEndorser).
	endorser atomic.Pointer[Endorser]

	// ready is true while this node is the leader and its barrier has been
	// applied: only then may it stamp, propose and answer reads.
	ready  atomic.Bool
	lastTS atomic.Int64
	// leaseClock is where this leader's lease clock counts from (see
	// command.Envelope.Clock); set by becomeReady before the node is ready.
	leaseClock atomic.Pointer[leaseClockBase]
	// Counters for metrics.
	forwarded     atomic.Uint64
	leaderChanges atomic.Uint64
	peers         peerHealth
	raftLog       *hclogAdapter
	// leaderlessSince is since when this node has known no leader (Unix ns;
	// 0 while it knows one), also at start-up before the first election.
	// followLeadership keeps it.
	leaderlessSince atomic.Int64

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	closed atomic.Bool

	// leadMu orders promotion against demotion: becomeReady promotes (reaper
	// active, ready) only while its term's context is live, checked under
	// leadMu, and followLeadership cancels that context and demotes under
	// leadMu, so a becomeReady that lost the race can never undo a demotion.
	leadMu sync.Mutex
}

// Open starts a node. On first start with InitialCluster set it bootstraps the
// cluster; later starts recover everything from DataDir.
func Open(cfg Config) (*Node, error) {
	cfg.Defaults()
	if cfg.ID == "" {
		return nil, errors.New("node id is empty: pass --id")
	}
	if err := os.MkdirAll(cfg.DataDir, 0o750); err != nil {
		return nil, fmt.Errorf("create data dir %s: %w", cfg.DataDir, err)
	}
	n := &Node{cfg: cfg, logger: cfg.Logger.With("node", cfg.ID), failed: make(chan struct{}), stopped: make(chan struct{})}
	n.disk = newDiskGuard(cfg.DataDir, cfg.MinFreeDisk, cfg.FreeSpace)
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.fsm = fsm.New(n.logger)
	n.reaper = expiry.New(expiry.SystemClock{}, proposerFunc(n.Propose), n.fsm, n.logger)
	if cfg.HistoryRetention != nil {
		n.reaper.SetRetention(*cfg.HistoryRetention)
	}
	n.fsm.AddObserver(n.reaper)
	for _, o := range cfg.Observers {
		n.fsm.AddObserver(o)
	}

	ok := false
	defer func() {
		if !ok {
			n.cancel()
			n.closeAll()
		}
	}()

	if cfg.Engine == "" {
		k, err := DataDirEngine(cfg.DataDir)
		if err != nil {
			return nil, err
		}
		if k == "" {
			k = DefaultEngine
		}
		cfg.Engine, n.cfg.Engine = k, k
	}
	if err := checkEngine(cfg.DataDir, cfg.Engine); err != nil {
		return nil, err
	}
	var err error
	if cfg.Shared != nil && cfg.Engine != EngineEtcd {
		return nil, fmt.Errorf("groups sharing one store need the etcd engine, not %s", cfg.Engine)
	}
	if cfg.Engine == EngineEtcd {
		err = n.openEtcd()
	} else {
		err = n.openHashicorp()
	}
	if err != nil {
		return nil, err
	}
	dial := n.mux.Dialer

	n.fwdClient = &http.Client{Transport: &http.Transport{
		DialContext:         ForwardDialer(dial),
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	}}
	n.fwdServer = &http.Server{Handler: n.forwardHandler(), ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(n.logger.Handler(), slog.LevelWarn)}
	limitForwardServer(n.fwdServer)
	if cfg.Shared != nil {
		if err := cfg.Shared.register(n.group(), n.fwdServer.Handler); err != nil {
			return nil, err
		}
		n.wg.Add(1)
		go func() { defer n.wg.Done(); <-n.ctx.Done() }()
	} else {
		n.wg.Add(1)
		go func() { defer n.wg.Done(); _ = n.fwdServer.Serve(n.mux.ForwardListener()) }()
	}
	n.wg.Add(3)
	go func() { defer n.wg.Done(); n.packer.run() }()
	go func() { defer n.wg.Done(); n.followLeadership() }()
	go func() { defer n.wg.Done(); n.reaper.Run(n.ctx) }()
	n.wg.Add(1)
	go func() { defer n.wg.Done(); n.registerSelf() }()
	n.wg.Add(1)
	go func() { defer n.wg.Done(); n.watchPeers() }()
	if r, ok := n.raft.(*raft.Raft); ok {
		n.wg.Add(1)
		go func() { defer n.wg.Done(); n.snapshotIfDue(r) }()
	}
	ok = true
	// Last: a write that failed during start-up is reported here at once.
	if n.setFatal != nil {
		n.setFatal(n.fail)
	}
	return n, nil
}

// listen opens the raft port and its mux (both engines share it).
func (n *Node) listen() error {
	cfg := n.cfg
	ln, err := net.Listen("tcp", cfg.RaftAddr)
	if err != nil {
		return fmt.Errorf("listen for raft on %s: %w (is another node using this port?)", cfg.RaftAddr, err)
	}
	adv, err := net.ResolveTCPAddr("tcp", cfg.RaftAdvertise)
	if err != nil {
		ln.Close()
		return fmt.Errorf("raft advertise address %q: %w", cfg.RaftAdvertise, err)
	}
	ln, dial := securePeers(ln, sourceDialer(cfg.RaftAddr), cfg.PeerTLS)
	n.mux = NewMux(ln, adv, n.logger)
	n.mux.Dialer = dial
	n.wg.Add(1)
	go func() { defer n.wg.Done(); _ = n.mux.Serve() }()
	return nil
}

// openDataDirStore opens the etcd engine's pebble log under a data dir.
func openDataDirStore(dataDir string) (*multiStore, error) {
	storeDir := filepath.Join(dataDir, etcdStoreDir)
	_, statErr := os.Stat(storeDir)
	store, err := openMultiStore(storeDir)
	var ce *CorruptError
	if errors.As(err, &ce) || (err != nil && statErr == nil && !errors.Is(err, os.ErrPermission)) {
		// An existing log pebble cannot open (a file of its own missing or
		// damaged, whatever error pebble names) is a damaged data dir.
		return nil, &RefusedError{Dir: dataDir, Err: err}
	}
	return store, err
}

// openEtcd starts the etcd engine on the node's pebble log.
func (n *Node) openEtcd() error {
	cfg := n.cfg
	if sh := cfg.Shared; sh != nil {
		n.mux, n.etcdStore, n.etcdTrans = sh.mux, sh.store, sh.trans
		return n.startEtcd()
	}
	store, err := openDataDirStore(cfg.DataDir)
	if err != nil {
		return err
	}
	store.writeHook = cfg.etcdWriteHook
	n.etcdStore = store
	n.closeLogs = store.Close
	if err := n.listen(); err != nil {
		return err
	}
	n.etcdTrans = newEtcdTransport(n.mux, n.logger)
	return n.startEtcd()
}

// group is the node's Raft group id.
func (n *Node) group() uint64 {
	if n.cfg.Group == 0 {
		return defaultGroup
	}
	return n.cfg.Group
}

// startEtcd starts the node's group on its store and transport.
func (n *Node) startEtcd() error {
	cfg := n.cfg
	e, err := newEtcdEngine(etcdEngineConfig{
		ID: cfg.ID, Group: n.group(), InitialCluster: cfg.InitialCluster,
		Election:  max(cfg.HeartbeatTimeout, cfg.ElectionTimeout),
		Threshold: cfg.SnapshotThreshold, Trailing: cfg.TrailingLogs, Interval: cfg.SnapshotInterval,
		SnapshotBytes: cfg.etcdLogBytes, TrailingBytes: cfg.etcdLogBytes,
		RaftLogLevel: cfg.RaftLogLevel, Logger: n.logger, FSM: n.fsm, Store: n.etcdStore, Transport: n.etcdTrans,
		MarkDir:      filepath.Join(cfg.DataDir, etcdStoreDir+"-mark", strconv.FormatUint(n.group(), 10)),
		OnFail:       n.fail,
		PeerHealth:   n.peers.set,
		InitialState: cfg.InitialState, InitialIndex: cfg.InitialIndex,
		SnapshotHold: cfg.SnapshotHold,
	})
	if err != nil {
		var ce *CorruptError
		if errors.As(err, &ce) || errors.Is(err, errMarkMissing) || strings.Contains(err.Error(), "entries were lost") {
			return &RefusedError{Dir: cfg.DataDir, Err: err}
		}
		return err
	}
	n.raft = e
	// No commit notices: etcd raft tells the followers of every commit
	// itself, in its next append or heartbeat.
	n.packer = newPacker(e.Apply, nil, cfg.PackInFlight, cfg.CommitNoticeDelay, cfg.PackLinger, n.ctx.Done())
	return nil
}

// openHashicorp starts hashicorp/raft on the data dir's log store.
func (n *Node) openHashicorp() error {
	cfg := n.cfg
	if err := checkLogStoreKind(cfg.DataDir, cfg.LogStore); err != nil {
		return err
	}
	if cfg.LogStore == LogStoreWAL || cfg.LogStore == "" {
		logTornTail(filepath.Join(cfg.DataDir, walDirName), n.logger)
	}
	cs, closeLogs, err := openCheckedStore(cfg.LogStore, cfg.DataDir)
	if err != nil {
		return err
	}
	n.closeLogs = closeLogs
	if cfg.wrapLogStore != nil {
		cs.inner = cfg.wrapLogStore(cs.inner)
	}
	store := cs.raftStore()
	hlog := newRaftLogger(n.logger, cfg.RaftLogLevel)
	n.raftLog = hlog.(*hclogAdapter)
	snaps, err := raft.NewFileSnapshotStoreWithLogger(cfg.DataDir, cfg.SnapshotRetain, hlog) // adds "snapshots/"
	if err != nil {
		return fmt.Errorf("open snapshot store in %s: %w", cfg.DataDir, err)
	}
	// Before Raft reads anything: Raft would apply a damaged entry, start
	// from a log that lost acknowledged entries, or fall back to an older
	// snapshot the log no longer continues (and panic).
	if err := verifyDataDir(cs, snaps, cfg.DataDir, n.logger); err != nil {
		return err
	}

	if err := n.listen(); err != nil {
		return err
	}
	n.setFatal = cs.SetFatal
	ioTimeout := raftIOTimeout
	if cfg.raftIOTimeout > 0 {
		ioTimeout = cfg.raftIOTimeout
	}
	n.trans = newSerialTransport(raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: n.mux.RaftLayer(), MaxPool: 5, Timeout: ioTimeout, Logger: hlog,
	}))

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.ID)
	rc.Logger = hlog
	rc.HeartbeatTimeout = cfg.HeartbeatTimeout
	rc.ElectionTimeout = cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = cfg.LeaderLeaseTimeout
	if cfg.CommitTimeout > 0 {
		rc.CommitTimeout = cfg.CommitTimeout
	}
	rc.SnapshotThreshold = cfg.SnapshotThreshold
	rc.SnapshotInterval = cfg.SnapshotInterval
	rc.TrailingLogs = cfg.TrailingLogs
	// Group commit: the leader takes up to MaxAppendEntries queued proposals
	// into one log write (one fsync) and one AppendEntries round.
	rc.BatchApplyCh = true
	rc.MaxAppendEntries = 512
	rc.PreVoteDisabled = false

	hasState, err := raft.HasExistingState(store, store, snaps)
	if err != nil {
		return fmt.Errorf("inspect raft state in %s: %w", cfg.DataDir, err)
	}
	// A write-through cache of the newest entries: without it the leader
	// reads every entry it just wrote back from the WAL to replicate it, and
	// every follower reads back every entry it just stored to apply it (a
	// pread each). Measured in docs/benchmarks.md: follower CPU per cycle
	// -20 %, leader -10 %.
	logs, err := raft.NewLogCache(LogCacheEntries, store)
	if err != nil {
		return fmt.Errorf("raft log cache: %w", err)
	}
	r, err := newRaftRefusingPanics(cfg.DataDir, func() (*raft.Raft, error) {
		return raft.NewRaft(rc, n.fsm, logs, store, snaps, n.trans)
	})
	if err != nil {
		return fmt.Errorf("start raft: %w", err)
	}
	n.raft = r
	n.hlogs = logs
	if !hasState && len(cfg.InitialCluster) > 0 {
		if _, self := cfg.InitialCluster[cfg.ID]; !self {
			return fmt.Errorf("--initial-cluster does not name this node %q", cfg.ID)
		}
		ids := make([]string, 0, len(cfg.InitialCluster))
		for id := range cfg.InitialCluster {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		var servers []raft.Server
		for _, id := range ids {
			servers = append(servers, raft.Server{ID: raft.ServerID(id), Address: raft.ServerAddress(cfg.InitialCluster[id]), Suffrage: raft.Voter})
		}
		// Every initial member bootstraps with the same configuration; Raft
		// treats identical bootstraps as one.
		if err := r.BootstrapCluster(raft.Configuration{Servers: servers}).Error(); err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
			return fmt.Errorf("bootstrap cluster: %w", err)
		}
		n.logger.Info("bootstrapped new cluster", "members", len(servers))
	} else if hasState {
		n.logger.Info("recovered raft state from data dir", "dir", cfg.DataDir)
	}

	n.packer = newPacker(r.Apply, r.Barrier, cfg.PackInFlight, cfg.CommitNoticeDelay, cfg.PackLinger, n.ctx.Done())
	return nil
}

// fail stops the node after a storage failure: a write or fsync that failed
// (the page cache may have dropped the data, so no later write can be
// trusted), or corruption read back while running. The node takes no further
// part in Raft and answers no requests; Failed tells its owner.
func (n *Node) fail(err error) {
	if !n.fatal.CompareAndSwap(nil, &err) {
		return
	}
	n.logger.Error("stopping this node: its storage failed, so it takes no further part in Raft and serves no requests. "+
		"Fix the disk and restart it; if it then refuses its data dir, follow docs/operations.md, \"A node refuses its data dir\"", "err", err)
	n.ready.Store(false)
	close(n.failed)
	// Not from the caller's goroutine: that is Raft's, inside a log store
	// call, and Raft's shutdown waits for it.
	go func() { _ = n.Shutdown() }()
}

// Failed is closed once a storage failure has stopped the node (Err says why).
func (n *Node) Failed() <-chan struct{} { return n.failed }

// Err is the storage failure that stopped the node, or nil.
func (n *Node) Err() error {
	if p := n.fatal.Load(); p != nil {
		return *p
	}
	return nil
}

// stoppedErr answers requests on a node its storage failure stopped.
func (n *Node) stoppedErr() error {
	if err := n.Err(); err != nil {
		return &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Err: err,
			Message: "this node stopped because its storage failed; retry through another node (with the same request_id, a write that did commit is answered from there)"}
	}
	return nil
}

type proposerFunc func(ctx context.Context, e *command.Envelope) error

func (f proposerFunc) Propose(ctx context.Context, e *command.Envelope) error { return f(ctx, e) }

// FSM is the node's state machine (for reads and observers).
func (n *Node) FSM() *fsm.FSM { return n.fsm }

// Raft exposes the replication engine for status and tests.
func (n *Node) Raft() Engine { return n.raft }

// ConfigurationAt is the group's configuration as entry index saw it when
// applied: the same on every replica, unlike the current one, which a
// membership change may have moved on from by the time a node asks.
// Only the etcd engine keeps it.
func (n *Node) ConfigurationAt(index uint64) (raft.Configuration, error) {
	h, ok := n.raft.(interface {
		ConfigurationAt(uint64) (raft.Configuration, error)
	})
	if !ok {
		return raft.Configuration{}, errors.New("the hashicorp engine keeps no configuration history")
	}
	return h.ConfigurationAt(index)
}

// Engine is the node's replication engine kind.
func (n *Node) Engine() EngineKind { return n.cfg.Engine }

// ID is the node id.
func (n *Node) ID() string { return n.cfg.ID }

// IsLeader reports whether this node is the leader and ready to serve.
func (n *Node) IsLeader() bool { return n.ready.Load() && n.raft.State() == raft.Leader }

// followLeadership promotes and demotes the reaper as leadership comes and
// goes. LeaderCh may drop signals, so Raft's own state is re-read on every
// signal and on a short tick.
func (n *Node) followLeadership() {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var termCancel context.CancelFunc
	leading := false
	for {
		select {
		case <-n.ctx.Done():
			if termCancel != nil {
				termCancel()
			}
			return
		case <-n.raft.LeaderCh():
		case <-tick.C:
		}
		if addr, _ := n.raft.LeaderWithID(); addr == "" {
			n.leaderlessSince.CompareAndSwap(0, time.Now().UnixNano())
		} else {
			n.leaderlessSince.Store(0)
		}
		now := n.raft.State() == raft.Leader
		if now == leading {
			continue
		}
		leading = now
		n.leaderChanges.Add(1)
		if now {
			var tctx context.Context
			tctx, termCancel = context.WithCancel(n.ctx)
			n.wg.Add(2)
			go func() { defer n.wg.Done(); n.becomeReady(tctx) }()
			go func() { defer n.wg.Done(); n.runPromoter(tctx) }()
		} else {
			n.demote(termCancel)
			termCancel = nil
			n.logger.Info("lost leadership")
		}
	}
}

// LeaderlessFor is how long this node has known no leader (0 while it knows
// one), to within followLeadership's 100 ms tick. A node cut off from the
// majority, or removed from the cluster, stays leaderless; a failover makes it
// so for a few hundred milliseconds.
func (n *Node) LeaderlessFor() time.Duration {
	since := n.leaderlessSince.Load()
	if since == 0 {
		return 0
	}
	return time.Since(time.Unix(0, since))
}

// LeaderContact says whether this node knows a leader and how long ago it last
// heard from one (0 on the leader; -1 if it never has): what a stale read,
// answered from this node's state, tells the client about its freshness.
func (n *Node) LeaderContact() (known bool, since time.Duration) {
	if n.raft.State() == raft.Leader {
		return true, 0
	}
	addr, _ := n.raft.LeaderWithID()
	last := n.raft.LastContact()
	if last.IsZero() {
		return addr != "", -1
	}
	return addr != "", time.Since(last)
}

// demote ends the term (endTerm cancels its context; nil for none) and closes
// the node for writes and reads. It holds leadMu, as promote does.
func (n *Node) demote(endTerm context.CancelFunc) {
	n.leadMu.Lock()
	defer n.leadMu.Unlock()
	if endTerm != nil {
		endTerm()
	}
	n.ready.Store(false)
	n.leaseClock.Store(nil)
	n.reaper.Demote()
}

// becomeReady applies a barrier so every entry of earlier terms is in the FSM,
// then starts the reaper from that state and opens the node for writes.
func (n *Node) becomeReady(ctx context.Context) {
	for ctx.Err() == nil {
		if err := awaitFuture(ctx, n.raft.Barrier(5*time.Second)); err != nil {
			n.logger.Warn("leader barrier failed; retrying", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		if ctx.Err() != nil || n.raft.State() != raft.Leader {
			return
		}
		// Timestamps never go backwards along the log, even if this node's
		// clock is behind the previous leader's. The lease clock counts on
		// from where the log stands, on this node's monotonic clock: the
		// time between the last leader's last entry and now is not counted
		// (a lease may gain it, never lose it), and no wall clock is read.
		term := n.raft.CurrentTerm()
		n.fsm.Read(func(s *state.State) {
			n.leaseClock.Store(&leaseClockBase{base: s.LeaseClock(), start: time.Now(), term: term})
			for {
				prev := n.lastTS.Load()
				if prev >= s.LastTS() || n.lastTS.CompareAndSwap(prev, s.LastTS()) {
					return
				}
			}
		})
		if err := n.ensureTokenKey(ctx); err != nil {
			n.logger.Warn("installing the token-signing key failed; retrying", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		if n.promote(ctx) {
			n.logger.Info("became leader", "term", n.raft.CurrentTerm(), "applied", n.fsm.AppliedIndex())
		}
		return
	}
}

// promote starts the reaper and opens the node for writes and reads, unless
// the term ctx belongs to has ended (followLeadership demoted the node after
// becomeReady's last check): both sides hold leadMu, so a demotion is either
// seen here or undoes this promotion, never the other way round.
func (n *Node) promote(ctx context.Context) bool {
	n.leadMu.Lock()
	defer n.leadMu.Unlock()
	if ctx.Err() != nil || n.raft.State() != raft.Leader {
		return false
	}
	n.reaper.Promote()
	n.ready.Store(true)
	return true
}

// ensureTokenKey gives a cluster without a token-signing key its first one,
// before this leader serves any grant, so every grant carries a proof. The
// seed is drawn here, outside the state machine; a racing proposal from an
// earlier leader makes this one a no-op (the FSM keeps the first key).
func (n *Node) ensureTokenKey(ctx context.Context) error {
	has := false
	n.fsm.Read(func(s *state.State) { _, _, has = s.SigningKey() })
	if has {
		return nil
	}
	body := &command.SetTokenKey{}
	if _, err := rand.Read(body.Seed[:]); err != nil {
		return fmt.Errorf("draw a token key: %w", err)
	}
	data, err := command.EncodeChecked(n.stamped(&command.Envelope{ClientID: "dlock", Body: body}))
	if err != nil {
		return err
	}
	if err := awaitFuture(ctx, n.raft.Apply(data, 5*time.Second)); err != nil {
		return fmt.Errorf("propose the token key: %w", err)
	}
	var id [8]byte
	retired := 0
	n.fsm.Read(func(s *state.State) {
		_, id, _ = s.SigningKey()
		retired = len(s.TokenKeys()) - 1
	})
	// retired_keys > 0 on a new key: a cluster restored from a snapshot,
	// whose old cluster's key now only verifies older proofs.
	n.logger.Info("installed the cluster's token-signing key", "key_id", fmt.Sprintf("%x", id), "retired_keys", retired)
	return nil
}

// registerSelf records this node's API address in the replicated state once a
// leader exists, so every node can point clients to the leader's API. It
// proposes at most one registration per start: a restarted node that is
// still replaying its log has not yet applied its earlier registration, so
// it first catches up with what the leader has committed, and a proposal
// that succeeded is not repeated however late this node applies it.
func (n *Node) registerSelf() {
	if n.cfg.APIAddr == "" {
		return
	}
	want := n.selfMember()
	for n.ctx.Err() == nil {
		if n.leaderCommit(); n.registered(want) {
			return
		}
		ctx, cancel := context.WithTimeout(n.ctx, 5*time.Second)
		_, err := n.Apply(ctx, &command.Envelope{Body: &command.RegisterMember{ID: want.ID, RaftAddr: want.RaftAddr, APIAddr: want.APIAddr, Version: want.Version}})
		cancel()
		if err == nil {
			return
		}
		select {
		case <-n.ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// leaderCommit waits (bounded) until this node knows a leader and has
// applied everything committed when it asked, so that a registration made
// in an earlier run is seen before a new one is proposed.
func (n *Node) leaderCommit() {
	for n.ctx.Err() == nil {
		if leader, _ := n.raft.LeaderWithID(); leader != "" {
			ctx, cancel := context.WithTimeout(n.ctx, CatchUpTimeout)
			_ = n.CatchUp(ctx, n.raft.CommitIndex())
			cancel()
			return
		}
		select {
		case <-n.ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// selfMember is this node's own member record as it should be in the state.
func (n *Node) selfMember() state.Member {
	return state.Member{ID: n.cfg.ID, RaftAddr: n.cfg.RaftAdvertise, APIAddr: n.cfg.APIAddr, Version: memberVersion()}
}

// memberVersion is how this build names itself in the member list: its
// version and the commit it was built from.
func memberVersion() string {
	bi := buildinfo.Get()
	v := bi.Version
	if c := bi.Commit; c != "unknown" && c != "" {
		v += " (" + c[:min(12, len(c))] + ")"
	}
	return v
}

// registered reports whether the state holds m exactly.
func (n *Node) registered(m state.Member) bool {
	found := false
	n.fsm.Read(func(s *state.State) {
		for _, x := range s.Members() {
			if x == m {
				found = true
			}
		}
	})
	return found
}

// Stopping tells the node it is about to shut down, with its peers: Raft's
// complaints about peers that go away from then on are logged at debug level
// (dlock dev stops all its nodes; a clean Ctrl-C is no error).
func (n *Node) Stopping() {
	if n.raftLog != nil {
		n.raftLog.stopping.Store(true)
	}
}

// Shutdown stops the node: Raft first (so nothing new commits), then the
// forwarding server, transport and stores. Safe to call twice.
func (n *Node) Shutdown() error {
	n.Stopping()
	if !n.closed.CompareAndSwap(false, true) {
		<-n.stopped
		return nil
	}
	defer close(n.stopped)
	n.cancel()
	var err error
	if n.raft != nil {
		err = n.shutdownRaft()
	}
	n.ready.Store(false)
	n.closeAll()
	n.wg.Wait()
	return err
}

// shutdownRaft stops Raft and waits for it, within a bound.
//
// hashicorp/raft's shutdown waits for every goroutine of its own, its
// replication goroutines among them, and only then closes its transport;
// a replication goroutine blocked on a peer that stopped reading or
// answering would hold it for the transport's I/O timeout, each time it
// tries. So the transport (and with it every Raft connection) is closed as
// soon as Raft is told to stop: nothing Raft sends from then on matters.
//
// The wait is bounded all the same, on either engine: after a storage
// failure hashicorp/raft's main loop may be parked in the failed store for
// good (checkedStore.stableFailed), and a Raft that does not stop for any
// other reason must not hold the process's exit. The rest of the node is
// then stopped regardless; the goroutine waiting on Raft exits if Raft ever
// stops.
func (n *Node) shutdownRaft() error {
	bound := raftStopWait
	if n.Err() != nil {
		bound = failedShutdownWait
	}
	t := time.NewTimer(bound)
	defer t.Stop()
	// The etcd engine's Shutdown returns once it has stopped;
	// hashicorp/raft's only signals its goroutines and returns at once.
	told := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		f := n.raft.Shutdown()
		close(told)
		done <- f.Error()
	}()
	if n.trans != nil {
		select {
		case <-told:
			_ = n.trans.Close()
		case <-t.C:
			return n.raftStuck(bound)
		}
	}
	select {
	case err := <-done:
		return err
	case <-t.C:
		return n.raftStuck(bound)
	}
}

// raftStuck reports a Raft that did not stop within bound.
func (n *Node) raftStuck(bound time.Duration) error {
	if n.Err() != nil {
		n.logger.Warn("raft did not stop within its bound after the storage failure; stopping the rest of the node", "bound", bound)
		return nil
	}
	n.logger.Error("raft did not stop within its bound; stopping the rest of the node without it (a bug: a goroutine dump, SIGQUIT, shows where it waits)", "bound", bound)
	return fmt.Errorf("raft did not stop within %s", bound)
}

// failedShutdownWait bounds the wait for Raft to stop after a storage failure.
const failedShutdownWait = 5 * time.Second

// raftStopWait bounds the wait for Raft to stop otherwise. Stopping takes
// milliseconds; what may take longer is a snapshot being written or
// restored, which Raft finishes first.
const raftStopWait = 30 * time.Second

// raftIOTimeout is the hashicorp transport's deadline for each RPC's I/O (an
// InstallSnapshot's grows with its size).
const raftIOTimeout = 10 * time.Second

func (n *Node) closeAll() {
	if sh := n.cfg.Shared; sh != nil {
		// The base outlives its groups; only this group's forwarding stops.
		sh.unregister(n.group())
		if n.fwdClient != nil {
			n.fwdClient.CloseIdleConnections()
		}
		return
	}
	if n.fwdServer != nil {
		_ = n.fwdServer.Close()
	}
	if n.fwdClient != nil {
		n.fwdClient.CloseIdleConnections()
	}
	if n.trans != nil {
		_ = n.trans.Close()
	}
	if n.etcdTrans != nil {
		n.etcdTrans.Close()
	}
	if n.mux != nil {
		_ = n.mux.Close()
	}
	if n.closeLogs != nil {
		_ = n.closeLogs()
	}
}

// checkLogStoreKind pins a data dir to the log store it was created with:
// opening it with the other kind would find no log and could bootstrap a
// fresh, empty cluster over the old one.
func checkLogStoreKind(dir string, kind LogStoreKind) error {
	path := filepath.Join(dir, "LOG_STORE")
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		if got := LogStoreKind(strings.TrimSpace(string(b))); got != kind {
			return fmt.Errorf("data dir %s was created with --log-store %s; start with --log-store %s (or use a new data dir)", dir, got, got)
		}
		return nil
	case errors.Is(err, os.ErrNotExist):
		if err := os.WriteFile(path, []byte(string(kind)+"\n"), 0o640); err != nil {
			return fmt.Errorf("record log store kind in %s: %w", dir, err)
		}
		return nil
	default:
		return fmt.Errorf("read %s: %w", path, err)
	}
}

// sourceDialer dials peers from the host of the raft listen address when that
// is a specific IP, so a multi-homed node talks to its peers from the address
// they know it by (and a test proxy can tell nodes apart by source address).
func sourceDialer(listen string) *net.Dialer {
	d := &net.Dialer{Timeout: 10 * time.Second}
	host, _, err := net.SplitHostPort(listen)
	if ip := net.ParseIP(host); err == nil && ip != nil && !ip.IsUnspecified() {
		d.LocalAddr = &net.TCPAddr{IP: ip}
	}
	return d
}
