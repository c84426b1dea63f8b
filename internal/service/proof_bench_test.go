package service

import (
	"crypto/ed25519"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/dlock/dlock/fence"
	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/fsm"
)

// applyTokenKey commits a SetTokenKey entry at index to f.
func applyTokenKey(tb testing.TB, f *fsm.FSM, index uint64, seed [32]byte, rotate bool) {
	tb.Helper()
	env := (&command.Envelope{ClientID: "dlock", Body: &command.SetTokenKey{Seed: seed, Rotate: rotate}}).Stamped(int64(index))
	data, err := command.EncodeChecked(env)
	if err != nil {
		tb.Fatal(err)
	}
	f.Apply(&raft.Log{Index: index, Type: raft.LogCommand, Data: data})
}

func publicKey(seed [32]byte) ed25519.PublicKey {
	return ed25519.NewKeyFromSeed(seed[:]).Public().(ed25519.PublicKey)
}

// The signer is cached per key id: proofs verify with the cluster's key, and
// after a rotation with the new key at once, not the cached old one.
func TestProofUsesTheCurrentKeyAcrossRotation(t *testing.T) {
	f := fsm.New(nil)
	s := New(&fakeNode{leader: f, local: f}, nil, nil)
	t.Cleanup(s.Close)
	if p := s.proof("jobs/x", 1, "c1", "ref"); p != "" {
		t.Fatalf("proof without a cluster key: %q", p)
	}
	first, second := [32]byte{7}, [32]byte{8}
	applyTokenKey(t, f, 1, first, false)
	for token := uint64(1); token <= 3; token++ {
		p := s.proof("jobs/x", token, "c1", "ref")
		if err := fence.NewKeySet(publicKey(first)).Verify("jobs/x", token, "c1", "ref", p); err != nil {
			t.Fatalf("token %d: %v", token, err)
		}
	}
	applyTokenKey(t, f, 2, second, true)
	p := s.proof("jobs/x", 4, "c1", "ref")
	if err := fence.NewKeySet(publicKey(second)).Verify("jobs/x", 4, "c1", "ref", p); err != nil {
		t.Fatalf("after rotation: %v", err)
	}
	if err := fence.NewKeySet(publicKey(first)).Verify("jobs/x", 4, "c1", "ref", p); err == nil {
		t.Fatal("after rotation the proof still verifies with the retired key")
	}
}

// BenchmarkProof is the per-grant cost of the token proof (one Ed25519
// signature); deriving the key per grant showed here as twice the time.
func BenchmarkProof(b *testing.B) {
	f := fsm.New(nil)
	applyTokenKey(b, f, 1, [32]byte{7}, false)
	s := New(&fakeNode{leader: f, local: f}, nil, nil)
	b.Cleanup(s.Close)
	b.ReportAllocs()
	var token uint64
	for b.Loop() {
		token++
		if s.proof("jobs/x", token, "c1", "ref") == "" {
			b.Fatal("no proof")
		}
	}
}
