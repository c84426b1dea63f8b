package server_test

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	dlockv1 "github.com/dlock/dlock/api/dlock/v1"
	"github.com/dlock/dlock/fence"
	"github.com/dlock/dlock/internal/state"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
)

// leakedSeed is what whoever copies a snapshot (or a data directory, or a
// backup) learns: the signing key's seed, which is replicated state.
func leakedSeed(t *testing.T, c *testcluster.Cluster, node string) ed25519.PrivateKey {
	t.Helper()
	st, err := state.Restore(saveSnapshot(t, c, node))
	if err != nil {
		t.Fatal(err)
	}
	seed, _, ok := st.SigningKey()
	if !ok {
		t.Fatal("the snapshot has no signing key")
	}
	return ed25519.NewKeyFromSeed(seed[:])
}

// After a rotation for a leaked key, the published key set bounds the
// retired key by the last token granted before the rotation (over HTTP and
// gRPC alike): its genuine proofs still verify, but a proof forged with the
// leaked seed for a later token is refused before it can reach a resource's
// Checker and lock the honest holders out. Revoking drops the retired key
// altogether, at the price of the proofs it signed.
func TestTokenProofRetiredKeyIsBounded(t *testing.T) {
	c := testcluster.New(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	follower := c.Follower()

	var grants []acquireAnswer
	for i, name := range []string{"fenced/a", "fenced/b"} {
		code, a := acquire(t, c, follower, name, map[string]any{"client_id": "w", "ttl_ms": 60000})
		if code != 200 || a.TokenProof == "" {
			t.Fatalf("acquire %d: %d %+v", i, code, a)
		}
		grants = append(grants, a)
	}
	last := grants[1].FencingToken
	leaked := leakedSeed(t, c, follower)

	var rotated fence.KeySetDocument
	code, err := c.Do(context.Background(), http.MethodPost, c.URL(follower)+fence.TokenKeyPath+"/rotate", nil, &rotated)
	if err != nil || code != 200 || len(rotated.Keys) != 2 {
		t.Fatalf("rotate: %d %v %+v", code, err, rotated)
	}
	if rotated.Keys[0].MaxToken != nil || rotated.Keys[1].MaxToken == nil || *rotated.Keys[1].MaxToken != last ||
		rotated.Keys[1].ID != fence.KeyIDOf(leaked.Public().(ed25519.PublicKey)).String() {
		t.Fatalf("rotation at token %d published %+v", last, rotated)
	}
	// Every node publishes the same bound (once it has applied the
	// rotation: the document is read from the node's own state), and gRPC
	// says the same as HTTP.
	for _, id := range c.Running() {
		testutil.Eventually(t, 10*time.Second, id+" publishes the retired key's bound", func() (bool, string) {
			_, d := keySet(t, c, id)
			return len(d.Keys) == 2 && d.Keys[1].MaxToken != nil && *d.Keys[1].MaxToken == last && d.Keys[0].ID == rotated.Keys[0].ID, fmt.Sprintf("%+v", d)
		})
	}
	pb, err := dlockv1.NewClusterServiceClient(dialGRPC(t, c.GRPCAddr(leader))).GetTokenKeys(context.Background(), &dlockv1.GetTokenKeysRequest{})
	if err != nil || len(pb.Keys) != 2 || pb.Keys[0].MaxToken != nil || pb.Keys[1].MaxToken == nil || pb.Keys[1].GetMaxToken() != last || pb.Keys[1].Id != rotated.Keys[1].ID {
		t.Fatalf("gRPC GetTokenKeys: %v %v", pb, err)
	}

	ks, _ := keySet(t, c, leader)
	for i, g := range grants {
		if err := ks.Verify([]string{"fenced/a", "fenced/b"}[i], g.FencingToken, "w", g.LeaseRef, g.TokenProof); err != nil {
			t.Fatalf("a proof made before the rotation: %v", err)
		}
	}
	// The holder of the leaked seed signs a token above every real one.
	ref := fence.LeaseRef("00000000000000000000000000000000")
	for _, tok := range []uint64{last + 1, 1 << 62} {
		forged := fence.SignProof(leaked, "fenced/a", tok, "mallory", ref)
		if err := ks.Verify("fenced/a", tok, "mallory", ref, forged); !errors.Is(err, fence.ErrTokenAboveKeyBound) {
			t.Fatalf("proof forged with the retired key for token %d: %v, want ErrTokenAboveKeyBound", tok, err)
		}
	}
	// Grants after the rotation carry the new key's proofs.
	code, after := acquire(t, c, follower, "fenced/c", map[string]any{"client_id": "w", "ttl_ms": 60000})
	if code != 200 {
		t.Fatalf("acquire after rotation: %d", code)
	}
	if err := ks.Verify("fenced/c", after.FencingToken, "w", after.LeaseRef, after.TokenProof); err != nil {
		t.Fatalf("a proof made after the rotation: %v", err)
	}

	// Revoke: only the new key is left; nothing signed before verifies.
	var revoked fence.KeySetDocument
	code, err = c.Do(context.Background(), http.MethodPost, c.URL(leader)+fence.TokenKeyPath+"/rotate", map[string]any{"revoke_retired": true}, &revoked)
	if err != nil || code != 200 || len(revoked.Keys) != 1 || !revoked.Keys[0].Current || revoked.Keys[0].ID == rotated.Keys[0].ID {
		t.Fatalf("rotate with revoke_retired: %d %v %+v", code, err, revoked)
	}
	ks, _ = keySet(t, c, leader) // the node that applied the revocation
	for _, g := range append(grants, after) {
		if err := ks.Verify("fenced/c", after.FencingToken, "w", after.LeaseRef, g.TokenProof); !errors.Is(err, fence.ErrUnknownKey) {
			t.Fatalf("a proof signed before the revocation: %v, want ErrUnknownKey", err)
		}
	}
}
