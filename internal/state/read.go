package state

import (
	"sort"

	"github.com/dlock/dlock/internal/command"
)

// LockInfo is the public view of one lock.
type LockInfo struct {
	Name string
	Held bool
	// Holder is the first holder in grant order.
	Holder  command.Holder
	Waiters int
	// Value is the holder's value.
	Value string
	// DelayedUntil is, while a lock-delay keeps the lock from everyone, its
	// end on the leader's wall clock (display; 0 otherwise).
	DelayedUntil int64
	// Limit is the lock's limit (1 for a mutex); Shared the holders' mode.
	Limit  int
	Shared bool
	// Subtree: some holder's grant covers the subtree.
	Subtree bool
	// Holders are every holder, in grant order.
	Holders []Holder
}

// QueuedInfo is one waiter in a lock's queue, as a reader may see it (no
// lease id: that is the waiter's secret).
type QueuedInfo struct {
	ClientID   string
	EnqueuedAt int64
	Deadline   int64
}

// MaxQueueView bounds the waiters one read shows, so a lock with a long
// queue cannot make one answer arbitrarily large; Waiters has the full count.
const MaxQueueView = 100

// LockQueue is the head of a lock's wait queue in order, at most
// MaxQueueView waiters (LockInfo.Waiters has the full count).
func (s *State) LockQueue(name string) []QueuedInfo {
	lk, _ := s.locks.Get(&Lock{Name: name})
	if lk == nil {
		return nil
	}
	q := lk.Queue()
	out := make([]QueuedInfo, 0, min(len(q), MaxQueueView))
	for _, w := range q[:min(len(q), MaxQueueView)] {
		out = append(out, QueuedInfo{ClientID: w.ClientID, EnqueuedAt: w.EnqueuedAt, Deadline: w.Deadline})
	}
	return out
}

// GetLock returns the view of a lock; a lock nobody holds or waits for is
// simply not held.
func (s *State) GetLock(name string) LockInfo {
	lk, _ := s.locks.Get(&Lock{Name: name})
	if lk == nil {
		return LockInfo{Name: name, Limit: 1}
	}
	return s.info(lk)
}

func (s *State) info(lk *Lock) LockInfo {
	li := LockInfo{Name: lk.Name, Held: lk.Held(), Waiters: len(lk.Queue()), Limit: lk.Limit(), Shared: lk.Shared(), Subtree: lk.subtreeHolders() > 0,
		Value: lk.Value()}
	li.DelayedUntil, _, _ = lk.Delayed()
	if lk.Held() {
		li.Holders = make([]Holder, lk.NumHolders())
		for i := range li.Holders {
			li.Holders[i] = s.holderOf(lk, lk.grantAt(i))
		}
		li.Holder = li.Holders[0].Holder
	}
	return li
}

// ListLocks returns up to limit locks whose names start with prefix and sort
// after `after`, in name order, and whether more exist.
func (s *State) ListLocks(prefix, after string, limit int) ([]LockInfo, bool) {
	start := prefix
	if after > start {
		start = after
	}
	var out []LockInfo
	more := false
	s.locks.AscendGreaterOrEqual(&Lock{Name: start}, func(lk *Lock) bool {
		if !hasPrefix(lk.Name, prefix) {
			return false
		}
		if lk.Name == after {
			return true
		}
		if _, election := command.SplitKey(lk.Name); election {
			return true // elections live in the same table but are not locks
		}
		if len(out) == limit {
			more = true
			return false
		}
		out = append(out, s.info(lk))
		return true
	})
	return out, more
}

// ElectionInfo is the public view of one election.
type ElectionInfo struct {
	Name        string
	HasLeader   bool
	CandidateID string
	Value       string
	Token       uint64
	Since       int64
	ExpiresAt   int64
	Campaigners int
}

// GetElection returns the view of an election by its (normalized) name.
func (s *State) GetElection(name string) ElectionInfo {
	ei := ElectionInfo{Name: name}
	lk, _ := s.locks.Get(&Lock{Name: command.ElectionKey(name)})
	if lk == nil {
		return ei
	}
	ei.Campaigners = len(lk.Queue())
	if lk.Held() {
		l := s.leases[lk.Holder]
		ei.HasLeader, ei.CandidateID, ei.Value, ei.Token, ei.Since, ei.ExpiresAt = true, l.ClientID, lk.Value(), lk.Token, lk.GrantedAt, l.ExpiresAt()
	}
	return ei
}

// ListElections returns up to limit elections whose names start with prefix
// and sort after `after`, in name order, and whether more exist.
func (s *State) ListElections(prefix, after string, limit int) ([]ElectionInfo, bool) {
	start := command.ElectionKey(prefix)
	if after > prefix {
		start = command.ElectionKey(after)
	}
	var out []ElectionInfo
	more := false
	s.locks.AscendGreaterOrEqual(&Lock{Name: start}, func(lk *Lock) bool {
		name, election := command.SplitKey(lk.Name)
		if !election || !hasPrefix(name, prefix) {
			return false
		}
		if name == after {
			return true
		}
		if len(out) == limit {
			more = true
			return false
		}
		out = append(out, s.GetElection(name))
		return true
	})
	return out, more
}

// LockState is the internal view of a lock used by the service to answer a
// waiting acquire.
type LockState struct {
	Holder   command.LeaseID
	Token    uint64
	GrantSeq uint64
}

// LockHolder returns the first holder of a lock, by lease (internal).
func (s *State) LockHolder(name string) LockState {
	lk, _ := s.locks.Get(&Lock{Name: name})
	if lk == nil {
		return LockState{}
	}
	return LockState{Holder: lk.Holder, Token: lk.Token, GrantSeq: lk.GrantSeq}
}

// LockGrant returns the grant a lease holds on a lock, if it holds one
// (internal).
func (s *State) LockGrant(name string, id command.LeaseID) (LockState, bool) {
	lk, _ := s.locks.Get(&Lock{Name: name})
	if lk == nil {
		return LockState{}, false
	}
	i := lk.grantIndex(id)
	if i < 0 {
		return LockState{}, false
	}
	g := lk.grantAt(i)
	return LockState{Holder: g.LeaseID, Token: g.Token, GrantSeq: g.GrantSeq}, true
}

// Lease returns a copy of the lease's scalar fields (nil maps), if it exists.
func (s *State) Lease(id command.LeaseID) (Lease, bool) {
	l := s.leases[id]
	if l == nil {
		return Lease{}, false
	}
	c := *l
	c.names = NameSet{}
	return c, true
}

// WaitSeq returns the sequence of a lease's wait on a lock, if it waits.
func (s *State) WaitSeq(id command.LeaseID, name string) (uint64, bool) {
	l := s.leases[id]
	if l == nil {
		return 0, false
	}
	return l.Waits().Get(name)
}

// Counts is a summary for metrics and status pages.
type Counts struct {
	Locks, Held, Waiters, Leases, Sessions int
	// Grants counts holders: more than Held when counting or shared locks
	// have several.
	Grants int
}

// Counts summarises the table. It walks everything: not for hot paths.
func (s *State) Counts() Counts {
	var c Counts
	s.locks.Ascend(func(lk *Lock) bool {
		c.Locks++
		if lk.Held() {
			c.Held++
		}
		c.Grants += lk.NumHolders()
		c.Waiters += len(lk.Queue())
		return true
	})
	for _, l := range s.leases {
		c.Leases++
		if l.Session {
			c.Sessions++
		}
	}
	return c
}

// LeaseTimer is what the leader's reaper needs to know about one active lease.
type LeaseTimer struct {
	LeaseID     command.LeaseID
	Gen         uint64
	RemainingMs int64
}

// WaitTimer is what the reaper needs to know about one queued wait.
type WaitTimer struct {
	Wait        command.WaitRef
	RemainingMs int64
}

// Timers lists every active lease and queued wait with its time left as of the
// newest applied command, on the lease clock (command.Envelope.Clock), never
// on wall-clock timestamps: those may come from two leaders whose clocks
// disagree, and a successor would then expire a lease early by the skew. A
// new leader counts that time again from the moment it takes over, so no lease
// ends before its holder had its full TTL.
func (s *State) Timers() ([]LeaseTimer, []WaitTimer) {
	leases := make([]LeaseTimer, 0, len(s.leases))
	for _, l := range s.leases {
		if l.Active {
			leases = append(leases, LeaseTimer{LeaseID: l.ID, Gen: l.Gen, RemainingMs: l.RenewedClock + int64(l.TTLms) - s.clock})
		}
	}
	var waits []WaitTimer
	s.locks.Ascend(func(lk *Lock) bool {
		for _, w := range lk.Queue() {
			waits = append(waits, WaitTimer{Wait: command.WaitRef{LeaseID: w.LeaseID, Name: lk.Name, Seq: w.Seq}, RemainingMs: w.ClockDeadline - s.clock})
		}
		return true
	})
	return leases, waits
}

// DelayOf says whether a lock-delay keeps the lock from everyone: until when
// (leader wall clock, display) and which grant's end began it.
func (s *State) DelayOf(name string) (until int64, token uint64, ok bool) {
	lk, _ := s.locks.Get(&Lock{Name: name})
	if lk == nil {
		return 0, 0, false
	}
	return lk.Delayed()
}

// DelayTimer is a lock-delay in force, for the leader's reaper.
type DelayTimer struct {
	Name        string
	Token       uint64
	RemainingMs int64
}

// DelayTimers lists the lock-delays in force, with their time left on the
// lease clock as of the newest entry.
func (s *State) DelayTimers() []DelayTimer {
	var out []DelayTimer
	s.locks.Ascend(func(lk *Lock) bool {
		if _, token, ok := lk.Delayed(); ok {
			out = append(out, DelayTimer{Name: lk.Name, Token: token, RemainingMs: lk.extra.delayClock - s.clock})
		}
		return true
	})
	return out
}

// Members lists registered members by id.
func (s *State) Members() []Member {
	out := make([]Member, 0, len(s.members))
	for _, m := range s.members {
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}
