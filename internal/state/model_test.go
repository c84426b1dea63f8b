package state

import (
	"strings"
	"testing"

	"github.com/google/btree"

	"github.com/dlock/dlock/internal/command"
)

// The lock model's rules written a second time, the slow and obvious way
// (every pair of grants and waiters), to check the indexed implementation
// after every step.

// claim is a grant or a wait as the model sees it.
type claim struct {
	name            string
	shared, subtree bool
	place           uint64 // waits only
	lease           command.LeaseID
}

// inside reports whether name is in the subtree of root (below it).
func inside(name, root string) bool {
	if _, el := command.SplitKey(name); el {
		return false
	}
	if _, el := command.SplitKey(root); el {
		return false
	}
	return strings.HasPrefix(name, root+"/")
}

// crossConflict: two claims on different names overlap through a subtree
// and are not both shared.
func crossConflict(a, b claim) bool {
	if a.name == b.name {
		return false
	}
	overlap := (a.subtree && inside(b.name, a.name)) || (b.subtree && inside(a.name, b.name))
	return overlap && !(a.shared && b.shared)
}

func claims(s *State) (grants, waits []claim) {
	s.locks.Ascend(func(lk *Lock) bool {
		for _, g := range lk.Grants() {
			grants = append(grants, claim{name: lk.Name, shared: lk.Shared(), subtree: g.Subtree, lease: g.LeaseID})
		}
		for _, w := range lk.Queue() {
			waits = append(waits, claim{name: lk.Name, shared: w.Shared, subtree: w.Subtree, place: w.Place, lease: w.LeaseID})
		}
		return true
	})
	return grants, waits
}

// modelBlocked is the rule for a queue's head w on lk, written plainly.
// Two claims on different names conflict only if one covers a subtree, so
// a head that does not is checked against the subtree claims alone.
func modelBlocked(lk *Lock, w claim, grants, waits, subGrants, subWaits []claim) bool {
	if n := lk.NumHolders(); n > 0 && (w.shared != lk.Shared() || (!w.shared && n >= lk.Limit())) {
		return true
	}
	if !w.subtree {
		grants, waits = subGrants, subWaits
	}
	for _, g := range grants {
		if crossConflict(w, g) {
			return true
		}
	}
	for _, v := range waits {
		if v.place < w.place && crossConflict(w, v) {
			return true
		}
	}
	return false
}

func subtreeClaims(cs []claim) []claim {
	var out []claim
	for _, c := range cs {
		if c.subtree {
			out = append(out, c)
		}
	}
	return out
}

// checkLockModel: no two grants conflict; every queue's head is held back
// by something (nobody waits who could go in); and the derived indexes are
// what rebuilding them from the locks gives.
func checkLockModel(t testing.TB, s *State) {
	t.Helper()
	grants, waits := claims(s)
	subGrants, subWaits := subtreeClaims(grants), subtreeClaims(waits)
	for _, a := range subGrants {
		for _, b := range grants {
			if crossConflict(a, b) {
				t.Fatalf("index %d: grants on %q (shared %v subtree %v) and %q (shared %v subtree %v) overlap", s.index, a.name, a.shared, a.subtree, b.name, b.shared, b.subtree)
			}
		}
	}
	s.locks.Ascend(func(lk *Lock) bool {
		if q := lk.Queue(); len(q) > 0 && !lk.delayed() { // a lock-delay holds every waiter back
			h := claim{name: lk.Name, shared: q[0].Shared, subtree: q[0].Subtree, place: q[0].Place}
			if !modelBlocked(lk, h, grants, waits, subGrants, subWaits) {
				t.Fatalf("index %d: the head of %q's queue (%+v) could go in but waits\n%s", s.index, lk.Name, q[0], dump(s))
			}
		}
		return true
	})
	intent := map[string]intentCount{}
	idx := newWaitIdx()
	s.locks.Ascend(func(lk *Lock) bool {
		for range lk.NumHolders() {
			ancestors(lk.Name, func(a string) bool {
				c := intent[a]
				if lk.Shared() {
					c.s++
				} else {
					c.x++
				}
				intent[a] = c
				return true
			})
		}
		for _, w := range lk.Queue() {
			below := wBelowX
			if w.Shared {
				below = wBelowS
			}
			ancestors(lk.Name, func(a string) bool {
				idx.ReplaceOrInsert(waitItem{key: a, kind: below, place: w.Place, name: lk.Name})
				return true
			})
			if w.Subtree {
				sub := wSubX
				if w.Shared {
					sub = wSubS
				}
				idx.ReplaceOrInsert(waitItem{key: lk.Name, kind: sub, place: w.Place, name: lk.Name})
			}
		}
		return true
	})
	if len(intent) != len(s.intent) {
		t.Fatalf("index %d: intent has %d prefixes, the locks give %d", s.index, len(s.intent), len(intent))
	}
	for k, c := range intent {
		if s.intent[k] != c {
			t.Fatalf("index %d: intent[%q] = %+v, the locks give %+v", s.index, k, s.intent[k], c)
		}
	}
	if !sameItems(idx, s.waitIdx) {
		t.Fatalf("index %d: the waiters' index differs from the queues", s.index)
	}
}

func sameItems(a, b *btree.BTreeG[waitItem]) bool {
	var x, y []waitItem
	a.Ascend(func(it waitItem) bool { x = append(x, it); return true })
	b.Ascend(func(it waitItem) bool { y = append(y, it); return true })
	if len(x) != len(y) {
		return false
	}
	for i := range x {
		if x[i] != y[i] {
			return false
		}
	}
	return true
}

// checkNoJump: a grant made by a step (a new acquire, or a waiter let in)
// leaves nobody who was ahead of it in line and conflicts with it still
// waiting: on its own name, nobody ahead of it at all; elsewhere, no
// overlapping waiter in a conflicting mode. before are the queues before
// the step; the place of a new acquire is after every waiter's; seq names
// the step's command.
func checkNoJump(t testing.TB, s *State, seq uint64, before map[string][]Waiter, ev []Event) {
	t.Helper()
	_, waits := claims(s)
	for _, e := range ev {
		if e.Type != EventAcquired || (e.Cause != CauseAcquire && e.Cause != CauseHandoff) {
			continue
		}
		place := ^uint64(0)
		if e.Cause == CauseHandoff {
			found := false
			for _, w := range before[e.Name] {
				// A takeover of a place in line may be let in at once,
				// under the new acquire's Seq, in the place it took.
				if w.LeaseID == e.LeaseID && w.Seq == e.Seq || e.Seq == seq && w.ClientID == e.ClientID {
					place, found = w.Place, true
					break // takeover takes the client's first place
				}
			}
			if !found {
				t.Fatalf("index %d: %q let in a lease that was not in line: %+v", s.index, e.Name, e)
			}
		}
		g := claim{name: e.Name, shared: e.Shared, subtree: e.Subtree}
		for _, v := range waits {
			if v.place >= place {
				continue
			}
			if v.name == e.Name || crossConflict(g, v) {
				t.Fatalf("index %d: grant of %q (%+v) jumped waiter %+v", s.index, e.Name, e, v)
			}
		}
	}
}
