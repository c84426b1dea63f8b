package chaos

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	dlockv1 "github.com/dlock/dlock/api/dlock/v1"
)

// Election observers under faults: on a one-group cluster, one gRPC
// Observe stream per election and node follows the workload's elections
// through the faults, reopening on the next node after a break. Observe
// promises the election's view when the stream opens and a new view after
// every change (api/dlock/v1/dlock.proto), so after the heal:
//
//   - within one stream the leaders' tokens never go back, and a token
//     names one candidate;
//   - a leader whose token an acknowledged campaign was granted is that
//     campaign's candidate;
//   - every observer's last stream reaches the election's final view, and
//     carries every acknowledged win whose campaign was sent after that
//     stream's first view arrived (the server read that view, and
//     subscribed, before the campaign was even sent).

type observer struct {
	key   string // electionPrefix + name, as the history keys it
	first int    // the node it opens on first
	clk   *clock

	mu   sync.Mutex
	segs []obsSegment
}

// obsSegment is one stream: from its first view to its break (or the end).
type obsSegment struct {
	firstAt int64 // when its first view arrived
	views   []obsView
}

type obsView struct {
	rev       uint64
	candidate string
	token     uint64 // 0: nobody leads
}

type observerFleet struct {
	obs    []*observer
	cancel context.CancelFunc
	wg     sync.WaitGroup
	opened int // streams opened, over all observers
	mu     sync.Mutex

	// what halt saw: each election's final view, and the observers whose
	// last stream reached it
	finals map[string]obsView
	caught map[*observer]bool
}

// startObservers follows every election of the workload from every node;
// nil on a sharded cluster or without gRPC.
func (r *runner) startObservers(elections []string) *observerFleet {
	if r.sm.n() > 1 || r.api.grpc == nil {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &observerFleet{cancel: cancel}
	clients := r.api.grpc.elections // the suite's connections, one per node
	for _, key := range elections {
		for i := range r.c.nodes {
			o := &observer{key: key, first: i, clk: r.clk}
			f.obs = append(f.obs, o)
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				o.run(ctx, clients, f)
			}()
		}
	}
	return f
}

func (o *observer) run(ctx context.Context, clients []dlockv1.ElectionServiceClient, f *observerFleet) {
	for node := o.first; ctx.Err() == nil; node = (node + 1) % len(clients) {
		st, err := clients[node].Observe(ctx, &dlockv1.ObserveRequest{Name: realName(o.key)})
		if err == nil {
			f.mu.Lock()
			f.opened++
			f.mu.Unlock()
			seg := -1
			for {
				resp, err := st.Recv()
				if err != nil {
					break
				}
				v := obsView{rev: resp.GetElection().GetRevision()}
				if l := resp.GetElection().GetLeader(); l != nil {
					v.candidate, v.token = l.CandidateId, l.FencingToken
				}
				o.mu.Lock()
				if seg < 0 {
					o.segs = append(o.segs, obsSegment{firstAt: o.clk.now()})
					seg = len(o.segs) - 1
				}
				o.segs[seg].views = append(o.segs[seg].views, v)
				o.mu.Unlock()
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// last is the observer's latest view, if it has one.
func (o *observer) last() (obsView, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if n := len(o.segs); n > 0 {
		vs := o.segs[n-1].views
		return vs[len(vs)-1], true
	}
	return obsView{}, false
}

// halt waits up to timeout for every observer to show its election's final
// leader (finals, read on the healed cluster; nil: the run did not heal, so
// nothing is final) and stops them.
func (f *observerFleet) halt(finals map[string]obsView, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	f.caught, f.finals = map[*observer]bool{}, finals
	for _, o := range f.obs {
		want, ok := finals[o.key]
		for ok && time.Now().Before(deadline) {
			if v, have := o.last(); have && v.token == want.token && v.candidate == want.candidate {
				f.caught[o] = true
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	f.cancel()
	f.wg.Wait()
}

// check checks the halted observers against the acknowledged operations.
func (f *observerFleet) check(ops []Op) ([]anomaly, obsStats) {
	st := obsStats{observers: len(f.obs), opened: f.opened}
	for _, o := range f.obs {
		for _, s := range o.segs {
			st.views += len(s.views)
		}
	}
	a, wins := checkObservers(f.obs, f.caught, f.finals, ops)
	st.winsChecked = wins
	return a, st
}

type obsStats struct {
	observers, opened, views, winsChecked int
}

func (s obsStats) String() string {
	return fmt.Sprintf("%d gRPC Observe streams (%d opened), %d views, %d acknowledged wins checked against the streams",
		s.observers, s.opened, s.views, s.winsChecked)
}

// checkObservers checks the observers' streams: caught says which last
// streams reached the final view (finals). It also returns how many
// acknowledged wins it looked for in those streams.
func checkObservers(obs []*observer, caught map[*observer]bool, finals map[string]obsView, ops []Op) (out []anomaly, checked int) {
	bad := func(kind, format string, args ...any) {
		out = append(out, anomaly{Kind: kind, What: fmt.Sprintf(format, args...)})
	}
	type win struct {
		client string
		call   int64
		token  uint64
	}
	wins := map[string][]win{}    // by election
	holder := map[string]string{} // "key token" → candidate
	for _, op := range ops {
		if op.Kind == kAcquire && op.Out == oOK && isElection(op.Lock) {
			wins[op.Lock] = append(wins[op.Lock], win{op.Client, op.Call, op.OutToken})
			holder[fmt.Sprintf("%s %d", op.Lock, op.OutToken)] = op.Client
		}
	}
	for i, o := range obs {
		for k, s := range o.segs {
			var last, top obsView // the view before, and the one with the highest token
			for j, v := range s.views {
				if j > 0 && (v.rev < last.rev || (v.token != 0 && (v.token < top.token || (v.token == top.token && v.candidate != top.candidate)))) {
					bad("observe:order", "observer %d of %s, stream %d: view %+v after %+v (highest token so far: %+v)", i, o.key, k, v, last, top)
				}
				if v.token > top.token {
					top = v
				}
				if c, ok := holder[fmt.Sprintf("%s %d", o.key, v.token)]; ok && v.token != 0 && c != v.candidate {
					bad("observe:wrong-leader", "observer %d of %s, stream %d: token %d shown as %q's, granted to %q", i, o.key, k, v.token, v.candidate, c)
				}
				last = v
			}
		}
		stuck := false
		if _, want := finals[o.key]; want && !caught[o] {
			v, _ := o.last()
			bad("observe:stuck", "observer %d of %s never showed the final view %+v after the heal (last %+v)", i, o.key, finals[o.key], v)
			stuck = true
		}
		// Every win whose campaign was sent after a stream's first view
		// came is in that stream if the stream got as far as it: tokens
		// rise in grant order, so a stream that showed a later leader
		// showed every leader before it. The last stream, once it showed
		// the final view, owes every such win.
		for k, s := range o.segs {
			seen := map[uint64]bool{}
			var top uint64
			for _, v := range s.views {
				seen[v.token] = true
				top = max(top, v.token)
			}
			whole := k == len(o.segs)-1 && caught[o] && !stuck
			for _, w := range wins[o.key] {
				if w.call < s.firstAt || (!whole && w.token > top) {
					continue
				}
				checked++
				if !seen[w.token] {
					bad("observe:missed", "observer %d of %s: %q's win with token %d (sent at %s) is not in stream %d, whose first view came at %s and which showed tokens up to %d",
						i, o.key, w.client, w.token, fmtT(w.call), k, fmtT(s.firstAt), top)
				}
			}
		}
	}
	return out, checked
}

// finalElections reads each election's final view through node via.
func (r *runner) finalElections(via int, keys []string) (map[string]obsView, error) {
	finals := map[string]obsView{}
	for _, key := range keys {
		var e struct {
			Leader *struct {
				CandidateID  string `json:"candidate_id"`
				FencingToken uint64 `json:"fencing_token"`
			} `json:"leader"`
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		code, err := getJSON(ctx, r.c.nodes[via].url()+"/api/v1/elections/"+url.PathEscape(realName(key)), &e)
		cancel()
		if err != nil || code != 200 {
			return nil, fmt.Errorf("read election %s: %d %v", realName(key), code, err)
		}
		v := obsView{}
		if e.Leader != nil {
			v.candidate, v.token = e.Leader.CandidateID, e.Leader.FencingToken
		}
		finals[key] = v
	}
	return finals, nil
}

// elections lists the workload's elections (their history keys).
func (w *workload) elections() []string {
	var out []string
	for _, l := range append(append([]lockSpec{}, w.hot...), w.cold...) {
		if isElection(l.name) {
			out = append(out, l.name)
		}
	}
	return out
}

func TestObserverChecks(t *testing.T) {
	key := electionPrefix + "elect/a"
	ops := []Op{
		{Kind: kAcquire, Lock: key, Client: "c1", Out: oOK, OutToken: 10, Call: 100},
		{Kind: kAcquire, Lock: key, Client: "c2", Out: oOK, OutToken: 12, Call: 300},
	}
	final := map[string]obsView{key: {candidate: "c2", token: 12}}
	mk := func(firstAt int64, views ...obsView) *observer {
		return &observer{key: key, segs: []obsSegment{{firstAt: firstAt, views: views}}}
	}
	for _, c := range []struct {
		name string
		o    *observer
		want string // anomaly kinds, joined
	}{
		{"every change", mk(50, obsView{1, "", 0}, obsView{3, "c1", 10}, obsView{5, "", 0}, obsView{9, "c2", 12}), ""},
		{"a win before the stream need not show", mk(200, obsView{6, "", 0}, obsView{9, "c2", 12}), ""},
		{"a win after the stream's first view must", mk(50, obsView{1, "", 0}, obsView{9, "c2", 12}), "observe:missed"},
		{"a token going back", mk(250, obsView{9, "c2", 12}, obsView{10, "c1", 10}, obsView{11, "c2", 12}), "observe:order"},
		{"a leader named wrong", mk(250, obsView{9, "c3", 12}), "observe:wrong-leader,observe:stuck"},
		{"one token, two candidates", mk(250, obsView{8, "c2", 12}, obsView{9, "c3", 12}, obsView{10, "c2", 12}), "observe:order,observe:wrong-leader"},
		{"a revision going back", mk(250, obsView{9, "c2", 12}, obsView{8, "c2", 12}), "observe:order"},
		{"a broken stream that showed a later leader owes the one before", &observer{key: key, segs: []obsSegment{
			{firstAt: 50, views: []obsView{{1, "", 0}, {9, "c2", 12}}},
			{firstAt: 400, views: []obsView{{9, "c2", 12}}},
		}}, "observe:missed"},
		{"a broken stream that stopped before a leader owes nothing after", &observer{key: key, segs: []obsSegment{
			{firstAt: 50, views: []obsView{{1, "", 0}, {3, "c1", 10}}},
			{firstAt: 400, views: []obsView{{9, "c2", 12}}},
		}}, ""},
	} {
		caught := map[*observer]bool{}
		if v, ok := c.o.last(); ok && v.token == final[key].token && v.candidate == final[key].candidate {
			caught[c.o] = true
		}
		var kinds []string
		as, _ := checkObservers([]*observer{c.o}, caught, final, ops)
		for _, a := range as {
			kinds = append(kinds, a.Kind)
		}
		if got := strings.Join(kinds, ","); got != c.want {
			t.Errorf("%s: anomalies %q, want %q", c.name, got, c.want)
		}
	}
}
