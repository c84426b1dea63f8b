package chaos

// Membership changes of a sharded cluster as a nemesis (docs/operations.md,
// "Growing and shrinking a sharded cluster"). The run has one node slot
// more than the cluster: a spare, out of the cluster at first. The member
// cycle joins it (a fresh data dir, --join), moves a replica onto it,
// moves every replica it holds off again, removes it (DELETE
// /api/v1/cluster/members/{id}; the node stops by itself), wipes its data
// dir and, after a gap, joins it again as a fresh node — while the
// cluster faults (which aim at it too while it is a member) and the move
// nemesis go on. As an operator must (the removal checks the map once,
// before it takes the node out of the meta group), the cycle lets no move
// onto the spare begin once it starts draining it.

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// Member cycle fault kinds (moves onto and off the spare are
// move-replica events, their detail says "member cycle").
const (
	fJoinNode   = "join-node"
	fRemoveNode = "remove-node"
)

// Bounds of the member cycle's steps during the run; each goes on after
// the faults stop, until finishMembers gives up.
const (
	joinWait   = 2 * time.Minute
	drainWait  = 4 * time.Minute
	removeWait = 2 * time.Minute
	// stopWait bounds how long a removed node takes to notice and stop
	// by itself; after that the harness kills it (and says so).
	stopWait = 30 * time.Second
)

// memberStats are a run's membership changes.
type memberStats struct {
	joins, joined   int // joins asked; those that became voters
	onto, off       int // moves onto and off the spare that finished
	removals        int // removals asked
	removed         int // removals done
	refused         int // removals answered 409 conflict (the node still held a replica)
	stoppedItself   int // removed nodes that stopped by themselves
	cycles          int // join, move onto, drain, remove: all done
	late            int // steps done (note) after the faults had stopped
	onNonMember     string
	joinTook, rmTok []time.Duration
}

func (s memberStats) String() string {
	return fmt.Sprintf("%d joins (%d voters, took %s), %d moves onto the joined node and %d off it, %d removals asked (%d done, %d refused with 409, %d nodes stopped by themselves), %d full cycles, %d of the joins, moves and removals done after the faults stopped",
		s.joins, s.joined, fmtDurations(s.joinTook), s.onto, s.off, s.removals, s.removed, s.refused, s.stoppedItself, s.cycles, s.late)
}

func fmtDurations(ds []time.Duration) string {
	s := make([]string, len(ds))
	for i, d := range ds {
		s[i] = d.Round(100 * time.Millisecond).String()
	}
	return "[" + strings.Join(s, " ") + "]"
}

// memberCycle runs the spare's joins and removals in its own goroutine,
// owned by the nemesis: stopping (finishMembers) ends the cycle at its
// next rest, cancel ends every wait.
type memberCycle struct {
	n     *nemesis
	spare int
	rng   *rand.Rand

	ctx      context.Context
	cancel   context.CancelFunc
	done     chan struct{}
	stopping chan struct{}
	stopOnce sync.Once
	stopped  int64 // clock time the faults stopped (0: still running)

	mu sync.Mutex
	st memberStats
}

func newMemberCycle(n *nemesis, spare int, seed uint64) *memberCycle {
	ctx, cancel := context.WithCancel(context.Background())
	return &memberCycle{n: n, spare: spare, rng: rand.New(rand.NewPCG(seed, 13)),
		ctx: ctx, cancel: cancel, done: make(chan struct{}), stopping: make(chan struct{})}
}

func (mc *memberCycle) id() string { return mc.n.c.nodes[mc.spare].id }

// set changes the spare's flags under the cluster's lock.
func (mc *memberCycle) set(f func(nd *cnode)) {
	mc.n.c.mu.Lock()
	defer mc.n.c.mu.Unlock()
	f(mc.n.c.nodes[mc.spare])
}

// note counts a step done (a join, a move onto or off the spare, a
// removal); late when the faults had stopped.
func (mc *memberCycle) note(f func(s *memberStats)) {
	mc.mu.Lock()
	defer mc.mu.Unlock()
	f(&mc.st)
	if mc.stopped != 0 {
		mc.st.late++
	}
}

// count counts something else (a request, a refusal, a cycle).
func (mc *memberCycle) count(f func(s *memberStats)) {
	mc.mu.Lock()
	defer mc.mu.Unlock()
	f(&mc.st)
}

// pause waits d, false once the cycle is stopping or cancelled.
func (mc *memberCycle) pause(d time.Duration) bool {
	select {
	case <-time.After(d):
		return true
	case <-mc.stopping:
		return false
	case <-mc.ctx.Done():
		return false
	}
}

// sleep waits d, false once cancelled (a step in progress goes on while
// the cycle is stopping).
func (mc *memberCycle) sleep(d time.Duration) bool {
	select {
	case <-time.After(d):
		return true
	case <-mc.ctx.Done():
		return false
	}
}

// run is the cycle: gap, join, move onto, drain, remove, over again.
func (mc *memberCycle) run() {
	defer close(mc.done)
	for {
		if !mc.pause(between(mc.rng, 2*time.Second, 6*time.Second)) {
			return
		}
		if !mc.join() {
			mc.leave() // a join that did not finish: take the node out again
			return
		}
		moved := mc.moveOnto()
		if !mc.pause(between(mc.rng, 3*time.Second, 10*time.Second)) && mc.ctx.Err() != nil {
			return
		}
		if !mc.leave() {
			return
		}
		if moved {
			mc.count(func(s *memberStats) { s.cycles++ })
		}
	}
}

// join starts the spare with a fresh data dir and --join, and waits until
// the meta group has it as a voter.
func (mc *memberCycle) join() bool {
	c := mc.n.c
	mc.set(func(nd *cnode) {
		nd.out, nd.removing, nd.noMoves, nd.rejoins, nd.started = false, false, true, true, true
	})
	ev := faultEvent{Kind: fJoinNode, Target: mc.id(), Start: mc.n.clk.now(), Detail: "a fresh data dir, --join through the other nodes"}
	err := c.start(mc.spare)
	if err != nil {
		ev.Err = err.Error()
	}
	i := mc.n.record(ev)
	mc.count(func(s *memberStats) { s.joins++ })
	start := time.Now()
	deadline := start.Add(joinWait)
	for {
		if v, ok := c.suffrage(mc.id()); ok && v == "voter" {
			break
		}
		if time.Now().After(deadline) || !mc.sleep(200*time.Millisecond) {
			mc.n.update(i, func(e *faultEvent) {
				e.Err = strings.TrimSpace(fmt.Sprintf("%s not a voter after %s", e.Err, time.Since(start).Round(time.Millisecond)))
			})
			return false
		}
	}
	took := time.Since(start)
	mc.set(func(nd *cnode) { nd.noMoves = false })
	mc.note(func(s *memberStats) { s.joined++; s.joinTook = append(s.joinTook, took) })
	mc.n.update(i, func(e *faultEvent) { e.Detail += fmt.Sprintf("; a voter after %s", took.Round(time.Millisecond)) })
	mc.n.logf("member cycle: %s joined, a voter after %s", mc.id(), took.Round(time.Millisecond))
	return true
}

// moveOnto moves one replica onto the spare: of a shard it lacks, from
// one of its replicas (never the anchor). False if none finished.
func (mc *memberCycle) moveOnto() bool {
	for try := 0; try < 5; try++ {
		if mc.ctx.Err() != nil {
			return false
		}
		m, err := mc.n.c.currentShardMap()
		if err != nil {
			mc.sleep(time.Second)
			continue
		}
		_, busy := mc.n.moves.inFlight()
		var ks []int
		for k := range m.n() {
			h := m.hosts(k)
			if len(h) > 0 && !slices.Contains(h, mc.id()) && m.moving(k) == "" && !busy[m.id(k)] {
				ks = append(ks, k)
			}
		}
		if len(ks) == 0 {
			mc.sleep(time.Second)
			continue
		}
		k := ks[mc.rng.IntN(len(ks))]
		var froms []string
		for _, id := range m.hosts(k) {
			if id != mc.n.moves.anchor {
				froms = append(froms, id)
			}
		}
		if len(froms) == 0 {
			continue
		}
		mv := moveRec{shard: m.id(k), from: froms[mc.rng.IntN(len(froms))], to: mc.id()}
		if mc.moveNow(mv, "onto the joined node") {
			mc.note(func(s *memberStats) { s.onto++ })
			return true
		}
	}
	return false
}

// moveNow runs mv through the harness's move set (the move nemesis leaves
// the shard alone meanwhile) and waits for it; true if it finished.
func (mc *memberCycle) moveNow(mv moveRec, why string) bool {
	n := mc.n
	ms := n.moves
	rec := &mv
	ms.mu.Lock()
	if ms.active[rec.shard] {
		ms.mu.Unlock()
		return false
	}
	rec.start = n.clk.now()
	ms.all = append(ms.all, rec)
	ms.active[rec.shard] = true
	ms.mu.Unlock()
	mem := n.c.memberIdx()
	via := mem[mc.rng.IntN(len(mem))]
	ev := faultEvent{Kind: fMoveReplica, Target: n.c.nodes[via].id, Start: rec.start,
		Detail: fmt.Sprintf("member cycle, %s: shard %d %s -> %s", why, rec.shard, rec.from, rec.to)}
	i := n.record(ev)
	rec.ev = i
	ctx, cancel := context.WithTimeout(mc.ctx, moveMaxTime)
	n.c.move(ctx, rec, via)
	cancel()
	ms.mu.Lock()
	delete(ms.active, rec.shard)
	ms.mu.Unlock()
	n.logf("member cycle: move of shard %d %s -> %s: %s after %d tries %s", rec.shard, rec.from, rec.to, rec.outcome, rec.attempts, rec.answer)
	n.update(i, func(e *faultEvent) {
		if rec.outcome == moveFinished {
			e.Detail += fmt.Sprintf("; finished in %s", rec.took.Round(time.Millisecond))
		} else {
			e.Detail += fmt.Sprintf("; %s: %s", rec.outcome, rec.answer)
		}
	})
	return rec.outcome == moveFinished
}

// leave drains the spare (every replica it holds moved to another node)
// and removes it; a removal refused with 409 drains again. False if it
// did not get out (the run ends with it a member).
func (mc *memberCycle) leave() bool {
	// Under the move set's lock: a move the nemesis picked onto the spare
	// is either in ms.all already (drain waits for it) or not asked.
	mc.n.moves.mu.Lock()
	mc.set(func(nd *cnode) { nd.noMoves = true })
	mc.n.moves.mu.Unlock()
	deadline := time.Now().Add(drainWait)
	for time.Now().Before(deadline) && mc.ctx.Err() == nil {
		if !mc.drain(deadline) {
			return false
		}
		switch mc.remove() {
		case removeDone:
			return true
		case removeFailed:
			return false
		}
		// Refused: the node holds a replica again; drain again.
		mc.sleep(time.Second)
	}
	return false
}

// drain moves the spare's replicas off it, one at a time, until the map
// lists it in no shard and no harness move onto it is in flight.
func (mc *memberCycle) drain(deadline time.Time) bool {
	for time.Now().Before(deadline) {
		if mc.ctx.Err() != nil {
			return false
		}
		if mc.n.moves.inFlightTo(mc.id()) {
			mc.sleep(500 * time.Millisecond) // a move picked before the drain began
			continue
		}
		m, err := mc.n.c.currentShardMap()
		if err != nil {
			mc.sleep(time.Second)
			continue
		}
		k := -1
		for j := range m.n() {
			if slices.Contains(m.hosts(j), mc.id()) {
				k = j
				break
			}
		}
		if k < 0 {
			return true
		}
		if m.moving(k) != "" {
			mc.sleep(500 * time.Millisecond) // that shard's move in flight ends first
			continue
		}
		var tos []string
		for _, id := range mc.n.c.moveTargets() {
			if !slices.Contains(m.hosts(k), id) {
				tos = append(tos, id)
			}
		}
		if len(tos) == 0 {
			mc.sleep(time.Second)
			continue
		}
		mv := moveRec{shard: m.id(k), from: mc.id(), to: tos[mc.rng.IntN(len(tos))]}
		if mc.moveNow(mv, "draining the node before its removal") {
			mc.note(func(s *memberStats) { s.off++ })
		} else {
			mc.sleep(time.Second)
		}
	}
	return false
}

type removeOutcome int

const (
	removeDone removeOutcome = iota
	removeRefused
	removeFailed
)

// remove asks any other node to remove the spare, then waits for it to
// stop by itself and wipes its data dir: it is out.
func (mc *memberCycle) remove() removeOutcome {
	c := mc.n.c
	mc.set(func(nd *cnode) { nd.removing = true })
	mem := c.memberIdx()
	via := mem[mc.rng.IntN(len(mem))]
	ev := faultEvent{Kind: fRemoveNode, Target: mc.id(), Start: mc.n.clk.now(), Detail: "through " + c.nodes[via].id}
	i := mc.n.record(ev)
	mc.count(func(s *memberStats) { s.removals++ })
	start := time.Now()
	deadline := start.Add(removeWait)
	var last string
	done := false
	for try := 0; !done; try++ {
		node := mem[(slices.Index(mem, via)+try)%len(mem)]
		code, body, err := c.adminCode(node, http.MethodDelete, "/api/v1/cluster/members/"+mc.id())
		switch {
		case err == nil && code == http.StatusOK:
			done = true
		case err == nil && code == http.StatusConflict:
			mc.count(func(s *memberStats) { s.refused++ })
			mc.n.update(i, func(e *faultEvent) { e.Detail += "; refused: " + body })
			mc.n.logf("member cycle: the removal of %s was refused: %s", mc.id(), body)
			mc.set(func(nd *cnode) { nd.removing = false })
			if !c.running(mc.spare) {
				_ = c.start(mc.spare) // killed by a fault meanwhile: back, as a member
			}
			return removeRefused
		default:
			if err != nil {
				last = err.Error()
			} else {
				last = fmt.Sprintf("%d %s", code, body)
			}
			// No answer, or outcome unknown: the members tell.
			if v, ok := c.suffrage(mc.id()); ok && v == "" {
				done = true
			}
		}
		if done {
			break
		}
		if time.Now().After(deadline) || !mc.sleep(500*time.Millisecond) {
			mc.n.update(i, func(e *faultEvent) { e.Err = "not removed: " + last })
			mc.set(func(nd *cnode) { nd.removing = false })
			if !c.running(mc.spare) {
				_ = c.start(mc.spare)
			}
			return removeFailed
		}
	}
	took := time.Since(start)
	// The removed node notices and stops by itself (exit 0); one a fault
	// killed meanwhile is dead already.
	itself := false
	c.mu.Lock()
	p := c.nodes[mc.spare].p
	c.mu.Unlock()
	if p != nil {
		itself = p.WaitExit(stopWait) && p.ExitCode() == 0
	}
	if err := c.wipe(mc.spare); err != nil {
		mc.n.update(i, func(e *faultEvent) { e.Err = "wipe: " + err.Error() })
	}
	mc.set(func(nd *cnode) { nd.out, nd.removing, nd.noMoves = true, false, true })
	how := "killed by the harness or a fault before it stopped by itself"
	if itself {
		how = "it stopped by itself"
	}
	mc.n.update(i, func(e *faultEvent) {
		e.Detail += fmt.Sprintf("; removed after %s, %s", took.Round(time.Millisecond), how)
	})
	mc.note(func(s *memberStats) {
		s.removed++
		s.rmTok = append(s.rmTok, took)
		if itself {
			s.stoppedItself++
		}
	})
	mc.n.logf("member cycle: %s removed after %s; %s", mc.id(), took.Round(time.Millisecond), how)
	// Whatever the harness did, no range may list a node that is not a
	// member (a move that began onto it while it was being removed).
	if m, err := c.currentShardMap(); err == nil {
		for k := range m.n() {
			if slices.Contains(m.hosts(k), mc.id()) {
				mc.mu.Lock()
				mc.st.onNonMember = fmt.Sprintf("after %s's removal shard %d lists it as a replica (replicas %v, leaving %q)", mc.id(), m.id(k), m.hosts(k), m.moving(k))
				mc.mu.Unlock()
			}
		}
	}
	return removeDone
}

// finishMembers lets the cycle finish its current step against the healed
// cluster (at most within), starting no new join, then stops it.
func (n *nemesis) finishMembers(within time.Duration) {
	mc := n.members
	if mc == nil {
		return
	}
	mc.mu.Lock()
	mc.stopped = n.clk.now()
	mc.mu.Unlock()
	mc.stopOnce.Do(func() { close(mc.stopping) })
	select {
	case <-mc.done:
	case <-time.After(within):
		mc.cancel()
		<-mc.done
	}
	mc.cancel()
}

// memberStats is the run's membership changes.
func (n *nemesis) memberStats() memberStats {
	if n.members == nil {
		return memberStats{}
	}
	n.members.mu.Lock()
	defer n.members.mu.Unlock()
	return n.members.st
}

// inFlightTo reports whether a move the harness asked for onto id has no
// outcome yet.
func (ms *moveSet) inFlightTo(id string) bool {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	for _, mv := range ms.all {
		if mv.to == id && mv.outcome == "" {
			return true
		}
	}
	return false
}

// suffrage is id's suffrage in the meta group as a member node reports it
// ("" when it is not a member); ok false when no node answered.
func (c *cluster) suffrage(id string) (string, bool) {
	for _, i := range c.memberIdx() {
		if c.nodes[i].id == id {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		var v struct {
			Members []struct {
				ID       string `json:"id"`
				Suffrage string `json:"suffrage"`
			} `json:"members"`
		}
		code, err := getJSON(ctx, c.nodes[i].url()+"/api/v1/cluster", &v)
		cancel()
		if err != nil || code != http.StatusOK {
			continue
		}
		for _, m := range v.Members {
			if m.ID == id {
				return m.Suffrage, true
			}
		}
		return "", true
	}
	return "", false
}

// adminCode sends one admin request without a body to node via: the
// status and the answer.
func (c *cluster) adminCode(via int, method, path string) (int, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	return c.adminCall(ctx, via, method, path, "")
}

// adminCall sends one admin request (body: JSON, or "" for none) through
// node via and returns the status (0: no answer) and the answer's body.
func (c *cluster) adminCall(ctx context.Context, via int, method, path, body string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.nodes[via].url()+path, strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := statusClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
	return resp.StatusCode, strings.TrimSpace(string(b)), nil
}

// replicasOnNonMembers describes the ranges whose replicas name a node
// that is not a member of the cluster ("" when none does), as the map and
// the members are when the run ends.
func (c *cluster) replicasOnNonMembers() string {
	m, err := c.currentShardMap()
	if err != nil {
		return ""
	}
	var bad []string
	for k := range m.n() {
		for _, id := range m.hosts(k) {
			if v, ok := c.suffrage(id); ok && v == "" {
				bad = append(bad, fmt.Sprintf("shard %d lists %s (replicas %v, leaving %q), which is not a member", m.id(k), id, m.hosts(k), m.moving(k)))
			}
		}
	}
	return strings.Join(bad, "; ")
}

// makeSpare takes node i out of the initial cluster: it is the member
// cycle's spare, out until the cycle joins it.
func (c *cluster) makeSpare(i int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	nd := c.nodes[i]
	nd.out, nd.rejoins, nd.noMoves = true, true, true
	var initial []string
	for _, o := range c.nodes {
		if o != nd {
			initial = append(initial, o.id+"="+o.proxyAddr)
		}
	}
	c.init = strings.Join(initial, ",")
}

// The faults aim at the members only: a spare out of the cluster or being
// removed is in no draw, a node joining or leaving is no move target, and
// with every node a member the draws are those the seeds always made.
func TestNemesisAimsAtMembers(t *testing.T) {
	c := &cluster{}
	for i := range 5 {
		c.nodes = append(c.nodes, &cnode{idx: i, id: fmt.Sprintf("n%d", i+1)})
	}
	n := &nemesis{c: c}
	all := c.memberIdx()
	for x := range 50 {
		if got, want := n.pick(all, x), n.permute(x, 5); !slices.Equal(got, want) {
			t.Fatalf("every node a member: pick %v, permute %v", got, want)
		}
	}
	c.makeSpare(4)
	if strings.Contains(c.init, "n5") || !strings.Contains(c.init, "n4=") {
		t.Fatalf("initial cluster with n5 the spare: %q", c.init)
	}
	c.nodes[2].noMoves = true // n3 joining or leaving
	mem := c.memberIdx()
	if !slices.Equal(mem, []int{0, 1, 2, 3}) || c.in(4) {
		t.Fatalf("members with n5 out: %v", mem)
	}
	if got := c.moveTargets(); !slices.Equal(got, []string{"n1", "n2", "n4"}) {
		t.Fatalf("move targets with n3 leaving and n5 out: %v", got)
	}
	seen := map[int]bool{}
	for x := range 50 {
		p := n.pick(mem, x)
		if s := slices.Sorted(slices.Values(p)); !slices.Equal(s, mem) {
			t.Fatalf("pick %v is not an order of %v", p, mem)
		}
		seen[p[0]] = true
	}
	if len(seen) != 4 {
		t.Fatalf("the draws lead with %d of the 4 members", len(seen))
	}
	c.nodes[4].out, c.nodes[4].removing = false, true
	if c.in(4) || slices.Contains(c.memberIdx(), 4) {
		t.Fatal("a node being removed is aimed at")
	}
	if err := c.start(4); err != nil || c.nodes[4].p != nil {
		t.Fatalf("a node being removed was started: %v", err)
	}
}
