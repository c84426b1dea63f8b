package state

import (
	"slices"
	"strings"

	"github.com/google/btree"

	"github.com/dlock/dlock/internal/command"
)

// This file holds the lock model beyond one exclusive holder: counting locks
// (Limit), shared grants and subtree grants, and the order in which waiters
// are let in.
//
// Conflicts. Two grants conflict unless both are shared, when their names
// overlap: the same name, or one is a subtree grant on an ancestor of the
// other's name. On one name the name's own rule decides: up to Limit
// exclusive holders, or any number of shared ones (Limit is then 1).
//
// Line order. Every waiter has a Place (its acquire's position in the log;
// a takeover keeps the place it takes over), and a lock's queue is in place
// order. A request is granted only if it conflicts with no grant and, for
// the line to hold, with no waiter ahead of it: on its own name, nobody may
// be ahead of it at all (strict FIFO; consecutive shared heads go
// together); on another name, no waiter with a smaller place whose request
// overlaps it in a conflicting mode. So a grant never jumps the line, and
// every waiter waits only for grants and for waiters ahead of it: the
// waits-for relation follows the places down, has no cycle, and each
// waiter is granted once the grants ahead end (leases end by themselves).
//
// Index. Checking a request costs O(depth · log n), never a walk of the
// held locks: the ancestors' own lock records say whether they have subtree
// holders; intent counts, per name prefix, the held grants strictly below it
// by mode (the intention locks of multi-granularity locking), so plain
// locks add no entry per lock (names sharing a prefix share its counter);
// and waitIdx, a B-tree over waiters only, finds the earliest waiter below
// a prefix and the earliest subtree waiter on a name.

// Grant is one holder of a lock, with its own fencing token.
type Grant struct {
	LeaseID   command.LeaseID
	Token     uint64
	GrantedAt int64
	// GrantSeq is the Seq of the acquire that was granted.
	GrantSeq uint64
	Subtree  bool
}

// lockExtra holds what most locks never have, so a plain held lock costs
// 64 bytes (docs/benchmarks.md).
type lockExtra struct {
	queue []Waiter
	value string
	// limit > 1 makes a counting lock.
	limit int32
	// shared: the holders hold in shared mode (false when none hold).
	shared bool
	// subtree: the first grant (the Lock's own fields) covers the subtree.
	subtree bool
	// more are the holders after the first, in grant (token) order.
	more []Grant
	// subtrees counts the holders with Subtree (derived).
	subtrees int32
	// delayMs is the (only) holder's lock-delay (Acquire.LockDelayMs).
	delayMs int64
	// A lock-delay in force: the token of the grant whose end began it
	// (0: none), and its end on the leader's wall clock (display) and on
	// the lease clock.
	delayToken uint64
	delayUntil int64
	delayClock int64
}

func (e *lockExtra) empty() bool {
	return len(e.queue) == 0 && e.value == "" && e.limit <= 1 && !e.shared && !e.subtree && len(e.more) == 0 &&
		e.delayMs == 0 && e.delayToken == 0
}

// ext returns the lock's extra record, making one if needed; tidy drops it
// again once it holds nothing.
func (l *Lock) ext() *lockExtra {
	if l.extra == nil {
		l.extra = &lockExtra{}
	}
	return l.extra
}

func (l *Lock) tidy() {
	if l.extra != nil && l.extra.empty() {
		l.extra = nil
	}
}

// Limit is the lock's limit: how many exclusive holders it admits at once.
func (l *Lock) Limit() int {
	if l.extra == nil || l.extra.limit <= 1 {
		return 1
	}
	return int(l.extra.limit)
}

// Shared reports whether the lock's holders hold it in shared mode.
func (l *Lock) Shared() bool { return l.extra != nil && l.extra.shared }

// NumHolders is the number of grants the lock has.
func (l *Lock) NumHolders() int {
	if !l.Held() {
		return 0
	}
	if l.extra == nil {
		return 1
	}
	return 1 + len(l.extra.more)
}

// grantAt is the i-th holder in grant order.
func (l *Lock) grantAt(i int) Grant {
	if i == 0 {
		return Grant{LeaseID: l.Holder, Token: l.Token, GrantedAt: l.GrantedAt, GrantSeq: l.GrantSeq, Subtree: l.extra != nil && l.extra.subtree}
	}
	return l.extra.more[i-1]
}

// Grants lists the holders in grant order.
func (l *Lock) Grants() []Grant {
	n := l.NumHolders()
	out := make([]Grant, n)
	for i := range out {
		out[i] = l.grantAt(i)
	}
	return out
}

// grantIndex is the position of the lease's grant, or -1.
func (l *Lock) grantIndex(id command.LeaseID) int {
	if !l.Held() {
		return -1
	}
	if l.Holder == id {
		return 0
	}
	if l.extra != nil {
		for i := range l.extra.more {
			if l.extra.more[i].LeaseID == id {
				return i + 1
			}
		}
	}
	return -1
}

func (l *Lock) subtreeHolders() int {
	if l.extra == nil {
		return 0
	}
	return int(l.extra.subtrees)
}

// firstSubtree is the oldest holder with Subtree.
func (l *Lock) firstSubtree() Grant {
	for i := range l.NumHolders() {
		if g := l.grantAt(i); g.Subtree {
			return g
		}
	}
	return Grant{}
}

// intentCount counts the grants held strictly below a name prefix.
type intentCount struct{ x, s int32 }

// The proper ancestors of a lock name, from the root down ("a", then
// "a/b", for "a/b/c"), are name[:i] for i = firstParent(name), then
// nextParent(name, i), while i >= 0; elections have none. (Loops rather
// than a callback: apply's hot path must not allocate closures.)
func firstParent(name string) int {
	if _, election := command.SplitKey(name); election {
		return -1
	}
	return strings.IndexByte(name, '/')
}

func nextParent(name string, i int) int {
	j := strings.IndexByte(name[i+1:], '/')
	if j < 0 {
		return -1
	}
	return i + 1 + j
}

// ancestors calls f with each proper ancestor of a lock name, from the root
// down, until f returns false.
func ancestors(name string, f func(a string) bool) {
	for i := firstParent(name); i >= 0 && f(name[:i]); i = nextParent(name, i) {
	}
}

// lock finds a lock in apply's paths without allocating a key (reads, which
// may run side by side, use their own).
func (s *State) lock(name string) *Lock {
	s.probe.Name = name
	lk, _ := s.locks.Get(&s.probe)
	s.probe.Name = ""
	return lk
}

func (s *State) intentAdd(name string, shared bool, d int32) {
	for i := firstParent(name); i >= 0; i = nextParent(name, i) {
		a := name[:i]
		c := s.intent[a]
		if shared {
			c.s += d
		} else {
			c.x += d
		}
		if c == (intentCount{}) {
			delete(s.intent, a)
		} else {
			s.intent[a] = c
		}
	}
}

// Kinds of waitIdx items.
const (
	wBelowX uint8 = iota // key: an ancestor of an exclusive waiter's name
	wBelowS              // key: an ancestor of a shared waiter's name
	wSubX                // key: the name of an exclusive subtree waiter
	wSubS                // key: the name of a shared subtree waiter
)

// waitItem is one waiter in waitIdx, under one key.
type waitItem struct {
	key   string
	kind  uint8
	place uint64
	name  string // the waiter's lock
}

func waitItemLess(a, b waitItem) bool {
	if a.key != b.key {
		return a.key < b.key
	}
	if a.kind != b.kind {
		return a.kind < b.kind
	}
	if a.place != b.place {
		return a.place < b.place
	}
	return a.name < b.name
}

func newWaitIdx() *btree.BTreeG[waitItem] { return btree.NewG(16, waitItemLess) }

// waitIndex adds (d true) or removes a waiter's items.
func (s *State) waitIndex(name string, w *Waiter, add bool) {
	put := func(it waitItem) {
		if add {
			s.waitIdx.ReplaceOrInsert(it)
		} else {
			s.waitIdx.Delete(it)
		}
	}
	below := wBelowX
	if w.Shared {
		below = wBelowS
	}
	for i := firstParent(name); i >= 0; i = nextParent(name, i) {
		put(waitItem{key: name[:i], kind: below, place: w.Place, name: name})
	}
	if w.Subtree {
		sub := wSubX
		if w.Shared {
			sub = wSubS
		}
		put(waitItem{key: name, kind: sub, place: w.Place, name: name})
	}
}

// waitBefore reports whether waitIdx has an item of this key and kind with a
// place before place.
func (s *State) waitBefore(key string, kind uint8, place uint64) bool {
	found := false
	s.waitIdx.AscendGreaterOrEqual(waitItem{key: key, kind: kind}, func(it waitItem) bool {
		found = it.key == key && it.kind == kind && it.place < place
		return false
	})
	return found
}

// request is what a request asks for, for the conflict check.
type request struct {
	name    string
	shared  bool
	subtree bool
	// place: waiters with a smaller place are ahead of it.
	place uint64
}

// blocker says why a request must wait: a lock with a grant in its way
// (lk, with below when the grant is inside the subtree asked for, to be
// found by heldBelow), or, with lk nil, only waiters ahead of it.
type blocker struct {
	lk    *Lock
	below bool
}

// blocked reports whether r must wait. lk is the request's own lock (nil if
// the table has none); fresh is a new request, which waits behind anyone in
// its own lock's queue (a waiter being let in is that queue's head).
func (s *State) blocked(lk *Lock, r request, fresh bool) (bool, blocker) {
	if lk != nil {
		if n := lk.NumHolders(); n > 0 && (r.shared != lk.Shared() || (!r.shared && n >= lk.Limit())) {
			return true, blocker{lk: lk}
		}
		if fresh && len(lk.Queue()) > 0 {
			if lk.Held() {
				return true, blocker{lk: lk}
			}
			return true, blocker{}
		}
	}
	for i := firstParent(r.name); i >= 0; i = nextParent(r.name, i) {
		a := r.name[:i]
		if alk := s.lock(a); alk != nil && alk.subtreeHolders() > 0 && !(r.shared && alk.Shared()) {
			return true, blocker{lk: alk}
		}
		if s.waitBefore(a, wSubX, r.place) || (!r.shared && s.waitBefore(a, wSubS, r.place)) {
			return true, blocker{}
		}
	}
	if r.subtree {
		if c := s.intent[r.name]; c.x > 0 || (!r.shared && c.s > 0) {
			return true, blocker{below: true}
		}
		if s.waitBefore(r.name, wBelowX, r.place) || (!r.shared && s.waitBefore(r.name, wBelowS, r.place)) {
			return true, blocker{}
		}
	}
	return false, blocker{}
}

// heldBelow finds a grant inside name's subtree that conflicts with a
// request in the given mode (for the refusal's holder): the first in name
// order.
func (s *State) heldBelow(name string, shared bool) *Lock {
	var found *Lock
	s.locks.AscendRange(&Lock{Name: name + "/"}, &Lock{Name: name + "0"}, func(lk *Lock) bool {
		if lk.Held() && !(shared && lk.Shared()) {
			found = lk
			return false
		}
		return true
	})
	return found
}

// refusal is the StatusLockHeld answer to r: the grant in its way, if a
// grant is (only waiters ahead of it may be), with the name that grant is on
// when it is another one.
func (s *State) refusal(r request, by blocker) command.Result {
	res := command.Result{Status: command.StatusLockHeld}
	lk := by.lk
	if by.below {
		lk = s.heldBelow(r.name, r.shared)
	}
	if lk == nil || !lk.Held() {
		return res
	}
	g := lk.grantAt(0)
	if lk.Name != r.name && !by.below {
		g = lk.firstSubtree()
	}
	h := s.holderOf(lk, g)
	res.Holder, res.HolderShared, res.HolderSubtree = h.Holder, h.Shared, h.Subtree
	if lk.Name != r.name {
		res.Message = lk.Name
	}
	return res
}

// Holder is one holder of a lock as others see it.
type Holder struct {
	command.Holder
	Shared, Subtree bool
}

func (s *State) holderOf(lk *Lock, g Grant) Holder {
	l := s.leases[g.LeaseID]
	return Holder{Holder: command.Holder{ClientID: l.ClientID, Token: g.Token, GrantedAt: g.GrantedAt, ExpiresAt: l.ExpiresAt()},
		Shared: lk.Shared(), Subtree: g.Subtree}
}

// addGrant makes g a holder of lk in the given mode.
func (s *State) addGrant(lk *Lock, g Grant, shared bool) {
	s.lockOut(lk)
	if !lk.Held() {
		lk.Holder, lk.Token, lk.GrantedAt, lk.GrantSeq = g.LeaseID, g.Token, g.GrantedAt, g.GrantSeq
		if shared || g.Subtree {
			e := lk.ext()
			e.shared, e.subtree = shared, g.Subtree
		}
	} else {
		e := lk.ext()
		e.more = append(e.more, g)
	}
	if g.Subtree {
		lk.ext().subtrees++
	}
	s.lockIn(lk)
	s.intentAdd(lk.Name, shared, 1)
}

// removeGrant takes the i-th holder away; the next one moves up.
func (s *State) removeGrant(lk *Lock, i int) Grant {
	g := lk.grantAt(i)
	shared := lk.Shared()
	s.lockOut(lk)
	e := lk.extra
	switch {
	case i > 0:
		e.more = slices.Delete(e.more, i-1, i)
	case e != nil && len(e.more) > 0:
		n := e.more[0]
		lk.Holder, lk.Token, lk.GrantedAt, lk.GrantSeq = n.LeaseID, n.Token, n.GrantedAt, n.GrantSeq
		e.subtree = n.Subtree
		e.more = slices.Delete(e.more, 0, 1)
	default:
		lk.Holder, lk.Token, lk.GrantedAt, lk.GrantSeq = command.LeaseID{}, 0, 0, 0
		if e != nil {
			e.subtree, e.shared = false, false
		}
	}
	if e != nil {
		if g.Subtree {
			e.subtrees--
		}
		if len(e.more) == 0 && e.more != nil {
			e.more = nil
		}
	}
	lk.tidy()
	s.lockIn(lk)
	s.intentAdd(lk.Name, shared, -1)
	return g
}

// wake lets in, in line order, every waiter that the end of a grant or a
// wait on name may have let through: the head of name's own queue (with the
// heads after it while they fit), the heads of its ancestors' queues (a
// subtree waiter there may have waited for it), and, when what ended covered
// name's subtree (below), the heads of every queue inside it. Letting one in
// never lets another through (it now holds what it waited with), so one pass
// in place order settles them all. Then name's lock goes if it is unused.
func (s *State) wake(name string, below bool) {
	cands := s.cands[:0]
	defer func() {
		clear(cands)
		s.cands = cands[:0]
	}()
	add := func(lk *Lock) {
		if lk != nil && len(lk.Queue()) > 0 && !slices.Contains(cands, lk) {
			cands = append(cands, lk)
		}
	}
	add(s.lock(name))
	for i := firstParent(name); i >= 0; i = nextParent(name, i) {
		add(s.lock(name[:i]))
	}
	if below {
		var names []string
		for _, kind := range []uint8{wBelowX, wBelowS} {
			s.waitIdx.AscendGreaterOrEqual(waitItem{key: name, kind: kind}, func(it waitItem) bool {
				if it.key != name || it.kind != kind {
					return false
				}
				names = append(names, it.name)
				return true
			})
		}
		slices.Sort(names)
		for _, n := range slices.Compact(names) {
			add(s.lock(n))
		}
	}
	slices.SortFunc(cands, func(a, b *Lock) int {
		pa, pb := a.Queue()[0].Place, b.Queue()[0].Place
		switch {
		case pa < pb:
			return -1
		case pa > pb:
			return 1
		}
		return 0
	})
	for _, lk := range cands {
		for len(lk.Queue()) > 0 && s.letIn(lk) {
		}
	}
	if lk := s.lock(name); lk != nil && !lk.Held() && len(lk.Queue()) == 0 && !lk.delayed() {
		s.deleteLock(lk)
	}
}

// letIn grants the head of lk's queue if nothing stands in its way.
func (s *State) letIn(lk *Lock) bool {
	if lk.delayed() {
		return false // until the leader commits the delay's end
	}
	w := lk.Queue()[0]
	if blocked, _ := s.blocked(lk, request{name: lk.Name, shared: w.Shared, subtree: w.Subtree, place: w.Place}, false); blocked {
		return false
	}
	s.queueRemove(lk, 0)
	lease := s.leases[w.LeaseID]
	if lease == nil {
		return true // cannot happen: waits end with their lease
	}
	lease.Waits().Delete(lk.Name)
	s.emit(Event{Type: EventWaitGone, Name: lk.Name, LeaseID: w.LeaseID, Seq: w.Seq})
	s.grant(lk, lease, w.Seq, w.Value, CauseHandoff, w.Shared, w.Subtree, w.LockDelayMs)
	s.rememberGrant(w, lk, lease)
	return true
}
