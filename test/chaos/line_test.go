package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"
)

// The line under faults: while the nemesis runs, holders take a fresh lock
// (exclusive, shared/exclusive, counting or subtree: lineKinds) and waiters join its
// line one after another, each only once a read through some node showed
// every earlier one queued. The cluster then owes them the lock in that
// order: any two that were both granted must have tokens in the order they
// joined. A waiter keeps its place through retries on other nodes
// (it sends a request_id), so only a wait that ended — timed out, or a grant
// lost before it was answered — excuses it, and such a waiter has no grant
// to compare. The quiet-phase checks (livenessWaiters) see the line only on a
// healed cluster.

const (
	lineProc    = 300 // Op.Proc of a round's first holder; its waiters, then other holders, follow
	lineWaiters = 3
	lineTTL     = 4 * time.Second
	lineWait    = 20 * time.Second
)

type lineStats struct {
	rounds  [len(lineKinds)]int // rounds whose holders got the lock, by kind (lineKinds)
	skipped int                 // rounds whose holders did not (no line to check)
	joined  int                 // waiters that joined behind a confirmed line
	granted int                 // waiters granted
	retried int                 // of those, granted through a second node or later
	pairs   int                 // pairs of granted waiters whose order was checked
}

func (s lineStats) String() string {
	total := 0
	var by []string
	for i, n := range s.rounds {
		total += n
		by = append(by, fmt.Sprintf("%s %d", lineKinds[i].what, n))
	}
	return fmt.Sprintf("%d rounds (%s; %d more without their holders), %d waiters, %d granted (%d of them after a retry), %d ordered pairs checked",
		total, strings.Join(by, ", "), s.skipped, s.joined, s.granted, s.retried, s.pairs)
}

// line runs its rounds on one goroutine until halted.
type line struct {
	r     *runner
	seed  uint64
	stop  chan struct{} // closed by halt: finish the round, start no other
	abort chan struct{} // closed when halt's wait ran out: give up every call
	done  chan struct{}
	stats lineStats
}

func (r *runner) startLine() *line {
	l := &line{r: r, seed: r.cfg.seed, stop: make(chan struct{}), abort: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		pace := rand.New(rand.NewPCG(l.seed, 4999))
		for k := 0; ; k++ {
			l.round(k)
			select {
			case <-l.stop:
				return
			case <-time.After(time.Duration(pace.Int64N(int64(200 * time.Millisecond)))):
			}
		}
	}()
	return l
}

// halt ends the rounds, waiting up to within for the current one; it reports
// whether they ended in time.
func (l *line) halt(within time.Duration) bool {
	close(l.stop)
	select {
	case <-l.done:
		return true
	case <-time.After(within):
		close(l.abort)
		<-l.done
		return false
	}
}

// lineKinds are the kinds of line, taken in turn: on an exclusive lock; on a
// shared/exclusive one, whose waiters are shared, exclusive, shared (the
// second reader must wait behind the writer, not join the first); on a
// counting lock of limit 2, held full by two holders; and on a subtree lock,
// a subtree waiter behind a holder inside it, then two requests for another
// name inside, which wait behind the subtree waiter though nothing holds
// that name. The last three use the lock model's names (rw/, sem/, sub/:
// isModelLock), which the one-holder checkers leave out.
var lineKinds = [...]struct {
	what    string
	prefix  string
	limit   int
	holders []lineReq
	waiters [lineWaiters]lineReq
}{
	{what: "exclusive", prefix: "line/", holders: []lineReq{{}}},
	{what: "shared/exclusive", prefix: "rw/line/", holders: []lineReq{{}}, waiters: [lineWaiters]lineReq{{shared: true}, {}, {shared: true}}},
	{what: "counting", prefix: "sem/line/", limit: 2, holders: []lineReq{{}, {}}},
	{what: "subtree", prefix: "sub/line/", holders: []lineReq{{name: "/a"}}, waiters: [lineWaiters]lineReq{{subtree: true}, {name: "/b"}, {name: "/b"}}},
}

// lineReq is one request of a line: on the round's lock, or on the name
// below it that name gives ("/a").
type lineReq struct {
	name            string
	shared, subtree bool
}

func (l *line) round(k int) {
	r := l.r
	kind := lineKinds[k%len(lineKinds)]
	lock := fmt.Sprintf("%s%d", kind.prefix, k)
	rng := rand.New(rand.NewPCG(l.seed, uint64(5000+k)))
	opts := callOpts{attempt: 2 * time.Second, overall: 60 * time.Second, stop: l.abort}
	mk := func(slot int, client, op, name string) *Op {
		return &Op{Proc: lineProc + slot, Client: client, Kind: op, Lock: name, ReqID: fmt.Sprintf("%s.%s.%d", client, op, k)}
	}
	release := func(slot int, g *Op, rng *rand.Rand) {
		op := mk(slot, g.Client, kRelease, g.Lock)
		op.Token, op.Lease = g.OutToken, g.OutLease
		r.api.releaseOrRenew(op, rng, opts)
	}

	// Holders take slots 0 and lineWaiters+1…; waiters 1…lineWaiters.
	var hs []*Op
	var hslots []int
	for j, q := range kind.holders {
		slot := 0
		if j > 0 {
			slot = lineWaiters + j
		}
		h := mk(slot, fmt.Sprintf("line-h%d", j), kAcquire, lock+q.name)
		h.TTL, h.Limit = int64(lineTTL), kind.limit
		r.api.acquire(h, rng, opts)
		if h.Out == oOK {
			hs, hslots = append(hs, h), append(hslots, slot)
		}
	}
	if len(hs) < len(kind.holders) {
		for j, h := range hs {
			release(hslots[j], h, rng)
		}
		l.stats.skipped++
		return
	}
	l.stats.rounds[k%len(lineKinds)]++

	var wg sync.WaitGroup
	var ws []*Op
	queued := map[string]int{} // waiters sent, by name
	for i := 1; i <= lineWaiters; i++ {
		q := kind.waiters[i-1]
		name := lock + q.name
		w := mk(i, fmt.Sprintf("line-w%d", i), kAcquire, name)
		w.TTL, w.Wait, w.Limit = int64(lineTTL), int64(lineWait), kind.limit
		w.Shared, w.Subtree = q.shared, q.subtree
		ws = append(ws, w)
		queued[name]++
		wrng := rand.New(rand.NewPCG(l.seed, uint64(5000+k)<<8|uint64(i)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.api.acquire(w, wrng, opts)
			if w.Out == oOK {
				release(i, w, wrng) // the next in line is served only then
			}
		}()
		if !r.waitQueued(name, queued[name], rng.IntN(len(r.c.nodes)), 5*time.Second, l.abort) {
			break // the next one could not be known to come after it
		}
	}
	l.stats.joined += len(ws)
	for j, h := range hs {
		release(hslots[j], h, rng)
	}
	wg.Wait()

	granted, pairs, inOrder := lineOrder(ws)
	for _, w := range ws {
		if w.Out == oOK && w.Attempts > 1 {
			l.stats.retried++
		}
	}
	l.stats.granted += granted
	l.stats.pairs += pairs
	if !inOrder {
		var desc []string
		for _, w := range ws {
			desc = append(desc, w.String())
		}
		r.anomaly(anomaly{Kind: "fifo:order", What: fmt.Sprintf("%s: waiters that queued one after the other were granted out of order:\n    %s",
			lock, strings.Join(desc, "\n    "))})
	}
}

// lineOrder checks waiters listed in the order they joined a line: those
// granted must hold increasing tokens. It returns how many were granted and
// how many ordered pairs that made.
func lineOrder(ws []*Op) (granted, pairs int, inOrder bool) {
	var last uint64
	inOrder = true
	for _, w := range ws {
		if w.Out != oOK {
			continue
		}
		if w.OutToken <= last {
			inOrder = false
		}
		last = w.OutToken
		pairs += granted
		granted++
	}
	return granted, pairs, inOrder
}

// waitQueued polls GET /locks/<lock> until it shows at least n waiters, for
// up to within, starting at node first and moving on to the next node after
// every failed or short read; it reports whether it saw them. Any node's
// answer will do: the callers let only the waiters they count join the
// line, so a count of n anywhere means all n had queued.
func (r *runner) waitQueued(lock string, n, first int, within time.Duration, stop <-chan struct{}) bool {
	deadline := time.Now().Add(within)
	for node := first; time.Now().Before(deadline); node = (node + 1) % len(r.c.nodes) {
		var v struct {
			Waiters int `json:"waiters"`
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := getJSON(ctx, r.c.nodes[node].url()+lockPath(lock, ""), &v)
		cancel()
		if err == nil && v.Waiters >= n {
			return true
		}
		select {
		case <-time.After(50 * time.Millisecond):
		case <-stop:
			return false
		}
	}
	return false
}

func TestLineOrder(t *testing.T) {
	ok := func(tok uint64) *Op { return &Op{Out: oOK, OutToken: tok} }
	gone := &Op{Out: oWaitTimeout}
	lost := &Op{Out: oLost, OutToken: 3}
	for _, c := range []struct {
		name    string
		ws      []*Op
		granted int
		pairs   int
		inOrder bool
	}{
		{"all granted in turn", []*Op{ok(5), ok(6), ok(9)}, 3, 3, true},
		{"a later waiter first", []*Op{ok(6), ok(5), ok(9)}, 3, 3, false},
		{"the last before the first", []*Op{ok(9), ok(6), ok(5)}, 3, 3, false},
		{"a wait that ended is no witness", []*Op{gone, ok(6), ok(7)}, 2, 1, true},
		{"nor is a grant lost before it was answered", []*Op{ok(4), lost, ok(5)}, 2, 1, true},
		{"order is kept across a gap", []*Op{ok(8), gone, ok(5)}, 2, 1, false},
		{"one granted: nothing to order", []*Op{gone, ok(5), lost}, 1, 0, true},
		{"none", nil, 0, 0, true},
	} {
		g, p, in := lineOrder(c.ws)
		if g != c.granted || p != c.pairs || in != c.inOrder {
			t.Errorf("%s: got granted %d, pairs %d, in order %v; want %d, %d, %v", c.name, g, p, in, c.granted, c.pairs, c.inOrder)
		}
	}
}
