package shard

import (
	"slices"
	"sync"
	"time"

	"github.com/dlock/dlock/internal/raftnode"
)

// Which replica a node without a shard sends the shard's calls to
// (forward.go). A replica that answered keeps getting the group's calls
// (sticky), so one that stopped accepting them (paused, cut off) costs one
// accept bound and not every call's; one that did not accept a call is
// tried last for benchPenalty, so calls of other groups, and of this one
// once the sticky choice fails, avoid it too. A node without a shard does
// not know its leader (it runs no copy of the group), so it does not aim
// for it; the replica it reaches forwards writes to the leader.

// ForwardAccept is how long a replica may take to start reading a
// forwarded call before the call goes to another replica, for a cluster
// with Raft election timeout election: five of them (a live process starts
// reading within milliseconds; a node silent for that long would already
// have been voted out as a leader), at least 500 ms so that a loaded
// machine's scheduling does not send calls away from a healthy replica,
// and at most 2 s.
func ForwardAccept(election time.Duration) time.Duration {
	if election <= 0 {
		election = raftnode.DefaultElectionTimeout
	}
	return min(max(5*election, 500*time.Millisecond), 2*time.Second)
}

// benchPenalty is how long a replica that did not accept a call (or could
// not be reached) is tried last.
const benchPenalty = 5 * time.Second

// maxSticky bounds the sticky choices kept: one per group asked, and the
// groups are the map's ranges; a map that changed a lot starts afresh.
const maxSticky = 1024

// fwdReplicas is a node's choice of replicas for forwarded calls.
type fwdReplicas struct {
	mu        sync.Mutex
	accept    time.Duration
	sticky    map[uint64]string    // group → the replica that answered last
	benched   map[string]time.Time // node → end of its penalty
	failovers uint64
}

func newFwdReplicas() *fwdReplicas {
	return &fwdReplicas{accept: ForwardAccept(0), sticky: map[uint64]string{}, benched: map[string]time.Time{}}
}

// SetForwardAccept sets how long a replica may take to start reading a
// forwarded call before it goes to the next replica (ForwardAccept).
func (r *Router) SetForwardAccept(d time.Duration) {
	if d <= 0 {
		return
	}
	r.pick.mu.Lock()
	r.pick.accept = d
	r.pick.mu.Unlock()
}

// ForwardFailovers counts the forwarded calls that went on to another
// replica because one did not accept them in time or could not be reached.
func (r *Router) ForwardFailovers() uint64 {
	r.pick.mu.Lock()
	defer r.pick.mu.Unlock()
	return r.pick.failovers
}

func (f *fwdReplicas) acceptBound() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.accept
}

// order is the order to try group's replicas hosts in (self left out):
// from this node's own point in the set (so calls of nodes that never got
// an answer yet spread), the sticky replica moved first, and the benched
// ones moved last, in that order.
func (f *fwdReplicas) order(group uint64, hosts []string, self string, now time.Time) []string {
	out := make([]string, 0, len(hosts))
	start := int(fnvString(self) % uint64(max(len(hosts), 1)))
	for i := range hosts {
		if n := hosts[(start+i)%len(hosts)]; n != self {
			out = append(out, n)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if s, ok := f.sticky[group]; ok {
		if i := slices.Index(out, s); i > 0 {
			copy(out[1:i+1], out[:i])
			out[0] = s
		}
	}
	var fresh, benched []string
	for _, n := range out {
		if until, ok := f.benched[n]; ok && now.Before(until) {
			benched = append(benched, n)
		} else {
			fresh = append(fresh, n)
		}
	}
	return append(fresh, benched...)
}

// answered records that node answered a call of group.
func (f *fwdReplicas) answered(group uint64, node string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sticky[group] == node {
		return
	}
	if len(f.sticky) >= maxSticky {
		clear(f.sticky)
	}
	f.sticky[group] = node
}

// bench records that node did not get a call of group (it did not accept
// it in time, or could not be reached): it is tried last for benchPenalty
// and is no longer the group's sticky replica.
func (f *fwdReplicas) bench(group uint64, node string, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sticky[group] == node {
		delete(f.sticky, group)
	}
	for n, until := range f.benched {
		if !now.Before(until) {
			delete(f.benched, n)
		}
	}
	f.benched[node] = now.Add(benchPenalty)
	f.failovers++
}
