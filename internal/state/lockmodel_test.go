package state

import (
	"bytes"
	"fmt"
	"slices"
	"testing"

	"github.com/dlock/dlock/internal/command"
)

// kind is what an acquire asks for beyond a name.
type kind struct {
	limit           int64
	shared, subtree bool
}

var (
	excl    = kind{}
	shr     = kind{shared: true}
	sub     = kind{subtree: true}
	shrSub  = kind{shared: true, subtree: true}
	sem3    = kind{limit: 3}
	ttlLong = int64(60_000)
)

// acq is an implicit-lease acquire of the given kind.
func (h *harness) acq(client, name string, lease command.LeaseID, wait int64, k kind) command.Result {
	h.t.Helper()
	return h.do(client, &command.Acquire{Name: name, LeaseID: lease, TTLms: ttlLong, WaitMs: wait, Limit: k.limit, Shared: k.shared, Subtree: k.subtree})
}

// granted lists the acquired events' client ids, in order.
func granted(ev []Event) []string {
	var out []string
	for _, e := range ofType(ev, EventAcquired) {
		out = append(out, e.ClientID)
	}
	return out
}

func holdersOf(s *State, name string) []string {
	var out []string
	for _, h := range s.GetLock(name).Holders {
		out = append(out, h.ClientID)
	}
	return out
}

func TestCountingLockAdmitsUpToItsLimit(t *testing.T) {
	h := newHarness(t)
	var toks []uint64
	for i := 1; i <= 3; i++ {
		r := h.acq(fmt.Sprint("c", i), "deploy", lid(i), 0, sem3)
		mustStatus(t, r, command.StatusOK)
		toks = append(toks, r.Token)
	}
	if toks[0] >= toks[1] || toks[1] >= toks[2] {
		t.Fatalf("tokens %v: each grant has its own, increasing", toks)
	}
	li := h.s.GetLock("deploy")
	if li.Limit != 3 || li.Shared || len(li.Holders) != 3 || li.Holder.Token != toks[0] {
		t.Fatalf("GetLock %+v", li)
	}
	// The fourth is refused without a wait, with a holder, and changes nothing.
	before, rev := dump(h.s), h.s.Revision()
	r := h.acq("c4", "deploy", lid(4), 0, sem3)
	mustStatus(t, r, command.StatusLockHeld)
	if r.Holder.ClientID != "c1" || r.Holder.Token != toks[0] || r.Message != "" {
		t.Fatalf("refusal holder %+v", r.Holder)
	}
	h.checkNoChange(before, rev)
	// With a wait it queues, and the first release lets it in in the same step.
	mustStatus(t, h.acq("c4", "deploy", lid(5), 30_000, sem3), command.StatusQueued)
	mustStatus(t, h.release("c2", "deploy", lid(2), toks[1]), command.StatusOK)
	if g := granted(h.ev); !slices.Equal(g, []string{"c4"}) {
		t.Fatalf("release let in %v, want c4", g)
	}
	if got := holdersOf(h.s, "deploy"); !slices.Equal(got, []string{"c1", "c3", "c4"}) {
		t.Fatalf("holders %v", got)
	}
	// Each holder proves itself with its own token.
	mustStatus(t, h.release("c1", "deploy", lid(1), toks[2]), command.StatusNotHolder)
	mustStatus(t, h.renew("c3", "deploy", lid(3), toks[2], 0), command.StatusOK)
}

func TestLimitMismatch(t *testing.T) {
	h := newHarness(t)
	mustStatus(t, h.acq("c1", "q", lid(1), 0, sem3), command.StatusOK)
	for _, k := range []kind{{limit: 2}, excl, {limit: 1}, {limit: 4}, shr} {
		before, rev := dump(h.s), h.s.Revision()
		r := h.acq("c2", "q", lid(2), 30_000, k)
		mustStatus(t, r, command.StatusLimitMismatch)
		if r.Limit != 3 {
			t.Fatalf("%+v: limit in the refusal %d, want 3", k, r.Limit)
		}
		h.checkNoChange(before, rev)
	}
	// A request that could never be valid is a plain invalid one.
	for _, k := range []kind{{limit: 3, shared: true}, {limit: -1}, {limit: command.MaxLimit + 1}} {
		mustStatus(t, h.acq("c2", "other", lid(2), 0, k), command.StatusInvalid)
	}
	mustStatus(t, h.acq("c2", "other", lid(2), 0, kind{limit: command.MaxLimit}), command.StatusOK)
	// Mutexes are limit 1: a counting acquire of one in use is refused too.
	mustStatus(t, h.acq("c3", "m", lid(3), 0, excl), command.StatusOK)
	mustStatus(t, h.acq("c4", "m", lid(4), 0, sem3), command.StatusLimitMismatch)
	// Once unused, the next acquire sets the limit afresh.
	tok := h.s.GetLock("q").Holder.Token
	mustStatus(t, h.release("c1", "q", lid(1), tok), command.StatusOK)
	mustStatus(t, h.acq("c5", "q", lid(5), 0, kind{limit: 2}), command.StatusOK)
	if h.s.GetLock("q").Limit != 2 {
		t.Fatalf("limit after reuse %d", h.s.GetLock("q").Limit)
	}
	// A lock with only waiters (held back elsewhere) is in use too.
	mustStatus(t, h.acq("c6", "tree", lid(6), 0, sub), command.StatusOK)
	mustStatus(t, h.acq("c7", "tree/x", lid(7), 30_000, sem3), command.StatusQueued)
	if li := h.s.GetLock("tree/x"); li.Held || li.Waiters != 1 {
		t.Fatalf("tree/x %+v", li)
	}
	mustStatus(t, h.acq("c8", "tree/x", lid(8), 30_000, excl), command.StatusLimitMismatch)
}

func TestSharedHoldersAndFairness(t *testing.T) {
	h := newHarness(t)
	r1 := h.acq("r1", "cfg", lid(1), 0, shr)
	r2 := h.acq("r2", "cfg", lid(2), 0, shr)
	mustStatus(t, r1, command.StatusOK)
	mustStatus(t, r2, command.StatusOK)
	if li := h.s.GetLock("cfg"); !li.Shared || len(li.Holders) != 2 {
		t.Fatalf("two shared holders: %+v", li)
	}
	// An exclusive request waits; a shared one after it waits behind it
	// (no writer starvation), even though it fits the holders.
	mustStatus(t, h.acq("w", "cfg", lid(3), 30_000, excl), command.StatusQueued)
	before, rev := dump(h.s), h.s.Revision()
	mustStatus(t, h.acq("r3", "cfg", lid(4), 0, shr), command.StatusLockHeld)
	h.checkNoChange(before, rev)
	mustStatus(t, h.acq("r3", "cfg", lid(4), 30_000, shr), command.StatusQueued)
	mustStatus(t, h.acq("r4", "cfg", lid(5), 30_000, shr), command.StatusQueued)
	mustStatus(t, h.release("r1", "cfg", lid(1), r1.Token), command.StatusOK)
	if g := granted(h.ev); len(g) != 0 {
		t.Fatalf("one shared holder left, yet %v let in", g)
	}
	mustStatus(t, h.release("r2", "cfg", lid(2), r2.Token), command.StatusOK)
	if g := granted(h.ev); !slices.Equal(g, []string{"w"}) {
		t.Fatalf("let in %v, want the writer", g)
	}
	if li := h.s.GetLock("cfg"); li.Shared || li.Holder.ClientID != "w" {
		t.Fatalf("%+v", li)
	}
	// The writer's release lets in both readers at once: consecutive shared
	// heads go together.
	mustStatus(t, h.release("w", "cfg", lid(3), h.s.GetLock("cfg").Holder.Token), command.StatusOK)
	if g := granted(h.ev); !slices.Equal(g, []string{"r3", "r4"}) {
		t.Fatalf("let in %v, want r3 and r4 together", g)
	}
}

func TestSharedBatchStopsAtExclusive(t *testing.T) {
	h := newHarness(t)
	x := h.acq("x", "k", lid(1), 0, excl)
	mustStatus(t, h.acq("s1", "k", lid(2), 30_000, shr), command.StatusQueued)
	mustStatus(t, h.acq("s2", "k", lid(3), 30_000, shr), command.StatusQueued)
	mustStatus(t, h.acq("x2", "k", lid(4), 30_000, excl), command.StatusQueued)
	mustStatus(t, h.acq("s3", "k", lid(5), 30_000, shr), command.StatusQueued)
	mustStatus(t, h.release("x", "k", lid(1), x.Token), command.StatusOK)
	if g := granted(h.ev); !slices.Equal(g, []string{"s1", "s2"}) {
		t.Fatalf("let in %v, want s1 and s2", g)
	}
	if li := h.s.GetLock("k"); li.Waiters != 2 {
		t.Fatalf("%+v", li)
	}
	// When the exclusive waiter gives up, the shared one behind it joins the
	// shared holders at once.
	seq, _ := h.s.WaitSeq(lid(4), "k")
	mustStatus(t, h.do("", &command.CancelWait{Wait: command.WaitRef{LeaseID: lid(4), Name: "k", Seq: seq}}), command.StatusOK)
	if g := granted(h.ev); !slices.Equal(g, []string{"s3"}) {
		t.Fatalf("the cancel let in %v, want s3", g)
	}
}

// The scenario: billing as a subtree waits for the holder of
// billing/job-A, then keeps out billing/job-B until it releases.
func TestSubtreeWaitsForHoldersInsideThenBlocksThem(t *testing.T) {
	h := newHarness(t)
	a := h.acq("job-a", "billing/job-A", lid(1), 0, excl)
	mustStatus(t, a, command.StatusOK)
	r := h.acq("sweeper", "billing", lid(2), 0, sub)
	mustStatus(t, r, command.StatusLockHeld)
	if r.Holder.ClientID != "job-a" || r.Message != "billing/job-A" || r.Holder.Token != a.Token {
		t.Fatalf("refusal names %+v, want job-a's grant on billing/job-A", r.Holder)
	}
	mustStatus(t, h.acq("sweeper", "billing", lid(2), 60_000, sub), command.StatusQueued)
	if li := h.s.GetLock("billing"); li.Held || li.Waiters != 1 {
		t.Fatalf("billing %+v", li)
	}
	// A new request inside the subtree waits behind the subtree waiter,
	// which is ahead of it in line, though nothing holds billing/job-B.
	r = h.acq("job-b", "billing/job-B", lid(3), 0, excl)
	mustStatus(t, r, command.StatusLockHeld)
	mustStatus(t, h.acq("job-b", "billing/job-B", lid(3), 60_000, excl), command.StatusQueued)
	// Outside the subtree nothing changes.
	mustStatus(t, h.acq("other", "billing2", lid(4), 0, excl), command.StatusOK)
	mustStatus(t, h.acq("other", "bill", lid(5), 0, excl), command.StatusOK)
	mustStatus(t, h.release("job-a", "billing/job-A", lid(1), a.Token), command.StatusOK)
	if g := granted(h.ev); !slices.Equal(g, []string{"sweeper"}) {
		t.Fatalf("job-A's release let in %v, want the subtree waiter", g)
	}
	b := h.s.GetLock("billing")
	if !b.Subtree || b.Holder.ClientID != "sweeper" || !b.Holders[0].Subtree {
		t.Fatalf("billing %+v", b)
	}
	// Held: it keeps out every name below it, at any depth.
	r = h.acq("deep", "billing/x/y", lid(6), 0, shr)
	mustStatus(t, r, command.StatusLockHeld)
	if r.Message != "billing" || !r.HolderSubtree {
		t.Fatalf("refusal %+v", r.Holder)
	}
	mustStatus(t, h.release("sweeper", "billing", lid(2), b.Holder.Token), command.StatusOK)
	if g := granted(h.ev); !slices.Equal(g, []string{"job-b"}) {
		t.Fatalf("billing's release let in %v, want job-b", g)
	}
}

func TestSubtreeConflictTable(t *testing.T) {
	// first holds, second asks: does the second go in?
	cases := []struct {
		firstName  string
		first      kind
		secondName string
		second     kind
		ok         bool
	}{
		{"a", sub, "a/b", excl, false},
		{"a", sub, "a/b", shr, false},
		{"a", shrSub, "a/b", shr, true},
		{"a", shrSub, "a/b", excl, false},
		{"a", shrSub, "a/b/c", shrSub, true},
		{"a", sub, "a/b", shrSub, false},
		{"a/b", excl, "a", sub, false},
		{"a/b", shr, "a", shrSub, true},
		{"a/b", shr, "a", sub, false},
		{"a/b", excl, "a", shrSub, false},
		{"a/b", excl, "a", excl, true}, // without subtree, names are apart
		{"a", excl, "a/b", excl, true},
		{"a", sub, "ab", excl, true},
		{"a", sub, "ab/c", excl, true},
		{"a/b", sub, "a", excl, true}, // a subtree grant covers below, not above
		{"a", sub, "a", sub, false},
		{"a", shrSub, "a", shr, true},
		{"a", shrSub, "a", excl, false},
	}
	for i, c := range cases {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			h := newHarness(t)
			mustStatus(t, h.acq("c1", c.firstName, lid(1), 0, c.first), command.StatusOK)
			before, rev := dump(h.s), h.s.Revision()
			r := h.acq("c2", c.secondName, lid(2), 0, c.second)
			if c.ok {
				mustStatus(t, r, command.StatusOK)
				return
			}
			mustStatus(t, r, command.StatusLockHeld)
			if r.Holder.ClientID != "c1" {
				t.Fatalf("refusal holder %+v", r.Holder)
			}
			h.checkNoChange(before, rev)
		})
	}
}

// A waiter ahead in line keeps out a later request it conflicts with, on
// any name; one it does not conflict with goes in.
func TestWaitersAheadKeepLaterRequestsOut(t *testing.T) {
	h := newHarness(t)
	mustStatus(t, h.acq("r", "a/b", lid(1), 0, shr), command.StatusOK)
	// A shared subtree on "a" fits the shared holder; an exclusive one waits.
	mustStatus(t, h.acq("w", "a", lid(2), 30_000, sub), command.StatusQueued)
	// A later shared request on a/c: it conflicts with the waiting
	// exclusive subtree on "a" ahead of it, so it waits too.
	mustStatus(t, h.acq("r2", "a/c", lid(3), 0, shr), command.StatusLockHeld)
	// A later shared subtree request on a/b fits the holder of a/b but not
	// the waiter on "a": it waits.
	mustStatus(t, h.acq("r3", "a/b", lid(4), 0, shr), command.StatusLockHeld)
	// Names outside the waiter's subtree are free.
	mustStatus(t, h.acq("x", "b/c", lid(5), 0, excl), command.StatusOK)
}

func TestElectionsAndModes(t *testing.T) {
	h := newHarness(t)
	key := command.ElectionKey("db")
	for _, k := range []kind{shr, sub, sem3} {
		mustStatus(t, h.acq("c", key, lid(1), 0, k), command.StatusInvalid)
	}
	// A lease holds a lock in one mode: asking again in another is refused.
	mustStatus(t, h.session("s", lid(2), ttlLong), command.StatusOK)
	mustStatus(t, h.do("s", &command.Acquire{Name: "m", LeaseID: lid(2), Session: true, Shared: true}), command.StatusOK)
	mustStatus(t, h.do("s", &command.Acquire{Name: "m", LeaseID: lid(2), Session: true, Shared: true}), command.StatusOK)
	mustStatus(t, h.do("s", &command.Acquire{Name: "m", LeaseID: lid(2), Session: true}), command.StatusInvalid)
	mustStatus(t, h.do("s", &command.Acquire{Name: "m", LeaseID: lid(2), Session: true, Shared: true, Subtree: true}), command.StatusInvalid)
}

func TestTakeoverKeepsModeAndPlace(t *testing.T) {
	h := newHarness(t)
	a := h.acq("c", "sem", lid(1), 0, sem3)
	h.acq("d", "sem", lid(2), 0, sem3)
	// The same client comes back with a new lease and takes its grant over.
	r := h.do("c", &command.Acquire{Name: "sem", LeaseID: lid(3), TTLms: ttlLong, Limit: 3, Takeover: true})
	mustStatus(t, r, command.StatusOK)
	if r.Token <= a.Token || !slices.Equal(holdersOf(h.s, "sem"), []string{"d", "c"}) {
		t.Fatalf("takeover %+v holders %v", r, holdersOf(h.s, "sem"))
	}
	if _, ok := h.s.LockGrant("sem", lid(1)); ok {
		t.Fatal("the old lease still holds")
	}
}

// Every waiter that is never timed out or cancelled is let in once the
// grants ahead of it end: from random states full of subtree, shared and
// counting waiters, release every grant, again and again, and nobody is
// left waiting.
func TestNobodyWaitsForEver(t *testing.T) {
	for _, seed := range []uint64{5, 6, 7} {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			s := New()
			g := newGen(seed, s)
			// Run until the queues are long, with cross-name waits among them.
			for i := 0; i < 3000 && (i < 300 || s.Counts().Waiters < 20 || !crossWait(s)); i++ {
				e := g.next()
				s.Apply(g.idx, e)
				s.TakeEvents()
			}
			waiting := map[command.WaitRef]bool{}
			s.locks.Ascend(func(lk *Lock) bool {
				for _, w := range lk.Queue() {
					waiting[command.WaitRef{LeaseID: w.LeaseID, Name: lk.Name, Seq: w.Seq}] = true
				}
				return true
			})
			if len(waiting) < 10 {
				t.Fatalf("only %d waiters to drain", len(waiting))
			}
			start := len(waiting)
			for round := 0; len(waiting) > 0; round++ {
				if round > 10_000 {
					t.Fatalf("%d of %d waiters never let in", len(waiting), start)
				}
				var rel []command.Envelope
				s.locks.Ascend(func(lk *Lock) bool {
					if _, tok, ok := lk.Delayed(); ok { // the leader ends lock-delays in time
						rel = append(rel, command.Envelope{Body: &command.EndLockDelay{Name: lk.Name, Token: tok}})
					}
					for _, gr := range lk.Grants() {
						rel = append(rel, command.Envelope{ClientID: s.leases[gr.LeaseID].ClientID, Body: &command.Release{Name: lk.Name, LeaseID: gr.LeaseID, Token: gr.Token}})
					}
					return true
				})
				if len(rel) == 0 {
					t.Fatalf("nothing held, yet %d wait: %v", len(waiting), waiting)
				}
				for i := range rel {
					g.idx++
					rel[i].TS, rel[i].Clock = g.ts, g.clock
					if r := s.Apply(g.idx, &rel[i]); r.Status != command.StatusOK {
						t.Fatalf("release refused: %+v", r)
					}
					for _, ev := range s.TakeEvents() {
						switch ev.Type {
						case EventAcquired:
							delete(waiting, command.WaitRef{LeaseID: ev.LeaseID, Name: ev.Name, Seq: ev.Seq})
						case EventDequeued:
							t.Fatalf("a wait ended without a grant: %+v", ev)
						}
					}
					checkInvariants(t, s)
				}
			}
			t.Logf("seed %d: %d waiters all let in", seed, start)
		})
	}
}

func TestLockModelSnapshotRoundTrip(t *testing.T) {
	h := newHarness(t)
	h.acq("c1", "sem", lid(1), 0, sem3)
	h.acq("c2", "sem", lid(2), 0, sem3)
	h.acq("r1", "cfg", lid(3), 0, shrSub)
	h.acq("r2", "cfg/a", lid(4), 0, shr)
	h.acq("w", "cfg/b", lid(5), 30_000, excl)
	h.acq("j", "tree/a", lid(6), 0, excl)
	h.acq("t", "tree", lid(7), 30_000, sub)
	h.acq("u", "tree/b", lid(8), 30_000, shr)
	snap := h.s.Snapshot()
	r, err := Restore(snap)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(r.Snapshot(), snap) || fullDump(r) != fullDump(h.s) || r.Digest() != h.s.Digest() {
		t.Fatalf("restored state differs:\n%s\nvs\n%s", fullDump(r), fullDump(h.s))
	}
	checkInvariants(t, r)
	// The restored replica lets in the same waiter as the original.
	rel := &command.Envelope{TS: h.ts + 1, ClientID: "j", Body: &command.Release{Name: "tree/a", LeaseID: lid(6), Token: h.s.GetLock("tree/a").Holder.Token}}
	h.s.Apply(h.idx+1, rel)
	r.Apply(h.idx+1, rel)
	if fullDump(r) != fullDump(h.s) || h.s.GetLock("tree").Holder.ClientID != "t" {
		t.Fatalf("after a release: %s\nvs\n%s", fullDump(r), fullDump(h.s))
	}
}

// crossWait reports whether some waiter on a free lock is held back by
// something on another name.
func crossWait(s *State) bool {
	found := false
	s.locks.Ascend(func(lk *Lock) bool {
		found = !lk.Held() && len(lk.Queue()) > 0
		return !found
	})
	return found
}
