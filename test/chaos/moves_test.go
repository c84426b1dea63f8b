package chaos

// Replica moves as a nemesis (`dlock serve --shard-replicas R`,
// docs/operations.md, "Moving a shard's replica"): on a cluster whose
// shards each run on a subset of the nodes, the nemesis moves a shard's
// replica from one of its nodes to a node that lacks it, through any node,
// while the other faults go on — a move runs in the background and can
// span kills, pauses, partitions and splits. A third of the moves drawn go
// back to the node the last finished move took a replica off, the case in
// which that node's old copy of the group may still be running when it is
// added again.

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// fMoveReplica moves one replica of a shard to a node that lacks it
// (POST /api/v1/cluster/shards/move) and goes on without waiting for it.
const fMoveReplica = "move-replica"

// shardedMoveFaults is the nemesis of a sharded run whose shards run on a
// subset of the nodes: shardedFaults and moves. (A separate list, so the
// seeds of runs without moves draw what they always drew.)
var shardedMoveFaults = append(append([]faultWeight(nil), shardedFaults...), faultWeight{fMoveReplica, 3})

// The sharded nemesis's cluster faults that are always a move when one is
// possible, so even CI's short run moves a replica and moves one back.
const (
	moveForcedAt     = 3
	moveBackForcedAt = 5
)

// maxMovesInFlight bounds the harness's moves running at once; a move
// drawn beyond it kills a follower instead.
const maxMovesInFlight = 2

// moveMaxTime bounds how long the harness keeps asking for one move during
// the run (the server goes on with a move after its answer; the final
// check looks for moves still in flight).
const moveMaxTime = 4 * time.Minute

// Outcomes of a move, as the harness saw them.
const (
	moveFinished   = "finished"
	moveConflict   = "conflict"   // 409: a split or another move of the shard in flight
	moveRefused    = "refused"    // another 4xx
	moveUnfinished = "unfinished" // still under way when the harness stopped asking
)

// moveRec is one move the nemesis asked for.
type moveRec struct {
	shard    int
	from, to string
	back     bool  // back to the node the last finished move took the replica off
	ev       int   // its event in the schedule
	start    int64 // clock time
	outcome  string
	took     time.Duration
	attempts int
	answer   string // the last refusal
}

// moveStats are a run's moves.
type moveStats struct {
	attempted, attemptedBack int
	finished, finishedBack   int
	conflicts, refused       int
	unfinished               int
	finishedLate             int // finished after the faults stopped
}

func (s moveStats) String() string {
	return fmt.Sprintf("%d attempted (%d back to the node just left): %d finished (%d back; %d of them once the faults had stopped), %d conflicts (409: a split or move of the shard in flight), %d refused, %d unfinished",
		s.attempted, s.attemptedBack, s.finished, s.finishedBack, s.finishedLate, s.conflicts, s.refused, s.unfinished)
}

// moveSet is the nemesis's moves: those in flight run in goroutines it
// owns (wg), bounded by ctx, which finish cancels.
type moveSet struct {
	mu     sync.Mutex
	all    []*moveRec
	last   *moveRec // the last finished move
	active map[int]bool
	wg     sync.WaitGroup
	ctx    context.Context
	cancel context.CancelFunc
	// anchor is the node every move keeps as a replica of every shard, so
	// that a merged watch over all shards has a node to run on, when the
	// server does not forward watches ("" when it does).
	anchor string
}

func newMoveSet() *moveSet {
	ctx, cancel := context.WithCancel(context.Background())
	return &moveSet{active: map[int]bool{}, ctx: ctx, cancel: cancel}
}

func (ms *moveSet) inFlight() (int, map[int]bool) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return len(ms.active), maps.Clone(ms.active)
}

// pickMove chooses a move in m, from the draws a and b, onto one of nodes
// (the nodes a move may target): back (when wanted and possible) undoes
// the last finished move; else a shard with no move
// in flight (in the map or the harness's), one of its replicas other than
// anchor, and one of the nodes that lack it. ok false when none is
// possible (every shard on every node, or every shard moving).
func pickMove(m shardMap, nodes []string, anchor string, last *moveRec, busy map[int]bool, a, b int, wantBack bool) (moveRec, bool) {
	if wantBack && last != nil && last.from != anchor && slices.Contains(nodes, last.from) {
		if k := indexOfID(m, last.shard); k >= 0 && m.moving(k) == "" && !busy[last.shard] &&
			slices.Contains(m.hosts(k), last.to) && len(m.hosts(k)) > 0 && !slices.Contains(m.hosts(k), last.from) && last.to != anchor {
			return moveRec{shard: last.shard, from: last.to, to: last.from, back: true}, true
		}
	}
	var ks []int
	for k := range m.n() {
		h := m.hosts(k)
		if len(h) == 0 || len(h) >= len(nodes) || m.moving(k) != "" || busy[m.id(k)] {
			continue
		}
		if len(h) == 1 && h[0] == anchor {
			continue
		}
		ks = append(ks, k)
	}
	if len(ks) == 0 {
		return moveRec{}, false
	}
	k := ks[b%len(ks)]
	var froms, tos []string
	for _, id := range m.hosts(k) {
		if id != anchor {
			froms = append(froms, id)
		}
	}
	for _, id := range nodes {
		if !slices.Contains(m.hosts(k), id) {
			tos = append(tos, id)
		}
	}
	if len(froms) == 0 || len(tos) == 0 {
		return moveRec{}, false
	}
	return moveRec{shard: m.id(k), from: froms[a%len(froms)], to: tos[(a>>8)%len(tos)]}, true
}

// indexOfID is the range of shard id in m (-1: none).
func indexOfID(m shardMap, id int) int {
	for k := range m.n() {
		if m.id(k) == id {
			return k
		}
	}
	return -1
}

// moveDone reports whether mv is done in m: to runs the shard, from does
// not, and no move of it is in flight.
func moveDone(m shardMap, mv *moveRec) bool {
	k := indexOfID(m, mv.shard)
	return k >= 0 && m.moving(k) == "" && slices.Contains(m.hosts(k), mv.to) && !slices.Contains(m.hosts(k), mv.from)
}

// moveOnce sends one move request through node via and returns the status
// (0: no answer) and the answer's body.
func (c *cluster) moveOnce(ctx context.Context, via, shard int, from, to string, d time.Duration) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	body := fmt.Sprintf(`{"shard":%d,"from":%q,"to":%q}`, shard, from, to)
	return c.adminCall(ctx, via, http.MethodPost, "/api/v1/cluster/shards/move", body)
}

// move asks for mv through the nodes from via on, one after the other,
// until it is done, refused, or ctx ends: a 503 (the move is under way,
// or no leader), 429 or a lost answer is asked again, which waits for the
// move in flight; a 400 or 409 after the first try may be the answer to a
// repeat of a move that finished, which the map tells.
func (c *cluster) move(ctx context.Context, mv *moveRec, via int) {
	start := time.Now()
	for try := 0; ; try++ {
		if ctx.Err() != nil {
			mv.outcome = moveUnfinished
			return
		}
		node := (via + try) % len(c.nodes)
		mv.attempts++
		code, body, err := c.moveOnce(ctx, node, mv.shard, mv.from, mv.to, 30*time.Second)
		switch {
		case err == nil && code == http.StatusOK:
			mv.outcome, mv.took = moveFinished, time.Since(start)
			return
		case err == nil && (code == http.StatusConflict || code == http.StatusBadRequest):
			if m, merr := c.currentShardMap(); merr == nil && moveDone(m, mv) && try > 0 {
				mv.outcome, mv.took = moveFinished, time.Since(start)
				return
			}
			mv.outcome, mv.answer = moveRefused, fmt.Sprintf("%d %s", code, body)
			if code == http.StatusConflict {
				mv.outcome = moveConflict
			}
			return
		case err == nil && code != http.StatusServiceUnavailable && code != http.StatusTooManyRequests && code < 500:
			mv.outcome, mv.answer = moveRefused, fmt.Sprintf("%d %s", code, body)
			return
		}
		if err != nil {
			mv.answer = err.Error()
		} else {
			mv.answer = fmt.Sprintf("%d %s", code, body)
		}
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// startMove runs mv in the background; its schedule entry (event i) gets
// the outcome.
func (n *nemesis) startMove(mv moveRec, via, i int) {
	ms := n.moves
	rec := &mv
	rec.ev, rec.start = i, n.clk.now()
	ms.mu.Lock()
	ms.all = append(ms.all, rec)
	if !slices.Contains(n.c.moveTargets(), rec.to) {
		// The member cycle began draining the target since the pick (it
		// takes a node out of the targets under ms.mu, then waits for the
		// moves onto it in ms.all): as an operator must, no move onto a
		// node being removed.
		rec.outcome, rec.answer = moveRefused, "not asked: the harness is draining "+rec.to+" for its removal"
		ms.mu.Unlock()
		n.update(i, func(e *faultEvent) { e.Detail += "; " + rec.answer })
		return
	}
	ms.active[rec.shard] = true
	ms.mu.Unlock()
	ms.wg.Add(1)
	go func() {
		defer ms.wg.Done()
		ctx, cancel := context.WithTimeout(ms.ctx, moveMaxTime)
		defer cancel()
		n.c.move(ctx, rec, via)
		ms.mu.Lock()
		delete(ms.active, rec.shard)
		if rec.outcome == moveFinished {
			ms.last = rec
		}
		ms.mu.Unlock()
		n.logf("move of shard %d %s -> %s: %s after %d tries %s", rec.shard, rec.from, rec.to, rec.outcome, rec.attempts, rec.answer)
		n.update(i, func(e *faultEvent) {
			switch rec.outcome {
			case moveFinished:
				e.Detail = strings.TrimPrefix(fmt.Sprintf("%s; finished in %s", e.Detail, rec.took.Round(time.Millisecond)), "; ")
			default:
				e.Detail = strings.TrimPrefix(fmt.Sprintf("%s; %s: %s", e.Detail, rec.outcome, rec.answer), "; ")
			}
		})
	}()
}

// finishMoves waits (at most within) for the moves still in flight, which
// now run against a healed cluster, then stops asking.
func (n *nemesis) finishMoves(within time.Duration) {
	ms := n.moves
	if ms == nil {
		return
	}
	done := make(chan struct{})
	go func() { ms.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(within):
		ms.cancel()
		<-done
	}
	ms.cancel()
}

// moveStats counts the run's moves; stoppedAt is when the faults stopped.
func (n *nemesis) moveStats(stoppedAt int64) (moveStats, []moveRec) {
	var st moveStats
	if n.moves == nil {
		return st, nil
	}
	n.moves.mu.Lock()
	defer n.moves.mu.Unlock()
	var out []moveRec
	for _, mv := range n.moves.all {
		out = append(out, *mv)
		st.attempted++
		if mv.back {
			st.attemptedBack++
		}
		switch mv.outcome {
		case moveFinished:
			st.finished++
			if mv.back {
				st.finishedBack++
			}
			if mv.start+int64(mv.took) > stoppedAt {
				st.finishedLate++
			}
		case moveConflict:
			st.conflicts++
		case moveRefused:
			st.refused++
		default:
			st.unfinished++
		}
	}
	return st, out
}

// movesSettled waits (bounded) until no shard has a move in flight, as
// every node sees the map; the shards still moving if not.
func (c *cluster) movesSettled(within time.Duration) string {
	deadline := time.Now().Add(within)
	for {
		var moving []string
		for i := range c.nodes {
			if !c.in(i) {
				continue // a spare out of the cluster
			}
			v, err := c.view(i, time.Second)
			if err != nil {
				moving = append(moving, fmt.Sprintf("%s: %v", c.nodes[i].id, err))
				continue
			}
			for _, s := range v.Shards {
				if s.Leaving != "" {
					moving = append(moving, fmt.Sprintf("%s sees shard %d moving off %s (replicas %v)", c.nodes[i].id, s.ID, s.Leaving, s.Replicas))
				}
			}
		}
		if len(moving) == 0 {
			return ""
		}
		if time.Now().After(deadline) {
			return strings.Join(moving, "; ")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// watchesForwarded reports whether a merged watch through a node that
// does not run every shard is served (the node forwards it to the
// replicas) rather than refused with a 503; errors if neither is seen.
func (c *cluster) watchesForwarded(m shardMap) (bool, error) {
	node := -1
	for i, nd := range c.nodes {
		if !c.in(i) {
			continue
		}
		for k := range m.n() {
			if h := m.hosts(k); len(h) > 0 && !slices.Contains(h, nd.id) {
				node = i
			}
		}
	}
	if node < 0 {
		return true, nil // every node runs every shard
	}
	var last string
	for try := 0; try < 20; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.nodes[node].url()+"/api/v1/watch", nil)
		if err != nil {
			cancel()
			return false, err
		}
		req.Header.Set("Accept", "text/event-stream")
		resp, err := statusClient.Do(req)
		if err == nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
			resp.Body.Close()
			cancel()
			switch {
			case resp.StatusCode == http.StatusOK:
				return true, nil
			case resp.StatusCode == http.StatusServiceUnavailable && strings.Contains(string(b), "not forwarded"):
				return false, nil
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, b)
		} else {
			cancel()
			last = err.Error()
		}
		time.Sleep(250 * time.Millisecond)
	}
	return false, fmt.Errorf("a watch through %s, which lacks a shard: %s", c.nodes[node].id, last)
}

// anchorWatches makes node 0 a replica of every shard (moving a replica
// onto it where it lacks one) when the server does not forward watches,
// so that the merged watchers have a node to run on; the nemesis then
// never moves a replica off it. It returns the anchor's id ("" when
// watches forward).
func (r *runner) anchorWatches() (string, error) {
	m, err := r.c.currentShardMap()
	if err != nil {
		return "", err
	}
	fwd, err := r.c.watchesForwarded(m)
	if err != nil || fwd {
		return "", err
	}
	anchor := r.c.nodes[0].id
	for k := range m.n() {
		h := m.hosts(k)
		if len(h) == 0 || slices.Contains(h, anchor) {
			continue
		}
		mv := &moveRec{shard: m.id(k), from: h[len(h)-1], to: anchor}
		ctx, cancel := context.WithTimeout(context.Background(), moveMaxTime)
		r.c.move(ctx, mv, 0)
		cancel()
		if mv.outcome != moveFinished {
			return "", fmt.Errorf("move shard %d's replica from %s to %s before the run: %s (%s)", mv.shard, mv.from, mv.to, mv.outcome, mv.answer)
		}
		r.logf("before the run: moved shard %d's replica from %s to %s in %s, so %s runs every shard", mv.shard, mv.from, mv.to, mv.took.Round(time.Millisecond), anchor)
	}
	if _, err := r.c.waitHealthy(60*time.Second, nil); err != nil {
		return "", err
	}
	return anchor, nil
}

// The move nemesis's choices on a map with 4 shards on 3 of 4 nodes: a
// move takes a replica to the one node that lacks it and never off the
// anchor; a move back undoes the last finished one when the map still
// allows it; shards moving (in the map or the harness) and shards on every
// node are left alone.
func TestPickMove(t *testing.T) {
	nodes := []string{"n1", "n2", "n3", "n4"}
	m := shardMap{starts: []string{"", "g", "n", "t"},
		replicas: [][]string{{"n1", "n2", "n3"}, {"n1", "n2", "n3"}, {"n1", "n3", "n4"}, {"n1", "n2", "n4"}},
		leaving:  []string{"", "", "", ""}}
	seen := map[string]bool{}
	for a := range 64 {
		for b := range 8 {
			mv, ok := pickMove(m, nodes, "n1", nil, nil, a*97, b, false)
			if !ok {
				t.Fatalf("no move in %+v", m)
			}
			k := indexOfID(m, mv.shard)
			if mv.from == "n1" || !slices.Contains(m.hosts(k), mv.from) || slices.Contains(m.hosts(k), mv.to) || mv.back {
				t.Fatalf("move %+v on replicas %v", mv, m.hosts(k))
			}
			seen[fmt.Sprintf("%d:%s", mv.shard, mv.from)] = true
		}
	}
	if len(seen) != 8 { // 4 shards × the 2 replicas other than n1
		t.Fatalf("the draws reach %d of 8 (shard, from) pairs: %v", len(seen), seen)
	}
	// Without an anchor, n1 may give up a replica too.
	fromN1 := false
	for a := range 64 {
		if mv, _ := pickMove(m, nodes, "", nil, nil, a, a, false); mv.from == "n1" {
			fromN1 = true
		}
	}
	if !fromN1 {
		t.Fatal("without an anchor no move takes a replica off n1")
	}
	// Back: shard 1 moved n4 -> n2 (as in m); the move back is n2 -> n4.
	last := &moveRec{shard: 1, from: "n4", to: "n2", outcome: moveFinished}
	if mv, ok := pickMove(m, nodes, "n1", last, nil, 5, 3, true); !ok || !mv.back || mv.shard != 1 || mv.from != "n2" || mv.to != "n4" {
		t.Fatalf("move back of %+v: %+v %v", last, mv, ok)
	}
	// Not back while shard 1 moves, nor once the map no longer allows it.
	moving := m
	moving.leaving = []string{"", "n3", "", ""}
	if mv, ok := pickMove(moving, nodes, "n1", last, nil, 5, 3, true); !ok || mv.back || mv.shard == 1 {
		t.Fatalf("a move of a moving shard: %+v", mv)
	}
	if mv, _ := pickMove(m, nodes, "n1", last, map[int]bool{1: true}, 5, 3, true); mv.back || mv.shard == 1 {
		t.Fatalf("a move of a shard the harness is moving: %+v", mv)
	}
	if mv, _ := pickMove(m, nodes, "n1", &moveRec{shard: 1, from: "n3", to: "n2"}, nil, 5, 3, true); mv.back {
		t.Fatalf("a move back to a node that runs the shard: %+v", mv)
	}
	// Nor back to a node no move may target (a spare joining, leaving or
	// out of the cluster).
	if mv, _ := pickMove(m, []string{"n1", "n2", "n3"}, "n1", last, nil, 5, 3, true); mv.back || mv.to == "n4" {
		t.Fatalf("a move back to a node that is not a target: %+v", mv)
	}
	// Every shard on every node: nothing to move.
	all := shardMap{starts: []string{"", "n"}, replicas: [][]string{nodes, nodes}}
	if mv, ok := pickMove(all, nodes, "", nil, nil, 1, 1, false); ok {
		t.Fatalf("a move with every shard on every node: %+v", mv)
	}
	if !moveDone(m, &moveRec{shard: 1, from: "n4", to: "n2"}) || moveDone(moving, &moveRec{shard: 1, from: "n4", to: "n2"}) || moveDone(m, &moveRec{shard: 2, from: "n4", to: "n2"}) {
		t.Fatal("moveDone")
	}
}
