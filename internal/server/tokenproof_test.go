package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/dlock/dlock/fence"
	"github.com/dlock/dlock/internal/testcluster"
)

func keySet(t *testing.T, c *testcluster.Cluster, node string) (*fence.KeySet, fence.KeySetDocument) {
	t.Helper()
	var doc fence.KeySetDocument
	code, err := c.Do(context.Background(), http.MethodGet, c.URL(node)+fence.TokenKeyPath, nil, &doc)
	if err != nil || code != 200 {
		t.Fatalf("GET token-key on %s: %d %v", node, code, err)
	}
	b, _ := json.Marshal(doc)
	ks, err := fence.ParseKeySet(b)
	if err != nil {
		t.Fatalf("parse key set from %s: %v (%s)", node, err, b)
	}
	return ks, doc
}

// Every grant carries a proof that verifies offline with the cluster's
// published keys, survives a leader change (the key is replicated), binds the
// exact grant, and stays verifiable after a key rotation.
func TestGrantsCarryVerifiableTokenProofs(t *testing.T) {
	c := testcluster.New(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	follower := c.Follower()

	code, a := acquire(t, c, follower, "fenced/a", map[string]any{"client_id": "w1", "ttl_ms": 60000})
	if code != 200 || a.TokenProof == "" || a.LeaseRef != fence.LeaseRef(a.LeaseID) {
		t.Fatalf("acquire: %d %+v", code, a)
	}
	ks, doc := keySet(t, c, follower)
	if len(doc.Keys) != 1 || !doc.Keys[0].Current {
		t.Fatalf("a new cluster should have one current key: %+v", doc)
	}
	if err := ks.Verify("fenced/a", a.FencingToken, "w1", a.LeaseRef, a.TokenProof); err != nil {
		t.Fatalf("proof of a real grant does not verify: %v", err)
	}
	// The proof binds this grant: any other token, lock, client or lease fails.
	for name, err := range map[string]error{
		"higher token": ks.Verify("fenced/a", a.FencingToken+1000, "w1", a.LeaseRef, a.TokenProof),
		"other lock":   ks.Verify("fenced/b", a.FencingToken, "w1", a.LeaseRef, a.TokenProof),
		"other client": ks.Verify("fenced/a", a.FencingToken, "w2", a.LeaseRef, a.TokenProof),
		"other lease":  ks.Verify("fenced/a", a.FencingToken, "w1", fence.LeaseRef("00000000000000000000000000000000"), a.TokenProof),
		"raw lease id": ks.Verify("fenced/a", a.FencingToken, "w1", a.LeaseID, a.TokenProof),
	} {
		if !errors.Is(err, fence.ErrBadSignature) {
			t.Errorf("%s: Verify = %v, want ErrBadSignature", name, err)
		}
	}

	// Every node publishes the same keys.
	for _, id := range c.Running() {
		_, d := keySet(t, c, id)
		if len(d.Keys) != 1 || d.Keys[0].ID != doc.Keys[0].ID {
			t.Fatalf("%s publishes %+v, %s published %+v", id, d, follower, doc)
		}
	}

	// A new leader signs with the same replicated key.
	c.Kill(leader)
	newLeader := c.WaitLeader(20 * time.Second)
	code, b := acquire(t, c, newLeader, "fenced/b", map[string]any{"client_id": "w2", "ttl_ms": 60000})
	if code != 200 {
		t.Fatalf("acquire after failover: %d", code)
	}
	if err := ks.Verify("fenced/b", b.FencingToken, "w2", b.LeaseRef, b.TokenProof); err != nil {
		t.Fatalf("proof from the new leader does not verify with the old key set: %v", err)
	}

	// Rotation: new grants use the new key; old proofs still verify with the
	// published set, which keeps the old key.
	var rotated fence.KeySetDocument
	code, err := c.Do(context.Background(), http.MethodPost, c.URL(newLeader)+fence.TokenKeyPath+"/rotate", nil, &rotated)
	if err != nil || code != 200 || len(rotated.Keys) != 2 || !rotated.Keys[0].Current || rotated.Keys[1].ID != doc.Keys[0].ID {
		t.Fatalf("rotate: %d %v %+v", code, err, rotated)
	}
	code, d := acquire(t, c, newLeader, "fenced/c", map[string]any{"client_id": "w3", "ttl_ms": 60000})
	if code != 200 {
		t.Fatalf("acquire after rotation: %d", code)
	}
	if err := ks.Verify("fenced/c", d.FencingToken, "w3", d.LeaseRef, d.TokenProof); !errors.Is(err, fence.ErrUnknownKey) {
		t.Fatalf("a proof by the new key verified with the old set: %v", err)
	}
	ks2, _ := keySet(t, c, newLeader)
	for _, g := range []struct {
		lock, client string
		a            acquireAnswer
	}{{"fenced/a", "w1", a}, {"fenced/b", "w2", b}, {"fenced/c", "w3", d}} {
		if err := ks2.Verify(g.lock, g.a.FencingToken, g.client, g.a.LeaseRef, g.a.TokenProof); err != nil {
			t.Fatalf("%s: proof does not verify with the rotated set: %v", g.lock, err)
		}
	}
}
