package chaos

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// lockSpec is a lock of the workload and the TTL its clients ask for.
type lockSpec struct {
	name string
	ttl  time.Duration
	// long locks have a TTL far beyond the run (600 s): they never expire, so
	// every grant and release on them is checked without expiry's leeway.
	// Their clients always release them (or take them over after a crash).
	long bool
	// The lock model (model locks): a counting lock's limit; rw: each
	// acquire is shared or exclusive at random; subtree: every grant
	// covers the names below.
	limit   int
	rw      bool
	subtree bool
}

// modelLocks are the locks of the lock model: a counting lock, a
// shared/exclusive one, and a subtree lock with locks inside it. Their
// grants overlap by design, so the one-holder checkers (holds, fence,
// linearizability, conflict holders) leave them to checkModelHolds.
func modelLocks() []lockSpec {
	return []lockSpec{
		{name: "sem/a", ttl: 2 * time.Second, limit: 3},
		{name: "rw/a", ttl: 2 * time.Second, rw: true},
		{name: "tree", ttl: 2 * time.Second, rw: true, subtree: true},
		{name: "tree/a", ttl: 1500 * time.Millisecond, rw: true},
		{name: "tree/b/c", ttl: 1500 * time.Millisecond},
	}
}

// isModelLock reports whether a lock is one of modelLocks, or of the lock
// model's lines under faults (lineKinds; a subtree line has a tree of its
// own, "sub/…", out of reach of the workload's subtree lock "tree").
func isModelLock(name string) bool {
	return strings.HasPrefix(name, "sem/") || strings.HasPrefix(name, "rw/") || name == "tree" || strings.HasPrefix(name, "tree/") ||
		strings.HasPrefix(name, "sub/")
}

const longTTL = 600 * time.Second

// buildLocks lists the workload's locks. With shards, the names spread over
// every shard's range of the default bounds (--shards 4: "", g, n, t by
// top-level segment): cold locks under four top-level segments, one in
// each range, hot locks in the last range (which the one-group names leave
// to the lock-model locks), and elections and session locks in every range.
func buildLocks(shards int) (hot, cold []lockSpec, sess []string) {
	hot = []lockSpec{
		{name: "hot/a", ttl: longTTL, long: true},
		{name: "hot/b", ttl: 1500 * time.Millisecond},
		{name: "hot/c", ttl: 3 * time.Second},
		{name: "hot/d", ttl: longTTL, long: true},
		{name: electionPrefix + "elect/a", ttl: 2 * time.Second},
		{name: electionPrefix + "elect/b", ttl: longTTL, long: true},
	}
	ttls := []time.Duration{1 * time.Second, 2 * time.Second, 4 * time.Second}
	if shards > 1 {
		hot = append(hot,
			lockSpec{name: "warm/a", ttl: longTTL, long: true},
			lockSpec{name: "warm/b", ttl: 2 * time.Second},
			lockSpec{name: electionPrefix + "vote/a", ttl: 2 * time.Second},
			// Elections in the two middle ranges too (elect/* is shard 0's).
			lockSpec{name: electionPrefix + "lead/a", ttl: 2 * time.Second},
			lockSpec{name: electionPrefix + "post/a", ttl: longTTL, long: true})
		segs := []string{"cold", "ice", "snow", "wind"} // shards 0, 1, 2, 3 of the default 4
		for i := range 40 {
			cold = append(cold, lockSpec{name: fmt.Sprintf("%s/%02d", segs[i%len(segs)], i), ttl: ttls[i%len(ttls)]})
		}
		sess = []string{"cell/0", "lane/0", "sess/0", "sess/1", "unit/0"}
		return hot, cold, sess
	}
	for i := range 40 {
		cold = append(cold, lockSpec{name: fmt.Sprintf("cold/%02d", i), ttl: ttls[i%len(ttls)]})
	}
	sess = []string{"sess/0", "sess/1", "sess/2"}
	return hot, cold, sess
}

// workload runs the clients.
type workload struct {
	clk *clock
	h   *history
	api *apiClient

	hot, cold []lockSpec
	model     []lockSpec
	sess      []string

	stopping chan struct{} // closed: finish the current job, clean up, return
	abort    chan struct{} // closed: give up at once
	clients  []*client
	wg       sync.WaitGroup

	pauses, crashes atomic.Int64
}

// client is one lock user. It runs one job at a time.
type client struct {
	w       *workload
	idx     int
	id      string
	inc     int
	seq     int
	rng     *rand.Rand
	session bool // a session client: holds sess/* locks under a session

	pauseCh chan time.Duration // the client-pause nemesis asks for a pause (a GC pause)
	crashCh chan time.Duration // the client-crash nemesis asks for a crash and restart

	// long locks whose grant may exist without the client knowing its lease
	// (an acquire without a definitive answer): until when to watch them
	cleanup map[string]int64

	// session state
	sid    string
	sttl   time.Duration
	sbound int64

	done chan struct{}
}

// belief is what a client believes it holds.
type belief struct {
	spec    lockSpec
	token   uint64
	lease   string
	session bool
	bound   int64 // it must stop using the lock at this run-clock time
	hd      *hold
}

func newWorkload(clk *clock, h *history, api *apiClient, seed uint64, nImplicit, nSession, shards int) *workload {
	w := &workload{clk: clk, h: h, api: api, stopping: make(chan struct{}), abort: make(chan struct{})}
	w.hot, w.cold, w.sess = buildLocks(shards)
	w.model = modelLocks()
	for i := range nImplicit + nSession {
		c := &client{
			w: w, idx: i, id: fmt.Sprintf("c%d", i),
			rng:     rand.New(rand.NewPCG(seed, uint64(1000+i))),
			session: i >= nImplicit,
			pauseCh: make(chan time.Duration, 1),
			crashCh: make(chan time.Duration, 1),
			cleanup: map[string]int64{},
			done:    make(chan struct{}),
		}
		if c.session {
			c.id = fmt.Sprintf("s%d", i-nImplicit)
		}
		w.clients = append(w.clients, c)
	}
	return w
}

func (w *workload) start() {
	for _, c := range w.clients {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			defer close(c.done)
			if c.session {
				c.runSession()
			} else {
				c.run()
			}
		}()
	}
}

// stop asks every client to finish and waits up to within; it returns the
// clients still running then.
func (w *workload) stop(within time.Duration) []string {
	close(w.stopping)
	// Closed, not sent on: every client still running at the deadline must
	// see it (a channel from time.After delivers once, and the second
	// stuck client waited for ever).
	expired := make(chan struct{})
	t := time.AfterFunc(within, func() { close(expired) })
	defer t.Stop()
	var stuck []string
	for _, c := range w.clients {
		select {
		case <-c.done:
		case <-expired:
			stuck = append(stuck, c.id)
		}
	}
	if len(stuck) > 0 {
		close(w.abort)
		w.wg.Wait()
	}
	return stuck
}

func (c *client) stopping() bool {
	select {
	case <-c.w.stopping:
		return true
	default:
		return false
	}
}

func (c *client) now() int64 { return c.w.clk.now() }

func (c *client) reqID() string {
	c.seq++
	return fmt.Sprintf("%s.%d.%d", c.id, c.inc, c.seq)
}

func (c *client) opts() callOpts {
	return callOpts{attempt: 2 * time.Second, overall: 60 * time.Second, stop: c.w.abort}
}

// sleep sleeps d (bounded by abort).
func (c *client) sleep(d time.Duration) {
	if d <= 0 {
		return
	}
	select {
	case <-time.After(d):
	case <-c.w.abort:
	}
}

func (c *client) jitter(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(c.rng.Int64N(int64(hi-lo)+1))
}

func (c *client) newOp(kind, lock string) *Op {
	return &Op{Proc: c.idx, Client: c.id, Inc: c.inc, Kind: kind, Lock: lock, ReqID: c.reqID()}
}

// endHold closes the client's belief at t.
func (c *client) endHold(b *belief, t int64, why string) {
	b.hd.End = min(t, b.bound)
	b.hd.Why = why
	c.w.h.addHold(b.hd)
}

func (c *client) pickLock() lockSpec {
	switch r := c.rng.IntN(100); {
	case r < 15:
		return c.w.model[c.rng.IntN(len(c.w.model))]
	case r < 70:
		return c.w.hot[c.rng.IntN(len(c.w.hot))]
	}
	return c.w.cold[c.rng.IntN(len(c.w.cold))]
}

// run is an implicit-lease client: acquire with ttl_ms, renew, release.
func (c *client) run() {
	for !c.stopping() {
		select {
		case d := <-c.crashCh:
			c.crash(nil, d)
			continue
		case d := <-c.pauseCh:
			c.sleep(d) // a pause while holding nothing: only a delay
		default:
		}
		c.runCleanup(false)
		switch r := c.rng.IntN(100); {
		case r < 12:
			c.get(c.pickLock().name)
		default:
			c.job(c.pickLock())
		}
	}
	c.runCleanup(true)
}

// get is a linearizable read of one lock.
func (c *client) get(lock string) *Op {
	op := c.newOp(kGet, lock)
	op.ReqID = ""
	c.w.api.get(op, c.rng, c.opts())
	return op
}

// job acquires one lock (trying, or waiting in line), holds it for a while —
// writing to its fenced register, renewing — and releases or abandons it.
func (c *client) job(spec lockSpec) {
	op := c.newOp(kAcquire, spec.name)
	op.TTL = int64(spec.ttl)
	if isElection(spec.name) {
		op.Value = fmt.Sprintf("%s@%d", c.id, c.seq)
	}
	if c.rng.IntN(100) < 40 {
		op.Wait = int64(c.jitter(500*time.Millisecond, 4*time.Second))
	}
	// Some acquires take over what an earlier incarnation of this client_id
	// left behind; the others wait for it or are refused like anyone.
	op.Takeover = c.rng.IntN(100) < 25
	op.Limit, op.Subtree = spec.limit, spec.subtree
	op.Shared = spec.rw && c.rng.IntN(100) < 60
	o := c.opts()
	if op.Wait > 0 {
		o.attempt = time.Second // plus the wait
	}
	c.w.api.acquire(op, c.rng, o)
	switch op.Out {
	case oOK:
		b := &belief{spec: spec, token: op.OutToken, lease: op.OutLease, bound: op.Call + int64(spec.ttl)}
		b.hd = &hold{Lock: spec.name, Client: c.id, Inc: c.inc, Token: op.OutToken, Lease: op.OutLease, Start: op.Return, GrantOp: op.ID,
			Limit: op.Limit, Shared: op.Shared, Subtree: op.Subtree}
		if op.Return >= b.bound {
			c.endHold(b, op.Return, "granted after its bound")
			return
		}
		c.hold(b)
	case oHeld:
		c.sleep(c.jitter(20*time.Millisecond, 200*time.Millisecond))
	case oUnknown:
		if spec.long {
			c.cleanup[spec.name] = c.now() + int64(time.Duration(op.Wait)+15*time.Second)
		}
	}
}

// hold is the holding loop shared by both kinds of client.
func (c *client) hold(b *belief) {
	var holdFor time.Duration
	if b.spec.long {
		holdFor = c.jitter(50*time.Millisecond, 800*time.Millisecond)
	} else {
		holdFor = time.Duration(float64(b.spec.ttl) * (0.1 + 1.0*c.rng.Float64()))
	}
	endAt := c.now() + int64(holdFor)
	for {
		if c.stopping() {
			c.finish(b)
			return
		}
		select {
		case d := <-c.crashCh:
			c.crash(b, d)
			return
		case d := <-c.pauseCh:
			c.pausedWrite(b, d)
			return
		default:
		}
		now := c.now()
		if now >= b.bound {
			c.lost(b, b.bound, "bound passed")
			return
		}
		// A model lock has several holders by design: its one register
		// would refuse all but the newest token.
		accepted, late := true, false
		if !isModelLock(b.spec.name) {
			accepted, late = c.w.h.fencedWrite(b.spec.name, c.id, c.inc, b.token, b.bound, false)
		}
		if late {
			c.lost(b, b.bound, "bound passed")
			return
		}
		if !accepted {
			// Someone with a newer token wrote while we were inside our bound:
			// the checker reports it; stop using the lock.
			c.endHold(b, c.now(), "fenced out")
			return
		}
		if now >= endAt {
			if !b.spec.long && !b.session && c.rng.IntN(100) < 15 {
				c.endHold(b, c.now(), "abandoned")
				return
			}
			c.release(b)
			return
		}
		if isElection(b.spec.name) && c.rng.IntN(100) < 15 {
			// A leader announces a new value.
			op := c.newOp(kProclaim, b.spec.name)
			op.Token, op.Lease, op.Value = b.token, b.lease, fmt.Sprintf("%s@%d", c.id, c.seq)
			c.w.api.releaseOrRenew(op, c.rng, c.opts())
			if op.Out == oNotHolder {
				c.endHold(b, op.Return, "proclaim: not_holder")
				return
			}
		}
		if b.bound-now < int64(b.spec.ttl/2) || (b.spec.long && c.rng.IntN(100) < 10) {
			if !c.renew(b) {
				return
			}
		}
		c.sleep(min(c.jitter(20*time.Millisecond, 100*time.Millisecond), time.Duration(b.bound-c.now())))
	}
}

// renew extends the belief's bound (a keepalive for a session hold); false
// when the hold ended.
func (c *client) renew(b *belief) bool {
	if b.session {
		if !c.keepAlive() {
			c.endHold(b, c.now(), "session lost")
			return false
		}
		if c.sbound <= b.bound {
			// The keepalive was answered too late: our bound passed meanwhile.
			c.lost(b, b.bound, "bound passed during keepalive")
			return false
		}
		b.bound = c.sbound
		return true
	}
	op := c.newOp(kRenew, b.spec.name)
	op.Token, op.Lease = b.token, b.lease
	c.w.api.releaseOrRenew(op, c.rng, c.opts())
	switch op.Out {
	case oOK:
		if op.Return >= b.bound {
			c.lost(b, b.bound, "bound passed during renew")
			return false
		}
		b.bound = max(b.bound, op.Call+int64(b.spec.ttl))
		return true
	case oNotHolder:
		c.endHold(b, op.Return, "renew: not_holder")
		return false
	default:
		// No answer: keep going until the old bound.
		return c.now() < b.bound
	}
}

// lost ends a hold whose bound passed; half the time the client still tries
// to release with its old token (the service must refuse it if someone else
// holds the lock, or free it if nobody took it).
func (c *client) lost(b *belief, at int64, why string) {
	c.endHold(b, at, why)
	if c.rng.IntN(2) == 0 {
		c.sendRelease(b)
	}
}

// release gives the lock back; the belief ends when the release is sent.
func (c *client) release(b *belief) {
	c.endHold(b, c.now(), "released")
	c.sendRelease(b)
}

func (c *client) sendRelease(b *belief) {
	op := c.newOp(kRelease, b.spec.name)
	op.Token, op.Lease = b.token, b.lease
	if b.session {
		op.Session = b.lease
	}
	c.w.api.releaseOrRenew(op, c.rng, c.opts())
	if op.Out == oUnknown && b.spec.long {
		c.cleanup[b.spec.name] = c.now() + int64(15*time.Second)
	}
}

// pausedWrite is the GC-pause story: the client checked its bound, decided to
// write, then stopped for d (longer than its TTL) and writes with its old
// token anyway. The fenced register must reject it if someone newer wrote.
// Then it wakes up, sees its bound passed and tries to renew.
func (c *client) pausedWrite(b *belief, d time.Duration) {
	if !b.spec.long {
		ttl := b.spec.ttl
		if b.session {
			ttl = c.sttl
		}
		d = max(d, time.Duration(float64(ttl)*(1.2+1.3*c.rng.Float64())))
	}
	c.w.pauses.Add(1)
	c.sleep(d)
	if !isModelLock(b.spec.name) {
		c.w.h.fencedWrite(b.spec.name, c.id, c.inc, b.token, b.bound, true)
	}
	now := c.now()
	if now < b.bound {
		// A pause shorter than the bound (long locks): carry on holding.
		c.hold(b)
		return
	}
	c.endHold(b, b.bound, "paused past its bound")
	if b.session {
		return
	}
	op := c.newOp(kRenew, b.spec.name)
	op.Token, op.Lease = b.token, b.lease
	c.w.api.releaseOrRenew(op, c.rng, c.opts())
	if op.Out == oOK {
		// Nobody took the lock meanwhile (the lease outlived the pause): give it back.
		c.sendRelease(b)
	}
}

// crash forgets everything (no release) and comes back d later as a new
// incarnation with the same client_id.
func (c *client) crash(b *belief, d time.Duration) {
	c.w.crashes.Add(1)
	if b != nil {
		c.endHold(b, c.now(), "crashed")
		if b.spec.long && !b.session {
			// Its successor takes the lock over (same client_id, new lease).
			c.cleanup[b.spec.name] = c.now() + int64(15*time.Second)
		}
	}
	if c.session {
		c.sid = "" // the session is forgotten and expires
	}
	c.sleep(d)
	c.inc++
}

// finish ends a hold when the workload stops: long locks are released, the
// others released or abandoned (their leases must then expire: the liveness
// check watches them).
func (c *client) finish(b *belief) {
	if b.spec.long || c.rng.IntN(2) == 0 {
		c.release(b)
		return
	}
	c.endHold(b, c.now(), "abandoned at stop")
}

// runCleanup resolves long locks whose grant the client may hold without
// knowing its lease: a read shows whether the lock is held by this client_id
// without the client knowing, and a takeover (same client_id, new lease) and
// release frees it. With final, it keeps going until every entry is resolved.
func (c *client) runCleanup(final bool) {
	for len(c.cleanup) > 0 {
		for lock, until := range c.cleanup {
			g := c.get(lock)
			switch {
			case g.Out == oOK && g.Held && g.HolderClient == c.id:
				op := c.newOp(kAcquire, lock)
				op.TTL = int64(longTTL)
				op.Takeover = true
				if isElection(lock) {
					op.Value = c.id + "@cleanup"
				}
				c.w.api.acquire(op, c.rng, c.opts())
				if op.Out == oOK {
					b := &belief{spec: lockSpec{name: lock, ttl: longTTL, long: true}, token: op.OutToken, lease: op.OutLease, bound: op.Call + int64(longTTL)}
					b.hd = &hold{Lock: lock, Client: c.id, Inc: c.inc, Token: op.OutToken, Lease: op.OutLease, Start: op.Return, GrantOp: op.ID}
					c.release(b)
				}
			case g.Out == oOK && c.now() > until:
				delete(c.cleanup, lock)
			}
		}
		if !final {
			return
		}
		select {
		case <-c.w.abort:
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// --- session clients ---

// runSession is a session client: one session at a time, locks sess/* held
// under it, keepalives, sometimes a delete or a session left to expire.
func (c *client) runSession() {
	for !c.stopping() {
		select {
		case d := <-c.crashCh:
			c.crash(nil, d)
			continue
		case d := <-c.pauseCh:
			c.sleep(d)
		default:
		}
		if c.sid == "" && !c.createSession() {
			c.sleep(c.jitter(50*time.Millisecond, 300*time.Millisecond))
			continue
		}
		if c.sbound-c.now() < int64(c.sttl/2) && !c.keepAlive() {
			continue
		}
		switch r := c.rng.IntN(100); {
		case r < 6:
			c.deleteSession()
		case r < 11:
			// Stop keeping it alive: it must expire; then a keepalive on it
			// must fail (or succeed if the lease outlived our bound).
			old := c.sid
			c.sid = ""
			c.sleep(time.Duration(c.sbound-c.now()) + c.jitter(c.sttl/2, 2*c.sttl))
			op := c.newOp(kKeepAlive, "")
			op.Session = old
			c.w.api.keepAliveOrDelete(op, c.rng, c.opts())
		case r < 20:
			c.get(c.w.sess[c.rng.IntN(len(c.w.sess))])
		default:
			c.sessionJob(c.w.sess[c.rng.IntN(len(c.w.sess))])
		}
	}
	if c.sid != "" && c.rng.IntN(2) == 0 {
		c.deleteSession()
	}
}

func (c *client) createSession() bool {
	op := c.newOp(kSessCreate, "")
	c.sttl = []time.Duration{2 * time.Second, 3 * time.Second, 4 * time.Second}[c.rng.IntN(3)]
	op.TTL = int64(c.sttl)
	c.w.api.createSession(op, c.rng, c.opts())
	if op.Out != oOK {
		return false
	}
	c.sid, c.sbound = op.Session, op.Call+int64(c.sttl)
	if op.Return >= c.sbound {
		c.sid = "" // answered after its own bound: useless, let it expire
		return false
	}
	return true
}

// keepAlive renews the session; false when it is gone (or was answered after
// the bound).
func (c *client) keepAlive() bool {
	op := c.newOp(kKeepAlive, "")
	op.Session = c.sid
	c.w.api.keepAliveOrDelete(op, c.rng, c.opts())
	switch op.Out {
	case oOK:
		if op.Return >= c.sbound {
			c.sid = ""
			return false
		}
		c.sbound = max(c.sbound, op.Call+int64(c.sttl))
		return true
	case oUnknown:
		if c.now() >= c.sbound {
			c.sid = ""
			return false
		}
		return true
	default:
		c.sid = ""
		return false
	}
}

func (c *client) deleteSession() {
	op := c.newOp(kSessDelete, "")
	op.Session = c.sid
	c.sid = ""
	c.w.api.keepAliveOrDelete(op, c.rng, c.opts())
}

func (c *client) sessionJob(lock string) {
	op := c.newOp(kAcquire, lock)
	op.Session = c.sid
	if c.rng.IntN(100) < 40 {
		op.Wait = int64(c.jitter(200*time.Millisecond, c.sttl/3))
	}
	op.Takeover = c.rng.IntN(100) < 25 // as job
	o := c.opts()
	if op.Wait > 0 {
		o.attempt = time.Second
	}
	c.w.api.acquire(op, c.rng, o)
	switch op.Out {
	case oOK:
		spec := lockSpec{name: lock, ttl: c.sttl}
		b := &belief{spec: spec, token: op.OutToken, lease: op.OutLease, session: true, bound: c.sbound}
		b.hd = &hold{Lock: lock, Client: c.id, Inc: c.inc, Token: op.OutToken, Lease: op.OutLease, Session: true, Start: op.Return, GrantOp: op.ID}
		if op.Return >= b.bound {
			c.endHold(b, op.Return, "granted after its bound")
			c.sendRelease(b)
			return
		}
		c.hold(b)
	case oNoSession:
		c.sid = ""
	case oHeld:
		c.sleep(c.jitter(20*time.Millisecond, 200*time.Millisecond))
	}
}
