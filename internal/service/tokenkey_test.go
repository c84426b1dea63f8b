package service

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dlock/dlock/fence"
	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/fsm"
	"github.com/dlock/dlock/internal/raftnode"
	"github.com/dlock/dlock/internal/state"
)

// endorseAsLeader gives n's answers the endorsements of a service on the
// leader's state, as the leader adds them to its answers to forwarded writes.
func (n *fakeNode) endorseAsLeader(t *testing.T) {
	leader := New(leaderView{n}, nil, nil)
	t.Cleanup(leader.Close)
}

// leaderView is the node as the leader's service sees it.
type leaderView struct{ *fakeNode }

func (v leaderView) FSM() *fsm.FSM                   { return v.leader }
func (v leaderView) SetEndorser(f raftnode.Endorser) { v.endorser = f }

func (n *fakeNode) seed() (seed [32]byte) {
	n.leader.Read(func(st *state.State) { seed, _, _ = st.SigningKey() })
	return seed
}

// leaderKeySet is the key set the leader's state publishes.
func (n *fakeNode) leaderKeySet(t *testing.T) *fence.KeySet {
	t.Helper()
	var doc fence.KeySetDocument
	n.leader.Read(func(st *state.State) {
		for _, k := range st.TokenKeys() {
			if k.Current {
				doc.Keys = append(doc.Keys, fence.NewKeyInfo(k.Public, true))
			} else {
				doc.Keys = append(doc.Keys, fence.NewRetiredKeyInfo(k.Public, k.MaxToken))
			}
		}
	})
	return keySet(t, &doc)
}

// keySet is what a resource does: read the published document as JSON.
func keySet(t *testing.T, doc *fence.KeySetDocument) *fence.KeySet {
	t.Helper()
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	ks, err := fence.ParseKeySet(b)
	if err != nil {
		t.Fatal(err)
	}
	return ks
}

// The published key set bounds every retired key by the last token granted
// before its rotation: the retired key's genuine proofs still verify, and a
// proof forged with its seed for any later token is refused. Revocation
// drops the retired keys and, with them, every proof they signed.
func TestTokenKeysPublishRetiredKeyBounds(t *testing.T) {
	ctx := context.Background()
	n, s := keyedService(t)
	type grant struct {
		name string
		resp *AcquireResponse
	}
	var grants []grant
	acquire := func() {
		t.Helper()
		name := fmt.Sprintf("jobs/%d", len(grants))
		r, err := s.Acquire(ctx, AcquireRequest{Name: name, ClientID: "w", TTLms: 30_000})
		if err != nil || !r.Acquired || r.TokenProof == "" {
			t.Fatalf("acquire %s: %+v %v", name, r, err)
		}
		grants = append(grants, grant{name, r})
	}
	verify := func(ks *fence.KeySet, g grant) error {
		return ks.Verify(g.name, g.resp.FencingToken, "w", g.resp.LeaseRef, g.resp.TokenProof)
	}
	for range 3 {
		acquire()
	}
	first := n.seed()
	doc, err := s.RotateTokenKey(ctx, RotateTokenKeyRequest{})
	if err != nil {
		t.Fatal(err)
	}
	acquire() // token 4, signed with the new key
	if len(doc.Keys) != 2 || !doc.Keys[0].Current || doc.Keys[0].MaxToken != nil ||
		doc.Keys[1].Current || doc.Keys[1].MaxToken == nil || *doc.Keys[1].MaxToken != 3 {
		t.Fatalf("key set after rotating at token 3: %s", mustJSON(doc))
	}
	if got, err := s.TokenKeys(ctx); err != nil || mustJSON(got) != mustJSON(doc) {
		t.Fatalf("TokenKeys = %s, %v; the rotation answered %s", mustJSON(got), err, mustJSON(doc))
	}
	ks := keySet(t, doc)
	for _, g := range grants {
		if err := verify(ks, g); err != nil {
			t.Fatalf("genuine proof of token %d: %v", g.resp.FencingToken, err)
		}
	}
	// Whoever has the retired key's seed signs a later token: refused.
	oldPriv := ed25519.NewKeyFromSeed(first[:])
	ref := fence.LeaseRef("00000000000000000000000000000000")
	for _, tok := range []uint64{4, 5, 1 << 62} {
		forged := fence.SignProof(oldPriv, "jobs/0", tok, "mallory", ref)
		if err := ks.Verify("jobs/0", tok, "mallory", ref, forged); !errors.Is(err, fence.ErrTokenAboveKeyBound) {
			t.Fatalf("proof forged with the retired key for token %d: %v", tok, err)
		}
	}

	// A second rotation bounds the second key by token 4; the first keeps 3.
	second := n.seed()
	doc, err = s.RotateTokenKey(ctx, RotateTokenKeyRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(doc.Keys) != 3 || *doc.Keys[1].MaxToken != 4 || *doc.Keys[2].MaxToken != 3 ||
		doc.Keys[1].ID != fence.KeyIDOf(publicKey(second)).String() || doc.Keys[2].ID != fence.KeyIDOf(publicKey(first)).String() {
		t.Fatalf("key set after the second rotation: %s", mustJSON(doc))
	}

	// Revocation: only the new key is left, and no earlier proof verifies.
	doc, err = s.RotateTokenKey(ctx, RotateTokenKeyRequest{RevokeRetired: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(doc.Keys) != 1 || !doc.Keys[0].Current || doc.Keys[0].MaxToken != nil {
		t.Fatalf("key set after revoking: %s", mustJSON(doc))
	}
	ks = keySet(t, doc)
	for _, g := range grants {
		if err := verify(ks, g); !errors.Is(err, fence.ErrUnknownKey) {
			t.Fatalf("proof of token %d after revocation: %v, want ErrUnknownKey", g.resp.FencingToken, err)
		}
	}
	acquire()
	if err := verify(ks, grants[len(grants)-1]); err != nil {
		t.Fatalf("a grant after the revocation: %v", err)
	}
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// A node answering a grant signs it with the key current once the grant is
// applied there, not with the key its lagging state still has: that key may
// have been retired before the grant, with a bound below its token, and the
// resource would refuse the genuine proof as forged.
func TestGrantIsSignedWithTheKeyCurrentAtTheGrant(t *testing.T) {
	ctx := context.Background()
	n := newFakeNode(true)
	s := New(n, nil, nil)
	t.Cleanup(s.Close)
	if _, err := n.Apply(ctx, &command.Envelope{ClientID: "dlock", Body: &command.SetTokenKey{Seed: [32]byte{7}}}); err != nil {
		t.Fatal(err)
	}
	n.ship()
	// The leader rotates (bound 0: nothing granted yet); this node has not
	// applied the rotation when the grant comes back from the leader.
	if _, err := n.Apply(ctx, &command.Envelope{ClientID: "dlock", Body: &command.SetTokenKey{Seed: [32]byte{8}, Rotate: true}}); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(50 * time.Millisecond)
		n.ship()
	}()
	r, err := s.Acquire(ctx, AcquireRequest{Name: "jobs/x", ClientID: "w", TTLms: 30_000})
	if err != nil || !r.Acquired {
		t.Fatalf("acquire: %+v %v", r, err)
	}
	if err := n.leaderKeySet(t).Verify("jobs/x", r.FencingToken, "w", r.LeaseRef, r.TokenProof); err != nil {
		t.Fatalf("the genuine proof of token %d does not verify with the published keys: %v", r.FencingToken, err)
	}
}
