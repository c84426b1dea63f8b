package state

import (
	"sort"

	"github.com/dlock/dlock/internal/command"
)

// LockInfo is the public view of one lock.
type LockInfo struct {
	Name    string
	Held    bool
	Holder  command.Holder
	Waiters int
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
		return LockInfo{Name: name}
	}
	return s.info(lk)
}

func (s *State) info(lk *Lock) LockInfo {
	li := LockInfo{Name: lk.Name, Held: lk.Held(), Waiters: len(lk.Queue())}
	if lk.Held() {
		li.Holder = holderOf(lk, s.leases[lk.Holder])
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

// LockHolder returns who holds a lock, by lease (internal).
func (s *State) LockHolder(name string) LockState {
	lk, _ := s.locks.Get(&Lock{Name: name})
	if lk == nil {
		return LockState{}
	}
	return LockState{Holder: lk.Holder, Token: lk.Token, GrantSeq: lk.GrantSeq}
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
}

// Counts summarises the table. It walks everything: not for hot paths.
func (s *State) Counts() Counts {
	var c Counts
	s.locks.Ascend(func(lk *Lock) bool {
		c.Locks++
		if lk.Held() {
			c.Held++
		}
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

// Members lists registered members by id.
func (s *State) Members() []Member {
	out := make([]Member, 0, len(s.members))
	for _, m := range s.members {
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}
