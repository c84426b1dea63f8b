package state

import (
	"testing"

	"github.com/dlock/dlock/internal/command"
)

// digestFixture is a state with something in every part: session- and
// implicitly-held locks, a queue of three, an election with a value, a
// member, an ACL token, a signing key and dedup entries.
func digestFixture(t *testing.T) *State {
	h := newHarness(t)
	mustStatus(t, h.do("n", &command.RegisterMember{ID: "n1", RaftAddr: "r:1", APIAddr: "a:1"}), command.StatusOK)
	mustStatus(t, h.do("dlock", &command.SetTokenKey{Seed: [32]byte{1}}), command.StatusOK)
	mustStatus(t, h.do("admin", &command.SetACLToken{AccessorID: [16]byte{1}, SecretHash: [32]byte{2}, Description: "ops",
		Rules: []command.ACLRule{{Prefix: "a/", Perms: command.PermLock}}}), command.StatusOK)
	mustStatus(t, h.session("s1", lid(1), 10_000), command.StatusOK)
	mustStatus(t, h.session("s2", lid(2), 10_000), command.StatusOK)
	mustStatus(t, h.sacquire("s1", "a/one", lid(1), 0), command.StatusOK)
	mustStatus(t, h.sacquire("s2", "a/two", lid(2), 0), command.StatusOK)
	mustStatus(t, h.req("c", "r1", &command.Acquire{Name: "a/q", LeaseID: lid(3), TTLms: 5000}), command.StatusOK)
	for i, c := range []string{"w1", "w2", "w3"} {
		mustStatus(t, h.req(c, "r", &command.Acquire{Name: "a/q", LeaseID: lid(10 + i), TTLms: 5000, WaitMs: 60_000}), command.StatusQueued)
	}
	mustStatus(t, h.do("e", &command.Acquire{Name: command.ElectionKey("boss"), LeaseID: lid(4), TTLms: 5000, Value: "node-1"}), command.StatusOK)
	return h.s
}

// Replicas whose states differ in one field of one record — a lock's holder
// or token, one waiter, the queue's order, a lease's TTL or generation, an
// election value, a member, an ACL token, a signing key, a dedup entry —
// have different digests, though every count and counter is the same.
func TestDigestCoversEveryRecord(t *testing.T) {
	base := digestFixture(t)
	snap := base.Snapshot()
	want := base.Digest()
	lock := func(s *State, name string) *Lock {
		lk, _ := s.locks.Get(&Lock{Name: name})
		if lk == nil {
			t.Fatalf("no lock %s", name)
		}
		return lk
	}
	cases := map[string]func(s *State){
		"lock holder": func(s *State) {
			a, b := lock(s, "a/one"), lock(s, "a/two")
			a.Holder, b.Holder = b.Holder, a.Holder
		},
		"lock token": func(s *State) {
			a, b := lock(s, "a/one"), lock(s, "a/two")
			a.Token, b.Token = b.Token, a.Token
		},
		"lock grant time": func(s *State) { lock(s, "a/one").GrantedAt++ },
		"election value":  func(s *State) { lock(s, command.ElectionKey("boss")).setValue("node-2") },
		"one waiter":      func(s *State) { lock(s, "a/q").Queue()[1].Deadline++ },
		"waiter request":  func(s *State) { lock(s, "a/q").Queue()[2].RequestID = "r2" },
		"queue order": func(s *State) {
			q := lock(s, "a/q").Queue()
			q[0], q[1] = q[1], q[0]
			q[0].Place, q[1].Place = q[1].Place, q[0].Place
		},
		"lease ttl":        func(s *State) { s.leases[lid(1)].TTLms += 1000 },
		"lease generation": func(s *State) { s.leases[lid(2)].Gen++ },
		"lease renewal":    func(s *State) { s.leases[lid(3)].RenewedClock-- },
		"member":           func(s *State) { s.members["n1"] = Member{ID: "n1", RaftAddr: "r:1", APIAddr: "a:2"} },
		"acl token":        func(s *State) { s.aclTokens[[16]byte{1}].Description = "ops!" },
		"signing key":      func(s *State) { s.tokenKeys[0].CreatedAt++ },
		"dedup entry":      func(s *State) { s.dedupRing.at(0).result.Token++ },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			r, err := Restore(snap)
			if err != nil {
				t.Fatal(err)
			}
			if r.Digest() != want {
				t.Fatalf("a restored copy has digest %016x, the original %016x", r.Digest(), want)
			}
			mutate(r)
			// The replica that has this state (through its snapshot, so
			// the test does not depend on how the digest is kept).
			other, err := Restore(r.Snapshot())
			if err != nil {
				t.Fatalf("the mutated state does not restore: %v", err)
			}
			if other.Counts() != base.Counts() || other.Revision() != base.Revision() || other.LastToken() != base.LastToken() {
				t.Fatalf("the mutation changed a count or counter, which proves nothing")
			}
			if other.Digest() == want {
				t.Fatalf("a state that differs in %s has the same digest %016x", name, want)
			}
		})
	}
}
