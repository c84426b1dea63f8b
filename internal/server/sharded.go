package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/metrics"
	"github.com/dlock/dlock/internal/raftnode"
	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/shard"
	"github.com/dlock/dlock/internal/state"
	"github.com/dlock/dlock/internal/watch"
)

// startSharded opens a node of a sharded cluster: the meta group, which
// holds the shard map, and one Raft group per range, all on one shared
// store and raft port, a service per data group, and the router in front
// of them (docs/architecture.md, Shards).
func startSharded(cfg Config) (*Server, error) {
	m, err := shard.NewMap(cfg.Shards.Bounds) // generation 1, with its ids and groups
	if err != nil {
		return nil, err
	}
	m.Replicas = cfg.Shards.Replicas // a placement made by the caller
	// A node that joined a running cluster (shardmembers.go) bootstraps
	// no group and counts itself among no initial nodes; the placement of
	// --shard-replicas is the initial cluster's, which the map holds.
	joined, recorded, err := startMode(cfg)
	if err != nil {
		return nil, err
	}
	if r := cfg.Shards.Placement; r > 0 && !joined {
		// --shard-replicas: on the nodes the data dir recorded at its
		// first start (a later --initial-cluster may list nodes that
		// joined since), else on the initial cluster's.
		nodes, err := shard.RecordedNodes(cfg.Raft.DataDir)
		if err != nil {
			return nil, err
		}
		if len(nodes) == 0 {
			nodes = slices.Sorted(maps.Keys(cfg.Raft.InitialCluster))
		}
		if len(nodes) == 0 {
			return nil, errors.New("--shard-replicas places the shards on the nodes of --initial-cluster: give it on the first start")
		}
		if m, err = m.Place(nodes, r); err != nil {
			return nil, fmt.Errorf("--shard-replicas: %w", err)
		}
	}
	// all are the initial cluster's nodes: the replicas of a range without
	// a replica set. A restart without --initial-cluster reads them from
	// the data dir's start record, or (a dir from before it) from the meta
	// group's configuration below.
	all := recorded
	fromFlags := len(recorded) == 0 && len(cfg.Raft.InitialCluster) > 0
	if fromFlags {
		all = slices.Sorted(maps.Keys(cfg.Raft.InitialCluster))
	}
	for k := range m.Bounds {
		for _, id := range m.Hosts(k, all) {
			if _, ok := cfg.Raft.InitialCluster[id]; !ok && fromFlags {
				return nil, fmt.Errorf("shard %d is placed on node %q, which is not in the initial cluster", k, id)
			}
		}
	}
	switch {
	case cfg.Raft.Engine != raftnode.EngineEtcd:
		return nil, fmt.Errorf("--shards %d needs --raft-engine etcd (many groups share one log and one raft port only on that engine)", m.N())
	case cfg.LeaveOnShutdown:
		return nil, errors.New("--leave-on-shutdown is not available on a sharded cluster: move the node's shard replicas off it (dlock shards move), then remove it (dlock members remove ID); see docs/operations.md")
	}
	if joined {
		// Recorded before the map file, which marks the dir as started.
		if err := os.MkdirAll(cfg.Raft.DataDir, 0o750); err != nil {
			return nil, err
		}
		if err := shard.RecordStart(cfg.Raft.DataDir, nil); err != nil {
			return nil, fmt.Errorf("record the start mode: %w", err)
		}
	}
	if err := shard.CheckDataDir(cfg.Raft.DataDir, m); err != nil {
		return nil, err
	}
	if fromFlags {
		if err := shard.RecordStart(cfg.Raft.DataDir, all); err != nil {
			return nil, fmt.Errorf("record the start mode: %w", err)
		}
	}
	ln, grpcLn, rc, err := listenAPI(cfg)
	if err != nil {
		return nil, err
	}
	s := &Server{ln: ln, done: make(chan struct{}), logger: cfg.Logger.With("node", rc.ID), cfg: cfg, joined: make(chan struct{})}
	ss := &shardSet{logger: s.logger, cfg: cfg, rc: rc, initial: m, groups: map[uint64]*groupRun{},
		pending: map[uint64]carved{}, kick: make(chan struct{}, 1), mtr: metrics.New(), all: all, driving: map[uint64]bool{}, unclean: map[uint64]string{},
		removed: make(chan struct{})}
	s.shards = ss
	ok := false
	defer func() {
		if ok {
			return
		}
		ss.shutdown()
		if ss.shared != nil {
			_ = ss.shared.Close()
		}
		ln.Close()
		if grpcLn != nil {
			grpcLn.Close()
		}
	}()
	ss.shared, err = raftnode.OpenShared(raftnode.SharedConfig{DataDir: rc.DataDir, RaftAddr: rc.RaftAddr,
		RaftAdvertise: rc.RaftAdvertise, PeerTLS: rc.PeerTLS, Logger: rc.Logger})
	if err != nil {
		return nil, err
	}
	s.shared = ss.shared
	mc := rc
	mc.Shared, mc.Group = ss.shared, m.MetaGroup()
	mc.Logger = rc.Logger.With("shard", "meta")
	mc.Observers = append(rc.Observers[:len(rc.Observers):len(rc.Observers)], ss.observer(mc.Group))
	if ss.meta, err = raftnode.Open(mc); err != nil {
		return nil, fmt.Errorf("meta group: %w", err)
	}
	// The meta group's service serves the ACL calls: tokens live in its
	// state, and every data group's service authorizes from it. It also
	// answers for the cluster's members (every node), and is the API's
	// front when no data group runs here.
	ss.metaSvc = service.New(ss.meta, nil, cfg.Logger.With("shard", "meta"))
	ss.metaSvc.SetRecorder(ss.mtr)
	ss.metaSvc.SetLimits(cfg.Limits.Service)
	ss.metaSvc.EnableACL(cfg.ACL)
	if len(all) == 0 && !joined {
		// A data dir from before start records: no node had joined then,
		// so the meta group's members are the initial cluster.
		for _, s := range ss.meta.Status().Servers {
			all = append(all, s.ID)
		}
		slices.Sort(all)
		if len(all) == 0 {
			return nil, errors.New("the meta group has no members on disk; give --initial-cluster (a new cluster) or --join (a new node)")
		}
		if err := shard.RecordStart(cfg.Raft.DataDir, all); err != nil {
			return nil, fmt.Errorf("record the start mode: %w", err)
		}
		ss.all = all
	}
	// The initial ranges' groups this node runs (bootstrapped with their
	// replicas, unless moved off this node since), then whatever the meta
	// group and the groups' own states (splits, moves) say it must run.
	moved, err := shard.MovedGroups(rc.DataDir)
	if err != nil {
		return nil, err
	}
	svcs := make([]*service.Service, m.N())
	var front *groupRun
	for k := 0; k < m.N(); k++ {
		if !m.Hosted(k, rc.ID, all) || moved[m.Group(k)] {
			continue
		}
		initial := map[string]string{}
		for _, id := range m.Hosts(k, all) {
			initial[id] = rc.InitialCluster[id]
		}
		g, err := ss.open(m.Group(k), strconv.Itoa(m.IDs[k]), nil, initial)
		if err != nil {
			return nil, fmt.Errorf("shard %d: %w", k, err)
		}
		svcs[k] = g.svc
		if front == nil {
			front = g
		}
	}
	if front == nil {
		front = &groupRun{node: ss.meta, svc: ss.metaSvc}
	}
	s.Node, s.Service = front.node, front.svc
	ss.router = shard.NewRouter(m, svcs)
	ss.router.SetSplitter(ss)
	ss.router.SetMover(ss)
	ss.router.SetRemote(ss)
	ss.router.SetForwardAccept(shard.ForwardAccept(max(rc.HeartbeatTimeout, rc.ElectionTimeout)))
	ss.router.SetMembers(ss.metaSvc)
	ss.router.SetMembership(ss)
	ss.shared.HandleRoute(ss.router)
	ss.router.SetACL(ss.metaSvc)
	gate := make(chan struct{})
	ss.router.SetGate(gate)
	ss.reconcile(context.Background())
	s.router = ss.router
	s.serveAPI(ss.router, s.Service, ss.mtr, ln, grpcLn)
	ctx, cancel := context.WithCancel(context.Background())
	s.stop = cancel
	if joined && len(cfg.Join) > 0 {
		go s.join(ctx, rc.ID, rc.RaftAdvertise)
	} else {
		close(s.joined)
	}
	s.stopped = make(chan struct{})
	go func() {
		select {
		case <-ss.removed:
		case <-front.node.Failed():
		case <-ss.meta.Failed():
		case <-ctx.Done():
			return
		}
		close(s.stopped)
	}()
	s.balanced = make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); shard.Balance(ctx, ss.balanced, s.logger) }()
	go func() { defer wg.Done(); ss.openGate(ctx, gate) }()
	go func() { defer wg.Done(); ss.run(ctx); ss.wg.Wait() }()
	go func() { wg.Wait(); close(s.balanced) }()
	ok = true
	return s, nil
}

// shardSet is a sharded node's Raft groups: the meta group, which holds
// the shard map, and a data group per range — more as ranges split — with
// their services, and the router in front of them. Its loop (run) follows
// the meta group and the groups' states: it starts the groups of new
// ranges, commits splits to the map, and hands the router each new map.
type shardSet struct {
	logger *slog.Logger
	cfg    Config
	rc     raftnode.Config
	shared *raftnode.Shared
	mtr    *metrics.Metrics

	// gauges is the source of /metrics' state gauges: the node's first
	// running group, registered once and swapped as groups come and go.
	gauges     gaugeSource
	gaugesOnce sync.Once

	initial shard.Map
	router  *shard.Router
	meta    *raftnode.Node
	metaSvc *service.Service

	mu      sync.Mutex
	groups  map[uint64]*groupRun
	order   []uint64
	pending map[uint64]carved
	stopped bool
	kick    chan struct{}
	// all are the initial cluster's node ids; driving the groups whose
	// move this node is driving (moves.go), wg those steps.
	all     []string
	driving map[uint64]bool
	wg      sync.WaitGroup
	// unclean are the groups stopped here by a move whose data is not
	// deleted yet (moves.go, cleanMoved): id → shard name.
	unclean map[uint64]string
	// member is set once the meta group has listed this node, absent
	// counts the rounds since it has not; removed is closed once it was
	// removed (shardmembers.go).
	member     bool
	absent     int
	removed    chan struct{}
	removeOnce sync.Once
}

// groupRun is one data group running on this node.
type groupRun struct {
	id   uint64
	name string
	node *raftnode.Node
	svc  *service.Service
}

// carved is a split-off group's first state, as this node's copy of its
// source group src applied the split. It lives only in memory until the new
// group is stored here, so src holds its snapshots meanwhile (unstored): a
// crash before then replays the split entry, which carves it again.
type carved struct {
	src   uint64
	state []byte
	index uint64
}

// splitObserver hands a split's carved state to the set (it runs on the
// source group's apply goroutine: record and signal, never block).
type splitObserver struct {
	ss  *shardSet
	src uint64
}

func (ss *shardSet) observer(g uint64) splitObserver { return splitObserver{ss, g} }

func (o splitObserver) Applied(index uint64, events []state.Event) {
	for _, e := range events {
		if e.Type != state.EventSplit {
			continue
		}
		o.ss.mu.Lock()
		o.ss.pending[e.Token] = carved{src: o.src, state: e.Carved, index: index}
		o.ss.mu.Unlock()
		o.ss.poke()
	}
}

// unstored is group src's snapshot hold (raftnode.Config.SnapshotHold): an
// error while a split src applied here has a new group not stored on this
// node yet. Until it is, src's log keeps the split entry, so a restart
// replays it and carves the new group's state again; were src to snapshot
// past the split first, a crash would leave the carved state nowhere
// (docs/architecture.md, "A crash inside a split").
func (ss *shardSet) unstored(src uint64) error {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for g, c := range ss.pending {
		if c.src == src {
			return fmt.Errorf("group %x split off here is not stored yet", g)
		}
	}
	return nil
}

func (o splitObserver) Restored(*state.State) { o.ss.poke() }

func (ss *shardSet) poke() {
	select {
	case ss.kick <- struct{}{}:
	default:
	}
}

// open starts data group g on this node: bootstrapped with the initial
// cluster (an initial range), seeded from a carved state (a range split off
// here), or empty, to be sent a snapshot by its leader (a range split off
// while this node was away). A group already stored recovers from disk.
func (ss *shardSet) open(g uint64, name string, seed *carved, initial map[string]string) (*groupRun, error) {
	hub := watch.NewHub(ss.cfg.WatchHistory, ss.cfg.WatchBuffer)
	gc := ss.rc
	gc.Shared, gc.Group = ss.shared, g
	gc.Logger = ss.rc.Logger.With("shard", name)
	gc.Observers = append(ss.rc.Observers[:len(ss.rc.Observers):len(ss.rc.Observers)], hub, ss.observer(g))
	gc.SnapshotHold = func() error { return ss.unstored(g) }
	first := len(ss.groups) == 0
	if first {
		// The state gauges of /metrics are the first shard's; every
		// shard's requests count in the request metrics.
		gc.Observers = append(gc.Observers, ss.mtr)
	}
	switch {
	case seed != nil:
		gc.InitialState, gc.InitialIndex = seed.state, seed.index
		voters, err := ss.votersOf(seed.src, seed.index)
		if err != nil {
			return nil, err
		}
		gc.InitialCluster = voters
	default:
		gc.InitialCluster = initial
	}
	if h := openHook.Load(); h != nil {
		if err := (*h)(ss.rc.ID, g); err != nil {
			return nil, err
		}
	}
	node, err := raftnode.Open(gc)
	if err != nil {
		return nil, err
	}
	svc := service.New(node, hub, ss.cfg.Logger.With("shard", name))
	svc.SetRecorder(ss.mtr)
	svc.SetLimits(ss.cfg.Limits.Service)
	svc.SetBrowserHosts(ss.cfg.BrowserHosts)
	svc.EnableACL(ss.cfg.ACL)
	svc.SetACLState(ss.meta.FSM(), ss.meta)
	if first {
		// A node whose groups all moved away may open one again: the
		// collector is registered once (a second registration panics).
		ss.gauges.cur.Store(&metricsSource{node, hub})
		ss.gaugesOnce.Do(func() { ss.mtr.Attach(&ss.gauges) })
	}
	run := &groupRun{id: g, name: name, node: node, svc: svc}
	ss.mu.Lock()
	ss.groups[g] = run
	ss.order = append(ss.order, g)
	ss.mu.Unlock()
	return run, nil
}

// votersOf is the voters (id to raft address) a group split off group src
// at entry index starts with: src's own as that entry saw them. Every
// replica seeds the new group with the same voters at the same index, even
// if a move changed src's members before some replica got here; they
// cannot come from --initial-cluster, which a restarted node is not given.
func (ss *shardSet) votersOf(src, index uint64) (map[string]string, error) {
	ss.mu.Lock()
	run := ss.groups[src]
	ss.mu.Unlock()
	if run == nil {
		return nil, fmt.Errorf("the split's source group %d is not running here", src)
	}
	cfg, err := run.node.ConfigurationAt(index)
	if err != nil {
		return nil, fmt.Errorf("the split's source group's voters: %w", err)
	}
	out := map[string]string{}
	for _, sv := range cfg.Servers {
		if sv.Suffrage != raft.Voter {
			continue
		}
		if sv.Address == "" {
			return nil, fmt.Errorf("the split's source group does not know voter %s's raft address yet", sv.ID)
		}
		out[string(sv.ID)] = string(sv.Address)
	}
	if len(out) == 0 {
		return nil, errors.New("the split's source group has no voters yet")
	}
	return out, nil
}

// run follows the map until ctx ends: on every split applied here, every
// restore, and a few times a second.
func (ss *shardSet) run(ctx context.Context) {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-ss.kick:
		}
		ss.reconcile(ctx)
	}
}

// metaMap is the map the meta group holds (ok false: none committed yet).
func (ss *shardSet) metaMap() (shard.Map, bool) {
	var gen uint64
	var rs []command.ShardRange
	var removing []string
	ss.meta.FSM().Read(func(st *state.State) { gen, rs = st.ShardMap(); removing = st.Removing() })
	if gen == 0 {
		return shard.Map{}, false
	}
	m := shard.FromRanges(gen, rs)
	m.Removing = removing
	return m, true
}

// reconcile does one round of run: commit the initial map to a new meta
// group, start the groups this node should run, commit a split that the
// map lacks, and route by the newest map.
func (ss *shardSet) reconcile(ctx context.Context) {
	ss.watchRemoval()
	m, ok := ss.metaMap()
	if !ok {
		m = ss.initial
		if ss.meta.IsLeader() {
			ss.commitMap(ctx, m)
		}
	}
	// The splits recorded in the states of the groups running here.
	type split struct {
		src uint64
		rec state.SplitRecord
	}
	var splits []split
	ss.mu.Lock()
	runs := make([]*groupRun, 0, len(ss.order))
	for _, g := range ss.order {
		runs = append(runs, ss.groups[g])
	}
	ss.mu.Unlock()
	for _, run := range runs {
		run.node.FSM().Read(func(st *state.State) {
			for _, r := range st.Splits() {
				splits = append(splits, split{run.id, r})
			}
		})
	}
	// Groups to start: those split off here (carved), those the map names,
	// and those a split recorded in a running group's state names.
	type want struct {
		g    uint64
		name string
		seed *carved
	}
	var wants []want
	ss.mu.Lock()
	seen := map[uint64]bool{}
	add := func(g uint64, seed *carved) {
		if ss.groups[g] == nil && !seen[g] {
			seen[g] = true
			wants = append(wants, want{g, groupName(m, g), seed})
		}
	}
	pend := make([]uint64, 0, len(ss.pending))
	for g := range ss.pending {
		pend = append(pend, g)
	}
	sort.Slice(pend, func(i, j int) bool { return pend[i] < pend[j] })
	for _, g := range pend {
		if ss.groups[g] != nil {
			// Open already (stored here, or empty and sent its state by
			// the leader of a replica that stored it): a replay's carve.
			delete(ss.pending, g)
			continue
		}
		c := ss.pending[g]
		add(g, &c)
	}
	for k, g := range m.Groups {
		if m.Hosted(k, ss.rc.ID, ss.all) {
			add(g, nil)
		}
	}
	for _, sp := range splits {
		if k := m.IndexOfGroup(sp.rec.Group); k < 0 || m.Hosted(k, ss.rc.ID, ss.all) {
			add(sp.rec.Group, nil)
		}
	}
	ss.mu.Unlock()
	for _, w := range wants {
		ss.mu.Lock()
		stopped := ss.stopped
		ss.mu.Unlock()
		if stopped || ctx.Err() != nil {
			return
		}
		if _, err := ss.open(w.g, w.name, w.seed, nil); err != nil {
			ss.logger.Error("could not start a shard's group; will retry", "group", w.g, "err", err)
			continue
		}
		ss.logger.Info("started a shard's group (split off, or moved here)", "group", w.g, "seeded", w.seed != nil)
		ss.mu.Lock()
		delete(ss.pending, w.g)
		ss.mu.Unlock()
	}
	// A split the map lacks: commit the next generation (any node may;
	// the meta group takes only the next generation, once) — but only from
	// a node that runs the new group, so a map that names it implies some
	// node stored its state (its source may snapshot past the split then).
	for _, sp := range splits {
		if m.IndexOfGroup(sp.rec.Group) >= 0 {
			continue
		}
		ss.mu.Lock()
		running := ss.groups[sp.rec.Group] != nil
		ss.mu.Unlock()
		if !running {
			continue
		}
		next, err := m.Split(sp.src, sp.rec.At, sp.rec.Group)
		if err != nil {
			continue // the map is not there yet (an earlier split first)
		}
		_ = ss.commitMap(ctx, next)
		break
	}
	ss.route(m)
	ss.stopMoved(ctx, m)
	ss.driveMoves(ctx, m)
}

func groupName(m shard.Map, g uint64) string {
	if k := m.IndexOfGroup(g); k >= 0 {
		return strconv.Itoa(m.IDs[k])
	}
	return "g" + strconv.FormatUint(g, 16)
}

// commitMap proposes m to the meta group (a no-op there unless it is the
// next generation).
func (ss *shardSet) commitMap(ctx context.Context, m shard.Map) error {
	_, err := ss.commitMapResult(ctx, m)
	return err
}

// commitMapResult is commitMap with the meta group's answer: StatusOK with
// Token the generation it applied (or, with a message, the current one
// when m's was stale), or StatusInvalid when it refused the map.
func (ss *shardSet) commitMapResult(ctx context.Context, m shard.Map) (command.Result, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	env := &command.Envelope{Body: &command.SetShardMap{Generation: m.Generation, Ranges: m.Ranges(), Removing: m.Removing}}
	resp, err := ss.meta.Apply(ctx, env)
	if err != nil {
		ss.logger.Info("could not commit the shard map; will retry", "generation", m.Generation, "err", err)
		return command.Result{}, err
	}
	if resp.Result.Status != command.StatusOK {
		ss.logger.Info("the meta group refused a shard map", "generation", m.Generation, "reason", resp.Result.Message)
	}
	return resp.Result, nil
}

// route hands the router m with the services of its groups.
func (ss *shardSet) route(m shard.Map) {
	svcs := make([]*service.Service, len(m.Groups))
	ss.mu.Lock()
	for k, g := range m.Groups {
		if run := ss.groups[g]; run != nil {
			svcs[k] = run.svc
		}
	}
	ss.mu.Unlock()
	if ss.router != nil {
		ss.router.Update(m, svcs)
	}
}

// openHook, set only by tests (export_test.go), runs before a data group
// opens and may refuse it: a crash between a split's apply and the new
// group's start, held open.
var openHook atomic.Pointer[func(node string, group uint64) error]

// splitWait bounds how long a split waits for the new map to reach this
// node's router once the source shard applied it.
const splitWait = 20 * time.Second

// Split splits the range holding at (shard.Splitter): it commits the split
// on the source shard, then waits until this node routes by the map with
// the new range.
func (ss *shardSet) Split(ctx context.Context, at string) error {
	m := ss.router.Map()
	if k := m.Lookup(at); k > 0 && m.Bounds[k] == at && m.Groups[k] == shard.ChildGroup(m.Groups[k-1], at) {
		return nil // done already (a retry)
	}
	k, err := m.CheckSplitPoint(at)
	if err != nil {
		return apierror.New(apierror.InvalidArgument, "%v; nothing was changed", err)
	}
	if from := m.LeavingReplica(k); from != "" {
		return apierror.New(apierror.Conflict, "shard %d is moving its replica on %s; split it once the move is done (GET /api/v1/cluster shows leaving while it runs); nothing was changed", m.IDs[k], from)
	}
	src := m.Groups[k]
	start, end := m.Range(k)
	child := shard.ChildGroup(src, at)
	ss.mu.Lock()
	run := ss.groups[src]
	ss.mu.Unlock()
	if run == nil {
		return &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Message: fmt.Sprintf(
			"shard %d's group does not run on this node; split it through one of its replicas %v", m.IDs[k], m.Hosts(k, ss.all))}
	}
	if err := run.svc.ProposeSplit(ctx, &command.Split{At: at, Group: child, From: start, To: end}); err != nil {
		return err
	}
	ss.poke()
	ctx, cancel := context.WithTimeout(ctx, splitWait)
	defer cancel()
	for {
		if nm := ss.router.Map(); nm.IndexOfGroup(child) >= 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Message: fmt.Sprintf(
				"shard %d applied the split at %q, but the new map has not reached this node within %s; it will (GET /cluster shows shard_generation)", m.IDs[k], at, splitWait)}
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// balanced lists the data groups of the current map for the balancer.
func (ss *shardSet) balanced() []shard.Balanced {
	m := ss.router.Map()
	ss.mu.Lock()
	defer ss.mu.Unlock()
	var out []shard.Balanced
	for k, g := range m.Groups {
		if run := ss.groups[g]; run != nil {
			out = append(out, shard.Balanced{ID: m.IDs[k], G: run.node})
		}
	}
	return out
}

// nodes is every group on this node, the meta group last; services every
// group's, the meta group's last.
func (ss *shardSet) nodes() []*raftnode.Node {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	var out []*raftnode.Node
	for _, g := range ss.order {
		out = append(out, ss.groups[g].node)
	}
	if ss.meta != nil {
		out = append(out, ss.meta)
	}
	return out
}

func (ss *shardSet) services() []*service.Service {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	var out []*service.Service
	for _, g := range ss.order {
		out = append(out, ss.groups[g].svc)
	}
	if ss.metaSvc != nil {
		out = append(out, ss.metaSvc)
	}
	return out
}

// shutdown stops opening groups and shuts every group down (start-up
// failure; Server.Shutdown does it in its own order).
func (ss *shardSet) shutdown() {
	ss.mu.Lock()
	ss.stopped = true
	ss.mu.Unlock()
	ss.wg.Wait()
	for _, n := range ss.nodes() {
		_ = n.Shutdown()
	}
	for _, svc := range ss.services() {
		svc.Close()
	}
}

// Shards is a sharded node's data groups in the order of its current map,
// range k at k (a group not started here yet is missing); a one-group
// node's one group.
func (s *Server) Shards() []*raftnode.Node {
	if s.shards == nil {
		return []*raftnode.Node{s.Node}
	}
	m := s.shards.router.Map()
	s.shards.mu.Lock()
	defer s.shards.mu.Unlock()
	var out []*raftnode.Node
	for _, g := range m.Groups {
		if run := s.shards.groups[g]; run != nil {
			out = append(out, run.node)
		}
	}
	return out
}

// ShardMap is the map a sharded node routes by.
func (s *Server) ShardMap() shard.Map {
	if s.shards == nil {
		return shard.Map{}
	}
	return s.shards.router.Map()
}

func (s *Server) allNodes() []*raftnode.Node {
	if s.shards != nil {
		return s.shards.nodes()
	}
	return []*raftnode.Node{s.Node}
}

func (s *Server) allServices() []*service.Service {
	if s.shards != nil {
		return s.shards.services()
	}
	return []*service.Service{s.Service}
}

// ShardGroup is this node's group of the shard with id (nil: it does not
// run it, or not yet).
func (s *Server) ShardGroup(id int) *raftnode.Node {
	if s.shards == nil {
		return nil
	}
	m := s.shards.router.Map()
	k := m.IndexOf(id)
	if k < 0 {
		return nil
	}
	s.shards.mu.Lock()
	defer s.shards.mu.Unlock()
	if run := s.shards.groups[m.Groups[k]]; run != nil {
		return run.node
	}
	return nil
}

// GroupStored reports whether this node's store holds anything of Raft
// group g (a sharded node; false otherwise).
func (s *Server) GroupStored(g uint64) (bool, error) {
	if s.shared == nil {
		return false, nil
	}
	return s.shared.GroupStored(g)
}

// MembersNode is the group whose configuration names every node: a
// sharded node's meta group (its data groups may run on some nodes only),
// else the one group.
func (s *Server) MembersNode() *raftnode.Node {
	if s.shards != nil && s.shards.meta != nil {
		return s.shards.meta
	}
	return s.Node
}

// ACLBootstrap creates the first management token on this node's cluster:
// in its one group's state, or in a sharded cluster's meta group, where
// every shard reads the tokens from.
func (s *Server) ACLBootstrap(ctx context.Context) (*service.ACLTokenView, error) {
	if s.shards != nil {
		return s.shards.metaSvc.ACLBootstrap(ctx)
	}
	return s.Service.ACLBootstrap(ctx)
}

// gaugeSource is a metrics.Source that reads whichever group was last
// made the node's first (nothing before one opens).
type gaugeSource struct{ cur atomic.Pointer[metricsSource] }

func (g *gaugeSource) Status() raftnode.Status {
	if m := g.cur.Load(); m != nil {
		return m.Status()
	}
	return raftnode.Status{}
}

func (g *gaugeSource) Read(fn func(*state.State)) {
	if m := g.cur.Load(); m != nil {
		m.Read(fn)
	}
}

func (g *gaugeSource) Watchers() int {
	if m := g.cur.Load(); m != nil {
		return m.Watchers()
	}
	return 0
}
