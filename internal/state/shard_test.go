package state

import (
	"bytes"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/dlock/dlock/internal/command"
)

// applyBoth applies one encoded entry to two replicas and checks they agree.
func applyBoth(t *testing.T, idx uint64, env *command.Envelope, a, b *State) (command.Result, []Event) {
	t.Helper()
	raw := command.Encode(env)
	ea, err := command.Decode(raw)
	if err != nil {
		t.Fatal(err)
	}
	eb, _ := command.Decode(raw)
	ra, rb := a.Apply(idx, ea), b.Apply(idx, eb)
	evA, evB := a.TakeEvents(), b.TakeEvents()
	if ra != rb || !reflect.DeepEqual(evA, evB) {
		t.Fatalf("index %d: replicas disagree: %+v vs %+v", idx, ra, rb)
	}
	return ra, evA
}

type lockCopy struct {
	info  LockInfo
	queue []QueuedInfo
	hist  []GrantRecord
}

func locksOf(s *State) map[string]lockCopy {
	out := map[string]lockCopy{}
	s.locks.Ascend(func(lk *Lock) bool {
		out[lk.Name] = lockCopy{s.GetLock(lk.Name), s.LockQueue(lk.Name), s.History(lk.Name, 1000)}
		return true
	})
	return out
}

// TestSplitCarve runs random logs, splits at "m" and checks: both replicas
// carve byte-identical halves; every lock lands in exactly one half, whole
// (holders, tokens, queue in order, history); the new half keeps every
// session, every dedup entry and the counters; each half refuses the
// other's names with wrong_shard (before its dedup table); both halves
// keep every invariant as random commands go on; their snapshots round-trip.
func TestSplitCarve(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3, 4} {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			a, b := New(), New()
			g := newGen(seed, a)
			for range 2500 {
				env := g.next()
				applyBoth(t, g.idx, env, a, b)
			}
			before, err := Restore(a.Snapshot())
			if err != nil {
				t.Fatal(err)
			}
			locks := locksOf(before)
			g.idx++
			split := &command.Split{At: "m", Group: 77}
			r, ev := applyBoth(t, g.idx, &command.Envelope{TS: g.ts, Body: split}, a, b)
			mustStatus(t, r, command.StatusOK)
			if !bytes.Equal(a.Snapshot(), b.Snapshot()) {
				t.Fatal("the kept halves differ between replicas")
			}
			sp := findEvent(t, ev, EventSplit)
			if sp.Name != "m" || sp.Token != 77 {
				t.Fatalf("split event %+v", sp)
			}
			child, err := Restore(sp.Carved)
			if err != nil {
				t.Fatalf("the carved state does not restore: %v", err)
			}
			checkInvariants(t, a)
			checkInvariants(t, child)
			if from, to, ranged := a.Range(); !ranged || from != "" || to != "m" {
				t.Fatalf("kept range [%q, %q) ranged %v", from, to, ranged)
			}
			if from, to, ranged := child.Range(); !ranged || from != "m" || to != "" {
				t.Fatalf("carved range [%q, %q) ranged %v", from, to, ranged)
			}
			if child.Index() != g.idx || child.LastToken() != before.LastToken() || child.Revision() < before.Revision() || child.LeaseClock() != before.LeaseClock() {
				t.Fatalf("carved counters: index %d token %d revision %d clock %d; source had %d %d %d %d", child.Index(), child.LastToken(),
					child.Revision(), child.LeaseClock(), g.idx, before.LastToken(), before.Revision(), before.LeaseClock())
			}
			// Every lock in exactly one half, whole.
			low, high := locksOf(a), locksOf(child)
			moved := 0
			for name, want := range locks {
				half, other := low, high
				if command.TopSegment(name) >= "m" {
					half, other = high, low
					moved++
				}
				got, ok := half[name]
				if _, dup := other[name]; !ok || dup {
					t.Fatalf("lock %q: in its half %v, in the other %v", name, ok, dup)
				}
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("lock %q changed in the carve:\n got %+v\nwant %+v", name, got, want)
				}
			}
			if len(low)+len(high) != len(locks) {
				t.Fatalf("%d+%d locks after the carve, %d before", len(low), len(high), len(locks))
			}
			if moved == 0 || moved == len(locks) {
				t.Fatalf("the log left %d of %d locks above the split: the test splits nothing", moved, len(locks))
			}
			// Sessions in both halves; dedup entries in the new one.
			for id, l := range before.leases {
				if !l.Session {
					continue
				}
				if _, ok := child.Lease(id); !ok {
					t.Fatalf("session %x missing from the carved state", id[:4])
				}
				if _, ok := a.Lease(id); !ok {
					t.Fatalf("session %x missing from the kept state", id[:4])
				}
			}
			before.dedupRing.each(func(e *dedupEntry) {
				got, ok := child.Lookup(e.key.client, e.key.request)
				if !ok || got != e.result {
					t.Fatalf("dedup entry %v: carved %+v %v, want %+v", e.key, got, ok, e.result)
				}
			})
			// Each half refuses the other's names, before its dedup table.
			for _, tc := range []struct {
				s    *State
				name string
			}{{a, "rw"}, {a, "sem"}, {child, "hot/a"}, {child, command.ElectionKey("leader")}, {child, "cold/01"}} {
				rev := tc.s.Revision()
				r := tc.s.Apply(g.idx+1, &command.Envelope{TS: g.ts, ClientID: "c", RequestID: "req-1",
					Body: &command.Acquire{Name: tc.name, LeaseID: lid(900), TTLms: 5000}})
				tc.s.TakeEvents()
				if r.Status != command.StatusWrongShard || tc.s.Revision() != rev {
					t.Fatalf("acquire of %q on the wrong half: %v (revision %d → %d)", tc.name, r.Status, rev, tc.s.Revision())
				}
			}
			// The same split again changes nothing; a split outside the
			// range, or naming another range, is refused.
			for _, bad := range []*command.Split{{At: "m", Group: 77}, {At: "t", Group: 78}, {At: "f", Group: 79, From: "a", To: "m"}, {At: "a/b", Group: 80, To: "m"}, {At: "", Group: 81, To: "m"}} {
				snap := a.Snapshot()
				r := a.Apply(g.idx+1, &command.Envelope{TS: g.ts, Body: bad})
				a.TakeEvents()
				if bad.At == "m" {
					mustStatus(t, r, command.StatusOK)
				} else {
					mustStatus(t, r, command.StatusInvalid)
				}
				if !bytes.Equal(snap, a.Snapshot()) {
					t.Fatalf("split %+v changed the state", bad)
				}
			}
			// Both halves go on under random commands, replicated.
			for _, half := range []*State{a, child} {
				twin, err := Restore(half.Snapshot())
				if err != nil {
					t.Fatal(err)
				}
				hg := newGen(seed+100, half)
				hg.idx, hg.ts, hg.clock = g.idx+1, g.ts, g.clock
				for range 1500 {
					env := hg.next()
					applyBoth(t, hg.idx, env, half, twin)
					if !half.Owns("hot") && half.locks.Len() > 0 {
						half.locks.Ascend(func(lk *Lock) bool {
							if command.TopSegment(lk.Name) < "m" {
								t.Fatalf("lock %q granted on the half above m", lk.Name)
							}
							return true
						})
					}
				}
				checkInvariants(t, half)
				if half.Digest() != half.FullDigest() {
					t.Fatal("digest drifted from the records")
				}
				rt, err := Restore(half.Snapshot())
				if err != nil || !bytes.Equal(rt.Snapshot(), half.Snapshot()) {
					t.Fatalf("snapshot round trip: %v", err)
				}
			}
		})
	}
}

// TestSplitKeepsPlaceAndAnswersRetries: a queued acquire whose lock moves
// keeps its place, and its retry with the same request_id, sent to the new
// shard, is answered from the carried dedup entry: queued, with the same
// wait; then granted in order.
func TestSplitKeepsPlaceAndAnswersRetries(t *testing.T) {
	h := newHarness(t)
	first := h.req("a", "ra", &command.Acquire{Name: "x/1", LeaseID: lid(1), TTLms: 5000})
	mustStatus(t, first, command.StatusOK)
	q1 := h.req("b", "rb", &command.Acquire{Name: "x/1", LeaseID: lid(2), TTLms: 5000, WaitMs: 60_000})
	q2 := h.req("c", "rc", &command.Acquire{Name: "x/1", LeaseID: lid(3), TTLms: 5000, WaitMs: 60_000})
	mustStatus(t, q1, command.StatusQueued)
	mustStatus(t, q2, command.StatusQueued)
	low := h.req("d", "rd", &command.Acquire{Name: "a", LeaseID: lid(4), TTLms: 5000})
	mustStatus(t, low, command.StatusOK)

	h.idx++
	h.ts += 10
	r := h.s.Apply(h.idx, &command.Envelope{TS: h.ts, Clock: h.ts - startTS, Body: &command.Split{At: "m", Group: 5}})
	mustStatus(t, r, command.StatusOK)
	ev := h.s.TakeEvents()
	if n := len(ofType(ev, EventWaitGone)); n != 2 {
		t.Fatalf("%d wait_gone events for the moved waits, want 2", n)
	}
	child, err := Restore(findEvent(t, ev, EventSplit).Carved)
	if err != nil {
		t.Fatal(err)
	}
	// The source refuses the retry; the new shard answers it from the
	// carried dedup entry, with the same wait.
	if r := h.req("b", "rb", &command.Acquire{Name: "x/1", LeaseID: lid(2), TTLms: 5000, WaitMs: 60_000}); r.Status != command.StatusWrongShard {
		t.Fatalf("retry on the source: %v", r.Status)
	}
	idx := h.idx + 1
	rr := child.Apply(idx, &command.Envelope{TS: h.ts, Clock: h.ts - startTS, ClientID: "b", RequestID: "rb",
		Body: &command.Acquire{Name: "x/1", LeaseID: lid(2), TTLms: 5000, WaitMs: 60_000}})
	if rr.Status != command.StatusQueued || !rr.Replayed || rr.Seq != q1.Seq || rr.LeaseID != q1.LeaseID {
		t.Fatalf("retry on the new shard: %+v, want the queued wait %+v", rr, q1)
	}
	// The holder releases there: b, then c, in line; tokens rise.
	idx++
	mustStatus(t, child.Apply(idx, &command.Envelope{TS: h.ts, ClientID: "a", Body: &command.Release{Name: "x/1", LeaseID: lid(1), Token: first.Token}}), command.StatusOK)
	li := child.GetLock("x/1")
	if !li.Held || li.Holders[0].ClientID != "b" || li.Holders[0].Token <= low.Token {
		t.Fatalf("after the release on the new shard: %+v", li)
	}
	if got, ok := child.Lookup("b", "rb"); !ok || got.Status != command.StatusOK || got.Token != li.Holders[0].Token {
		t.Fatalf("the granted wait's dedup entry: %+v", got)
	}
	idx++
	mustStatus(t, child.Apply(idx, &command.Envelope{TS: h.ts, ClientID: "b", Body: &command.Release{Name: "x/1", LeaseID: lid(2), Token: li.Holders[0].Token}}), command.StatusOK)
	if li2 := child.GetLock("x/1"); !li2.Held || li2.Holders[0].ClientID != "c" || li2.Holders[0].Token <= li.Holders[0].Token {
		t.Fatalf("second hand-off: %+v", li2)
	}
	checkInvariants(t, child)
}

// TestSetShardMap: only the next generation applies; bad maps are refused.
func TestSetShardMap(t *testing.T) {
	h := newHarness(t)
	m1 := []command.ShardRange{{Start: "", ID: 0, Group: 10}, {Start: "m", ID: 1, Group: 11}}
	mustStatus(t, h.do("", &command.SetShardMap{Generation: 2, Ranges: m1}), command.StatusOK)
	if gen, _ := h.s.ShardMap(); gen != 0 {
		t.Fatalf("generation 2 applied over none: %d", gen)
	}
	mustStatus(t, h.do("", &command.SetShardMap{Generation: 1, Ranges: m1}), command.StatusOK)
	m2 := []command.ShardRange{{Start: "", ID: 0, Group: 10}, {Start: "f", ID: 2, Group: 12, Replicas: []string{"n1", "n2"}}, {Start: "m", ID: 1, Group: 11}}
	for _, bad := range [][]command.ShardRange{
		nil,
		{{Start: "a", ID: 0, Group: 10}},
		{{Start: "", ID: 0, Group: 10}, {Start: "m", ID: 0, Group: 11}},
		{{Start: "", ID: 0, Group: 10}, {Start: "m", ID: 1, Group: 10}},
		{{Start: "", ID: 0, Group: 10}, {Start: "m", ID: 1, Group: 11}, {Start: "c", ID: 2, Group: 12}},
		{{Start: "", ID: 0, Group: 10}, {Start: "a/b", ID: 1, Group: 11}},
		{{Start: "", ID: 0, Group: 1}},
		{{Start: "", ID: 0, Group: 10, Replicas: []string{"n2", "n1"}}},
		{{Start: "", ID: 0, Group: 10, Replicas: []string{"n1", "n1"}}},
		{{Start: "", ID: 0, Group: 10, Replicas: []string{""}}},
		{{Start: "", ID: 0, Group: 10, Replicas: []string{"n1"}, Leaving: "n2"}},
		{{Start: "", ID: 0, Group: 10, Replicas: []string{strings.Repeat("n", command.MaxReplicaIDLen+1)}}},
	} {
		mustStatus(t, h.do("", &command.SetShardMap{Generation: 2, Ranges: bad}), command.StatusInvalid)
	}
	mustStatus(t, h.do("", &command.SetShardMap{Generation: 2, Ranges: m2}), command.StatusOK)
	mustStatus(t, h.do("", &command.SetShardMap{Generation: 2, Ranges: m1}), command.StatusOK) // stale: no-op
	gen, rs := h.s.ShardMap()
	if gen != 2 || !reflect.DeepEqual(rs, m2) {
		t.Fatalf("map %d %+v", gen, rs)
	}
	rt, err := Restore(h.s.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	if g2, rs2 := rt.ShardMap(); g2 != 2 || !reflect.DeepEqual(rs2, m2) {
		t.Fatalf("after restore: %d %+v", g2, rs2)
	}
}

// TestShardMapRemoving: a map's removing nodes may not be replicas of any
// range; a version 10 entry keeps them; a map that drops one clears it.
func TestShardMapRemoving(t *testing.T) {
	base := []command.ShardRange{{Start: "", ID: 0, Group: 10, Replicas: []string{"n1", "n2"}}, {Start: "m", ID: 1, Group: 11, Replicas: []string{"n2", "n3"}}}
	withX := []command.ShardRange{{Start: "", ID: 0, Group: 10, Replicas: []string{"n1", "n2", "x"}, Leaving: "n1"}, {Start: "m", ID: 1, Group: 11, Replicas: []string{"n2", "n3"}}}
	cases := []struct {
		name     string
		ranges   []command.ShardRange
		removing []string
		want     command.Status
	}{
		{"none", base, nil, command.StatusOK},
		{"a node on no range", base, []string{"x"}, command.StatusOK},
		{"several", base, []string{"x", "y"}, command.StatusOK},
		{"a replica", base, []string{"n3"}, command.StatusInvalid},
		{"a move's target", withX, []string{"x"}, command.StatusInvalid},
		{"a move's leaving replica", withX, []string{"n1"}, command.StatusInvalid},
		{"an implicit replica set", []command.ShardRange{{Start: "", ID: 0, Group: 10}}, []string{"x"}, command.StatusInvalid},
		{"empty id", base, []string{""}, command.StatusInvalid},
		{"repeated", base, []string{"x", "x"}, command.StatusInvalid},
		{"too long an id", base, []string{strings.Repeat("x", command.MaxReplicaIDLen+1)}, command.StatusInvalid},
		{"too many", base, func() []string {
			var ids []string
			for i := range command.MaxRemoving + 1 {
				ids = append(ids, fmt.Sprintf("x%d", i))
			}
			return ids
		}(), command.StatusInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			mustStatus(t, h.do("", &command.SetShardMap{Generation: 1, Ranges: base}), command.StatusOK)
			before, rev := dump(h.s), h.s.Revision()
			r := h.do("", &command.SetShardMap{Generation: 2, Ranges: tc.ranges, Removing: tc.removing})
			mustStatus(t, r, tc.want)
			gen, _ := h.s.ShardMap()
			if tc.want != command.StatusOK {
				if gen != 1 || r.Message == "" || len(h.s.Removing()) != 0 {
					t.Fatalf("refused map changed the state: generation %d removing %v (%q)", gen, h.s.Removing(), r.Message)
				}
				h.checkNoChange(before, rev)
				return
			}
			if gen != 2 || len(h.s.Removing()) != len(tc.removing) || (len(tc.removing) > 0 && !reflect.DeepEqual(h.s.Removing(), tc.removing)) {
				t.Fatalf("generation %d removing %v", gen, h.s.Removing())
			}
		})
	}
}

// TestShardMapRemovingCarried: a version 10 entry (from a node that knows
// nothing of removals) keeps the removing nodes and is refused when it
// places one; a current entry that drops one clears it (a join again).
func TestShardMapRemovingCarried(t *testing.T) {
	h := newHarness(t)
	base := []command.ShardRange{{Start: "", ID: 0, Group: 10, Replicas: []string{"n1", "n2"}}}
	mustStatus(t, h.do("", &command.SetShardMap{Generation: 1, Ranges: base, Removing: []string{"x"}}), command.StatusOK)
	old := func(gen uint64, rs []command.ShardRange) command.Result {
		h.idx++
		h.ts += h.step
		return h.s.Apply(h.idx, &command.Envelope{TS: h.ts, Version: 10, Body: &command.SetShardMap{Generation: gen, Ranges: rs}})
	}
	mustStatus(t, old(2, []command.ShardRange{{Start: "", ID: 0, Group: 10, Replicas: []string{"n1", "n2", "x"}, Leaving: "n2"}}), command.StatusInvalid)
	if gen, _ := h.s.ShardMap(); gen != 1 {
		t.Fatalf("an old entry placed a removing node: generation %d", gen)
	}
	mustStatus(t, old(2, []command.ShardRange{{Start: "", ID: 0, Group: 10, Replicas: []string{"n1", "n2", "n3"}, Leaving: "n2"}}), command.StatusOK)
	if gen, _ := h.s.ShardMap(); gen != 2 || !reflect.DeepEqual(h.s.Removing(), []string{"x"}) {
		t.Fatalf("an old entry dropped the removing nodes: generation %d removing %v", gen, h.s.Removing())
	}
	mustStatus(t, h.do("", &command.SetShardMap{Generation: 3, Ranges: base}), command.StatusOK)
	if len(h.s.Removing()) != 0 {
		t.Fatalf("a current map without x kept it: %v", h.s.Removing())
	}
	rt, err := Restore(h.s.Snapshot())
	if err != nil || len(rt.Removing()) != 0 {
		t.Fatalf("restore: %v %v", err, rt)
	}
}

// TestShardMapRemoveMoveRace: a move onto x and x's removal, both proposed
// on generation 1, in either order: exactly one applies; the other is
// stale, and once proposed again on the map that won, refused.
func TestShardMapRemoveMoveRace(t *testing.T) {
	base := []command.ShardRange{{Start: "", ID: 0, Group: 10, Replicas: []string{"n1", "n2"}}}
	move := &command.SetShardMap{Generation: 2, Ranges: []command.ShardRange{{Start: "", ID: 0, Group: 10, Replicas: []string{"n1", "n2", "x"}, Leaving: "n2"}}}
	remove := &command.SetShardMap{Generation: 2, Ranges: base, Removing: []string{"x"}}
	for _, moveFirst := range []bool{true, false} {
		h := newHarness(t)
		mustStatus(t, h.do("", &command.SetShardMap{Generation: 1, Ranges: base}), command.StatusOK)
		first, second := remove, move
		if moveFirst {
			first, second = move, remove
		}
		r1 := h.do("", first)
		r2 := h.do("", second)
		if r1.Status != command.StatusOK || r1.Token != 2 || r1.Message != "" {
			t.Fatalf("move first %v: the first proposal did not apply: %+v", moveFirst, r1)
		}
		if r2.Status != command.StatusOK || r2.Message != "stale generation" || r2.Token != 2 {
			t.Fatalf("move first %v: the second proposal was not stale: %+v", moveFirst, r2)
		}
		_, rs := h.s.ShardMap()
		placed := slices.Contains(rs[0].Replicas, "x")
		removing := slices.Contains(h.s.Removing(), "x")
		if placed == removing || placed != moveFirst {
			t.Fatalf("move first %v: x placed %v and removing %v", moveFirst, placed, removing)
		}
		// The loser proposed again on the map that won (generation 3):
		// refused by the apply itself.
		if moveFirst {
			again := &command.SetShardMap{Generation: 3, Ranges: rs, Removing: []string{"x"}}
			mustStatus(t, h.do("", again), command.StatusInvalid)
		} else {
			again := &command.SetShardMap{Generation: 3, Ranges: move.Ranges, Removing: h.s.Removing()}
			r := h.do("", again)
			mustStatus(t, r, command.StatusInvalid)
			if !strings.Contains(r.Message, "being removed") {
				t.Fatalf("refusal says %q", r.Message)
			}
		}
		if gen, _ := h.s.ShardMap(); gen != 2 {
			t.Fatalf("move first %v: the loser applied: generation %d", moveFirst, gen)
		}
	}
}
