// Package state is dlock's replicated state as a pure, deterministic value: locks
// with their FIFO wait queues, leases (implicit per-acquire leases and explicit
// sessions), the fencing-token and revision counters, cluster member metadata and
// the request dedup table. It knows nothing of Raft, clocks or randomness: every
// input, including the time, comes in the command, so every replica that applies
// the same log reaches byte-identical state.
package state

import (
	"strconv"
	"strings"

	"github.com/google/btree"

	"github.com/dlock/dlock/internal/command"
)

// Lease is the unit of liveness: when it ends, its locks are released and its
// waits dropped.
type Lease struct {
	ID       command.LeaseID
	ClientID string
	// TTLms is at most command.MaxTTLms; an int32 keeps Lease in the
	// 96-byte size class (TestHeldLockStructsStaySmall).
	TTLms int32
	// Session is true for explicit sessions; false for the implicit one-lock
	// lease an acquire with ttl_ms creates.
	Session bool
	// Active is true while the TTL runs: always for sessions, and for an implicit
	// lease once its lock is granted (its TTL counts from the grant).
	Active bool
	// Gen increases on every renewal, so an Expire proposed before a renewal
	// cannot end the renewed lease.
	Gen uint64
	// RenewedAt is the leader timestamp of the last grant or renewal, for
	// display.
	RenewedAt int64
	// RenewedClock is the lease clock (command.Envelope.Clock) at the last
	// grant or renewal: the time left is TTLms minus the lease-clock time
	// since, which never mixes two leaders' wall clocks.
	RenewedClock int64
	// names are the locks the lease holds (number 0) and waits for (the
	// wait's sequence, never 0): a lease never holds and waits for one lock,
	// so one set serves both (Locks, Waits).
	names NameSet
}

// Locks are the locks the lease holds.
func (l *Lease) Locks() LeaseNames { return LeaseNames{set: &l.names, held: true} }

// Waits are the locks the lease waits for, each with the wait's sequence.
func (l *Lease) Waits() LeaseNames { return LeaseNames{set: &l.names} }

// ExpiresAt is the display expiry in leader wall-clock milliseconds.
func (l *Lease) ExpiresAt() int64 {
	if !l.Active {
		return 0
	}
	return l.RenewedAt + int64(l.TTLms)
}

// Waiter is one queued acquire.
type Waiter struct {
	LeaseID  command.LeaseID
	ClientID string
	// Seq names the acquire that queued (command.Seq); it names this wait.
	Seq uint64
	// Place is the waiter's place in line across every lock: the log
	// position of the acquire that queued (a takeover keeps the place it
	// takes over). A queue is in place order.
	Place      uint64
	EnqueuedAt int64
	// Deadline is the leader timestamp at which the wait times out, for
	// display; ClockDeadline is the same moment on the lease clock, which
	// decides.
	Deadline      int64
	ClockDeadline int64
	// Value is an election campaigner's value, set as the lock's on grant.
	Value string
	// RequestID is the acquire's request id. When the wait is granted, the
	// dedup entry of that request is updated to the grant, so a retry of it
	// learns it was granted even after the grant has ended.
	RequestID string
	// LockDelayMs is the acquire's lock-delay, the grant's once granted.
	LockDelayMs int64
	// Shared and Subtree are what the acquire asked for.
	Shared, Subtree bool
}

// Lock is a named lock. It exists in the table while held or waited for.
// Its own fields are its first holder (in grant order); the others, the
// limit and the mode live in extra (lockmodel.go).
type Lock struct {
	Name      string
	Holder    command.LeaseID
	Token     uint64
	GrantedAt int64
	// GrantSeq is the Seq of the acquire that was granted.
	GrantSeq uint64
	// extra holds what most locks never have — waiters, an election's value,
	// more holders, a limit, a mode — so a held lock costs 64 bytes rather
	// than 96 (docs/benchmarks.md).
	extra *lockExtra
}

// Held reports whether some lease holds the lock.
func (l *Lock) Held() bool { return !l.Holder.IsZero() }

// Queue is the lock's FIFO wait queue (the slice is the lock's own).
func (l *Lock) Queue() []Waiter {
	if l.extra == nil {
		return nil
	}
	return l.extra.queue
}

// Value is an election leader's value (empty for plain locks).
func (l *Lock) Value() string {
	if l.extra == nil {
		return ""
	}
	return l.extra.value
}

func (l *Lock) setQueue(q []Waiter) {
	if len(q) == 0 && l.extra == nil {
		return
	}
	if len(q) == 0 {
		q = nil
	}
	l.ext().queue = q
	l.tidy()
}

func (l *Lock) setValue(v string) {
	if v == "" && l.extra == nil {
		return
	}
	l.ext().value = v
	l.tidy()
}

// lockDelayMs is the current grant's lock-delay (only a lock of limit 1,
// held exclusively and not as a subtree, may have one).
func (l *Lock) lockDelayMs() int64 {
	if l.extra == nil {
		return 0
	}
	return l.extra.delayMs
}

// Delayed reports whether a lock-delay keeps the lock from everyone, and
// until when (leader wall clock, display) and which grant's end began it.
func (l *Lock) Delayed() (until int64, token uint64, ok bool) {
	if l.extra == nil || l.extra.delayToken == 0 {
		return 0, 0, false
	}
	return l.extra.delayUntil, l.extra.delayToken, true
}

func (l *Lock) delayed() bool { return l.extra != nil && l.extra.delayToken != 0 }

func (l *Lock) setDelayMs(ms int64) {
	if ms == 0 && l.extra == nil {
		return
	}
	l.ext().delayMs = ms
	l.tidy()
}

func (l *Lock) setDelay(token uint64, until, clock int64) {
	if token == 0 && l.extra == nil {
		return
	}
	e := l.ext()
	e.delayToken, e.delayUntil, e.delayClock = token, until, clock
	l.tidy()
}

// Member is a node's advertised addresses.
type Member struct {
	ID       string
	RaftAddr string
	APIAddr  string
	Version  string // the build the member runs (snapshot version 7)
}

// State is the whole replicated state. The zero value is not usable; call New.
type State struct {
	index uint64
	ts    int64
	// clock is the lease clock: the largest command.Envelope.Clock applied.
	clock     int64
	revision  uint64
	lastToken uint64
	locks     *btree.BTreeG[*Lock]
	leases    map[command.LeaseID]*Lease
	members   map[string]Member
	tokenKeys []TokenKey // oldest first; the newest may be current

	aclTokens   map[[16]byte]*ACLToken
	aclBySecret map[[32]byte][16]byte
	aclByCN     map[string][16]byte

	dedup     map[dedupKey]int // key -> position in dedupRing
	dedupRing dedupRing

	hist history
	// shard is the range this state owns, its splits and the meta map (shard.go).
	shard shardState
	// lost holds, per session, the grants it lost while it lived (lost.go).
	lost map[command.LeaseID][]LostGrant

	// sum is the sum of every record's hash, kept up to date by each
	// mutation (digest.go) with rh, whose buffer only apply uses.
	sum uint64
	rh  recordHasher

	events  []Event
	changed bool

	// Derived, rebuilt on restore (lockmodel.go): grants below each name
	// prefix, the waiters' index, and the place in line of the command
	// being applied.
	intent  map[string]intentCount
	waitIdx *btree.BTreeG[waitItem]
	place   uint64
	// keepLost: the command being applied is of a version whose sessions
	// remember the grants they lose (command.Envelope.RemembersLostGrants).
	keepLost bool
	// probe and cands are apply's scratch (lock, wake).
	probe Lock
	cands []*Lock
}

func lockLess(a, b *Lock) bool { return a.Name < b.Name }

// New returns an empty state.
func New() *State {
	return &State{
		locks:   btree.NewG(32, lockLess),
		leases:  make(map[command.LeaseID]*Lease),
		members: make(map[string]Member),
		dedup:   make(map[dedupKey]int),

		aclTokens:   make(map[[16]byte]*ACLToken),
		aclBySecret: make(map[[32]byte][16]byte),
		aclByCN:     make(map[string][16]byte),

		hist:    newHistory(),
		intent:  make(map[string]intentCount),
		waitIdx: newWaitIdx(),
	}
}

// placeOf orders commands by their position in the log (command.Seq does
// not: a packed entry's later commands get Seqs above any index).
func placeOf(index, seq uint64) uint64 { return index<<16 | (seq-index)>>48 }

// Index is the Raft index of the last applied entry.
func (s *State) Index() uint64 { return s.index }

// LastTS is the leader timestamp of the last applied command.
func (s *State) LastTS() int64 { return s.ts }

// LeaseClock is the lease clock as of the newest applied command: a new
// leader counts on from it (command.Envelope.Clock).
func (s *State) LeaseClock() int64 { return s.clock }

// Revision is the number of state changes so far.
func (s *State) Revision() uint64 { return s.revision }

// LastToken is the last fencing token granted.
func (s *State) LastToken() uint64 { return s.lastToken }

// SetIndex records the Raft index of an entry that carried no command (for
// example a configuration change), so Index always matches the log.
func (s *State) SetIndex(index uint64) {
	if index > s.index {
		s.index = index
	}
}

// Apply applies the lone command of the log entry at index and returns its
// result. Events it produced are collected with TakeEvents.
func (s *State) Apply(index uint64, e *command.Envelope) command.Result {
	return s.ApplyAt(index, index, e)
}

// ApplyAt applies one command of the log entry at index; seq names the command
// (command.Seq: its index, or its place in a packed entry) and becomes the Seq
// of the acquire it may be.
func (s *State) ApplyAt(index, seq uint64, e *command.Envelope) command.Result {
	s.SetIndex(index)
	s.place = placeOf(index, seq)
	s.keepLost = e.RemembersLostGrants()
	// The leader never lets timestamps go backwards, but a log is input: keep the
	// invariant here too so remaining-time arithmetic can rely on it.
	if e.TS > s.ts {
		s.ts = e.TS
	}
	if e.Clock > s.clock {
		s.clock = e.Clock
	}
	if s.wrongShard(e) {
		return command.Result{Status: command.StatusWrongShard, Revision: s.revision}
	}
	var key dedupKey
	if e.RequestID != "" {
		key = dedupKey{e.ClientID, e.RequestID}
		if pos, ok := s.dedup[key]; ok {
			r := s.dedupRing.at(pos).result
			r.Replayed = true
			return r
		}
	}
	s.changed = false
	r := s.dispatch(seq, e)
	if s.changed {
		s.revision++
	}
	r.Revision = s.revision
	// A queue_full refusal changed nothing and holds only while the queue is
	// full: it is not remembered, so a retry of the request (clients retry a
	// 429) is judged afresh instead of being refused for ever.
	if e.RequestID != "" && r.Status != command.StatusQueueFull {
		s.remember(key, r)
	}
	return r
}

// rememberGrant turns the dedup entry of a granted wait's request from
// "queued" into the grant. A retry of that request (its first answer was lost)
// is then told the truth even once the wait is gone: it was granted, with this
// token — and if the grant has ended since, the service can say so instead of
// mistaking it for a timeout.
func (s *State) rememberGrant(w Waiter, lk *Lock, lease *Lease) {
	if w.RequestID == "" {
		return
	}
	pos, ok := s.dedup[dedupKey{w.ClientID, w.RequestID}]
	if !ok {
		return // forgotten already: the table is bounded
	}
	e := s.dedupRing.at(pos)
	if e.result.Status != command.StatusQueued || e.result.LeaseID != lease.ID || e.result.Seq != w.Seq {
		return
	}
	s.dedupOut(pos)
	e.result = command.Result{Status: command.StatusOK, LeaseID: lease.ID, Token: lk.grantAt(lk.grantIndex(lease.ID)).Token,
		ExpiresAt: lease.ExpiresAt(), TTLms: int64(lease.TTLms), Seq: w.Seq, Revision: e.result.Revision}
	s.dedupIn(pos)
}

func (s *State) dispatch(seq uint64, e *command.Envelope) command.Result {
	switch b := e.Body.(type) {
	case *command.RegisterMember:
		return s.registerMember(b)
	case *command.CreateSession:
		return s.createSession(e, b)
	case *command.KeepAlive:
		return s.keepAlive(e, b)
	case *command.DeleteSession:
		return s.deleteSession(e, b)
	case *command.Acquire:
		return s.acquire(seq, e, b)
	case *command.Release:
		return s.release(e, b)
	case *command.Renew:
		return s.renew(e, b)
	case *command.ExpireLeases:
		return s.expireLeases(b)
	case *command.ExpireWaits:
		return s.expireWaits(b)
	case *command.CancelWait:
		return s.cancelWait(b)
	case *command.Proclaim:
		return s.proclaim(e, b)
	case *command.SetTokenKey:
		return s.setTokenKey(b)
	case *command.SetACLToken:
		_, existed := s.aclTokens[b.AccessorID]
		return s.aclChanged(existed, b.AccessorID, s.setACLToken(e, b))
	case *command.DeleteACLToken:
		return s.aclChanged(true, b.AccessorID, s.deleteACLToken(b))
	case *command.Tick:
		// Only the lease clock moves (above); nothing a reader sees changes.
		return command.Result{Status: command.StatusOK}
	case *command.Revoke:
		return s.revoke(b)
	case *command.SetHistoryRetention:
		return s.setHistoryRetention(b)
	case *command.TrimHistory:
		return s.trimHistory()
	case *command.EndLockDelay:
		return s.endLockDelay(b)
	case *command.Split:
		return s.split(s.index, b, b.From, b.To)
	case *command.SetShardMap:
		return s.setShardMap(e, b)
	}
	return invalid("unknown command")
}

func invalid(msg string) command.Result {
	return command.Result{Status: command.StatusInvalid, Message: msg}
}

func validTTL(ttl int64) bool { return ttl >= command.MinTTLms && ttl <= command.MaxTTLms }

func (s *State) registerMember(b *command.RegisterMember) command.Result {
	if b.ID == "" {
		return invalid("member id is empty")
	}
	if len(b.Version) > command.MaxMemberVersionLen {
		return invalid("member version too long")
	}
	m := Member(*b)
	if old, ok := s.members[b.ID]; !ok || old != m {
		s.setMember(m)
		s.changed = true
	}
	return command.Result{Status: command.StatusOK}
}

func (s *State) createSession(e *command.Envelope, b *command.CreateSession) command.Result {
	if !validTTL(b.TTLms) {
		return invalid("ttl_ms out of range")
	}
	if b.LeaseID.IsZero() || s.leases[b.LeaseID] != nil {
		return invalid("lease id missing or already in use")
	}
	l := &Lease{ID: b.LeaseID, ClientID: e.ClientID, TTLms: int32(b.TTLms), Session: true, Active: true,
		RenewedAt: s.ts, RenewedClock: s.clock}
	s.addLease(l)
	s.touch(l)
	s.emit(Event{Type: EventSessionCreated, ClientID: l.ClientID})
	return command.Result{Status: command.StatusOK, LeaseID: l.ID, TTLms: int64(l.TTLms), ExpiresAt: l.ExpiresAt()}
}

func (s *State) keepAlive(e *command.Envelope, b *command.KeepAlive) command.Result {
	l := s.leases[b.LeaseID]
	if l == nil || !l.Session || (e.ClientID != "" && e.ClientID != l.ClientID) {
		return command.Result{Status: command.StatusSessionNotFound}
	}
	s.touch(l)
	return command.Result{Status: command.StatusOK, LeaseID: l.ID, TTLms: int64(l.TTLms), ExpiresAt: l.ExpiresAt()}
}

func (s *State) deleteSession(e *command.Envelope, b *command.DeleteSession) command.Result {
	l := s.leases[b.LeaseID]
	if l == nil || !l.Session || (e.ClientID != "" && e.ClientID != l.ClientID) {
		return command.Result{Status: command.StatusSessionNotFound}
	}
	s.endLease(l, CauseSessionDeleted)
	return command.Result{Status: command.StatusOK}
}

func (s *State) acquire(seq uint64, e *command.Envelope, b *command.Acquire) command.Result {
	name := b.Name
	if !command.ValidKey(name) {
		return invalid("bad lock name")
	}
	_, election := command.SplitKey(name)
	if len(b.Value) > command.MaxValueLen || (b.Value != "" && !election && !e.ValueOnLocks()) {
		return invalid("value too long, or given for a lock (only elections carry values)")
	}
	if b.WaitMs < 0 || b.WaitMs > command.MaxWaitMs {
		return invalid("wait_ms out of range")
	}
	if b.LockDelayMs < 0 || b.LockDelayMs > command.MaxLockDelayMs {
		return invalid("lock_delay_ms out of range")
	}
	limit := max(b.Limit, 1)
	switch {
	case b.Limit < 0 || b.Limit > command.MaxLimit:
		return invalid("limit out of range")
	case election && (limit != 1 || b.Shared || b.Subtree):
		return invalid("an election has one leader: limit, shared and subtree are for locks")
	case b.Shared && limit != 1:
		return invalid("a counting lock (limit above 1) is exclusive only")
	case b.LockDelayMs != 0 && (limit != 1 || b.Shared || b.Subtree):
		return invalid("lock_delay_ms is for a lock of limit 1 held exclusively, not as a subtree")
	}
	var lease *Lease
	if b.Session {
		lease = s.leases[b.LeaseID]
		if lease == nil || !lease.Session || lease.ClientID != e.ClientID {
			return command.Result{Status: command.StatusSessionNotFound}
		}
	} else {
		if !validTTL(b.TTLms) {
			return invalid("ttl_ms out of range")
		}
		if b.LeaseID.IsZero() || s.leases[b.LeaseID] != nil {
			return invalid("lease id missing or already in use")
		}
	}
	lk, _ := s.locks.Get(&Lock{Name: name})
	// The lock in use keeps the limit it was first taken with.
	if lk != nil && int64(lk.Limit()) != limit {
		return command.Result{Status: command.StatusLimitMismatch, Limit: int32(lk.Limit())}
	}

	// The same lease already holds it: idempotent, same token, lease refreshed.
	if i := -1; lk != nil && lease != nil {
		if i = lk.grantIndex(lease.ID); i >= 0 {
			g := lk.grantAt(i)
			if g.Subtree != b.Subtree || lk.Shared() != b.Shared {
				return invalid("this lease already holds the lock in another mode; release it first")
			}
			s.touch(lease)
			if lk.Value() != b.Value {
				// Campaigning again with a new value proclaims it, as in
				// etcd; acquiring a lock again with a new value sets it.
				s.setLockValue(lk, b.Value)
				s.emitValue(lk, lease, g.Token, election)
			}
			return command.Result{Status: command.StatusOK, LeaseID: lease.ID, Token: g.Token,
				ExpiresAt: lease.ExpiresAt(), TTLms: int64(lease.TTLms), Seq: g.GrantSeq}
		}
	}
	// The same lease already waits for it: idempotent, same place. A
	// campaigner that campaigns again with a new value keeps its place and
	// takes office with the new value, as a holder's re-campaign proclaims it.
	if lease != nil {
		if waitSeq, ok := lease.Waits().Get(name); ok {
			q := lk.Queue()
			for i := range q {
				if q[i].LeaseID != lease.ID {
					continue
				}
				if q[i].Shared != b.Shared || q[i].Subtree != b.Subtree {
					return invalid("this lease already waits for the lock in another mode; cancel that wait first")
				}
				if q[i].Value != b.Value || q[i].LockDelayMs != b.LockDelayMs {
					w := q[i]
					w.Value, w.LockDelayMs = b.Value, b.LockDelayMs
					s.queueReplace(lk, i, w)
					s.changed = true
				}
			}
			return command.Result{Status: command.StatusQueued, LeaseID: lease.ID, TTLms: int64(lease.TTLms), Seq: waitSeq}
		}
	}

	newLease := func(active bool) *Lease {
		l := &Lease{ID: b.LeaseID, ClientID: e.ClientID, TTLms: int32(b.TTLms), Active: active,
			RenewedAt: s.ts, RenewedClock: s.clock}
		s.addLease(l)
		return l
	}
	ok := func() command.Result {
		g := lk.grantAt(lk.grantIndex(lease.ID))
		return command.Result{Status: command.StatusOK, LeaseID: lease.ID, Token: g.Token,
			ExpiresAt: lease.ExpiresAt(), TTLms: int64(lease.TTLms), Seq: g.GrantSeq}
	}

	// The same client with a new lease asked to take over: its previous
	// incarnation crashed and it came back. Take its grant over at once,
	// with a new token (the grant must be in the same mode, so nothing
	// else is let in or kept out by the swap). Without the flag a
	// client_id alone takes nothing: the holder is like any other.
	if b.Takeover && lk != nil {
		for i := range lk.NumHolders() {
			g := lk.grantAt(i)
			old := s.leases[g.LeaseID]
			if old.ClientID != e.ClientID || g.Subtree != b.Subtree || lk.Shared() != b.Shared {
				continue
			}
			s.unhold(lk, i, CauseTakeover, "")
			if lease == nil {
				lease = newLease(true)
			}
			s.grant(lk, lease, seq, b.Value, CauseTakeover, b.Shared, b.Subtree, b.LockDelayMs)
			return ok()
		}
	}

	r := request{name: name, shared: b.Shared, subtree: b.Subtree, place: s.place}
	blocked, by := s.blocked(lk, r, true)
	switch {
	case lk != nil && lk.delayed():
		// A lock-delay keeps the lock from everyone; waiters keep their
		// places and are served once it ends (endLockDelay).
		if b.WaitMs == 0 {
			return command.Result{Status: command.StatusLockDelayed, TTLms: max(lk.extra.delayClock-s.clock, 1)}
		}
		if queueFull(lk, e.ClientID, b.MaxWaiters, b.Takeover) {
			return command.Result{Status: command.StatusQueueFull}
		}
	case !blocked:
		if lease == nil {
			lease = newLease(true)
		}
		if lk == nil {
			lk = s.newLock(name, limit)
		}
		s.grant(lk, lease, seq, b.Value, CauseAcquire, b.Shared, b.Subtree, b.LockDelayMs)
		return ok()
	case b.WaitMs == 0:
		return s.refusal(r, by)
	case lk != nil && queueFull(lk, e.ClientID, b.MaxWaiters, b.Takeover):
		return command.Result{Status: command.StatusQueueFull}
	}
	if lease == nil {
		lease = newLease(false)
	}
	if lk == nil {
		lk = s.newLock(name, limit)
	}
	if s.enqueue(lk, lease, seq, b, e.RequestID) {
		// A takeover of a place in line in another mode may have let it,
		// or those it held back, in.
		s.wake(name, true)
		if lk.grantIndex(lease.ID) >= 0 {
			return ok()
		}
	}
	return command.Result{Status: command.StatusQueued, LeaseID: lease.ID, TTLms: int64(lease.TTLms), Seq: seq}
}

// queueFull reports whether a wait by clientID would exceed the cap (0: none)
// on the lock's queue. A client that already waits and takes over moves its
// own place (enqueue), so it adds no waiter and is never refused.
func queueFull(lk *Lock, clientID string, limit int64, takeover bool) bool {
	q := lk.Queue()
	if limit <= 0 || int64(len(q)) < limit {
		return false
	}
	for i := range q {
		if takeover && q[i].ClientID == clientID {
			return false
		}
	}
	return true
}

// enqueue appends a wait, or, with takeover, if the same client already
// waits with another lease (it restarted), moves that place in line to the
// new lease. It reports whether it took over a place in another mode.
func (s *State) enqueue(lk *Lock, lease *Lease, seq uint64, b *command.Acquire, requestID string) bool {
	w := Waiter{LeaseID: lease.ID, ClientID: lease.ClientID, Seq: seq, Place: s.place, EnqueuedAt: s.ts, Deadline: s.ts + b.WaitMs,
		ClockDeadline: s.clock + b.WaitMs, Value: b.Value, RequestID: requestID, Shared: b.Shared, Subtree: b.Subtree, LockDelayMs: b.LockDelayMs}
	lease.Waits().Set(lk.Name, seq)
	s.changed = true
	q := lk.Queue()
	for i := range q {
		if b.Takeover && q[i].ClientID == lease.ClientID {
			prev := q[i]
			w.Place = prev.Place
			s.queueReplace(lk, i, w)
			if old := s.leases[prev.LeaseID]; old != nil {
				old.Waits().Delete(lk.Name)
				s.emit(Event{Type: EventWaitGone, Name: lk.Name, LeaseID: prev.LeaseID, Seq: prev.Seq})
				s.dropIfIdle(old)
			}
			s.emit(Event{Type: EventWaitTimer, Name: lk.Name, LeaseID: lease.ID, Seq: seq, RemainingMs: b.WaitMs})
			return prev.Shared != w.Shared || prev.Subtree != w.Subtree
		}
	}
	s.queueAppend(lk, w)
	s.emit(Event{Type: EventQueued, Name: lk.Name, ClientID: lease.ClientID, LeaseID: lease.ID, Seq: seq, Shared: w.Shared, Subtree: w.Subtree})
	s.emit(Event{Type: EventWaitTimer, Name: lk.Name, LeaseID: lease.ID, Seq: seq, RemainingMs: b.WaitMs})
	return false
}

// grant makes a lease a holder of the lock with a new fencing token.
func (s *State) grant(lk *Lock, lease *Lease, seq uint64, value, cause string, shared, subtree bool, delayMs int64) {
	s.lastToken++
	s.addGrant(lk, Grant{LeaseID: lease.ID, Token: s.lastToken, GrantedAt: s.ts, GrantSeq: seq, Subtree: subtree}, shared)
	if value != lk.Value() {
		s.setLockValue(lk, value)
	}
	if delayMs != lk.lockDelayMs() {
		s.lockOut(lk)
		lk.setDelayMs(delayMs)
		s.lockIn(lk)
	}
	lease.Locks().Set(lk.Name, 0)
	s.changed = true
	if !lease.Session {
		// An implicit lease's TTL counts from its grant. A session's does not
		// change: a grant is not a keepalive.
		s.leaseOut(lease)
		lease.Active = true
		s.leaseIn(lease)
		s.touch(lease)
	}
	s.emit(Event{Type: EventAcquired, Name: lk.Name, ClientID: lease.ClientID, Token: s.lastToken, Cause: cause, LeaseID: lease.ID, Seq: seq, Value: value, Shared: shared, Subtree: subtree})
}

// unhold takes the i-th grant of a lock away from its holder without
// letting anyone in, and keeps it in the history. A grant with a lock-delay
// that ends by expiry or revoke starts the delay. An implicit lease that
// holds nothing else ends with it.
func (s *State) unhold(lk *Lock, i int, cause, reason string) Grant {
	typ := EventReleased
	switch cause {
	case CauseExpired:
		typ = EventExpired
	case CauseRevoked:
		typ = EventRevoked
	}
	g := lk.grantAt(i)
	holder := s.leases[g.LeaseID]
	_, election := command.SplitKey(lk.Name)
	s.emit(Event{Type: typ, Name: lk.Name, ClientID: holder.ClientID, Token: g.Token, Cause: cause, Reason: reason, LeaseID: holder.ID,
		Shared: lk.Shared(), Subtree: g.Subtree, Value: lk.Value()})
	s.recordEnd(lk, g, holder, endCauseOf(cause, election), reason)
	if s.keepLost && holder.Session && (cause == CauseRevoked || cause == CauseTakeover) {
		s.recordLost(holder, lk, g.Token, endCauseOf(cause, election), reason)
	}
	holder.Locks().Delete(lk.Name)
	delay := lk.lockDelayMs()
	s.removeGrant(lk, i)
	if !lk.Held() {
		if lk.Value() != "" {
			s.setLockValue(lk, "")
		}
		if delay > 0 {
			s.lockOut(lk)
			lk.setDelayMs(0)
			if cause == CauseExpired || cause == CauseRevoked {
				lk.setDelay(g.Token, s.ts+delay, s.clock+delay)
				s.emit(Event{Type: EventDelayTimer, Name: lk.Name, Token: g.Token, RemainingMs: delay})
			}
			s.lockIn(lk)
		}
	}
	s.changed = true
	s.dropIfIdle(holder)
	return g
}

// release ends the i-th grant of a lock and lets in whoever it held back.
func (s *State) releaseGrant(lk *Lock, i int, cause, reason string) {
	g := s.unhold(lk, i, cause, reason)
	s.wake(lk.Name, g.Subtree)
}

// dropIfIdle ends an implicit lease that no longer holds or waits for anything.
func (s *State) dropIfIdle(l *Lease) {
	if !l.Session && l.Locks().Len() == 0 && l.Waits().Len() == 0 {
		s.deleteLease(l)
		s.emit(Event{Type: EventLeaseGone, LeaseID: l.ID})
	}
}

func (s *State) release(e *command.Envelope, b *command.Release) command.Result {
	lk, _, i := s.holderCheck(e, b.Name, b.LeaseID, b.Token)
	if i < 0 {
		return command.Result{Status: command.StatusNotHolder}
	}
	s.releaseGrant(lk, i, CauseReleased, "")
	return command.Result{Status: command.StatusOK}
}

// revoke ends a grant by force: no holder proof (the service checked the
// caller's right to revoke). The lock goes to the next waiter at once, or
// after the grant's lock-delay.
func (s *State) revoke(b *command.Revoke) command.Result {
	if !command.ValidKey(b.Name) || len(b.Reason) > command.MaxReasonLen {
		return invalid("bad lock name, or a reason over 256 bytes")
	}
	lk, _ := s.locks.Get(&Lock{Name: b.Name})
	if lk == nil || !lk.Held() {
		return command.Result{Status: command.StatusNotHolder}
	}
	// The grants to end, by token: the one named, or every one there is
	// now (not those the revokes let in).
	var tokens []uint64
	for _, g := range lk.Grants() {
		if b.Token == 0 || g.Token == b.Token {
			tokens = append(tokens, g.Token)
		}
	}
	if len(tokens) == 0 {
		return command.Result{Status: command.StatusNotHolder}
	}
	subtree := false
	msg := make([]string, len(tokens))
	for k, t := range tokens {
		i := -1
		for j, g := range lk.Grants() {
			if g.Token == t {
				i = j
			}
		}
		g := s.unhold(lk, i, CauseRevoked, b.Reason)
		subtree = subtree || g.Subtree
		msg[k] = strconv.FormatUint(t, 10)
	}
	s.wake(lk.Name, subtree)
	return command.Result{Status: command.StatusOK, Token: tokens[len(tokens)-1], Message: strings.Join(msg, " ")}
}

// endLockDelay ends the lock-delay begun by the end of grant b.Token and
// hands the lock on. The leader commits it when the delay has passed on its
// lease clock; anything else (no delay, another grant's) is left alone.
func (s *State) endLockDelay(b *command.EndLockDelay) command.Result {
	lk, _ := s.locks.Get(&Lock{Name: b.Name})
	if lk == nil {
		return command.Result{Status: command.StatusOK}
	}
	if _, token, ok := lk.Delayed(); !ok || token != b.Token {
		return command.Result{Status: command.StatusOK}
	}
	s.lockOut(lk)
	lk.setDelay(0, 0, 0)
	s.lockIn(lk)
	s.changed = true
	s.emit(Event{Type: EventDelayEnded, Name: lk.Name, Token: b.Token})
	s.wake(lk.Name, false)
	return command.Result{Status: command.StatusOK, Token: 1}
}

// emitValue tells watchers that a holder's value changed.
func (s *State) emitValue(lk *Lock, lease *Lease, token uint64, election bool) {
	typ := EventValueChanged
	if election {
		typ = EventProclaimed
	}
	s.emit(Event{Type: typ, Name: lk.Name, ClientID: lease.ClientID, Token: token, LeaseID: lease.ID, Value: lk.Value()})
}

// proclaim replaces the value of an election's leader (holder proof as renew).
func (s *State) proclaim(e *command.Envelope, b *command.Proclaim) command.Result {
	if _, election := command.SplitKey(b.Name); !election || len(b.Value) > command.MaxValueLen {
		return invalid("proclaim is for elections, with a value of at most 4 KiB")
	}
	lk, lease, i := s.holderCheck(e, b.Name, b.LeaseID, b.Token)
	if i < 0 {
		return command.Result{Status: command.StatusNotHolder}
	}
	if lk.Value() != b.Value {
		s.setLockValue(lk, b.Value)
		s.changed = true
		s.emit(Event{Type: EventProclaimed, Name: lk.Name, ClientID: lease.ClientID, Token: lk.Token, LeaseID: lease.ID, Value: b.Value})
	}
	return command.Result{Status: command.StatusOK, LeaseID: lease.ID, Token: lk.Token, ExpiresAt: lease.ExpiresAt(), TTLms: int64(lease.TTLms)}
}

func (s *State) renew(e *command.Envelope, b *command.Renew) command.Result {
	if b.TTLms != 0 && !validTTL(b.TTLms) {
		return invalid("ttl_ms out of range")
	}
	if b.SetValue && len(b.Value) > command.MaxValueLen {
		return invalid("value over 4 KiB")
	}
	lk, lease, i := s.holderCheck(e, b.Name, b.LeaseID, b.Token)
	if i < 0 {
		// A grant revoked before its holder heard of it: say so, with its
		// token, while the history still has it.
		if g, ok := s.endedGrant(b.Name, b.Token); ok && g.Cause == EndRevoked && g.ClientID == e.ClientID {
			return command.Result{Status: command.StatusLockLost, Token: g.Token}
		}
		return command.Result{Status: command.StatusNotHolder}
	}
	if b.SetValue && lk.Value() != b.Value {
		s.setLockValue(lk, b.Value)
		_, election := command.SplitKey(lk.Name)
		s.emitValue(lk, lease, lk.grantAt(i).Token, election)
	}
	if b.TTLms != 0 {
		s.leaseOut(lease)
		lease.TTLms = int32(b.TTLms)
		s.leaseIn(lease)
	}
	s.touch(lease)
	return command.Result{Status: command.StatusOK, LeaseID: lease.ID, ExpiresAt: lease.ExpiresAt(), TTLms: int64(lease.TTLms)}
}

// holderCheck proves the caller holds the lock: right name, the token of
// its grant, the holder's lease id and its client id. A token alone proves
// nothing. It returns the grant's position, or -1.
func (s *State) holderCheck(e *command.Envelope, name string, id command.LeaseID, token uint64) (*Lock, *Lease, int) {
	lk, _ := s.locks.Get(&Lock{Name: name})
	if lk == nil {
		return nil, nil, -1
	}
	i := lk.grantIndex(id)
	if i < 0 || lk.grantAt(i).Token != token {
		return nil, nil, -1
	}
	lease := s.leases[id]
	if lease == nil || lease.ClientID != e.ClientID {
		return nil, nil, -1
	}
	return lk, lease, i
}

func (s *State) expireLeases(b *command.ExpireLeases) command.Result {
	n := 0
	for _, lg := range b.Leases {
		l := s.leases[lg.LeaseID]
		if l == nil || !l.Active || l.Gen != lg.Gen {
			continue // renewed or gone since the reaper looked: the renewal wins
		}
		s.endLease(l, CauseExpired)
		n++
	}
	return command.Result{Status: command.StatusOK, Token: uint64(n)}
}

// endLease drops a lease's waits, releases every lock it holds (letting
// the next ones in) and deletes it. The waits go first, so a release cannot
// let the ending lease itself in. Names are visited in sorted order so every
// replica does the same.
func (s *State) endLease(l *Lease, cause string) {
	for _, name := range l.Waits().Sorted() {
		s.removeWait(l, name, cause)
	}
	for _, name := range l.Locks().Sorted() {
		lk, _ := s.locks.Get(&Lock{Name: name})
		s.releaseGrant(lk, lk.grantIndex(l.ID), cause, "")
	}
	if _, still := s.leases[l.ID]; still {
		s.deleteLease(l)
		s.emit(Event{Type: EventLeaseGone, LeaseID: l.ID})
	}
	if l.Session {
		typ := EventSessionDeleted
		if cause == CauseExpired {
			typ = EventSessionExpired
		}
		s.emit(Event{Type: typ, ClientID: l.ClientID, Cause: cause})
	}
	s.changed = true
}

// removeWait takes a lease's wait out of a lock's queue.
func (s *State) removeWait(l *Lease, name, cause string) {
	seq, _ := l.Waits().Get(name)
	l.Waits().Delete(name)
	lk, _ := s.locks.Get(&Lock{Name: name})
	var w Waiter
	if lk != nil {
		q := lk.Queue()
		for i := range q {
			if q[i].LeaseID == l.ID {
				w = q[i]
				s.queueRemove(lk, i)
				break
			}
		}
	}
	s.changed = true
	s.emit(Event{Type: EventDequeued, Name: name, ClientID: l.ClientID, Cause: cause, LeaseID: l.ID, Seq: seq, Shared: w.Shared, Subtree: w.Subtree})
	s.emit(Event{Type: EventWaitGone, Name: name, LeaseID: l.ID, Seq: seq})
	// Those it was ahead of may go in now.
	s.wake(name, w.Subtree)
}

func (s *State) waitMatches(w command.WaitRef) (*Lease, bool) {
	l := s.leases[w.LeaseID]
	if l == nil {
		return nil, false
	}
	seq, ok := l.Waits().Get(w.Name)
	return l, ok && seq == w.Seq
}

func (s *State) expireWaits(b *command.ExpireWaits) command.Result {
	n := 0
	for _, w := range b.Waits {
		if l, ok := s.waitMatches(w); ok {
			s.removeWait(l, w.Name, CauseTimeout)
			s.dropIfIdle(l)
			n++
		}
	}
	return command.Result{Status: command.StatusOK, Token: uint64(n)}
}

func (s *State) cancelWait(b *command.CancelWait) command.Result {
	if l, ok := s.waitMatches(b.Wait); ok {
		s.removeWait(l, b.Wait.Name, CauseCancelled)
		s.dropIfIdle(l)
		return command.Result{Status: command.StatusOK}
	}
	if b.ReleaseIfGranted {
		lk, _ := s.locks.Get(&Lock{Name: b.Wait.Name})
		if lk != nil {
			if i := lk.grantIndex(b.Wait.LeaseID); i >= 0 && lk.grantAt(i).GrantSeq == b.Wait.Seq {
				s.releaseGrant(lk, i, CauseCancelled, "")
				return command.Result{Status: command.StatusOK}
			}
		}
	}
	return command.Result{Status: command.StatusNotWaiting}
}

// touch records that a lease was (re)started: its TTL counts from this
// command, with a new generation and, for the leader's reaper, the time left
// counted from now.
func (s *State) touch(l *Lease) {
	s.leaseOut(l)
	l.RenewedAt, l.RenewedClock = s.ts, s.clock
	l.Gen++
	s.leaseIn(l)
	s.changed = true
	if l.Active {
		s.emit(Event{Type: EventLeaseTimer, LeaseID: l.ID, Gen: l.Gen, RemainingMs: l.RenewedClock + int64(l.TTLms) - s.clock})
	}
}

// hasPrefix is a name-prefix match.
func hasPrefix(name, prefix string) bool { return strings.HasPrefix(name, prefix) }
