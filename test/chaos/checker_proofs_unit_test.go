package chaos

import (
	"crypto/ed25519"
	"encoding/json"
	"strings"
	"testing"

	"github.com/dlock/dlock/fence"
)

// checkProofs accepts genuine proofs of lock and election grants, ignores
// answers that are not grants, and flags a grant without a proof and one whose
// proof is for another client, lock or token.
func TestCheckProofs(t *testing.T) {
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := json.Marshal(fence.KeySetDocument{Keys: []fence.KeyInfo{fence.NewKeyInfo(pub, true)}})
	if err != nil {
		t.Fatal(err)
	}
	ks, err := fence.ParseKeySet(doc)
	if err != nil {
		t.Fatal(err)
	}
	grant := func(id int, lock, client string, token uint64) Op {
		ref := fence.LeaseRef("lease-" + client)
		return Op{ID: id, Kind: kAcquire, Lock: lock, Client: client, Out: oOK, OutToken: token, OutLeaseRef: ref,
			OutProof: fence.SignProof(priv, signedKey(lock), token, client, ref)}
	}
	good := []Op{
		grant(1, "hot/a", "c1", 7),
		grant(2, electionPrefix+"elect/a", "c2", 8),
		{ID: 3, Kind: kAcquire, Lock: "hot/a", Client: "c3", Out: oHeld},
		{ID: 4, Kind: kRelease, Lock: "hot/a", Client: "c1", Out: oOK},
	}
	if an, n := checkProofs(good, ks); len(an) != 0 || n != 2 {
		t.Fatalf("genuine proofs: %v, %d verified; want none and 2", an, n)
	}
	missing := grant(5, "hot/b", "c1", 9)
	missing.OutProof = ""
	otherClient := grant(6, "hot/b", "c1", 10)
	otherClient.Client = "c9"
	otherToken := grant(7, "hot/b", "c1", 11)
	otherToken.OutToken = 12
	electionAsLock := grant(8, electionPrefix+"elect/b", "c1", 13)
	electionAsLock.OutProof = fence.SignProof(priv, "elect/b", 13, "c1", electionAsLock.OutLeaseRef)
	an, n := checkProofs([]Op{missing, otherClient, otherToken, electionAsLock}, ks)
	if n != 0 || len(an) != 4 {
		t.Fatalf("bad proofs: %d verified, anomalies %v; want 0 and 4", n, an)
	}
	if an[0].Kind != "safety:proof-missing" || !strings.HasPrefix(an[1].Kind, "safety:proof-invalid") {
		t.Fatalf("anomaly kinds: %v", an)
	}
}
