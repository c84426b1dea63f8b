package chaos

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	dlockv1 "github.com/dlock/dlock/api/dlock/v1"
	dlockclient "github.com/dlock/dlock/client"
)

// Watchers under faults. One Go-client watch per node (each listing the
// nodes from a different one first, so the streams start on different
// nodes) follows every change while the nemesis runs, resuming across node
// kills, pauses and partitions as the client does (design.md §5: a watch from
// revision R sees every later change exactly once); on a one-group cluster
// one gRPC or WebSocket watch per node does the same (watchraw_test.go).
// Afterwards:
//
//   - every revision two watchers both covered carries the same events, in
//     the same order, on both (nodes apply one log; a resumed stream neither
//     repeats nor skips);
//   - no watcher skipped a revision another one saw inside a stretch it
//     covered without a break;
//   - every acknowledged grant shows up as an acquired/elected event with its
//     token: at least on every watcher whose last, unbroken stream began
//     before the grant's call;
//   - every watcher catches up with the final revision after the heal.
//
// A stream the server refuses as compacted (a restarted node keeps events
// only since its snapshot) is re-listed and resumed from the listed
// revision: a break, counted, not an anomaly.
//
// On a sharded cluster each watcher follows one merged stream over every
// shard (GET /watch with from_revisions, watchmerged_test.go): revisions are
// per shard, so everything above is per shard — an event is identified by
// its shard and revision, a segment covers a range of revisions of each
// shard, and the final revision is a vector.

// watchSegment is one unbroken stretch of a stream: for each shard k, every
// event with a revision in [from[k], to[k]] was delivered (one entry on a
// one-group cluster).
type watchSegment struct {
	from, to   []uint64
	start, end int64 // clock times (end 0: still open)
}

// revAt is one revision of one shard (shard 0 on a one-group cluster).
type revAt struct {
	shard int
	rev   uint64
}

type streamWatcher struct {
	id  int
	cl  *dlockclient.Client
	clk *clock

	// sharded: the watcher follows the merged stream (runMerged), listing
	// at least minShards() shards' revisions for a new segment.
	sharded   bool
	minShards func() int

	mu       sync.Mutex
	caughtUp bool               // the open segment reached the final revision at halt
	events   map[revAt][]string // revision -> events, in order
	segs     []watchSegment
	grants   map[string]bool // "name#token" of acquired/elected events
	breaks   int
	resumes  int // gRPC and WebSocket streams reopened inside a stretch (watchraw_test.go)
	errs     []string
}

// watchKey identifies an event for comparison across watchers.
func watchKey(ev dlockclient.WatchEvent) string {
	return fmt.Sprintf("%s/%s/%s/%s/%d/%s/%s", ev.Kind, ev.Type, ev.Name, ev.ClientID, ev.FencingToken, ev.Cause, ev.Value)
}

type watchFleet struct {
	ws     []*streamWatcher
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startWatchers starts one watcher per node, and on a one-group cluster one
// more per node over gRPC or WebSocket (watchraw_test.go).
func (r *runner) startWatchers() *watchFleet {
	ctx, cancel := context.WithCancel(context.Background())
	f := &watchFleet{cancel: cancel}
	n := len(r.c.nodes)
	var raw []rawStream
	if r.sm.n() <= 1 {
		var urls []string
		for _, nd := range r.c.nodes {
			urls = append(urls, nd.url())
		}
		ws := wsWatch(urls)
		var grpc rawStream
		if r.api.grpc != nil {
			var watch []dlockv1.WatchServiceClient
			for _, cc := range r.api.grpc.conns {
				watch = append(watch, dlockv1.NewWatchServiceClient(cc))
			}
			grpc = grpcWatch(watch)
		}
		for i := range n {
			if i%2 == 0 && grpc != nil {
				raw = append(raw, grpc)
			} else {
				raw = append(raw, ws)
			}
		}
	}
	for i := range n + len(raw) {
		var eps []string
		for j := range n {
			eps = append(eps, r.c.nodes[(i+j)%n].url())
		}
		w := &streamWatcher{id: i, clk: r.clk, events: map[revAt][]string{}, grants: map[string]bool{}, minShards: r.c.knownShards, sharded: r.sm.n() > 1}
		cl, err := dlockclient.New(dlockclient.Config{Endpoints: eps, ClientID: fmt.Sprintf("chaos-watch-%d", i)})
		if err != nil {
			r.anomaly(anomaly{Kind: "harness", What: "watch client: " + err.Error()})
			continue
		}
		w.cl = cl
		f.ws = append(f.ws, w)
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			switch {
			case i >= n:
				w.runRaw(ctx, raw[i-n], i-n)
			case w.sharded:
				w.runMerged(ctx)
			default:
				w.run(ctx)
			}
		}()
	}
	return f
}

// openSegment lists the locks and opens a segment after the listed
// revision, which it returns; false if the list failed (after a pause, so
// the caller can try again).
func (w *streamWatcher) openSegment(ctx context.Context) (uint64, bool) {
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, rev, err := w.cl.ListWithRevision(lctx, "")
	cancel()
	if err != nil {
		time.Sleep(100 * time.Millisecond)
		return 0, false
	}
	w.mu.Lock()
	w.segs = append(w.segs, watchSegment{from: []uint64{rev + 1}, to: []uint64{rev}, start: w.clk.now()})
	w.mu.Unlock()
	return rev, true
}

// closeSegment ends the open segment.
func (w *streamWatcher) closeSegment() {
	w.mu.Lock()
	w.segs[len(w.segs)-1].end = w.clk.now()
	w.mu.Unlock()
}

func (w *streamWatcher) run(ctx context.Context) {
	for ctx.Err() == nil {
		rev, ok := w.openSegment(ctx)
		if !ok {
			continue
		}
		for ev, err := range w.cl.Watch(ctx, "", rev+1) {
			if err != nil {
				w.mu.Lock()
				w.breaks++
				var ce *dlockclient.CompactedError
				if !errors.As(err, &ce) && ctx.Err() == nil {
					// When, to find it in the node logs and the schedule.
					w.errs = append(w.errs, fmt.Sprintf("at %s: %v", fmtT(w.clk.now()), err))
				}
				w.mu.Unlock()
				break
			}
			w.add(0, ev)
		}
		w.closeSegment()
	}
}

// add records an event of shard k in the open segment.
func (w *streamWatcher) add(k int, ev dlockclient.WatchEvent) {
	w.mu.Lock()
	defer w.mu.Unlock()
	seg := &w.segs[len(w.segs)-1]
	if k < 0 || k >= len(seg.to) {
		w.errs = append(w.errs, fmt.Sprintf("an event of shard %d, which the cluster does not have: %s", k, watchKey(ev)))
		return
	}
	if ev.Revision < seg.to[k] {
		w.errs = append(w.errs, fmt.Sprintf("shard %d: revision %d after %d: out of order", k, ev.Revision, seg.to[k]))
	}
	seg.to[k] = ev.Revision
	at := revAt{k, ev.Revision}
	w.events[at] = append(w.events[at], watchKey(ev))
	if ev.Type == "acquired" || ev.Type == "elected" {
		w.grants[fmt.Sprintf("%s#%d", ev.Name, ev.FencingToken)] = true
	}
}

// reachedLocked reports whether the watcher's open segment reached the
// final revision of every shard.
func (w *streamWatcher) reachedLocked(final []uint64) bool {
	if len(w.segs) == 0 || w.segs[len(w.segs)-1].end != 0 {
		return false
	}
	to := w.segs[len(w.segs)-1].to
	if len(to) != len(final) {
		return false
	}
	for k := range final {
		if to[k] < final[k] {
			return false
		}
	}
	return true
}

func (w *streamWatcher) reached(final []uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.reachedLocked(final)
}

// halt waits (up to timeout) for every watcher to reach the cluster's final
// revision (one per shard), then stops them. A watcher whose open segment
// got there covers every revision of it up to final. final nil: stop now.
func (f *watchFleet) halt(final []uint64, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for _, w := range f.ws {
		for final != nil && !w.reached(final) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		w.mu.Lock()
		w.caughtUp = final != nil && w.reachedLocked(final)
		w.mu.Unlock()
	}
	f.cancel()
	f.wg.Wait()
	for _, w := range f.ws {
		w.mu.Lock()
		if n := len(w.segs); n > 0 && w.caughtUp {
			w.segs[n-1].to, w.segs[n-1].end = append([]uint64(nil), final...), 0
		}
		w.mu.Unlock()
		if w.cl != nil {
			_ = w.cl.Close()
		}
	}
}

// covers reports whether every event of revision r of shard k reached the
// watcher in one unbroken stretch. A stretch that broke may have delivered
// only part of its last revision, so that one does not count.
func (w *streamWatcher) covers(at revAt) bool {
	for i, s := range w.segs {
		if at.shard >= len(s.to) {
			continue
		}
		last := s.to[at.shard]
		if !(i == len(w.segs)-1 && w.caughtUp) {
			last-- // broken: its last revision may be partial
		}
		if at.rev >= s.from[at.shard] && at.rev <= last {
			return true
		}
	}
	return false
}

// watchStats is what the report says about the watchers.
type watchStats struct {
	watchers, events, breaks int
	resumes                  int
	revisions                int
	grantsChecked            int
}

func (s watchStats) String() string {
	return fmt.Sprintf("%d watchers, %d events over %d revisions, %d stream breaks (re-listed), %d gRPC and WebSocket watches reopened in place, %d acknowledged grants checked against the streams",
		s.watchers, s.events, s.revisions, s.breaks, s.resumes, s.grantsChecked)
}

// checkWatchers compares the streams with each other and with the
// acknowledged grants.
func checkWatchers(f *watchFleet, ops []Op, m shardMap) ([]anomaly, watchStats) {
	var out []anomaly
	var st watchStats
	st.watchers = len(f.ws)
	all := map[revAt]bool{}
	for _, w := range f.ws {
		st.breaks += w.breaks
		st.resumes += w.resumes
		for r, evs := range w.events {
			all[r] = true
			st.events += len(evs)
		}
		for _, e := range w.errs {
			out = append(out, anomaly{Kind: "watch:stream-error", What: fmt.Sprintf("watcher %d: %s", w.id, e)})
		}
		if !w.caughtUp {
			out = append(out, anomaly{Kind: "liveness:watch-stuck", What: fmt.Sprintf("watcher %d did not reach the final revision after the heal", w.id)})
		}
	}
	st.revisions = len(all)
	revs := make([]revAt, 0, len(all))
	for r := range all {
		revs = append(revs, r)
	}
	sort.Slice(revs, func(i, j int) bool {
		if revs[i].shard != revs[j].shard {
			return revs[i].shard < revs[j].shard
		}
		return revs[i].rev < revs[j].rev
	})
	for _, r := range revs {
		for i, a := range f.ws {
			if !a.covers(r) {
				continue
			}
			for _, b := range f.ws[i+1:] {
				if !b.covers(r) {
					continue
				}
				ea, eb := a.events[r], b.events[r]
				if strings.Join(ea, "\n") == strings.Join(eb, "\n") {
					continue
				}
				kind := "watch:streams-differ"
				if len(ea) == 0 || len(eb) == 0 {
					kind = "watch:event-missed"
				}
				out = append(out, anomaly{Kind: kind,
					What: fmt.Sprintf("%srevision %d: watcher %d saw %q, watcher %d saw %q", idPrefix(m, r.shard), r.rev, a.id, ea, b.id, eb)})
			}
		}
	}
	// A grant committed after a watcher's last stream began (its list came
	// before the grant's call) must be in that stream: it is unbroken to the
	// final revision.
	for _, o := range ops {
		if o.Kind != kAcquire || o.Out != oOK || o.OutToken == 0 {
			continue
		}
		key := fmt.Sprintf("%s#%d", realName(o.Lock), o.OutToken)
		for _, w := range f.ws {
			if !w.caughtUp || w.segs[len(w.segs)-1].start > o.Call {
				continue
			}
			st.grantsChecked++
			if !w.grants[key] {
				out = append(out, anomaly{Kind: "watch:grant-missed",
					What: fmt.Sprintf("watcher %d followed the whole of op #%d without a break but never saw its grant (%s%s token %d)", w.id, o.ID, shardPrefix(m, m.of(o.Lock)), realName(o.Lock), o.OutToken)})
			}
		}
	}
	return out, st
}

// idPrefix starts a message about the shard with id on a sharded cluster.
func idPrefix(m shardMap, id int) string {
	if m.n() <= 1 {
		return ""
	}
	return fmt.Sprintf("shard %d: ", id)
}

// The checker on hand-made streams: it accepts agreeing streams with breaks
// and catches a differing, a missed and a never-seen grant.
func TestWatchChecker(t *testing.T) {
	ev := func(rev uint64, typ, name string, token uint64) dlockclient.WatchEvent {
		return dlockclient.WatchEvent{Revision: rev, Kind: "lock", Type: typ, Name: name, FencingToken: token}
	}
	mk := func(id int, segs []watchSegment, evs ...dlockclient.WatchEvent) *streamWatcher {
		w := &streamWatcher{id: id, events: map[revAt][]string{}, grants: map[string]bool{}, caughtUp: true}
		for _, e := range evs {
			w.segs = segs
			at := revAt{0, e.Revision}
			w.events[at] = append(w.events[at], watchKey(e))
			if e.Type == "acquired" {
				w.grants[fmt.Sprintf("%s#%d", e.Name, e.FencingToken)] = true
			}
		}
		w.segs = segs
		return w
	}
	grant := Op{ID: 1, Kind: kAcquire, Lock: "a", Out: oOK, OutToken: 7, Call: 50, Return: 60}
	full := []dlockclient.WatchEvent{ev(1, "acquired", "a", 7), ev(2, "released", "a", 7), ev(2, "acquired", "a", 8), ev(3, "expired", "a", 8)}
	one := []watchSegment{{from: []uint64{1}, to: []uint64{3}, start: 10}}
	// Watcher 1 broke in the middle of revision 2 and re-listed at 3.
	broken := []watchSegment{{from: []uint64{1}, to: []uint64{2}, start: 10, end: 70}, {from: []uint64{3}, to: []uint64{3}, start: 80}}
	cases := []struct {
		name string
		ws   []*streamWatcher
		want string // anomaly kind, "" for none
	}{
		{"agree", []*streamWatcher{mk(0, one, full...), mk(1, one, full...)}, ""},
		{"partial last revision of a break", []*streamWatcher{mk(0, one, full...), mk(1, broken, full[0], full[1], full[3])}, ""},
		{"differ", []*streamWatcher{mk(0, one, full...), mk(1, one, full[0], full[1], ev(2, "acquired", "a", 9), full[3])}, "watch:streams-differ"},
		{"missed", []*streamWatcher{mk(0, one, full...), mk(1, one, full[0], full[3])}, "watch:event-missed"},
		{"grant never seen", []*streamWatcher{mk(0, one, full[1:]...), mk(1, one, full[1:]...)}, "watch:grant-missed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, _ := checkWatchers(&watchFleet{ws: c.ws}, []Op{grant}, oneShard)
			if c.want == "" && len(got) > 0 {
				t.Fatalf("anomalies on agreeing streams: %v", got)
			}
			if c.want != "" && (len(got) == 0 || got[0].Kind != c.want) {
				t.Fatalf("got %v, want a %s", got, c.want)
			}
		})
	}
}
