// The etcd engine: go.etcd.io/raft/v3 driven by a Ready loop, with the
// leader sending its entries to the followers while it writes them to its
// own log, a pebble log shared by every group of the node (etcdstore.go) and
// framed messages on the raft port (etcdtransport.go). It presents the same
// face as hashicorp/raft's *raft.Raft (the engine interface), so the node,
// the packer and membership code run unchanged on either.

package raftnode

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	gometrics "github.com/hashicorp/go-metrics/compat"
	hraft "github.com/hashicorp/raft"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"

	"github.com/dlock/dlock/internal/fsm"
)

// defaultGroup is the group id of a node's one Raft group today; shards add
// more with other ids over the same store and transport.
const defaultGroup uint64 = 1

// raftID is the etcd Raft id of a member: a 64-bit hash of its string id
// (joinLocal refuses a new member whose hash is taken).
func raftID(id string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(id))
	if v := h.Sum64(); v != 0 {
		return v
	}
	return 1
}

// etcdMember is a member's id and raft address, carried in the context of
// the configuration change that adds it and in every snapshot.
type etcdMember struct {
	ID   string `json:"id"`
	Addr string `json:"addr"`
}

// etcdView is what other goroutines read of the Raft loop's state.
type etcdView struct {
	state  hraft.RaftState
	lead   uint64
	term   uint64
	commit uint64
	book   map[uint64]etcdMember
	conf   raftpb.ConfState
	// members is the Raft goroutine's membersGen that book and conf are of.
	members uint64
}

// Future kinds.
const (
	propData = iota
	propBarrier
	propConf
	propRead
	propTransfer
	propSnapshot
)

// efuture answers one request to the engine; it satisfies hashicorp/raft's
// future interfaces, which the node's code waits on.
type efuture struct {
	kind     int
	data     []byte
	cc       raftpb.ConfChangeV2
	target   uint64
	rctx     string
	deadline time.Time

	index uint64
	term  uint64

	once sync.Once
	done chan struct{}
	err  error
	resp any
	cfg  hraft.Configuration
	meta *hraft.SnapshotMeta
	snap []byte
}

func newFuture(kind int) *efuture { return &efuture{kind: kind, done: make(chan struct{})} }

func (f *efuture) finish(resp any, err error) {
	f.once.Do(func() {
		f.resp, f.err = resp, err
		close(f.done)
	})
}

func (f *efuture) Error() error                       { <-f.done; return f.err }
func (f *efuture) Index() uint64                      { <-f.done; return f.index }
func (f *efuture) Response() any                      { <-f.done; return f.resp }
func (f *efuture) Configuration() hraft.Configuration { <-f.done; return f.cfg }
func (f *efuture) Open() (*hraft.SnapshotMeta, io.ReadCloser, error) {
	if err := f.Error(); err != nil {
		return nil, nil, err
	}
	return f.meta, io.NopCloser(bytes.NewReader(f.snap)), nil
}

func doneFuture(err error) *efuture {
	f := newFuture(propData)
	f.finish(nil, err)
	return f
}

// errConfRefused is a configuration change Raft refused because another one
// had not yet been applied.
var errConfRefused = errors.New("another membership change is still being applied; retry")

// etcdTick is the Raft loop's clock; timeouts are counted in ticks of it.
const etcdTick = 10 * time.Millisecond

type etcdEngineConfig struct {
	ID             string
	Group          uint64
	InitialCluster map[string]string
	Election       time.Duration
	Threshold      uint64
	Trailing       uint64
	// Interval is the least time between two snapshots taken for
	// Threshold (zero: none); each wait is drawn from [Interval,
	// 2·Interval), as hashicorp/raft's checks are. Under load a snapshot
	// every Threshold entries would come every few seconds, each holding
	// the apply goroutine and the log store, and on every node at once:
	// nodes that snapshot at different times leave a quorum writing.
	Interval time.Duration
	// SnapshotBytes and TrailingBytes bound the in-memory log in bytes as
	// Threshold and Trailing do in entries (an entry may be up to
	// command.MaxEntryBytes): a snapshot is also taken once SnapshotBytes of
	// entries were applied since the last, and compaction keeps at most
	// TrailingBytes of entries behind it. Zero means 64 MiB each.
	SnapshotBytes uint64
	TrailingBytes uint64
	RaftLogLevel  string
	Logger        *slog.Logger
	FSM           *fsm.FSM
	Store         *multiStore
	// MarkDir holds the group's durable high-water mark (checkstore.go's
	// durableMark): a restart whose log ends below it lost acknowledged
	// entries (a torn or corrupt tail pebble recovered from silently).
	MarkDir    string
	Transport  *etcdTransport
	OnFail     func(error)
	PeerHealth func(id string, failing bool)
	// InitialState, on a group with nothing stored yet, starts it from this
	// FSM snapshot at InitialIndex with InitialCluster as its voters
	// (Config.InitialState) instead of bootstrapping it empty.
	InitialState []byte
	InitialIndex uint64
	// SnapshotHold is Config.SnapshotHold.
	SnapshotHold func() error
}

type etcdEngine struct {
	cfg   etcdEngineConfig
	nid   uint64
	group uint64
	log   *slog.Logger
	store *multiStore
	mark  *durableMark
	trans *etcdTransport
	mem   *raft.MemoryStorage
	rn    *raft.RawNode
	fsm   *fsm.FSM

	recvc   chan raftpb.Message
	propc   chan *efuture
	reportc chan func(*raft.RawNode)
	applyc  chan *applyBatch
	snapc   chan *efuture
	// snapWritten brings a snapshot's write back to the apply goroutine.
	snapWritten chan *snapWrite
	stopc       chan struct{}
	// raftDone and applyDone close when the two goroutines end.
	raftDone  chan struct{}
	applyDone chan struct{}
	stopOnce  sync.Once
	failed    atomic.Bool
	// inflight counts writes queued with the append goroutine, which
	// Shutdown waits out before it closes the durable mark.
	inflight sync.WaitGroup

	// The append and apply goroutines' deliveries to the Raft goroutine.
	inMu  sync.Mutex
	inbox []localDelivery
	inSig chan struct{}

	view        atomic.Pointer[etcdView]
	lastContact atomic.Int64
	// commitsBy counts, as leader, the acknowledgements that moved the
	// commit index: the leader's own durable write or a follower's.
	commitsBy commitCounts
	leaderCh  chan bool

	// The Raft goroutine's own.
	// electionTick is the election timeout in ticks.
	electionTick int
	book         map[uint64]etcdMember
	conf         raftpb.ConfState
	// membersGen counts changes of book and conf, so publish, which runs
	// after every commit, copies them only when they changed.
	membersGen uint64
	scanTerm   uint64
	unassigned []*efuture
	transfers  []*efuture
	readSeq    uint64
	timings    raftTimings

	// mu guards the futures both goroutines resolve.
	mu      sync.Mutex
	waiting map[uint64]*efuture
	reads   map[string]*efuture

	// The apply goroutine's own.
	applied   uint64
	snapIndex uint64
	applyConf raftpb.ConfState
	applyBook map[uint64]etcdMember
	// applyBytes counts the entry bytes applied; sizeMarks holds it after
	// each applied batch since the last compaction, to find how far back
	// TrailingBytes reaches.
	applyBytes uint64
	snapBytes  uint64    // applyBytes at the last snapshot
	snapNext   time.Time // when Threshold may next take one (see Interval)
	sizeMarks  []sizeMark
	// snapDue is set when a snapshot was held back (SnapshotHold) or came
	// due while one was being written: it is taken once that one is
	// written, or after a later batch once the hold ends.
	snapDue bool
	// writing is the snapshot being written, nil when none is; asked is
	// the requested snapshots (Snapshot) waiting for it to finish.
	writing *snapWrite
	asked   []*efuture

	// hist is the apply goroutine's configurations by the index each took
	// effect at, for ConfigurationAt.
	hist confHistory
}

// confHistory holds the configurations applied since the last snapshot
// (the first mark is the one in effect at it), so a caller can learn the
// configuration a given applied entry saw — the same on every replica,
// unlike the current one.
type confHistory struct {
	mu      sync.Mutex
	marks   []confMark
	applied uint64
}

type confMark struct {
	index uint64
	confAt
}

// reset starts the history at a snapshot (or an empty log: index 0).
func (h *confHistory) reset(index uint64, c confAt) {
	h.mu.Lock()
	h.marks = []confMark{{index, c}}
	h.applied = index
	h.mu.Unlock()
}

// trim drops the marks no index at or after a snapshot at index needs.
func (h *confHistory) trim(index uint64) {
	h.mu.Lock()
	i := 0
	for i+1 < len(h.marks) && h.marks[i+1].index <= index {
		i++
	}
	h.marks = append(h.marks[:0], h.marks[i:]...)
	h.mu.Unlock()
}

// ConfigurationAt is the configuration in effect when entry index was
// applied: the same on every replica that applied it. It fails for an
// index not applied yet or from before the last snapshot.
func (e *etcdEngine) ConfigurationAt(index uint64) (hraft.Configuration, error) {
	h := &e.hist
	h.mu.Lock()
	defer h.mu.Unlock()
	if index > h.applied {
		return hraft.Configuration{}, fmt.Errorf("entry %d is not applied yet (applied %d)", index, h.applied)
	}
	if len(h.marks) == 0 || index < h.marks[0].index {
		return hraft.Configuration{}, fmt.Errorf("the configuration at entry %d is compacted away", index)
	}
	i := len(h.marks) - 1
	for h.marks[i].index > index {
		i--
	}
	return configurationOf(h.marks[i].cs, h.marks[i].book), nil
}

// sizeMark is applyBytes once entries up to index were applied.
type sizeMark struct{ index, bytes uint64 }

const defaultLogBytes = 64 << 20

// applyBatch is one Ready's work for the apply goroutine.
type applyBatch struct {
	snap  *raftpb.Snapshot
	ents  []raftpb.Entry
	confs map[uint64]confAt
	// resps go back to the Raft goroutine once ents are applied.
	resps []raftpb.Message
}

// confAt is the configuration after the change at an index was applied.
type confAt struct {
	cs   raftpb.ConfState
	book map[uint64]etcdMember
}

func newEtcdEngine(c etcdEngineConfig) (*etcdEngine, error) {
	e := &etcdEngine{
		cfg: c, nid: raftID(c.ID), group: c.Group, log: c.Logger, store: c.Store, trans: c.Transport,
		mem: raft.NewMemoryStorage(), fsm: c.FSM,
		recvc: make(chan raftpb.Message, 4096), propc: make(chan *efuture, 4096), reportc: make(chan func(*raft.RawNode), 1024),
		applyc: make(chan *applyBatch, 256), snapc: make(chan *efuture), snapWritten: make(chan *snapWrite, 1), stopc: make(chan struct{}),
		raftDone: make(chan struct{}), applyDone: make(chan struct{}), leaderCh: make(chan bool, 1), inSig: make(chan struct{}, 1),
		book: map[uint64]etcdMember{}, waiting: map[uint64]*efuture{}, reads: map[string]*efuture{},
	}
	e.snapNext = e.nextSnapAt()
	e.timings.peerNames = func(id uint64) string { return e.book[id].ID }
	if len(c.InitialState) > 0 {
		if err := e.seed(c); err != nil {
			return nil, err
		}
	}
	gs, err := e.store.Load(e.group)
	if err != nil {
		return nil, err
	}
	if gs.HardState.Commit > lastIndexOf(gs) {
		return nil, fmt.Errorf("the log ends at %d but this node acknowledged entry %d as committed: entries were lost",
			lastIndexOf(gs), gs.HardState.Commit)
	}
	if err := os.MkdirAll(c.MarkDir, 0o750); err != nil {
		return nil, fmt.Errorf("create %s: %w", c.MarkDir, err)
	}
	mark, value, existed, err := openMark(c.MarkDir)
	if err != nil {
		return nil, &CorruptError{File: filepath.Join(c.MarkDir, markFileName), Reason: err.Error()}
	}
	if existed && value > lastIndexOf(gs) {
		mark.f.Close()
		return nil, fmt.Errorf("the log ends at %d but it held entry %d durably before: entries were lost", lastIndexOf(gs), value)
	}
	kept, err := e.store.markKept(e.group)
	if err != nil {
		mark.f.Close()
		return nil, err
	}
	if err := markKeptCheck(kept, existed, mark.path); err != nil {
		mark.f.Close()
		return nil, err
	}
	if err := mark.set(lastIndexOf(gs)); err != nil {
		mark.f.Close()
		return nil, fmt.Errorf("write the durable mark: %w", err)
	}
	if !kept {
		if err := syncDir(c.MarkDir); err == nil {
			err = e.store.setMarkKept(e.group)
		}
		if err != nil {
			mark.f.Close()
			return nil, fmt.Errorf("record the durable mark: %w", err)
		}
	}
	e.mark = mark
	if !raft.IsEmptySnap(gs.Snapshot) {
		book, fsmData, err := decodeSnapData(gs.Snapshot.Data)
		if err != nil {
			return nil, &CorruptError{File: etcdStoreDir, Index: gs.Snapshot.Metadata.Index, Reason: "snapshot: " + err.Error()}
		}
		if err := e.fsm.Restore(io.NopCloser(bytes.NewReader(fsmData))); err != nil {
			return nil, fmt.Errorf("restore snapshot %d: %w", gs.Snapshot.Metadata.Index, err)
		}
		if err := e.mem.ApplySnapshot(gs.Snapshot); err != nil {
			return nil, err
		}
		e.book, e.conf = book, gs.Snapshot.Metadata.ConfState
		e.applied, e.snapIndex = gs.Snapshot.Metadata.Index, gs.Snapshot.Metadata.Index
		e.scanTerm = gs.Snapshot.Metadata.Term
	}
	e.applyConf, e.applyBook = e.conf, copyBook(e.book)
	e.hist.reset(e.applied, confAt{e.applyConf, e.applyBook})
	if !raft.IsEmptyHardState(gs.HardState) {
		// With asynchronous storage writes an entry may be applied, and
		// snapshotted, before the hard state that records its commit is
		// written; a crash in between leaves a snapshot past the stored
		// commit, which Raft refuses to start from. What a snapshot holds
		// was applied, so committed: its index is a commit this node knew.
		if snap := gs.Snapshot.Metadata.Index; gs.HardState.Commit < snap {
			e.log.Info("the stored commit index is behind the stored snapshot (a crash before the hard state was written); starting from the snapshot's", "commit", gs.HardState.Commit, "snapshot", snap)
			gs.HardState.Commit = snap
		}
		if err := e.mem.SetHardState(gs.HardState); err != nil {
			return nil, err
		}
	}
	if len(gs.Entries) > 0 {
		if err := e.mem.Append(gs.Entries); err != nil {
			return nil, err
		}
		e.scanTerm = gs.Entries[len(gs.Entries)-1].Term
	}
	e.electionTick = max(int(c.Election/etcdTick), 5)
	rc := &raft.Config{
		ID:                        e.nid,
		ElectionTick:              e.electionTick,
		HeartbeatTick:             max(e.electionTick/5, 1),
		Storage:                   e.mem,
		Applied:                   e.applied,
		MaxSizePerMsg:             1 << 20,
		MaxCommittedSizePerReady:  8 << 20,
		MaxUncommittedEntriesSize: 64 << 20,
		MaxInflightMsgs:           256,
		CheckQuorum:               true,
		PreVote:                   true,
		ReadOnlyOption:            raft.ReadOnlySafe,
		DisableProposalForwarding: true,
		// A leader removed from the configuration stops leading at once
		// (hashicorp/raft's does too) instead of leading a group it is not in.
		StepDownOnRemoval: true,
		// The leader sends its entries while it writes them, and counts
		// its own copy once the write is durable (handleReady).
		AsyncStorageWrites: true,
		Logger:             newEtcdRaftLogger(e.log, c.RaftLogLevel),
	}
	rn, err := raft.NewRawNode(rc)
	if err != nil {
		return nil, fmt.Errorf("start raft: %w", err)
	}
	e.rn = rn
	fresh := raft.IsEmptyHardState(gs.HardState) && raft.IsEmptySnap(gs.Snapshot) && len(gs.Entries) == 0
	if fresh && len(c.InitialCluster) > 0 {
		if _, self := c.InitialCluster[c.ID]; !self {
			return nil, fmt.Errorf("--initial-cluster does not name this node %q", c.ID)
		}
		ids := make([]string, 0, len(c.InitialCluster))
		for id := range c.InitialCluster {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		peers := make([]raft.Peer, 0, len(ids))
		seen := map[uint64]string{}
		for _, id := range ids {
			nid := raftID(id)
			if other, dup := seen[nid]; dup {
				return nil, fmt.Errorf("member ids %q and %q hash to the same raft id; rename one", other, id)
			}
			seen[nid] = id
			ctx, _ := json.Marshal(etcdMember{ID: id, Addr: c.InitialCluster[id]})
			peers = append(peers, raft.Peer{ID: nid, Context: ctx})
		}
		// Every initial member bootstraps with the same entries, so their
		// logs agree from the first index on.
		if err := rn.Bootstrap(peers); err != nil {
			return nil, fmt.Errorf("bootstrap cluster: %w", err)
		}
		e.log.Info("bootstrapped new cluster", "members", len(peers), "engine", "etcd")
	} else if !fresh {
		e.log.Info("recovered raft state from data dir", "engine", "etcd", "applied", e.applied, "last_index", lastIndexOf(gs))
	}
	e.publish()
	e.mark.start(c.OnFail)
	e.trans.register(e.group, e)
	go e.runRaft()
	go e.runApply()
	return e, nil
}

// seed stores a new group's initial snapshot (Config.InitialState) when the
// group has nothing stored yet: every replica seeds the same bytes at the
// same index, so their logs agree from the index after it, as bootstrapped
// groups' do from the first.
func (e *etcdEngine) seed(c etcdEngineConfig) error {
	gs, err := e.store.Load(e.group)
	if err != nil {
		return err
	}
	if !raft.IsEmptyHardState(gs.HardState) || !raft.IsEmptySnap(gs.Snapshot) || len(gs.Entries) > 0 {
		return nil
	}
	if c.InitialIndex == 0 || len(c.InitialCluster) == 0 {
		return errors.New("a seeded group needs its index and voters")
	}
	book := map[uint64]etcdMember{}
	var voters []uint64
	for id, addr := range c.InitialCluster {
		nid := raftID(id)
		book[nid] = etcdMember{ID: id, Addr: addr}
		voters = append(voters, nid)
	}
	sort.Slice(voters, func(i, j int) bool { return voters[i] < voters[j] })
	snap := raftpb.Snapshot{Data: encodeSnapData(book, c.InitialState), Metadata: raftpb.SnapshotMetadata{
		Index: c.InitialIndex, Term: 1, ConfState: raftpb.ConfState{Voters: voters}}}
	if err := e.store.Save(e.group, raftpb.HardState{Term: 1, Commit: c.InitialIndex}, nil, snap, true); err != nil {
		return fmt.Errorf("store the group's initial state: %w", err)
	}
	e.log.Info("seeded a new group from a carved state", "index", c.InitialIndex, "voters", len(voters))
	return nil
}

func lastIndexOf(gs groupState) uint64 {
	if n := len(gs.Entries); n > 0 {
		return gs.Entries[n-1].Index
	}
	return gs.Snapshot.Metadata.Index
}

func copyBook(b map[uint64]etcdMember) map[uint64]etcdMember {
	out := make(map[uint64]etcdMember, len(b))
	for k, v := range b {
		out[k] = v
	}
	return out
}

// Snapshot data: "DLES1" | uvarint(len(members)) | members JSON | FSM snapshot.
const snapMagic = "DLES1"

func encodeSnapData(book map[uint64]etcdMember, fsmData []byte) []byte {
	members := make([]etcdMember, 0, len(book))
	for _, m := range book {
		members = append(members, m)
	}
	sort.Slice(members, func(i, j int) bool { return members[i].ID < members[j].ID })
	mj, _ := json.Marshal(members)
	out := append([]byte(snapMagic), binary.AppendUvarint(nil, uint64(len(mj)))...)
	out = append(out, mj...)
	return append(out, fsmData...)
}

func decodeSnapData(b []byte) (map[uint64]etcdMember, []byte, error) {
	if !bytes.HasPrefix(b, []byte(snapMagic)) {
		return nil, nil, errors.New("not an etcd-engine snapshot")
	}
	b = b[len(snapMagic):]
	n, k := binary.Uvarint(b)
	if k <= 0 || uint64(len(b)-k) < n {
		return nil, nil, errors.New("truncated member list")
	}
	var members []etcdMember
	if err := json.Unmarshal(b[k:k+int(n)], &members); err != nil {
		return nil, nil, fmt.Errorf("member list: %w", err)
	}
	book := make(map[uint64]etcdMember, len(members))
	for _, m := range members {
		book[raftID(m.ID)] = m
	}
	return book, b[k+int(n):], nil
}

// ---- The Raft goroutine ----

func (e *etcdEngine) runRaft() {
	defer close(e.raftDone)
	defer e.failAll(hraft.ErrRaftShutdown)
	tick := time.NewTicker(etcdTick)
	defer tick.Stop()
	for {
		select {
		case <-e.stopc:
			return
		case <-tick.C:
			e.rn.Tick()
			e.expire(time.Now())
		case m := <-e.recvc:
			e.step(m)
		case f := <-e.propc:
			e.propose(f)
		case fn := <-e.reportc:
			fn(e.rn)
		case <-e.inSig:
			if !e.takeDeliveries() {
				return
			}
		}
		// Take what else has queued, so one Ready (one log write) covers it.
	drain:
		for range 512 {
			select {
			case m := <-e.recvc:
				e.step(m)
			case f := <-e.propc:
				e.propose(f)
			case <-e.inSig:
				if !e.takeDeliveries() {
					return
				}
			default:
				break drain
			}
		}
		for e.rn.HasReady() {
			if !e.handleReady(e.rn.Ready()) {
				return
			}
		}
		e.publish()
	}
}

func (e *etcdEngine) step(m raftpb.Message) {
	if m.Type == raftpb.MsgHeartbeat && m.Commit > 0 {
		// A leader only announces a commit index this node has acknowledged
		// as durable, and what this node made durable is in mem (appended
		// puts it there before the acknowledgement leaves). A higher one was
		// meant for an earlier life of this member id — one removed and
		// added back empty, the message queued for it while it was down —
		// and go.etcd.io/raft would panic on it. Dropping a heartbeat is
		// always safe; the leader's next one carries the new life's index.
		if last, err := e.mem.LastIndex(); err == nil && m.Commit > last {
			e.log.Warn("dropped a heartbeat for an earlier life of this member: its commit index is past this node's log",
				"commit", m.Commit, "last_index", last, "from", m.From, "term", m.Term)
			return
		}
	}
	switch m.Type {
	case raftpb.MsgApp, raftpb.MsgHeartbeat, raftpb.MsgSnap:
		e.lastContact.Store(time.Now().UnixNano())
	case raftpb.MsgAppResp:
		e.timings.answered(m)
	}
	e.stepCounted(m, false)
}

// stepCounted steps m; an acknowledgement that moves the commit index is
// counted by what came last: the leader's own write (own) or a follower's
// acknowledgement, and then whether the leader's copy was durable yet.
func (e *etcdEngine) stepCounted(m raftpb.Message, own bool) {
	if m.Type != raftpb.MsgAppResp {
		_ = e.rn.Step(m)
		return
	}
	before := e.rn.BasicStatus().Commit
	_ = e.rn.Step(m)
	st := e.rn.BasicStatus()
	if st.Commit <= before || st.RaftState != raft.StateLeader {
		return
	}
	if own {
		e.commitsBy.leaderWrite.Add(1)
		return
	}
	var self uint64
	e.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
		if id == e.nid {
			self = pr.Match
		}
	})
	if self >= st.Commit {
		e.commitsBy.followerAck.Add(1)
	} else {
		e.commitsBy.followersAlone.Add(1)
	}
}

// commitCounts is Status's CommitsBy.
type commitCounts struct{ leaderWrite, followerAck, followersAlone atomic.Uint64 }

// CommitsBy reports how many commit-index advances this node made as
// leader, by what completed them.
func (e *etcdEngine) CommitsBy() CommitsBy {
	return CommitsBy{LeaderWrite: e.commitsBy.leaderWrite.Load(), FollowerAck: e.commitsBy.followerAck.Load(),
		FollowersAlone: e.commitsBy.followersAlone.Load()}
}

func (e *etcdEngine) propose(f *efuture) {
	st := e.rn.BasicStatus()
	if st.RaftState != raft.StateLeader {
		f.finish(nil, hraft.ErrNotLeader)
		return
	}
	if st.LeadTransferee != raft.None && f.kind != propRead {
		f.finish(nil, hraft.ErrLeadershipTransferInProgress)
		return
	}
	f.term = st.Term
	switch f.kind {
	case propData, propBarrier:
		if err := e.rn.Propose(f.data); err != nil {
			f.finish(nil, hraft.ErrNotLeader)
			return
		}
		e.unassigned = append(e.unassigned, f)
	case propConf:
		if err := e.rn.ProposeConfChange(f.cc); err != nil {
			f.finish(nil, hraft.ErrNotLeader)
			return
		}
		e.unassigned = append(e.unassigned, f)
	case propRead:
		e.readSeq++
		f.rctx = string(binary.BigEndian.AppendUint64(nil, e.readSeq))
		e.mu.Lock()
		e.reads[f.rctx] = f
		e.mu.Unlock()
		e.rn.ReadIndex([]byte(f.rctx))
	case propTransfer:
		target := f.target
		if target == 0 {
			target = e.bestTransferee()
		}
		if target == 0 {
			f.finish(nil, errors.New("no other voter to hand leadership to"))
			return
		}
		f.target = target
		e.rn.TransferLeader(target)
		e.transfers = append(e.transfers, f)
	}
}

// bestTransferee is the most caught-up other voter.
func (e *etcdEngine) bestTransferee() uint64 {
	var best, match uint64
	st := e.rn.Status()
	for v := range st.Config.Voters.IDs() {
		pr, ok := st.Progress[v]
		if v == e.nid || !ok {
			continue
		}
		if best == 0 || pr.Match > match {
			best, match = v, pr.Match
		}
	}
	return best
}

// expire ends waits Raft may never answer: reads and transfers past their
// deadline.
func (e *etcdEngine) expire(now time.Time) {
	live := e.transfers[:0]
	for _, f := range e.transfers {
		if now.After(f.deadline) {
			f.finish(nil, errors.New("leadership transfer timed out"))
			continue
		}
		live = append(live, f)
	}
	e.transfers = live
	e.mu.Lock()
	for k, f := range e.reads {
		if now.After(f.deadline) {
			delete(e.reads, k)
			f.finish(nil, hraft.ErrLeadershipLost)
		}
	}
	e.mu.Unlock()
}

// handleReady hands one Ready on: messages to other nodes go out at once —
// the leader's appends among them, so it writes its log while its followers
// write theirs — the log write goes to the node's storage-append goroutine
// and the committed entries to the apply goroutine. With AsyncStorageWrites
// the library puts every message that may only leave after the write (a
// follower's acknowledgement, a vote, and the leader's acknowledgement of its
// own entries) in the write's responses, which the append goroutine delivers
// only once the write is durable: the leader counts its own copy of an entry
// only then, so a commit is still on a majority of disks.
func (e *etcdEngine) handleReady(rd raft.Ready) bool {
	if rd.SoftState != nil {
		e.softState(*rd.SoftState)
	}
	if n := len(rd.Entries); n > 0 {
		e.timings.written(rd.Entries[n-1].Index, time.Now())
	}
	e.match(rd.Entries)
	if len(rd.ReadStates) > 0 {
		e.mu.Lock()
		for _, rs := range rd.ReadStates {
			if f := e.reads[string(rs.RequestCtx)]; f != nil {
				delete(e.reads, string(rs.RequestCtx))
				f.index = rs.Index
				f.finish(nil, nil)
			}
		}
		e.mu.Unlock()
	}
	for _, m := range rd.Messages {
		switch m.To {
		case raft.LocalAppendThread:
			if !e.localAppend(m) {
				return false
			}
		case raft.LocalApplyThread:
			if !e.localApply(m) {
				return false
			}
		default:
			e.send(m)
		}
	}
	return true
}

// localAppend queues a MsgStorageAppend with the node's append goroutine.
// A snapshot received from the leader replaces the address book now: the
// Raft state this goroutine sees already includes it.
func (e *etcdEngine) localAppend(m raftpb.Message) bool {
	if m.Snapshot != nil && !raft.IsEmptySnap(*m.Snapshot) {
		book, _, err := decodeSnapData(m.Snapshot.Data)
		if err != nil {
			e.fail(fmt.Errorf("install snapshot %d: %w", m.Snapshot.Metadata.Index, err))
			return false
		}
		e.book, e.conf = book, m.Snapshot.Metadata.ConfState
		e.membersGen++
		e.scanTerm = max(e.scanTerm, m.Snapshot.Metadata.Term)
	}
	e.inflight.Add(1)
	leader := e.rn.BasicStatus().RaftState == raft.StateLeader
	if !e.store.submitAppend(e.group, e, m, leader, e.stopc) {
		e.inflight.Done()
		return false
	}
	return true
}

// localApply hands a MsgStorageApply's entries to the apply goroutine,
// applying configuration changes to Raft first (Raft's own view of the
// membership must follow the log on this goroutine).
func (e *etcdEngine) localApply(m raftpb.Message) bool {
	b := &applyBatch{ents: m.Entries, resps: m.Responses}
	for _, ent := range m.Entries {
		if ent.Type == raftpb.EntryNormal {
			continue
		}
		if b.confs == nil {
			b.confs = map[uint64]confAt{}
		}
		b.confs[ent.Index] = e.applyConfChange(ent)
	}
	return e.toApply(b)
}

// prepareAppend (append goroutine): a write that replaces the log's tail
// (new entries over old ones, or a received snapshot over the whole log)
// first lowers the durable mark, durably.
func (e *etcdEngine) prepareAppend(m *raftpb.Message) error {
	if m.Snapshot != nil && !raft.IsEmptySnap(*m.Snapshot) {
		if err := e.mark.truncating(m.Snapshot.Metadata.Index+1, math.MaxUint64); err != nil {
			return err
		}
	}
	if len(m.Entries) > 0 {
		return e.mark.truncating(m.Entries[0].Index, math.MaxUint64)
	}
	return nil
}

// appended (append goroutine): the write is durable. Raft reads the entries
// from the memory log once it hears so, so they go there first; then the
// responses go to the Raft goroutine.
func (e *etcdEngine) appended(m raftpb.Message) {
	var snap *raftpb.Snapshot
	if m.Snapshot != nil && !raft.IsEmptySnap(*m.Snapshot) {
		if err := e.mem.ApplySnapshot(*m.Snapshot); err != nil && !errors.Is(err, raft.ErrSnapOutOfDate) {
			e.appendFailed(fmt.Errorf("install snapshot: %w", err))
			return
		}
		snap = m.Snapshot
		if err := e.mark.stored(m.Snapshot.Metadata.Index); err != nil {
			e.appendFailed(fmt.Errorf("write the durable mark: %w", err))
			return
		}
	}
	if hs := (raftpb.HardState{Term: m.Term, Vote: m.Vote, Commit: m.Commit}); !raft.IsEmptyHardState(hs) {
		_ = e.mem.SetHardState(hs)
	}
	if n := len(m.Entries); n > 0 {
		if err := e.mem.Append(m.Entries); err != nil {
			e.appendFailed(fmt.Errorf("raft log: %w", err))
			return
		}
		if err := e.mark.stored(m.Entries[n-1].Index); err != nil {
			e.appendFailed(fmt.Errorf("write the durable mark: %w", err))
			return
		}
	}
	// A follower's acknowledgement or a vote leaves from here, saving the
	// hop through the Raft goroutine on every commit's path; what is for
	// this node's Raft (the leader's own acknowledgement) goes there.
	var local []raftpb.Message
	for _, r := range m.Responses {
		if r.To == e.nid {
			local = append(local, r)
		} else {
			e.sendFromLocal(r)
		}
	}
	e.deliver(localDelivery{snap: snap, msgs: local})
	e.inflight.Done()
}

// sendFromLocal sends m from a goroutine other than the Raft goroutine,
// with the address book it last published.
func (e *etcdEngine) sendFromLocal(m raftpb.Message) {
	addr := e.view.Load().book[m.To].Addr
	if addr == "" {
		addr, _ = e.trans.learnedAddr(m.To)
	}
	if addr == "" || !e.trans.send(e.group, addr, m) {
		e.unreachable(m.To)
	}
}

// appendFailed (append goroutine): the node stops; the write's responses are
// dropped, so no acknowledgement of it (the leader's own included) is ever
// counted.
func (e *etcdEngine) appendFailed(err error) {
	defer e.inflight.Done()
	if errors.Is(err, errStoreClosed) {
		e.failed.Store(true)
		return
	}
	e.fail(fmt.Errorf("raft log write failed: %w", err))
}

// fail stops the node for a storage failure and the Raft goroutine with it.
func (e *etcdEngine) fail(err error) {
	e.failed.Store(true)
	e.cfg.OnFail(err)
	e.deliver(localDelivery{failed: true})
}

// localDelivery is what the append and apply goroutines hand back to the
// Raft goroutine.
type localDelivery struct {
	// snap, installed by the append goroutine, goes on to the apply
	// goroutine before msgs are stepped (they let Raft apply past it).
	snap   *raftpb.Snapshot
	msgs   []raftpb.Message
	failed bool
}

// deliver queues d for the Raft goroutine; it never blocks, so the append
// and apply goroutines never wait on the Raft goroutine, which may itself be
// waiting to queue work with them. What queues is bounded by the writes and
// applies in flight.
func (e *etcdEngine) deliver(d localDelivery) {
	e.inMu.Lock()
	e.inbox = append(e.inbox, d)
	e.inMu.Unlock()
	select {
	case e.inSig <- struct{}{}:
	default:
	}
}

// takeDeliveries (Raft goroutine) steps what the local goroutines handed
// back; false if a storage failure stopped the node.
func (e *etcdEngine) takeDeliveries() bool {
	e.inMu.Lock()
	ds := e.inbox
	e.inbox = nil
	e.inMu.Unlock()
	for _, d := range ds {
		if d.failed || e.failed.Load() {
			return false
		}
		if d.snap != nil && !e.toApply(&applyBatch{snap: d.snap}) {
			return false
		}
		for _, m := range d.msgs {
			if m.To == e.nid {
				e.stepCounted(m, true)
			} else {
				e.send(m)
			}
		}
	}
	return true
}

func (e *etcdEngine) toApply(b *applyBatch) bool {
	select {
	case e.applyc <- b:
		return true
	case <-e.stopc:
		return false
	}
}

// applyConfChange applies a committed configuration change to Raft and to
// the address book.
func (e *etcdEngine) applyConfChange(ent raftpb.Entry) confAt {
	var cc raftpb.ConfChangeI
	var ctx []byte
	switch ent.Type {
	case raftpb.EntryConfChange:
		var c raftpb.ConfChange
		if err := c.Unmarshal(ent.Data); err != nil {
			panic(fmt.Sprintf("dlock etcd engine: cannot decode configuration change at %d: %v", ent.Index, err))
		}
		cc, ctx = c, c.Context
	case raftpb.EntryConfChangeV2:
		var c raftpb.ConfChangeV2
		if err := c.Unmarshal(ent.Data); err != nil {
			panic(fmt.Sprintf("dlock etcd engine: cannot decode configuration change at %d: %v", ent.Index, err))
		}
		cc, ctx = c, c.Context
	}
	var m etcdMember
	_ = json.Unmarshal(ctx, &m)
	for _, ch := range cc.AsV2().Changes {
		switch ch.Type {
		case raftpb.ConfChangeAddNode, raftpb.ConfChangeAddLearnerNode:
			if m.ID != "" && raftID(m.ID) == ch.NodeID {
				e.book[ch.NodeID] = m
			}
		case raftpb.ConfChangeRemoveNode:
			delete(e.book, ch.NodeID)
		}
	}
	e.conf = *e.rn.ApplyConfChange(cc)
	e.membersGen++
	return confAt{cs: e.conf, book: copyBook(e.book)}
}

// match gives each proposal of this node's leadership the index of its
// entry. Entries of a term come in order; the first of each term is its
// leader's empty entry, and every later one of a term this node leads is one
// of its proposals, in the order they were made.
func (e *etcdEngine) match(ents []raftpb.Entry) {
	for i := range ents {
		ent := &ents[i]
		first := ent.Term > e.scanTerm
		e.scanTerm = max(e.scanTerm, ent.Term)
		// Proposals of earlier terms lost their entries to a new leader.
		for len(e.unassigned) > 0 && e.unassigned[0].term < ent.Term {
			e.unassigned[0].finish(nil, hraft.ErrLeadershipLost)
			e.unassigned = e.unassigned[1:]
		}
		if first || len(e.unassigned) == 0 || e.unassigned[0].term != ent.Term {
			continue
		}
		f := e.unassigned[0]
		e.unassigned = e.unassigned[1:]
		f.index = ent.Index
		if f.kind == propConf && ent.Type == raftpb.EntryNormal {
			f.finish(nil, errConfRefused)
			continue
		}
		e.mu.Lock()
		e.waiting[ent.Index] = f
		e.mu.Unlock()
	}
}

// softState follows leadership: a leader that steps down fails what it was
// waiting for (outcome unknown), and finishes transfers.
func (e *etcdEngine) softState(ss raft.SoftState) {
	e.timings.roleChanged(ss.RaftState, e.rn.BasicStatus().Term)
	if ss.RaftState != raft.StateLeader {
		for _, f := range e.unassigned {
			f.finish(nil, hraft.ErrLeadershipLost)
		}
		e.unassigned = nil
		e.mu.Lock()
		for k, f := range e.waiting {
			delete(e.waiting, k)
			f.finish(nil, hraft.ErrLeadershipLost)
		}
		for k, f := range e.reads {
			delete(e.reads, k)
			f.finish(nil, hraft.ErrLeadershipLost)
		}
		e.mu.Unlock()
		for _, f := range e.transfers {
			f.finish(nil, nil)
		}
		e.transfers = nil
	}
}

func (e *etcdEngine) send(m raftpb.Message) {
	if m.To == e.nid {
		return
	}
	addr := e.book[m.To].Addr
	if addr == "" {
		addr, _ = e.trans.learnedAddr(m.To)
	}
	e.timings.sent(m)
	if addr == "" || !e.trans.send(e.group, addr, m) {
		e.rn.ReportUnreachable(m.To)
		if m.Type == raftpb.MsgSnap {
			e.rn.ReportSnapshot(m.To, raft.SnapshotFailure)
		}
	}
}

// publish makes the loop's state visible to other goroutines.
func (e *etcdEngine) publish() {
	st := e.rn.BasicStatus()
	e.timings.committed(st.Commit)
	v := &etcdView{lead: st.Lead, term: st.Term, commit: st.Commit}
	switch st.RaftState {
	case raft.StateLeader:
		v.state = hraft.Leader
	case raft.StateFollower:
		v.state = hraft.Follower
	default:
		v.state = hraft.Candidate
	}
	old := e.view.Load()
	if old != nil && old.members == e.membersGen {
		if old.state == v.state && old.lead == v.lead && old.term == v.term && old.commit == v.commit {
			return
		}
		v.book, v.conf, v.members = old.book, old.conf, old.members
	} else {
		v.book, v.conf, v.members = copyBook(e.book), e.conf, e.membersGen
	}
	e.view.Store(v)
	if old == nil || (old.state == hraft.Leader) != (v.state == hraft.Leader) {
		select {
		case e.leaderCh <- v.state == hraft.Leader:
		default:
		}
	}
}

// failAll answers everything still waiting when the loop ends.
func (e *etcdEngine) failAll(err error) {
	for _, f := range e.unassigned {
		f.finish(nil, err)
	}
	e.unassigned = nil
	for _, f := range e.transfers {
		f.finish(nil, err)
	}
	e.transfers = nil
	e.mu.Lock()
	for k, f := range e.waiting {
		delete(e.waiting, k)
		f.finish(nil, err)
	}
	for k, f := range e.reads {
		delete(e.reads, k)
		f.finish(nil, err)
	}
	e.mu.Unlock()
	e.drainProposals(err)
}

// ---- The apply goroutine ----

func (e *etcdEngine) runApply() {
	defer close(e.applyDone)
	defer e.endSnapshots()
	for {
		select {
		case <-e.stopc:
			return
		case b := <-e.applyc:
			if !e.apply(b) {
				return
			}
		case f := <-e.snapc:
			e.takeSnapshot(f)
		case w := <-e.snapWritten:
			e.snapshotWritten(w)
		}
	}
}

func (e *etcdEngine) apply(b *applyBatch) bool {
	if b.snap != nil && b.snap.Metadata.Index > e.applied {
		book, data, err := decodeSnapData(b.snap.Data)
		if err == nil {
			start := time.Now()
			err = e.fsm.Restore(io.NopCloser(bytes.NewReader(data)))
			gometrics.MeasureSince(keyFSMRestore, start)
		}
		if err != nil {
			e.fail(fmt.Errorf("install snapshot %d: %w", b.snap.Metadata.Index, err))
			return false
		}
		e.applied, e.snapIndex = b.snap.Metadata.Index, b.snap.Metadata.Index
		e.applyConf, e.applyBook = b.snap.Metadata.ConfState, book
		e.hist.reset(e.applied, confAt{e.applyConf, e.applyBook})
	}
	logs := make([]*hraft.Log, 0, len(b.ents))
	confChanged := false
	for _, ent := range b.ents {
		if ent.Index <= e.applied {
			continue
		}
		l := &hraft.Log{Index: ent.Index, Term: ent.Term}
		switch {
		case ent.Type == raftpb.EntryNormal && len(ent.Data) > 0:
			l.Type, l.Data = hraft.LogCommand, ent.Data
		case ent.Type == raftpb.EntryNormal:
			l.Type = hraft.LogNoop
		default:
			l.Type = hraft.LogConfiguration
			if c, ok := b.confs[ent.Index]; ok {
				e.applyConf, e.applyBook = c.cs, c.book
				confChanged = true
				e.hist.mu.Lock()
				e.hist.marks = append(e.hist.marks, confMark{ent.Index, c})
				e.hist.mu.Unlock()
			}
		}
		logs = append(logs, l)
	}
	if len(logs) == 0 {
		e.deliverApplied(b)
		return true
	}
	start := time.Now()
	resps := e.fsm.ApplyBatch(logs)
	gometrics.MeasureSince(keyApplyBatch, start)
	e.applied = logs[len(logs)-1].Index
	e.hist.mu.Lock()
	e.hist.applied = e.applied
	e.hist.mu.Unlock()
	for _, l := range logs {
		e.applyBytes += uint64(len(l.Data))
	}
	e.sizeMarks = append(e.sizeMarks, sizeMark{index: e.applied, bytes: e.applyBytes})
	e.mu.Lock()
	for i, l := range logs {
		f := e.waiting[l.Index]
		if f == nil {
			continue
		}
		delete(e.waiting, l.Index)
		if f.term != l.Term {
			f.finish(nil, hraft.ErrLeadershipLost)
			continue
		}
		f.finish(resps[i], nil)
	}
	e.mu.Unlock()
	e.deliverApplied(b)
	// A member added since the last snapshot would refuse it (Raft
	// ignores a snapshot whose configuration does not name it), so a
	// configuration change is snapshotted at once: a new member that is
	// too far behind for the log gets a snapshot that names it.
	snapBytes := e.cfg.SnapshotBytes
	if snapBytes == 0 {
		snapBytes = defaultLogBytes
	}
	byCount := e.cfg.Threshold > 0 && e.applied-e.snapIndex >= e.cfg.Threshold && !time.Now().Before(e.snapNext)
	due := e.snapDue || byCount || e.applyBytes-e.snapBytes >= snapBytes
	// While a snapshot is being written the counts still measure from the
	// one before it; only a configuration change must follow it.
	if confChanged || (due && e.writing == nil) {
		e.takeSnapshot(nil)
	}
	return true
}

// deliverApplied tells Raft the batch is applied (MsgStorageApplyResp).
func (e *etcdEngine) deliverApplied(b *applyBatch) {
	if len(b.resps) > 0 {
		e.deliver(localDelivery{msgs: b.resps})
	}
}

// ---- groupHandler (transport side) ----

func (e *etcdEngine) receive(m raftpb.Message) {
	select {
	case e.recvc <- m:
	case <-e.raftDone:
	}
}

func (e *etcdEngine) report(fn func(*raft.RawNode)) {
	select {
	case e.reportc <- fn:
	default:
	}
}

func (e *etcdEngine) unreachable(to uint64) {
	e.report(func(rn *raft.RawNode) { rn.ReportUnreachable(to) })
}

func (e *etcdEngine) snapshotDone(to uint64, ok bool) {
	st := raft.SnapshotFinish
	if !ok {
		st = raft.SnapshotFailure
	}
	e.report(func(rn *raft.RawNode) { rn.ReportSnapshot(to, st) })
}

func (e *etcdEngine) peerFailing(addr string, failing bool) {
	v := e.view.Load()
	if v == nil || e.cfg.PeerHealth == nil {
		return
	}
	for _, m := range v.book {
		if m.Addr == addr {
			e.cfg.PeerHealth(m.ID, failing)
		}
	}
}

// peerGone acts on the end of the stream a peer sends on. When that peer is
// this node's leader, its process most likely died: a killed process's
// kernel closes its connections at once. Waiting for the election timeout
// from its last heartbeat would add 150–300 ms to every such failover, so
// the node counts the timeout as passed (leaderGone). It is only a hint: a
// leader that is alive (a cut link) keeps its other followers, which refuse
// this node's pre-vote (check-quorum), and its next heartbeat that gets
// through makes this node its follower again.
func (e *etcdEngine) peerGone(addr string) {
	e.report(func(rn *raft.RawNode) { e.leaderGone(rn, addr) })
}

// leaderGone ticks a follower of the leader at addr through one election
// timeout, on the Raft goroutine. Past it, the node no longer refuses other
// nodes' pre-votes for its leader's sake, and it campaigns when what is
// left of its randomized timeout runs out, so the survivors' timers, not
// one node's choice, still pick who goes first; the ticking stops if the
// node starts an election.
func (e *etcdEngine) leaderGone(rn *raft.RawNode, addr string) {
	st := rn.BasicStatus()
	if st.RaftState != raft.StateFollower || st.Lead == raft.None || e.book[st.Lead].Addr != addr {
		return
	}
	for range e.electionTick {
		rn.Tick()
		if rn.BasicStatus().RaftState != raft.StateFollower {
			return
		}
	}
}

// ---- The engine interface (hashicorp/raft's shape) ----

func (e *etcdEngine) submit(f *efuture, timeout time.Duration) *efuture {
	if e.failed.Load() {
		f.finish(nil, hraft.ErrRaftShutdown)
		return f
	}
	var t <-chan time.Time
	if timeout > 0 {
		timer := time.NewTimer(timeout)
		defer timer.Stop()
		t = timer.C
	}
	select {
	case e.propc <- f:
		// The loop may have ended just before taking it: answer whatever
		// it left queued.
		select {
		case <-e.raftDone:
			e.drainProposals(hraft.ErrRaftShutdown)
		default:
		}
	case <-e.raftDone:
		f.finish(nil, hraft.ErrRaftShutdown)
	case <-t:
		f.finish(nil, hraft.ErrEnqueueTimeout)
	}
	return f
}

func (e *etcdEngine) drainProposals(err error) {
	for {
		select {
		case f := <-e.propc:
			f.finish(nil, err)
		default:
			return
		}
	}
}

func (e *etcdEngine) State() hraft.RaftState {
	select {
	case <-e.raftDone:
		return hraft.Shutdown
	default:
	}
	return e.view.Load().state
}

func (e *etcdEngine) LeaderWithID() (hraft.ServerAddress, hraft.ServerID) {
	v := e.view.Load()
	if v.lead == raft.None {
		return "", ""
	}
	m, ok := v.book[v.lead]
	if !ok {
		return "", ""
	}
	return hraft.ServerAddress(m.Addr), hraft.ServerID(m.ID)
}

func (e *etcdEngine) CommitIndex() uint64 { return e.view.Load().commit }
func (e *etcdEngine) CurrentTerm() uint64 { return e.view.Load().term }

func (e *etcdEngine) LastContact() time.Time {
	if e.view.Load().state == hraft.Leader {
		return time.Now()
	}
	if ns := e.lastContact.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

func (e *etcdEngine) LeaderCh() <-chan bool { return e.leaderCh }

func (e *etcdEngine) GetConfiguration() hraft.ConfigurationFuture {
	v := e.view.Load()
	f := newFuture(propData)
	f.cfg = configurationOf(v.conf, v.book)
	f.finish(nil, nil)
	return f
}

func configurationOf(cs raftpb.ConfState, book map[uint64]etcdMember) hraft.Configuration {
	var cfg hraft.Configuration
	add := func(ids []uint64, s hraft.ServerSuffrage) {
		for _, id := range ids {
			m, ok := book[id]
			if !ok {
				m = etcdMember{ID: fmt.Sprintf("%x", id)}
			}
			cfg.Servers = append(cfg.Servers, hraft.Server{ID: hraft.ServerID(m.ID), Address: hraft.ServerAddress(m.Addr), Suffrage: s})
		}
	}
	add(cs.Voters, hraft.Voter)
	add(cs.Learners, hraft.Nonvoter)
	sort.Slice(cfg.Servers, func(i, j int) bool { return cfg.Servers[i].ID < cfg.Servers[j].ID })
	return cfg
}

func (e *etcdEngine) Apply(cmd []byte, timeout time.Duration) hraft.ApplyFuture {
	f := newFuture(propData)
	f.data = cmd
	return e.submit(f, timeout)
}

func (e *etcdEngine) Barrier(timeout time.Duration) hraft.Future {
	return e.submit(newFuture(propBarrier), timeout)
}

func (e *etcdEngine) VerifyLeader() hraft.Future {
	f := newFuture(propRead)
	f.deadline = time.Now().Add(2 * e.cfg.Election)
	return e.submit(f, e.cfg.Election)
}

func (e *etcdEngine) confChange(typ raftpb.ConfChangeType, id, addr string, timeout time.Duration) hraft.IndexFuture {
	ctx, _ := json.Marshal(etcdMember{ID: id, Addr: addr})
	f := newFuture(propConf)
	f.cc = raftpb.ConfChangeV2{Changes: []raftpb.ConfChangeSingle{{Type: typ, NodeID: raftID(id)}}, Context: ctx}
	return e.submit(f, timeout)
}

func (e *etcdEngine) AddNonvoter(id hraft.ServerID, addr hraft.ServerAddress, _ uint64, timeout time.Duration) hraft.IndexFuture {
	if m, ok := e.view.Load().book[raftID(string(id))]; ok && m.ID != string(id) {
		return doneFuture(fmt.Errorf("member id %q hashes to the raft id of member %q; choose another id", id, m.ID))
	}
	return e.confChange(raftpb.ConfChangeAddLearnerNode, string(id), string(addr), timeout)
}

func (e *etcdEngine) AddVoter(id hraft.ServerID, addr hraft.ServerAddress, _ uint64, timeout time.Duration) hraft.IndexFuture {
	v := e.view.Load()
	nid := raftID(string(id))
	if m, ok := v.book[nid]; ok && m.ID != string(id) {
		return doneFuture(fmt.Errorf("member id %q hashes to the raft id of member %q; choose another id", id, m.ID))
	}
	for _, vid := range v.conf.Voters {
		if vid == nid {
			return doneFuture(nil)
		}
	}
	return e.confChange(raftpb.ConfChangeAddNode, string(id), string(addr), timeout)
}

func (e *etcdEngine) RemoveServer(id hraft.ServerID, _ uint64, timeout time.Duration) hraft.IndexFuture {
	return e.confChange(raftpb.ConfChangeRemoveNode, string(id), "", timeout)
}

func (e *etcdEngine) LeadershipTransfer() hraft.Future {
	f := newFuture(propTransfer)
	f.deadline = time.Now().Add(4 * e.cfg.Election)
	return e.submit(f, e.cfg.Election)
}

func (e *etcdEngine) LeadershipTransferToServer(id hraft.ServerID, _ hraft.ServerAddress) hraft.Future {
	f := newFuture(propTransfer)
	f.target = raftID(string(id))
	f.deadline = time.Now().Add(4 * e.cfg.Election)
	return e.submit(f, e.cfg.Election)
}

func (e *etcdEngine) Snapshot() hraft.SnapshotFuture {
	f := newFuture(propSnapshot)
	select {
	case e.snapc <- f:
	case <-e.applyDone:
		f.finish(nil, hraft.ErrRaftShutdown)
	}
	return f
}

// Shutdown stops both goroutines and answers everything still waiting.
func (e *etcdEngine) Shutdown() hraft.Future {
	e.stopOnce.Do(func() {
		close(e.stopc)
		<-e.raftDone
		<-e.applyDone
		// The append goroutine answers every write queued (it never
		// waits on this engine), so this ends.
		e.inflight.Wait()
		e.trans.unregister(e.group)
		e.failAll(hraft.ErrRaftShutdown)
		if err := e.mark.close(e.failed.Load()); err != nil {
			e.log.Warn("closing the durable mark failed", "err", err)
		}
	})
	return doneFuture(nil)
}

// ---- etcd raft's logger ----

type etcdRaftLogger struct {
	l     *slog.Logger
	level slog.Level
}

func newEtcdRaftLogger(l *slog.Logger, level string) raft.Logger {
	lv := slog.LevelWarn
	if level == "off" {
		lv = slog.Level(100)
	} else {
		_ = lv.UnmarshalText([]byte(level))
	}
	return &etcdRaftLogger{l: l.With("component", "raft"), level: lv}
}

func (r *etcdRaftLogger) log(lv slog.Level, msg string) {
	if lv >= r.level {
		r.l.Log(context.Background(), lv, msg)
	}
}

func (r *etcdRaftLogger) Debug(v ...any) { r.log(slog.LevelDebug, fmt.Sprint(v...)) }
func (r *etcdRaftLogger) Debugf(format string, v ...any) {
	r.log(slog.LevelDebug, fmt.Sprintf(format, v...))
}
func (r *etcdRaftLogger) Info(v ...any) { r.log(slog.LevelInfo, fmt.Sprint(v...)) }
func (r *etcdRaftLogger) Infof(format string, v ...any) {
	r.log(slog.LevelInfo, fmt.Sprintf(format, v...))
}
func (r *etcdRaftLogger) Warning(v ...any) { r.log(slog.LevelWarn, fmt.Sprint(v...)) }
func (r *etcdRaftLogger) Warningf(format string, v ...any) {
	r.log(slog.LevelWarn, fmt.Sprintf(format, v...))
}
func (r *etcdRaftLogger) Error(v ...any) { r.log(slog.LevelError, fmt.Sprint(v...)) }
func (r *etcdRaftLogger) Errorf(format string, v ...any) {
	r.log(slog.LevelError, fmt.Sprintf(format, v...))
}
func (r *etcdRaftLogger) Fatal(v ...any)                 { panic(fmt.Sprint(v...)) }
func (r *etcdRaftLogger) Fatalf(format string, v ...any) { panic(fmt.Sprintf(format, v...)) }
func (r *etcdRaftLogger) Panic(v ...any)                 { panic(fmt.Sprint(v...)) }
func (r *etcdRaftLogger) Panicf(format string, v ...any) { panic(fmt.Sprintf(format, v...)) }
