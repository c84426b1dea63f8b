package chaos

// Sharded clusters (`dlock serve --shards N`, docs/architecture.md, Shards):
// the same suite, with the harness knowing that every name lives in one
// shard — a Raft group with its own leader, fencing-token counter and
// revision. The checkers compare tokens and revisions only within a shard,
// the cluster is healthy when every shard has a leader all nodes agree on,
// and the nemesis aims at shard leaders, which the cluster spreads over the
// nodes, so one kill, pause or partition costs several shards their leader
// at once.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	dlockclient "github.com/dlock/dlock/client"
	"github.com/dlock/dlock/internal/shard"
)

// shardMap routes a key (a lock name, or electionPrefix and an election's
// name) to its shard as the cluster does: by the name's top-level segment
// against the shards' start bounds. The one-shard map sends everything to
// shard 0, so every checker works the same on a one-group cluster.
//
// Ranges are in name order; a split inserts one, with the next unused
// shard id, so range k is shard ids[k]. The checkers group names by the
// range of the map the cluster ends with: a name that moved in a split
// was granted by its old shard up to the split and by its new one after,
// which took its source's token counter, so per range of the final map
// the tokens still only rise (docs/architecture.md, Shards).
type shardMap struct {
	starts []string // starts[k] is range k's first top-level segment; starts[0] is ""
	ids    []int    // ids[k] is range k's shard id (nil: k)
	// replicas[k] are the nodes that run range k's group (nil: every node),
	// leaving[k] the one a move is taking off it ("": none). Routing names
	// does not need them; the move and split nemeses do.
	replicas [][]string
	leaving  []string
}

// hosts are the ids of the nodes that run range k (nil: every node).
func (m shardMap) hosts(k int) []string {
	if k < len(m.replicas) {
		return m.replicas[k]
	}
	return nil
}

// moving is range k's leaving replica ("" when no move is in flight).
func (m shardMap) moving(k int) string {
	if k < len(m.leaving) {
		return m.leaving[k]
	}
	return ""
}

var oneShard = shardMap{starts: []string{""}}

// defaultShardMap is `--shards n` without --shard-bounds.
func defaultShardMap(n int) shardMap {
	if n <= 1 {
		return oneShard
	}
	return shardMap{starts: shard.DefaultBounds(n)}
}

func (m shardMap) n() int { return len(m.starts) }

// id is range k's shard id.
func (m shardMap) id(k int) int {
	if m.ids == nil {
		return k
	}
	return m.ids[k]
}

// of is the shard of a key.
func (m shardMap) of(key string) int {
	name := strings.TrimPrefix(realName(key), "/")
	seg, _, _ := strings.Cut(name, "/")
	// The last start at or below seg.
	return sort.Search(len(m.starts), func(i int) bool { return m.starts[i] > seg }) - 1
}

// nameIn is a name with the given last segment that lives in range k: the
// range's start bound in front of the word, checked against the map. A
// split can end a range below start+word (["", "cold") has no "final"), so
// the word may get a "0" or "-" in front: both sort below the letters and
// digits the workload's bounds go on with.
func (m shardMap) nameIn(k int, word, last string) (string, error) {
	var name string
	for _, pre := range []string{"", "0", "-"} {
		name = m.starts[k] + pre + word + "/" + last
		if m.of(name) == k {
			return name, nil
		}
	}
	return "", fmt.Errorf("no name for shard %d from %q: %s lands in shard %d", m.id(k), word, name, m.id(m.of(name)))
}

// shardView is one shard in a node's GET /api/v1/cluster.
type shardView struct {
	ID           int    `json:"id"`
	Start        string `json:"start"`
	End          string `json:"end"`
	LeaderID     string `json:"leader_id"`
	Term         uint64 `json:"term"`
	CommitIndex  uint64 `json:"commit_index"`
	AppliedIndex uint64 `json:"applied_index"`
	Revision     uint64 `json:"revision"`
	LastToken    uint64 `json:"last_fencing_token"`
	// Replicas run the shard's group (every node when --shard-replicas
	// is not given); Leaving is the one a move in flight takes off it.
	Replicas []string `json:"replicas"`
	Leaving  string   `json:"leaving"`
}

// groupViews is a node's view of each group: its shards, or the one group.
func (v clusterView) groupViews() []shardView {
	if len(v.Shards) > 0 {
		return v.Shards
	}
	return []shardView{{LeaderID: v.LeaderID, Term: v.Term, CommitIndex: v.CommitIndex, AppliedIndex: v.AppliedIndex, Revision: v.Revision, LastToken: v.LastToken}}
}

// sameState reports whether two nodes' views agree on every group's applied
// index, revision and last fencing token.
func sameState(a, b clusterView) bool {
	ga, gb := a.groupViews(), b.groupViews()
	if len(ga) != len(gb) {
		return false
	}
	for k := range ga {
		if ga[k].AppliedIndex != gb[k].AppliedIndex || ga[k].Revision != gb[k].Revision || ga[k].LastToken != gb[k].LastToken {
			return false
		}
	}
	return true
}

// mapOfView is the shard map a node's GET /cluster reports.
func mapOfView(v clusterView) shardMap {
	var m shardMap
	for _, s := range v.Shards {
		m.starts = append(m.starts, s.Start)
		m.ids = append(m.ids, s.ID)
		m.replicas = append(m.replicas, s.Replicas)
		m.leaving = append(m.leaving, s.Leaving)
	}
	return m
}

// currentShardMap is the map every node routes by once the cluster is
// healthy (healthy() waits for them to agree): after splits, the one the
// checkers group names by.
func (c *cluster) currentShardMap() (shardMap, error) {
	if c.shards <= 1 {
		return oneShard, nil
	}
	var lastErr error
	for i := range c.nodes {
		v, err := c.view(i, 2*time.Second)
		if err != nil {
			lastErr = err
			continue
		}
		if len(v.Shards) == 0 {
			lastErr = fmt.Errorf("%s lists no shards", c.nodes[i].id)
			continue
		}
		return mapOfView(v), nil
	}
	return shardMap{}, fmt.Errorf("no node reported its shards: %v", lastErr)
}

// shardMapOf reads the shard map a running cluster reports and checks it
// is the one the harness expects (`--shards n`, default bounds).
func (c *cluster) shardMapOf(n int) (shardMap, error) {
	want := defaultShardMap(n)
	if n <= 1 {
		return want, nil
	}
	var lastErr error
	for try := 0; try < 50; try++ {
		for i := range c.nodes {
			v, err := c.view(i, time.Second)
			if err != nil {
				lastErr = err
				continue
			}
			if len(v.Shards) != n {
				return shardMap{}, fmt.Errorf("%s reports %d shards, want %d: %+v", c.nodes[i].id, len(v.Shards), n, v.Shards)
			}
			got := shardMap{}
			for k, s := range v.Shards {
				if s.ID != k {
					return shardMap{}, fmt.Errorf("%s lists shard %d at place %d", c.nodes[i].id, s.ID, k)
				}
				got.starts = append(got.starts, s.Start)
			}
			if strings.Join(got.starts, ",") != strings.Join(want.starts, ",") {
				return shardMap{}, fmt.Errorf("%s's shards start at %q, the default for %d shards is %q", c.nodes[i].id, got.starts, n, want.starts)
			}
			return got, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return shardMap{}, fmt.Errorf("no node reported its shards: %v", lastErr)
}

// shardLeaders names, per shard id, the node a majority of the answering
// nodes name as its leader (-1: none agreed).
func (c *cluster) shardLeaders() []int {
	var mu sync.Mutex
	votes := make([]map[string]int, max(1, c.shards, c.knownShards()))
	for k := range votes {
		votes[k] = map[string]int{}
	}
	var wg sync.WaitGroup
	for i := range c.nodes {
		if !c.running(i) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := c.view(i, 300*time.Millisecond)
			if err != nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for k, s := range v.groupViews() {
				id := k
				if len(v.Shards) > 0 {
					id = s.ID
				}
				if id < len(votes) && s.LeaderID != "" {
					votes[id][s.LeaderID]++
				}
			}
		}()
	}
	wg.Wait()
	out := make([]int, len(votes))
	for k := range votes {
		out[k] = -1
		best, bestN := "", 0
		for id, n := range votes[k] {
			if n > bestN || (n == bestN && id < best) {
				best, bestN = id, n
			}
		}
		for i, nd := range c.nodes {
			if nd.id == best {
				out[k] = i
			}
		}
	}
	return out
}

// topLeader is the node that leads the most shards (ties: the one leading
// the lowest shard), -1 if no shard has a leader. On a one-group cluster it
// is the leader.
func topLeader(leaders []int) int {
	count := map[int]int{}
	best := -1
	for _, l := range leaders {
		if l < 0 {
			continue
		}
		count[l]++
		if best < 0 || count[l] > count[best] {
			best = l
		}
	}
	return best
}

// ledBy lists the shards (ids) whose leader is one of nodes.
func ledBy(leaders []int, nodes ...int) []int {
	var out []int
	for k, l := range leaders {
		for _, n := range nodes {
			if l == n && l >= 0 {
				out = append(out, k)
				break
			}
		}
	}
	return out
}

func fmtShards(ks []int) string {
	s := make([]string, len(ks))
	for i, k := range ks {
		s[i] = strconv.Itoa(k)
	}
	return strings.Join(s, ",")
}

// Fault kinds only a sharded run draws: they take several shards' leaders
// (which the cluster spreads over the nodes) at once.
const (
	// fPauseMajority SIGSTOPs a majority, the node leading the most shards
	// among it: every shard stalls, and the paused leaders wake up stale.
	fPauseMajority = "pause-majority"
	// fIsolateShardLeaders cuts every node that leads a shard off from
	// every other node, both ways: every shard loses its leader at once
	// (with 3 nodes and 4 shards spread, every node is cut off alone).
	fIsolateShardLeaders = "isolate-shard-leaders"
	// fSplitRange asks a node to split a busy range at a fresh point (POST
	// /api/v1/cluster/shards/split) while the clients go on: the names
	// from the point to the end of the range move, with their holders,
	// waiters, leases and token counter, to a new shard. Nothing to heal;
	// the harness follows the new map (knownShards, currentShardMap).
	fSplitRange = "split-range"
)

// maxSplits bounds a run's splits: each adds a Raft group on every node
// of a 2-core machine. Once reached, a split-range draw kills a follower
// instead (the same draw, so a seed's schedule stays comparable).
const maxSplits = 6

// splitForcedAt is the sharded nemesis's cluster fault that is always a
// split-range (if a point is left), so even CI's short runs split a range.
const splitForcedAt = 2

// splitPoints are the top-level segments of the workload's names, sorted:
// the points a split-range picks from, so that it moves names in use.
func splitPoints(w *workload) []string {
	seen := map[string]bool{}
	var out []string
	add := func(key string) {
		seg, _, _ := strings.Cut(strings.TrimPrefix(realName(key), "/"), "/")
		if seg != "" && !seen[seg] {
			seen[seg] = true
			out = append(out, seg)
		}
	}
	for _, l := range append(append(append([]lockSpec(nil), w.hot...), w.cold...), w.model...) {
		add(l.name)
	}
	for _, name := range w.sess {
		add(name)
	}
	sort.Strings(out)
	return out
}

// splitPoint picks, by x, a fresh split point among pts: not a bound of m,
// with another point below it in the same range, so both halves keep
// names in use. "" when none is left.
func splitPoint(m shardMap, pts []string, x int) string {
	var cands []string
	for _, p := range pts {
		k := m.of(p)
		if m.starts[k] == p {
			continue
		}
		for _, q := range pts {
			if q < p && m.of(q) == k {
				cands = append(cands, p)
				break
			}
		}
	}
	if len(cands) == 0 {
		return ""
	}
	return cands[x%len(cands)]
}

// split asks node via to split the range holding at, at it; a 503 (the new
// map has not reached the node yet, or a shard has no leader) is asked
// again, which finds the split done once it is.
func (c *cluster) split(via int, at string) error {
	deadline := time.Now().Add(45 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.nodes[via].url()+"/api/v1/cluster/shards/split", strings.NewReader(`{"at":"`+at+`"}`))
		if err != nil {
			cancel()
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := statusClient.Do(req)
		var body []byte
		code := 0
		if err == nil {
			code = resp.StatusCode
			body, _ = io.ReadAll(io.LimitReader(resp.Body, 2048))
			resp.Body.Close()
		}
		cancel()
		if err == nil && code == http.StatusOK {
			return nil
		}
		if err == nil && code != http.StatusServiceUnavailable {
			return fmt.Errorf("split at %q through %s: %d %s", at, c.nodes[via].id, code, strings.TrimSpace(string(body)))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("split at %q through %s: still %d %v %s after 45 s", at, c.nodes[via].id, code, err, strings.TrimSpace(string(body)))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// faultWeight is one kind of cluster fault and how often it is drawn.
type faultWeight struct {
	kind   string
	weight int
}

// shardedFaults is the nemesis of a sharded run. What a sharded cluster
// cannot do yet is left out: member removal and --join (replace-follower,
// and the replacement of a node that refuses its damaged data dir, which
// corrupt-log, truncate-log and corrupt-snapshot rely on) and leadership
// transfer by hand (the cluster moves its shards' leaders itself, after
// every heal). Splits are drawn (split-range); moves of replicas are
// drawn on clusters whose shards run on some of the nodes
// (shardedMoveFaults).
var shardedFaults = []faultWeight{
	{fKillLeader, 4}, {fKillFollower, 3}, {fKillMajority, 1}, {fRestartAll, 2},
	{fPauseLeader, 4}, {fPauseFollower, 2}, {fPauseMajority, 1},
	{fIsolateLeader, 4}, {fBlackholeLeader, 2}, {fIsolateFollower, 2},
	{fSplitMinority, 2}, {fBridge, 2}, {fOneWayOut, 2}, {fOneWayIn, 2},
	{fIsolateShardLeaders, 2}, {fSplitRange, 1},
	{fDiskLow, 1}, {fDiskFull, 1},
}

// workloadCoverage checks that every shard holds locks of each kind the
// checkers look at: one-holder locks (linearizability, two holders,
// fencing), a lock held under sessions, and an election.
func workloadCoverage(m shardMap, w *workload) error {
	type cover struct{ lock, session, election bool }
	got := make([]cover, m.n())
	for _, l := range append(append([]lockSpec(nil), w.hot...), w.cold...) {
		k := m.of(l.name)
		if isElection(l.name) {
			got[k].election = true
		} else {
			got[k].lock = true
		}
	}
	for _, s := range w.sess {
		got[m.of(s)].session = true
	}
	var miss []string
	for k, c := range got {
		if !c.lock || !c.session || !c.election {
			miss = append(miss, fmt.Sprintf("shard %d (from %q): locks %v, session locks %v, elections %v", k, m.starts[k], c.lock, c.session, c.election))
		}
	}
	if len(miss) > 0 {
		return fmt.Errorf("the workload leaves shards without locks of a kind: %s", strings.Join(miss, "; "))
	}
	return nil
}

// TestChaosShardsCI is CI's short sharded runs on the etcd engine, each for
// DLOCK_CHAOS_CI_DURATION (default 30 s) of faults: 3 nodes with 4 shards
// on every node, DLOCK_CHAOS_SHARD_SEEDS (default 4); then 4 nodes with 4
// shards on 3 nodes each (--shard-replicas 3), so the nemesis moves
// replicas too, DLOCK_CHAOS_MOVE_SEEDS (default 5); then the same with a
// spare fifth node that the member cycle joins, fills, drains and
// removes, DLOCK_CHAOS_MEMBER_SEEDS (default 6).
func TestChaosShardsCI(t *testing.T) {
	skipUnlessEnabled(t)
	// Shards run on the etcd engine only (the nodes also get --raft-engine
	// etcd): whichever engine the rest of this run tests.
	t.Setenv("DLOCK_TEST_RAFT_ENGINE", "etcd")
	d := envDuration("DLOCK_CHAOS_CI_DURATION", 30*time.Second)
	for _, seed := range seedList("DLOCK_CHAOS_SHARD_SEEDS", 4) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			cfg := configFromEnv(seed, d)
			cfg.shards = envInt("DLOCK_CHAOS_SHARDS", 4)
			if cfg.shards < 2 {
				cfg.shards = 4
			}
			rep := runChaos(t, cfg)
			// A run that never cost two shards their leaders at once did not
			// test what it is for.
			if rep.multiLeaderFaults == 0 && !t.Failed() {
				t.Errorf("no fault hit two or more shard leaders at once (%d cluster faults)", rep.clusterFaults())
			}
		})
	}
	for _, seed := range seedList("DLOCK_CHAOS_MOVE_SEEDS", 5) {
		t.Run(fmt.Sprintf("moves/seed=%d", seed), func(t *testing.T) {
			cfg := configFromEnv(seed, d)
			cfg.shards = envInt("DLOCK_CHAOS_SHARDS", 4)
			if cfg.shards < 2 {
				cfg.shards = 4
			}
			cfg.nodes, cfg.replicas = 4, 3
			runChaos(t, cfg) // fails a run that finished no move
		})
	}
	for _, seed := range seedList("DLOCK_CHAOS_MEMBER_SEEDS", 6) {
		t.Run(fmt.Sprintf("members/seed=%d", seed), func(t *testing.T) {
			cfg := configFromEnv(seed, d)
			cfg.shards = envInt("DLOCK_CHAOS_SHARDS", 4)
			if cfg.shards < 2 {
				cfg.shards = 4
			}
			cfg.nodes, cfg.replicas, cfg.spare = 4, 3, true
			runChaos(t, cfg) // fails a run that did not join, fill and remove the spare
		})
	}
}

// seedList is the seeds in env (comma-separated), else def.
func seedList(env string, def ...uint64) []uint64 {
	v := os.Getenv(env)
	if v == "" {
		return def
	}
	var seeds []uint64
	for _, s := range strings.Split(v, ",") {
		if n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64); err == nil {
			seeds = append(seeds, n)
		}
	}
	return seeds
}

// clusterFaults counts the run's cluster faults.
func (rep *runReport) clusterFaults() int {
	n := 0
	for _, f := range rep.faults {
		if f.Kind != fClientPause && f.Kind != fClientCrash {
			n++
		}
	}
	return n
}

// The default 4-shard map routes as the cluster does, and the sharded
// workload puts locks, session locks and elections in every shard.
func TestShardedWorkloadCoversEveryShard(t *testing.T) {
	m := defaultShardMap(4)
	if got := strings.Join(m.starts, ","); got != ",g,n,t" {
		t.Fatalf("default bounds for 4 shards: %q, want \",g,n,t\"", got)
	}
	for key, want := range map[string]int{
		"cold/01": 0, electionPrefix + "elect/a": 0, "final/token": 0, "g": 1, "hot/a": 1, "live/fifo": 1,
		"m/x": 1, "n": 2, "sess/0": 2, "sem/a": 2, "tree/b/c": 3, "t": 3, "zz/y": 3, "/hot/a": 1, "A/b": 0, "0": 0,
	} {
		if got := m.of(key); got != want {
			t.Errorf("shard of %q: %d, want %d", key, got, want)
		}
	}
	for _, key := range []string{"cold/01", "hot/a", "sess/0", "tree/b/c", "zz/y", "0"} {
		if got := oneShard.of(key); got != 0 {
			t.Errorf("one shard: %q in shard %d", key, got)
		}
	}
	w := newWorkload(nil, nil, nil, 1, 6, 2, 4)
	if err := workloadCoverage(m, w); err != nil {
		t.Fatal(err)
	}
	// The one-group workload is the one the soak records were made with.
	if err := workloadCoverage(m, newWorkload(nil, nil, nil, 1, 6, 2, 1)); err == nil {
		t.Fatal("the one-group workload covers every shard of 4: the check cannot fail")
	}
	for k := range m.n() {
		name, err := m.nameIn(k, "final", "token")
		if err != nil || m.of(name) != k {
			t.Fatalf("final name for shard %d: %q %v", k, name, err)
		}
	}
}

// On a sharded cluster tokens are compared within a shard only: the same
// token on two shards, or a smaller token granted later on another shard,
// is correct; the same faults within one shard are still caught, and a
// fenced register still knows whose token it got.
func TestShardedTokenChecker(t *testing.T) {
	m := defaultShardMap(4)
	// cold/* is shard 0, hot/* shard 1, wind/* shard 3.
	acrossShards := (&hb{}).
		add(acq("a", "cold/01", 2*s, 0, s/10, oOK, 5, "la")).
		add(acq("b", "hot/a", 2*s, 2*s/10, 3*s/10, oOK, 4, "lb")).   // later, smaller: another shard
		add(acq("c", "wind/01", 2*s, 4*s/10, 5*s/10, oOK, 5, "lc")). // the same token: another shard
		ops
	if a := checkTokens(acrossShards, m); len(a) != 0 {
		t.Fatalf("tokens of different shards compared: %v", a)
	}
	if a := checkTokens(acrossShards, oneShard); len(a) == 0 {
		t.Fatal("one group: a reused and a falling token went unnoticed")
	}
	withinShard := (&hb{}).
		add(acq("a", "cold/01", 2*s, 0, s/10, oOK, 5, "la")).
		add(acq("b", "elect-no/x", 2*s, 2*s/10, 3*s/10, oOK, 4, "lb")). // 'e': shard 0, later, smaller
		add(acq("c", "cold/02", 2*s, 4*s/10, 5*s/10, oOK, 5, "lc")).    // shard 0, token reused
		ops
	var kinds []string
	for _, x := range checkTokens(withinShard, m) {
		kinds = append(kinds, x.Kind)
		if !strings.HasPrefix(x.What, "shard 0: ") {
			t.Errorf("anomaly without its shard: %s", x.What)
		}
	}
	got := strings.Join(kinds, ",")
	if !strings.Contains(got, "safety:token-order") || !strings.Contains(got, "safety:token-reused") {
		t.Fatalf("checkTokens within a shard found %q", got)
	}
	// Across a split: shard 0 split at "d" after token 5; the new shard
	// (id 4) took its counter, so both went on from 6. Grouped by the
	// final map, every range's tokens rise; grouped by the first map, the
	// two 6s would look like a reuse.
	split := shardMap{starts: []string{"", "d", "g", "n", "t"}, ids: []int{0, 4, 1, 2, 3}}
	acrossSplit := (&hb{}).
		add(acq("a", "elect-no/x", 2*s, 0, s/10, oOK, 4, "la")). // moves at d
		add(acq("b", "cold/01", 2*s, 2*s/10, 3*s/10, oOK, 5, "lb")).
		add(acq("c", "elect-no/x", 2*s, 4*s/10, 5*s/10, oOK, 6, "lc")). // on the new shard
		add(acq("d", "cold/02", 2*s, 6*s/10, 7*s/10, oOK, 6, "ld")).    // on the old one
		ops
	if a := checkTokens(acrossSplit, split); len(a) != 0 {
		t.Fatalf("tokens across a split, grouped by the final map: %v", a)
	}
	if a := checkTokens(acrossSplit, m); len(a) == 0 {
		t.Fatal("grouped by the first map the split's two 6s are not a reuse: the check cannot fail")
	}
	// A name's token that falls across the split is still caught.
	fell := append(append([]Op(nil), acrossSplit...), (&hb{}).add(acq("e", "elect-no/x", 2*s, 8*s/10, 9*s/10, oOK, 3, "le")).ops...)
	if a := checkTokens(fell, split); len(a) == 0 || !strings.HasPrefix(a[0].What, "shard 4: ") {
		t.Fatalf("a falling token on the new shard: %v", a)
	}
	// Registers: token 5 of cold/01 written by its holder is fine although
	// wind/01 also has a token 5; wind/01's token 5 written by cold/01's
	// holder is not a grant of that register.
	ws := []write{
		{Lock: "cold/01", Client: "a", Token: 5, Accepted: true, At: s / 5, Bound: 2 * s},
		{Lock: "wind/01", Client: "c", Token: 5, Accepted: true, At: 6 * s / 10, Bound: 2 * s},
	}
	if a, _ := checkFence(acrossShards, ws); len(a) != 0 {
		t.Fatalf("registers of different shards' locks: %v", a)
	}
	ws = append(ws, write{Lock: "wind/01", Client: "a", Token: 5, Accepted: true, At: 7 * s / 10, Bound: 2 * s})
	if a, _ := checkFence(acrossShards, ws); len(a) != 1 || a[0].Kind != "safety:fence-unknown-token" {
		t.Fatalf("a write with another lock's token: %v", a)
	}
}

// leaderList renders each shard's leader ("0=n1 1=n2 …", "-" for none).
func leaderList(c *cluster, leaders []int) string {
	s := make([]string, len(leaders))
	for k, l := range leaders {
		id := "-"
		if l >= 0 {
			id = c.nodes[l].id
		}
		s[k] = fmt.Sprintf("%d=%s", k, id)
	}
	return strings.Join(s, " ")
}

// The watch checker on a merged stream: revisions are per shard, so shard 0's
// revision 1 and shard 1's revision 1 are different revisions with
// different events; a watcher that misses shard 1's is caught. (Resuming
// each shard exactly where it left off is the Go client's, tested there.)
func TestShardedWatchChecker(t *testing.T) {
	m := shardMap{starts: []string{"", "n"}}
	ev := func(rev uint64, typ, name string, token uint64) dlockclient.WatchEvent {
		return dlockclient.WatchEvent{Revision: rev, Kind: "lock", Type: typ, Name: name, FencingToken: token}
	}
	type sev struct {
		shard int
		ev    dlockclient.WatchEvent
	}
	mk := func(id int, evs ...sev) *streamWatcher {
		w := &streamWatcher{id: id, events: map[revAt][]string{}, grants: map[string]bool{}, caughtUp: true,
			segs: []watchSegment{{from: []uint64{1, 1}, to: []uint64{2, 2}, start: 10}}}
		for _, e := range evs {
			at := revAt{e.shard, e.ev.Revision}
			w.events[at] = append(w.events[at], watchKey(e.ev))
			if e.ev.Type == "acquired" {
				w.grants[fmt.Sprintf("%s#%d", e.ev.Name, e.ev.FencingToken)] = true
			}
		}
		return w
	}
	all := []sev{
		{0, ev(1, "acquired", "a", 1)}, {0, ev(2, "released", "a", 1)},
		{1, ev(1, "acquired", "z", 1)}, {1, ev(2, "released", "z", 1)},
	}
	grants := []Op{
		{ID: 1, Kind: kAcquire, Lock: "a", Out: oOK, OutToken: 1, Call: 20, Return: 30},
		{ID: 2, Kind: kAcquire, Lock: "z", Out: oOK, OutToken: 1, Call: 20, Return: 30},
	}
	if got, _ := checkWatchers(&watchFleet{ws: []*streamWatcher{mk(0, all...), mk(1, all...)}}, grants, m); len(got) != 0 {
		t.Fatalf("agreeing merged streams: %v", got)
	}
	got, _ := checkWatchers(&watchFleet{ws: []*streamWatcher{mk(0, all...), mk(1, all[0], all[1], all[3])}}, grants, m)
	var kinds []string
	for _, a := range got {
		kinds = append(kinds, a.Kind)
	}
	if k := strings.Join(kinds, ","); !strings.Contains(k, "watch:event-missed") || !strings.Contains(k, "watch:grant-missed") {
		t.Fatalf("a merged stream that missed shard 1's revision 1: %q", k)
	}

}

// Split points: a fresh point inside a range with a name in use below it,
// never a bound; the sequence a seed draws is fixed, each split shrinks the
// choice, and the final-token and revoke names of every range of the map
// after the splits still land in their range.
func TestSplitPoints(t *testing.T) {
	w := newWorkload(nil, nil, nil, 1, 6, 2, 4)
	pts := splitPoints(w)
	if !sort.StringsAreSorted(pts) || len(pts) < 10 {
		t.Fatalf("split points %q", pts)
	}
	m := defaultShardMap(4)
	var got []string
	for i := range maxSplits {
		at := splitPoint(m, pts, 7*i+3)
		if at == "" {
			t.Fatalf("no split point left after %d splits of %q", i, m.starts)
		}
		k := m.of(at)
		if m.starts[k] == at {
			t.Fatalf("split at the bound %q", at)
		}
		got = append(got, at)
		// The split as the cluster makes it: a range from at with the next id.
		next := 0
		for k := range m.n() {
			next = max(next, m.id(k)+1)
		}
		starts := append(append(append([]string(nil), m.starts[:k+1]...), at), m.starts[k+1:]...)
		ids := make([]int, 0, len(starts))
		for j := range m.n() {
			ids = append(ids, m.id(j))
			if j == k {
				ids = append(ids, next)
			}
		}
		m = shardMap{starts: starts, ids: ids}
	}
	// The map the seed-20261131 soak ended with: shard 0 is ["", "cold"),
	// below "final"; its final checks need a name all the same.
	soak := shardMap{starts: []string{"", "cold", "elect", "g", "ice", "lane", "n", "rw", "sem", "t"}, ids: []int{0, 5, 4, 1, 7, 9, 2, 6, 8, 3}}
	for k := range soak.n() {
		for _, word := range []string{"token", "revoke"} {
			name, err := soak.nameIn(k, "final", word)
			if err != nil || soak.of(name) != k {
				t.Fatalf("the soak's map: %q %v", name, err)
			}
		}
	}
	if again := splitPoint(defaultShardMap(4), pts, 3); again != got[0] {
		t.Fatalf("the first split point is %q, then %q: not fixed by the draw", got[0], again)
	}
	for k := range m.n() {
		for _, word := range []string{"token", "revoke"} {
			if _, err := m.nameIn(k, "final", word); err != nil {
				t.Fatalf("after splits at %q: %v", got, err)
			}
		}
	}
	t.Logf("splits at %q: ranges from %q, ids %v", got, m.starts, m.ids)
}
