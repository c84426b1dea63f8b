package state

import (
	"fmt"
	"testing"

	"github.com/dlock/dlock/internal/command"
)

// A session remembers the grants it lost while it lived — revoked, or
// taken over by another lease of its client — never those it released or
// lost by ending, and forgets them when it ends.
func TestSessionRemembersLostGrants(t *testing.T) {
	h := newHarness(t)
	h.session("s", lid(1), ttl)
	a := h.sacquire("s", "a", lid(1), 0)
	b := h.sacquire("s", "b", lid(1), 0)
	c := h.sacquire("s", "c", lid(1), 0)
	e := h.do("s", &command.Acquire{Name: command.ElectionKey("db"), LeaseID: lid(1), Session: true, Value: "v"})
	mustStatus(t, h.release("s", "a", lid(1), a.Token), command.StatusOK)
	if got := h.s.SessionLost(lid(1), 0); len(got) != 0 {
		t.Fatalf("a release is remembered as lost: %+v", got)
	}
	rb := h.do("op", &command.Revoke{Name: "b", Token: b.Token, Reason: "stuck"})
	mustStatus(t, rb, command.StatusOK)
	// The same client takes c over under a lease of its own.
	mustStatus(t, h.do("s", &command.Acquire{Name: "c", LeaseID: lid(2), TTLms: ttl, Takeover: true}), command.StatusOK)
	re := h.do("op", &command.Revoke{Name: command.ElectionKey("db"), Reason: "failover drill"})
	mustStatus(t, re, command.StatusOK)

	want := []LostGrant{
		{Key: "b", Token: b.Token, Cause: EndRevoked, Reason: "stuck", Revision: rb.Revision},
		{Key: "c", Token: c.Token, Cause: EndTakenOver},
		{Key: command.ElectionKey("db"), Token: e.Token, Cause: EndRevoked, Reason: "failover drill", Revision: re.Revision},
	}
	got := h.s.SessionLost(lid(1), 0)
	if len(got) != 3 {
		t.Fatalf("lost %+v, want %+v", got, want)
	}
	want[1].Revision = got[1].Revision
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("lost[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}
	if got[1].Revision <= rb.Revision || got[1].Revision >= re.Revision {
		t.Fatalf("takeover's revision %d is not between %d and %d", got[1].Revision, rb.Revision, re.Revision)
	}
	// after filters by revision: a client that saw rb's revision hears of
	// the two later ones only.
	if after := h.s.SessionLost(lid(1), rb.Revision); len(after) != 2 || after[0].Key != "c" {
		t.Fatalf("lost after %d: %+v", rb.Revision, after)
	}
	if after := h.s.SessionLost(lid(1), re.Revision); len(after) != 0 {
		t.Fatalf("lost after the newest: %+v", after)
	}
	if other := h.s.SessionLost(lid(2), 0); len(other) != 0 {
		t.Fatalf("an implicit lease remembers %+v", other)
	}
	// The snapshot keeps them.
	r, err := Restore(h.s.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	if got := r.SessionLost(lid(1), 0); len(got) != 3 || got[2] != want[2] {
		t.Fatalf("restored: %+v", got)
	}
	// They go with the session.
	mustStatus(t, h.do("s", &command.DeleteSession{LeaseID: lid(1)}), command.StatusOK)
	if got := h.s.SessionLost(lid(1), 0); len(got) != 0 {
		t.Fatalf("a deleted session's lost grants are kept: %+v", got)
	}
	if h.s.Digest() != h.s.FullDigest() {
		t.Fatal("the digest missed forgetting a session's lost grants")
	}
}

// What a session remembers is bounded: the oldest go first.
func TestSessionLostGrantsBounded(t *testing.T) {
	h := newHarness(t)
	h.session("s", lid(1), ttl)
	var first uint64
	for i := range MaxLostPerSession + 3 {
		name := fmt.Sprintf("l%d", i)
		g := h.sacquire("s", name, lid(1), 0)
		if i == 3 {
			first = g.Token
		}
		mustStatus(t, h.do("op", &command.Revoke{Name: name, Reason: "x"}), command.StatusOK)
	}
	got := h.s.SessionLost(lid(1), 0)
	if len(got) != MaxLostPerSession || got[0].Token != first || got[0].Key != "l3" {
		t.Fatalf("kept %d, oldest %+v; want %d from l3 (token %d)", len(got), got[0], MaxLostPerSession, first)
	}
	if h.s.Digest() != h.s.FullDigest() {
		t.Fatal("the digest missed dropping the oldest lost grant")
	}
}

// Sessions remember lost grants only from command version 8 on: a version 7
// entry applied by an older node remembered none, and a replay of it (or a
// node restored from a snapshot of that time) must agree with that node.
func TestLostGrantsOnlyFromVersion8(t *testing.T) {
	h := newHarness(t)
	h.session("s", lid(1), ttl)
	b := h.sacquire("s", "b", lid(1), 0)
	h.idx++
	h.ts += h.step
	raw := command.Encode(&command.Envelope{TS: h.ts, Clock: h.ts - startTS, ClientID: "op", Body: &command.Revoke{Name: "b", Token: b.Token, Reason: "stuck"}})
	raw[1] = 7 // version 8 changed no encoding
	old, err := command.Decode(raw)
	if err != nil {
		t.Fatal(err)
	}
	mustStatus(t, h.s.Apply(h.idx, old), command.StatusOK)
	h.s.TakeEvents()
	if got := h.s.SessionLost(lid(1), 0); len(got) != 0 {
		t.Fatalf("a version 7 revoke is remembered: %+v", got)
	}
	c := h.sacquire("s", "c", lid(1), 0)
	mustStatus(t, h.do("op", &command.Revoke{Name: "c", Token: c.Token}), command.StatusOK)
	if got := h.s.SessionLost(lid(1), 0); len(got) != 1 || got[0].Key != "c" {
		t.Fatalf("a current revoke: lost %+v, want c", got)
	}
}
