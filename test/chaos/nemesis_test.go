package chaos

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"time"
)

// faultEvent is one injected fault, as printed in the schedule.
type faultEvent struct {
	N       int    `json:"n"`
	Kind    string `json:"kind"`
	Target  string `json:"target"`
	Detail  string `json:"detail,omitempty"`
	Start   int64  `json:"start"`
	Heal    int64  `json:"heal"`              // when it was undone (0 for client faults)
	Healthy int64  `json:"healthy,omitempty"` // when the cluster was healthy again after the heal
	Err     string `json:"err,omitempty"`
	// LeadersHit counts the shards whose leader the fault took (killed,
	// paused or cut off from the majority) on a sharded cluster.
	LeadersHit int `json:"shard_leaders_hit,omitempty"`
}

func (f faultEvent) String() string {
	s := fmt.Sprintf("#%d %s %s %s", f.N, fmtT(f.Start), f.Kind, f.Target)
	if f.Detail != "" {
		s += " (" + f.Detail + ")"
	}
	if f.Heal > 0 {
		s += fmt.Sprintf(" healed %s", fmtT(f.Heal))
		if f.Healthy > 0 {
			s += fmt.Sprintf(", healthy %s after", time.Duration(f.Healthy-f.Heal).Round(time.Millisecond))
		} else {
			s += ", NOT healthy again"
		}
	}
	if f.Err != "" {
		s += " error: " + f.Err
	}
	return s
}

// Cluster fault kinds.
const (
	fKillLeader      = "kill-leader"
	fKillFollower    = "kill-follower"
	fKillMajority    = "kill-majority"
	fRestartAll      = "restart-all"
	fPauseLeader     = "pause-leader"
	fPauseFollower   = "pause-follower"
	fIsolateLeader   = "isolate-leader"
	fBlackholeLeader = "blackhole-leader"
	fIsolateFollower = "isolate-follower"
	fSplitMinority   = "partition-majority-minority"
	fBridge          = "partition-bridge"
	fOneWayOut       = "oneway-leader-cannot-send"
	fOneWayIn        = "oneway-leader-cannot-receive"
	fReplace         = "replace-follower"
	fReplaceLeader   = "replace-leader"
	fTransfer        = "transfer-leadership"
	fClientPause     = "client-pause"
	fClientCrash     = "client-crash"
)

// clusterFaults is the nemesis of a one-group run (a sharded run draws from
// shardedFaults).
var clusterFaults = []faultWeight{
	{fKillLeader, 4}, {fKillFollower, 3}, {fKillMajority, 1}, {fRestartAll, 2},
	{fPauseLeader, 4}, {fPauseFollower, 2},
	{fIsolateLeader, 4}, {fBlackholeLeader, 2}, {fIsolateFollower, 2},
	{fSplitMinority, 2}, {fBridge, 2}, {fOneWayOut, 2}, {fOneWayIn, 2},
	{fReplace, 1}, {fReplaceLeader, 1}, {fTransfer, 1},
	{fCorruptLog, 1}, {fTruncateLog, 1}, {fCorruptSnapshot, 1}, {fDiskLow, 1}, {fDiskFull, 1},
}

// diskFault reports whether kind needs the per-node tmpfs (mountDisks).
func diskFault(kind string) bool { return kind == fDiskLow || kind == fDiskFull }

// nemesis injects faults from its own seeded generator.
type nemesis struct {
	c   *cluster
	w   *workload
	clk *clock
	rng *rand.Rand // cluster faults
	crn *rand.Rand // client faults

	mu     sync.Mutex
	events []faultEvent
	logf   func(format string, args ...any)

	stop chan struct{}
	wg   sync.WaitGroup

	// gap and hold bound the schedule
	gapLo, gapHi   time.Duration
	holdLo, holdHi time.Duration
	// clientGapLo/Hi space the client faults
	clientGapLo, clientGapHi time.Duration
	// disks: the nodes' data dirs are on tmpfs of their own, so the disk
	// faults can run; outcomes counts how storage faults ended (note).
	disks    bool
	outcomes map[string]int
	// faults is what runCluster draws from: clusterFaults, or
	// shardedFaults on a sharded cluster.
	faults []faultWeight
	// points are where split-range may split (splitPoints); splits counts
	// the splits made; drawn counts the cluster faults drawn.
	points []string
	splits int
	drawn  int
	// moves are the replica moves (nil: the run does not move replicas).
	moves *moveSet
	// members is the member cycle (nil: the run has no spare node).
	members *memberCycle
}

// dense is the soak's pace (scripts/chaos.sh --pace dense, its default):
// about 3,000 faults in 30 minutes instead of about 1,100. Holds stay above
// the election timeout, so every kill or pause still costs a leader.
func (n *nemesis) dense() {
	n.gapLo, n.gapHi = 200*time.Millisecond, 1*time.Second
	n.holdLo, n.holdHi = 500*time.Millisecond, 2500*time.Millisecond
	n.clientGapLo, n.clientGapHi = 300*time.Millisecond, 1200*time.Millisecond
}

func newNemesis(c *cluster, w *workload, clk *clock, seed uint64, logf func(string, ...any)) *nemesis {
	return &nemesis{c: c, w: w, clk: clk, logf: logf,
		rng:   rand.New(rand.NewPCG(seed, 7)),
		crn:   rand.New(rand.NewPCG(seed, 11)),
		stop:  make(chan struct{}),
		gapLo: 500 * time.Millisecond, gapHi: 2500 * time.Millisecond,
		holdLo: 1 * time.Second, holdHi: 5 * time.Second,
		clientGapLo: 1 * time.Second, clientGapHi: 4 * time.Second,
		faults: clusterFaults,
	}
}

func (n *nemesis) record(e faultEvent) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	e.N = len(n.events) + 1
	n.events = append(n.events, e)
	n.logf("fault %s", e.String())
	return e.N - 1
}

func (n *nemesis) update(i int, f func(*faultEvent)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	f(&n.events[i])
}

func (n *nemesis) schedule() []faultEvent {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]faultEvent(nil), n.events...)
}

func (n *nemesis) sleep(d time.Duration) bool {
	select {
	case <-time.After(d):
		return true
	case <-n.stop:
		return false
	}
}

func between(r *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(r.Int64N(int64(hi-lo)+1))
}

func (n *nemesis) start() {
	n.wg.Add(2)
	go func() { defer n.wg.Done(); n.runCluster() }()
	go func() { defer n.wg.Done(); n.runClients() }()
	if n.members != nil {
		go n.members.run() // ended by finishMembers
	}
}

// halt stops the schedule; the fault in progress is healed by its loop.
func (n *nemesis) halt() {
	close(n.stop)
	n.wg.Wait()
}

func (n *nemesis) pickKind() string {
	total := 0
	for _, f := range n.faults {
		total += f.weight
	}
	x := n.rng.IntN(total)
	for _, f := range n.faults {
		if x < f.weight {
			if diskFault(f.kind) && !n.disks {
				return fKillFollower // the same draw, so a seed's schedule stays comparable
			}
			return f.kind
		}
		x -= f.weight
	}
	return n.faults[0].kind
}

func ids(c *cluster, idx []int) string {
	var s []string
	for _, i := range idx {
		s = append(s, c.nodes[i].id)
	}
	return strings.Join(s, ",")
}

// runCluster injects one cluster fault at a time: wait a gap, inject, hold,
// heal, wait (bounded) for the cluster to be healthy again.
func (n *nemesis) runCluster() {
	for {
		if !n.sleep(between(n.rng, n.gapLo, n.gapHi)) {
			return
		}
		kind := n.pickKind()
		// The faults aim at the members (every node, unless a spare is out
		// of the cluster or being removed); positions drawn below index mem.
		mem := n.c.memberIdx()
		N := len(mem)
		hold := between(n.rng, n.holdLo, n.holdHi)
		// Draw every random choice before looking at the cluster, so a seed
		// replays the same decisions whatever the leader turns out to be.
		pickA := n.rng.IntN(1 << 20)
		pickB := n.rng.IntN(1 << 20)
		// On a sharded cluster "the leader" is the node leading the most
		// shards: the fault takes every shard it leads.
		sharded := n.c.shards > 1
		n.drawn++
		var splitMap shardMap
		var splitAt string
		if sharded && (kind == fSplitRange || n.drawn == splitForcedAt) {
			// Where to split depends only on the earlier splits, so a seed
			// splits at the same points every time.
			var merr error
			if splitMap, merr = n.c.currentShardMap(); merr == nil && n.splits < maxSplits {
				splitAt = splitPoint(splitMap, n.points, pickB)
			}
			switch {
			case splitAt != "":
				kind = fSplitRange
			case kind == fSplitRange:
				kind = fKillFollower
			}
		}
		var mv moveRec
		if n.moves != nil && kind != fSplitRange && (kind == fMoveReplica || n.drawn == moveForcedAt || n.drawn == moveBackForcedAt) {
			// Which move depends on the map as the earlier moves and
			// splits left it (and on which of them finished in time).
			ok := false
			if active, busy := n.moves.inFlight(); active < maxMovesInFlight {
				if m, merr := n.c.currentShardMap(); merr == nil {
					nodes := n.c.moveTargets()
					n.moves.mu.Lock()
					last := n.moves.last
					n.moves.mu.Unlock()
					mv, ok = pickMove(m, nodes, n.moves.anchor, last, busy, pickA, pickB, n.drawn == moveBackForcedAt || pickB%3 == 0)
				}
			}
			switch {
			case ok:
				kind = fMoveReplica
			case kind == fMoveReplica:
				kind = fKillFollower
			}
		}
		var afterRecord func(i int)
		var leaders []int // per shard, before the fault
		var leader int
		if sharded {
			leaders = n.c.shardLeaders()
			leader = topLeader(leaders)
		} else {
			leader = n.c.leader()
		}
		if leader < 0 {
			leader = mem[pickA%N]
		}
		var hit []int // the nodes whose shard leaderships the fault takes
		others := make([]int, 0, N)
		for _, i := range mem {
			if i != leader {
				others = append(others, i)
			}
		}
		follower := others[pickA%len(others)]
		ev := faultEvent{Kind: kind, Start: n.clk.now()}
		var heal func() error
		var err error
		switch kind {
		case fKillLeader, fKillFollower:
			t := leader
			if kind == fKillFollower {
				t = follower
			}
			ev.Target = n.c.nodes[t].id
			hit = []int{t}
			err = n.c.kill(t)
			heal = func() error { return n.c.start(t) }
		case fKillMajority:
			victims := n.pick(mem, pickB)[:N/2+1]
			ev.Target = ids(n.c, victims)
			hit = victims
			for _, v := range victims {
				if e := n.c.kill(v); e != nil {
					err = e
				}
			}
			heal = func() error {
				var e error
				for _, v := range victims {
					if e2 := n.c.start(v); e2 != nil {
						e = e2
					}
				}
				return e
			}
		case fRestartAll:
			ev.Target = "all"
			hit = n.pick(mem, 0)
			for _, i := range mem {
				if e := n.c.kill(i); e != nil {
					err = e
				}
			}
			hold = between(n.rng, 0, 2*time.Second)
			heal = func() error {
				var e error
				for _, i := range mem {
					if e2 := n.c.start(i); e2 != nil {
						e = e2
					}
				}
				return e
			}
		case fPauseLeader, fPauseFollower:
			t := leader
			if kind == fPauseFollower {
				t = follower
			}
			ev.Target = n.c.nodes[t].id
			hit = []int{t}
			err = n.c.pause(t)
			heal = func() error { return n.c.resume(t) }
		case fPauseMajority:
			// A majority with the top leader in it: every shard stalls
			// without a quorum, the node left running campaigns alone and
			// raises the terms, and the paused leaders wake up to find out.
			victims := []int{leader}
			for _, v := range n.pick(mem, pickB) {
				if len(victims) < N/2+1 && v != leader {
					victims = append(victims, v)
				}
			}
			ev.Target = ids(n.c, victims)
			hit = victims
			for _, v := range victims {
				if e := n.c.pause(v); e != nil {
					err = e
				}
			}
			heal = func() error {
				var e error
				for _, v := range victims {
					if e2 := n.c.resume(v); e2 != nil {
						e = e2
					}
				}
				return e
			}
		case fIsolateShardLeaders:
			// Every node that leads a shard loses every link: no shard keeps
			// a leader that can reach a quorum.
			var isolated []int
			for _, i := range mem {
				if len(ledBy(leaders, i)) > 0 {
					isolated = append(isolated, i)
				}
			}
			if len(isolated) == 0 {
				isolated = []int{leader}
			}
			ev.Target = ids(n.c, isolated)
			hit = isolated
			for _, a := range isolated {
				for _, b := range mem {
					if b != a {
						n.c.net.cutBoth(a, b, linkRefuse)
					}
				}
			}
			heal = func() error { n.c.net.healAll(); return nil }
		case fIsolateLeader, fBlackholeLeader, fIsolateFollower:
			t, mode := leader, linkRefuse
			if kind == fIsolateFollower {
				t = follower
			}
			if kind == fBlackholeLeader {
				mode = linkBlackhole
			}
			ev.Target = n.c.nodes[t].id
			hit = []int{t}
			for _, i := range mem {
				if i != t {
					n.c.net.cutBoth(t, i, mode)
				}
			}
			heal = func() error { n.c.net.healAll(); return nil }
		case fSplitMinority:
			perm := n.pick(mem, pickB)
			k := 1 + pickA%max(1, (N-1)/2) // minority size
			minority, majority := perm[:k], perm[k:]
			ev.Target = ids(n.c, minority) + " | " + ids(n.c, majority)
			hit = minority
			for _, a := range minority {
				for _, b := range majority {
					n.c.net.cutBoth(a, b, linkRefuse)
				}
			}
			heal = func() error { n.c.net.healAll(); return nil }
		case fBridge:
			// Two halves that cannot talk, and one node that talks to both.
			perm := n.pick(mem, pickB)
			bridge := perm[0]
			rest := perm[1:]
			half := len(rest) / 2
			a, b := rest[:half], rest[half:]
			ev.Target = fmt.Sprintf("%s | bridge %s | %s", ids(n.c, a), n.c.nodes[bridge].id, ids(n.c, b))
			for _, x := range a {
				for _, y := range b {
					n.c.net.cutBoth(x, y, linkRefuse)
				}
			}
			heal = func() error { n.c.net.healAll(); return nil }
		case fReplace, fReplaceLeader:
			// Membership change under load: remove a follower, or the
			// leader (which first hands leadership to another voter, and
			// the new leader removes it), wipe its data and let it join
			// again as a new member (non-voter, then voter once caught up)
			// when the fault heals.
			t := follower
			if kind == fReplaceLeader {
				t = leader
			}
			ev.Target = n.c.nodes[t].id
			hit = []int{t}
			err = n.c.removeMember(leader, t)
			if err == nil {
				err = n.c.wipe(t)
			}
			heal = func() error {
				if n.c.running(t) {
					// The removal failed, or answered "outcome unknown" and
					// took effect after all: an operator reads the members
					// (as that answer says) and, finding the node gone,
					// replaces it now.
					if !n.c.removedFromCluster(t) {
						return nil // still a member: nothing to undo
					}
					if err := n.c.wipe(t); err != nil {
						return err
					}
				}
				return n.c.start(t)
			}
		case fSplitRange:
			// A busy range splits under load; the node asked is drawn.
			t := mem[pickA%N]
			k := splitMap.of(splitAt)
			start, end := splitMap.starts[k], ""
			if k+1 < splitMap.n() {
				end = splitMap.starts[k+1]
			}
			if hosts := splitMap.hosts(k); len(hosts) > 0 {
				// Through one of the range's replicas: only they can
				// propose the split.
				for _, i := range mem {
					if n.c.nodes[i].id == hosts[pickA%len(hosts)] {
						t = i
					}
				}
			}
			ev.Target = n.c.nodes[t].id
			ev.Detail = fmt.Sprintf("shard %d [%q, %q) at %q", splitMap.id(k), start, end, splitAt)
			if err = n.c.split(t, splitAt); err == nil {
				n.splits++
			}
			hold = 0
			heal = func() error { return nil }
		case fMoveReplica:
			// Asked through a drawn node; it runs in the background, so
			// the faults that follow overlap it.
			via := mem[(pickA>>4)%N]
			ev.Target = n.c.nodes[via].id
			back := ""
			if mv.back {
				back = ", back to the node it left"
			}
			ev.Detail = fmt.Sprintf("shard %d %s -> %s%s", mv.shard, mv.from, mv.to, back)
			afterRecord = func(i int) { n.startMove(mv, via, i) }
			hold = 0
			heal = func() error { return nil }
		case fTransfer:
			// A planned leader change under load (as before maintenance).
			ev.Target = n.c.nodes[leader].id + " -> " + n.c.nodes[follower].id
			err = n.c.transferLeadership(follower, follower)
			hold = 0
			heal = func() error { return nil }
		case fCorruptLog, fTruncateLog, fCorruptSnapshot, fDiskLow, fDiskFull:
			t := follower
			if diskFault(kind) && pickB%2 == 0 {
				t = leader // a leader's full disk refuses writes, or ends its term
			}
			ev.Target = n.c.nodes[t].id
			hit = []int{t}
			ev.Detail, heal, err = n.injectStorage(kind, t, pickB)
			if heal == nil {
				heal = func() error { return nil }
			}
		case fOneWayOut, fOneWayIn:
			ev.Target = n.c.nodes[leader].id
			hit = []int{leader}
			for _, o := range others {
				if kind == fOneWayOut {
					n.c.net.cut(leader, o, linkRefuse)
				} else {
					n.c.net.cut(o, leader, linkRefuse)
				}
			}
			heal = func() error { n.c.net.healAll(); return nil }
		}
		if d := n.c.net.describe(); d != "none" {
			ev.Detail = strings.TrimPrefix(ev.Detail+"; cuts: "+d, "; ")
		}
		if sharded {
			// Which shards' leaders the fault takes, as the nodes saw them
			// just before it.
			ks := ledBy(leaders, hit...)
			ev.LeadersHit = len(ks)
			ev.Detail = strings.TrimPrefix(fmt.Sprintf("%s; shard leaders hit: %d [%s] (leaders before: %s)", ev.Detail, len(ks), fmtShards(ks), leaderList(n.c, leaders)), "; ")
		}
		if err != nil {
			ev.Err = err.Error()
		}
		i := n.record(ev)
		if afterRecord != nil {
			afterRecord(i)
		}
		n.sleep(hold) // a stop cuts the hold short; the heal still runs
		herr := heal()
		healAt := n.clk.now()
		_, werr := n.c.waitHealthy(20*time.Second, nil)
		n.update(i, func(e *faultEvent) {
			e.Heal = healAt
			if herr != nil {
				e.Err = strings.TrimSpace(e.Err + " heal: " + herr.Error())
			}
			if werr == nil {
				e.Healthy = n.clk.now()
			} else {
				e.Err = strings.TrimSpace(e.Err + " " + werr.Error())
			}
		})
		select {
		case <-n.stop:
			return
		default:
		}
	}
}

// pick is the members mem in an order drawn from x: position i of a
// permutation of 0..len(mem)-1 names mem's node (with every node a
// member, that permutation itself, as the seeds have always drawn).
func (n *nemesis) pick(mem []int, x int) []int {
	p := n.permute(x, len(mem))
	for i, v := range p {
		p[i] = mem[v]
	}
	return p
}

// permute is a permutation of 0..N-1 drawn from x.
func (n *nemesis) permute(x, N int) []int {
	r := rand.New(rand.NewPCG(uint64(x), 3))
	p := r.Perm(N)
	return p
}

// runClients pauses clients (longer than their TTL when they hold a lock: the
// GC-pause story) and crashes and restarts them.
func (n *nemesis) runClients() {
	for {
		if !n.sleep(between(n.crn, n.clientGapLo, n.clientGapHi)) {
			return
		}
		c := n.w.clients[n.crn.IntN(len(n.w.clients))]
		kind := fClientPause
		if n.crn.IntN(100) < 30 {
			kind = fClientCrash
		}
		d := between(n.crn, 300*time.Millisecond, 2*time.Second)
		ch := c.pauseCh
		if kind == fClientCrash {
			ch = c.crashCh
		}
		select {
		case ch <- d:
			n.record(faultEvent{Kind: kind, Target: c.id, Start: n.clk.now(), Detail: fmt.Sprintf("%s (at least its TTL if it holds a lock)", d.Round(time.Millisecond))})
		default: // the previous request is still pending
		}
	}
}

// countByKind counts faults per kind, sorted by kind.
func countByKind(evs []faultEvent) []string {
	m := map[string]int{}
	for _, e := range evs {
		m[e.Kind]++
	}
	var out []string
	for k, v := range m {
		out = append(out, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(out)
	return out
}
