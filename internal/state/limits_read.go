package state

// Read-only accessors for the service's abuse caps (waiters per lock, leases
// per client). They change nothing and are called under fsm.Read, for the
// service's early refusals. The caps are per-node configuration, which Apply
// must not read; the waiter cap is enforced in Apply too, from the value the
// node wrote into the command (command.Acquire.MaxWaiters).

// LeaseCount is the number of live leases (sessions and implicit leases).
// It is O(1), so the service can skip counting one client's leases while the
// whole table holds fewer than that client's cap.
func (s *State) LeaseCount() int { return len(s.leases) }

// LeasesByClient counts the live leases of every client_id. It walks every
// lease, so callers check LeaseCount first and reuse the answer for a while.
func (s *State) LeasesByClient() map[string]int {
	out := make(map[string]int)
	for _, l := range s.leases {
		out[l.ClientID]++
	}
	return out
}

// ClientQueued reports whether clientID already waits in the lock's queue:
// queuing again with takeover (a restarted client with a new lease) takes
// that place instead of adding a waiter, so it must not count against the
// queue's cap.
func (s *State) ClientQueued(name, clientID string) bool {
	lk, _ := s.locks.Get(&Lock{Name: name})
	if lk == nil {
		return false
	}
	for i := range lk.Queue() {
		if lk.Queue()[i].ClientID == clientID {
			return true
		}
	}
	return false
}
