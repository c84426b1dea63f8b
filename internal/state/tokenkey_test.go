package state

import (
	"bytes"
	"crypto/ed25519"
	"fmt"
	"slices"
	"testing"

	"github.com/dlock/dlock/internal/command"
)

// retiredKey is a retired key made from seed byte n, with bound maxToken.
func retiredKey(n byte, maxToken uint64) TokenKey {
	pub := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{n}, 32)).Public().(ed25519.PublicKey)
	return TokenKey{ID: tokenKeyID(pub), Public: pub, MaxToken: maxToken}
}

func keyIDOfSeed(n byte) [8]byte {
	var seed [32]byte
	seed[0] = n
	return tokenKeyID(ed25519.NewKeyFromSeed(seed[:]).Public().(ed25519.PublicKey))
}

// keyStep is one step of a token-key scenario: grants (each a new lock, so a
// new token), a bootstrap, or a rotation to the key of seed byte key.
type keyStep struct {
	grants int
	key    byte // 0: no key command
	rotate bool
	revoke bool
	status command.Status
}

// wantKey is one key of the table after the scenario, oldest first.
type wantKey struct {
	seed     byte
	current  bool
	maxToken uint64
}

func TestTokenKeyBound(t *testing.T) {
	grants := func(n int) keyStep { return keyStep{grants: n} }
	boot := func(k byte) keyStep { return keyStep{key: k} }
	rotate := func(k byte) keyStep { return keyStep{key: k, rotate: true} }
	revoke := func(k byte) keyStep { return keyStep{key: k, rotate: true, revoke: true} }
	tests := []struct {
		name  string
		steps []keyStep
		want  []wantKey
	}{
		{"bootstrap: the current key is unbounded",
			[]keyStep{grants(2), boot(1), grants(3)},
			[]wantKey{{1, true, 0}}},
		{"rotation bounds the old key by the token counter",
			[]keyStep{boot(1), grants(3), rotate(2), grants(4)},
			[]wantKey{{1, false, 3}, {2, true, 0}}},
		{"rotation before any grant: the old key signed nothing",
			[]keyStep{boot(1), rotate(2), grants(2)},
			[]wantKey{{1, false, 0}, {2, true, 0}}},
		{"a second rotation bounds the second key, the first keeps its bound",
			[]keyStep{boot(1), grants(2), rotate(2), grants(3), rotate(3), grants(1)},
			[]wantKey{{1, false, 2}, {2, false, 5}, {3, true, 0}}},
		{"rotations without grants between them share a bound",
			[]keyStep{boot(1), grants(2), rotate(2), rotate(3)},
			[]wantKey{{1, false, 2}, {2, false, 2}, {3, true, 0}}},
		{"a bootstrap racing a rotation changes nothing",
			[]keyStep{boot(1), grants(1), rotate(2), grants(1), boot(9)},
			[]wantKey{{1, false, 1}, {2, true, 0}}},
		{"rotating to the current key again keeps it unbounded",
			[]keyStep{boot(1), grants(1), rotate(2), grants(1), rotate(2)},
			[]wantKey{{1, false, 1}, {2, true, 0}}},
		{"the cap drops the oldest keys and keeps the others' bounds",
			[]keyStep{boot(1), grants(1), rotate(2), grants(1), rotate(3), grants(1), rotate(4), grants(1), rotate(5),
				grants(1), rotate(6), grants(1), rotate(7), grants(1), rotate(8), grants(1), rotate(9), grants(1), rotate(10)},
			[]wantKey{{3, false, 3}, {4, false, 4}, {5, false, 5}, {6, false, 6}, {7, false, 7}, {8, false, 8}, {9, false, 9}, {10, true, 0}}},
		{"revoke drops every retired key",
			[]keyStep{boot(1), grants(2), rotate(2), grants(2), rotate(3), grants(1), revoke(4), grants(1)},
			[]wantKey{{4, true, 0}}},
		{"keys retired after a revocation are bounded again",
			[]keyStep{boot(1), grants(2), revoke(2), grants(2), rotate(3)},
			[]wantKey{{2, false, 4}, {3, true, 0}}},
		{"revoke as the first key is a plain bootstrap",
			[]keyStep{grants(1), revoke(1)},
			[]wantKey{{1, true, 0}}},
		{"revoke without a rotation is refused and changes nothing",
			[]keyStep{boot(1), grants(1), rotate(2), {key: 3, revoke: true, status: command.StatusInvalid}},
			[]wantKey{{1, false, 1}, {2, true, 0}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			lock := 0
			// tokensBy records, per key id, the tokens granted while it
			// was current: all of them must be within its bound.
			tokensBy := map[[8]byte][]uint64{}
			for _, st := range tt.steps {
				for range st.grants {
					lock++
					r := h.acquire(fmt.Sprintf("c%d", lock), fmt.Sprintf("jobs/%d", lock), lid(lock), 30_000, 0)
					mustStatus(t, r, command.StatusOK)
					if _, id, ok := h.s.SigningKey(); ok {
						tokensBy[id] = append(tokensBy[id], r.Token)
					}
				}
				if st.key != 0 {
					want := st.status
					if want == 0 {
						want = command.StatusOK
					}
					mustStatus(t, h.do("dlock", &command.SetTokenKey{Seed: [32]byte{st.key}, Rotate: st.rotate, RevokeRetired: st.revoke}), want)
				}
			}
			keys := h.s.TokenKeys()
			if len(keys) != len(tt.want) {
				t.Fatalf("%d keys, want %d: %+v", len(keys), len(tt.want), keys)
			}
			for i, w := range tt.want {
				k := keys[i]
				if k.ID != keyIDOfSeed(w.seed) || k.Current != w.current || k.MaxToken != w.maxToken {
					t.Errorf("key %d: id %x current %v max_token %d; want the key of seed %d, current %v, max_token %d",
						i, k.ID, k.Current, k.MaxToken, w.seed, w.current, w.maxToken)
				}
				if !k.Current {
					for _, tok := range tokensBy[k.ID] {
						if tok > k.MaxToken {
							t.Errorf("key %d signed token %d, above its bound %d", i, tok, k.MaxToken)
						}
					}
				}
			}
			// The bound is replicated state: a snapshot keeps it, and a
			// replica replaying the same log computes the same one.
			b := h.s.Snapshot()
			r, err := Restore(b)
			if err != nil {
				t.Fatalf("restore: %v", err)
			}
			if !slices.EqualFunc(r.TokenKeys(), keys, sameKey) || !bytes.Equal(r.Snapshot(), b) {
				t.Fatalf("restored keys %+v, want %+v", r.TokenKeys(), keys)
			}
			replica := New()
			for i, raw := range h.log {
				e, err := command.Decode(raw)
				if err != nil {
					t.Fatal(err)
				}
				replica.Apply(uint64(i+1), e)
				replica.TakeEvents()
			}
			if !bytes.Equal(replica.Snapshot(), b) {
				t.Fatal("a replica applying the same log has a different snapshot")
			}
		})
	}
}

func sameKey(a, b TokenKey) bool {
	return a.ID == b.ID && bytes.Equal(a.Public, b.Public) && a.Seed == b.Seed &&
		a.CreatedAt == b.CreatedAt && a.Current == b.Current && a.MaxToken == b.MaxToken
}

// A snapshot written before version 6 has no bounds: its retired keys get
// the snapshot's token counter, an upper bound of every token they signed,
// and the restored state writes them at the current version.
func TestRestoreOldSnapshotBoundsRetiredKeys(t *testing.T) {
	h := newHarness(t)
	h.do("dlock", &command.SetTokenKey{Seed: [32]byte{1}})
	for i := 1; i <= 2; i++ {
		mustStatus(t, h.acquire(fmt.Sprintf("c%d", i), fmt.Sprintf("a/%d", i), lid(i), 30_000, 0), command.StatusOK)
	}
	h.do("dlock", &command.SetTokenKey{Seed: [32]byte{2}, Rotate: true}) // bound 2
	for i := 3; i <= 5; i++ {
		mustStatus(t, h.acquire(fmt.Sprintf("c%d", i), fmt.Sprintf("a/%d", i), lid(i), 30_000, 0), command.StatusOK)
	}
	h.do("dlock", &command.SetTokenKey{Seed: [32]byte{3}, Rotate: true}) // bound 5
	mustStatus(t, h.acquire("c6", "a/6", lid(6), 30_000, 0), command.StatusOK)
	if h.s.LastToken() != 6 {
		t.Fatalf("last token %d", h.s.LastToken())
	}
	for _, v := range []byte{3, 4, 5} {
		t.Run(fmt.Sprintf("v%d", v), func(t *testing.T) {
			old := toRaw(h.s)
			old.version = v
			if v < 4 {
				old.acl = nil
			}
			got, err := Restore(old.encode())
			if err != nil {
				t.Fatalf("version %d snapshot refused: %v", v, err)
			}
			checkInvariants(t, got)
			keys := got.TokenKeys()
			if len(keys) != 3 || keys[0].MaxToken != 6 || keys[1].MaxToken != 6 || !keys[2].Current || keys[2].MaxToken != 0 {
				t.Fatalf("keys restored from version %d: %+v; want both retired keys bounded by the token counter 6", v, keys)
			}
			want := toRaw(h.s)
			want.beforeVersion9()
			want.keys[0].MaxToken, want.keys[1].MaxToken = 6, 6
			for i := range want.members {
				want.members[i].Version = "" // members' versions came with version 7
			}
			// Nor did they have the lease clock: it restarts at 0.
			want.clock = 0
			for i := range want.leases {
				want.leases[i].renewedClock = 0
			}
			if !bytes.Equal(got.Snapshot(), want.encode()) {
				t.Fatal("the restored state does not snapshot at the current version with the bounds")
			}
		})
	}
	// The current version keeps the exact bounds.
	got, err := Restore(h.s.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	if keys := got.TokenKeys(); keys[0].MaxToken != 2 || keys[1].MaxToken != 5 {
		t.Fatalf("version 6 bounds not kept: %+v", keys)
	}
}

// Restore checks the bounds: they are ordered, within the token counter, and
// only on retired keys.
func TestRestoreChecksTokenKeyBounds(t *testing.T) {
	base := func() *rawSnap {
		r := toRaw(sampleState(t))
		if r.lastToken < 3 || len(r.keys) != 2 {
			t.Fatalf("sample state: last token %d, %d keys", r.lastToken, len(r.keys))
		}
		return r
	}
	cases := []struct {
		name string
		mod  func(r *rawSnap)
		ok   bool
	}{
		{"as written", func(r *rawSnap) {}, true},
		{"retired bound zero", func(r *rawSnap) { r.keys[0].MaxToken = 0 }, true},
		{"retired bound at the counter", func(r *rawSnap) { r.keys[0].MaxToken = r.lastToken }, true},
		{"retired bound above the counter", func(r *rawSnap) { r.keys[0].MaxToken = r.lastToken + 1 }, false},
		{"current key bounded", func(r *rawSnap) { r.keys[1].MaxToken = 1 }, false},
		{"two retired keys in order", func(r *rawSnap) {
			r.keys[0].MaxToken = 2
			r.keys = append([]TokenKey{retiredKey(40, 1)}, r.keys...)
		}, true},
		{"two retired keys with equal bounds", func(r *rawSnap) {
			r.keys[0].MaxToken = 2
			r.keys = append([]TokenKey{retiredKey(40, 2)}, r.keys...)
		}, true},
		{"two retired keys out of order", func(r *rawSnap) {
			r.keys[0].MaxToken = 1
			r.keys = append([]TokenKey{retiredKey(40, 2)}, r.keys...)
		}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := base()
			tc.mod(r)
			s, err := Restore(r.encode())
			if tc.ok && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if !tc.ok && err == nil {
				t.Fatalf("accepted keys %+v", s.TokenKeys())
			}
		})
	}
}

// A state seeded from a snapshot retires the old cluster's key: no current
// key (the first leader installs a new one), the old one bounded by the
// token counter, and the result restores.
func TestRetireSigningKeyForARestoredCluster(t *testing.T) {
	h := newHarness(t)
	mustStatus(t, h.do("dlock", &command.SetTokenKey{Seed: [32]byte{7}}), command.StatusOK)
	r := h.acquire("c", "a", lid(1), 5000, 0)
	mustStatus(t, r, command.StatusOK)
	_, oldID, _ := h.s.SigningKey()

	s, err := Restore(h.s.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	k, ok := s.RetireSigningKey()
	if !ok || k.ID != oldID || k.MaxToken != r.Token || k.Current {
		t.Fatalf("retired %+v %v, want key %x bounded at %d", k, ok, oldID, r.Token)
	}
	if _, _, has := s.SigningKey(); has {
		t.Fatal("a current key is left")
	}
	if _, again := s.RetireSigningKey(); again {
		t.Fatal("retired twice")
	}
	s, err = Restore(s.Snapshot())
	if err != nil {
		t.Fatalf("the seeded state does not restore: %v", err)
	}
	checkInvariants(t, s)
	// The new cluster's first leader bootstraps a key of its own.
	res := s.Apply(s.Index()+1, &command.Envelope{TS: startTS + 1000, ClientID: "dlock", Body: &command.SetTokenKey{Seed: [32]byte{8}}})
	mustStatus(t, res, command.StatusOK)
	_, newID, has := s.SigningKey()
	keys := s.TokenKeys()
	if !has || newID == oldID || len(keys) != 2 || keys[0].ID != oldID || keys[0].MaxToken != r.Token {
		t.Fatalf("after the new key: current %x (%v), keys %+v", newID, has, keys)
	}
	checkInvariants(t, s)
}
