package state

import (
	"errors"
	"fmt"
	"slices"

	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/wire"
)

// Grants a session lost while it lived. A lock held under its own lease
// learns of a revoke at its next renew (lock_lost); one held under a session
// is kept alive by the session's keepalive, which names no lock. So the
// state remembers, per session, the grants that ended without the session
// ending and without its holder asking — revoked by an operator, or taken
// over by another lease of the same client — and a keepalive's answer lists
// those newer than the revision the client last saw (Service.KeepAlive).
// They go with the session.

// LostGrant is one grant a session lost: Key is the lock's name or the
// election's key (command.ElectionKey); Revision is the change that ended it.
type LostGrant struct {
	Key      string
	Token    uint64
	Cause    EndCause // EndRevoked or EndTakenOver
	Reason   string   // a revoke's reason
	Revision uint64
}

// MaxLostPerSession bounds what one session remembers (oldest dropped
// first): a client that keeps its session alive hears of each lost grant
// within a keepalive, so only a burst of more revokes than this between two
// keepalives goes unreported (its holder then learns at Unlock). Like every
// rule Apply follows, changing it needs a new command version.
const MaxLostPerSession = 256

// recordLost remembers that session l lost the grant with token on lk.
func (s *State) recordLost(l *Lease, lk *Lock, token uint64, cause EndCause, reason string) {
	if s.lost == nil {
		s.lost = make(map[command.LeaseID][]LostGrant)
	}
	list := s.lost[l.ID]
	if len(list) >= MaxLostPerSession {
		s.sum -= s.rh.lostGrant(l.ID, &list[0])
		list = slices.Delete(list, 0, 1)
	}
	g := LostGrant{Key: lk.Name, Token: token, Cause: cause, Reason: reason, Revision: s.revision + 1}
	s.sum += s.rh.lostGrant(l.ID, &g)
	s.lost[l.ID] = append(list, g)
}

// forgetLost drops what a lease that ends remembered.
func (s *State) forgetLost(id command.LeaseID) {
	list, ok := s.lost[id]
	if !ok {
		return
	}
	for i := range list {
		s.sum -= s.rh.lostGrant(id, &list[i])
	}
	delete(s.lost, id)
}

// SessionLost returns the grants session id lost at a revision after
// after, oldest first (nil for none or an unknown session).
func (s *State) SessionLost(id command.LeaseID, after uint64) []LostGrant {
	list := s.lost[id]
	i, _ := slices.BinarySearchFunc(list, after, func(g LostGrant, r uint64) int {
		if g.Revision <= r {
			return -1
		}
		return 1
	})
	return slices.Clone(list[i:])
}

func writeLostGrant(w *wire.Writer, g *LostGrant) {
	w.String(g.Key)
	w.Uvarint(g.Token)
	w.Byte(byte(g.Cause))
	w.String(g.Reason)
	w.Uvarint(g.Revision)
}

// writeLost writes the section: the sessions in id order, each with its
// lost grants oldest first.
func (s *State) writeLost(w *wire.Writer, keep func(string) bool) {
	kept := func(id command.LeaseID) []LostGrant {
		if keep == nil {
			return s.lost[id]
		}
		var out []LostGrant
		for _, g := range s.lost[id] {
			if keep(g.Key) {
				out = append(out, g)
			}
		}
		return out
	}
	ids := make([]command.LeaseID, 0, len(s.lost))
	for id := range s.lost {
		if len(kept(id)) > 0 {
			ids = append(ids, id)
		}
	}
	sortLeaseIDs(ids)
	w.Uvarint(uint64(len(ids)))
	for _, id := range ids {
		list := kept(id)
		w.Fixed(id[:])
		w.Uvarint(uint64(len(list)))
		for i := range list {
			writeLostGrant(w, &list[i])
		}
	}
}

// readLost reads the section (snapshot version 10), checking what Apply
// keeps true: live sessions in id order, each with 1 to MaxLostPerSession
// grants in revision order.
func (s *State) readLost(r *wire.Reader, v byte) error {
	if v < 10 {
		return nil
	}
	var prev command.LeaseID
	for n := r.Count(17); n > 0 && r.Err() == nil; n-- {
		var id command.LeaseID
		r.Fixed(id[:])
		l := s.leases[id]
		if l == nil || !l.Session || (len(s.lost) > 0 && string(prev[:]) >= string(id[:])) {
			return errors.New("lost grants of a lease that is not a live session, or out of order")
		}
		prev = id
		m := r.Count(5)
		if r.Err() == nil && (m == 0 || m > MaxLostPerSession) {
			return fmt.Errorf("a session with %d lost grants (1 to %d)", m, MaxLostPerSession)
		}
		list := make([]LostGrant, 0, m)
		var last uint64
		for ; m > 0 && r.Err() == nil; m-- {
			g := LostGrant{Key: r.String(), Token: r.Uvarint(), Cause: EndCause(r.Byte()), Reason: r.String(), Revision: r.Uvarint()}
			if r.Err() != nil {
				break
			}
			if !command.ValidKey(g.Key) || g.Token == 0 || g.Token > s.lastToken || (g.Cause != EndRevoked && g.Cause != EndTakenOver) ||
				len(g.Reason) > command.MaxReasonLen || g.Revision <= last || g.Revision > s.revision {
				return errors.New("a session's lost grant is inconsistent")
			}
			last = g.Revision
			list = append(list, g)
		}
		if s.lost == nil {
			s.lost = make(map[command.LeaseID][]LostGrant)
		}
		s.lost[id] = list
	}
	return nil
}
