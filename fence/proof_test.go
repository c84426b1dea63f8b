package fence

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

// testKey derives a fixed key from a seed byte, so failures reproduce.
func testKey(seed byte) (ed25519.PublicKey, ed25519.PrivateKey) {
	priv := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{seed}, ed25519.SeedSize))
	return priv.Public().(ed25519.PublicKey), priv
}

// TestProofMessageBytes pins the format byte for byte: the cluster signs and
// every resource verifies with these bytes, so they may never change.
func TestProofMessageBytes(t *testing.T) {
	got := ProofMessage("a/b", 0x0102030405060708, "cl", "")
	want := "dlock-fence-v1" + "\x03a/b" + "\x01\x02\x03\x04\x05\x06\x07\x08" + "\x02cl" + "\x00"
	if string(got) != want {
		t.Fatalf("ProofMessage = %q, want %q", got, want)
	}
	long := strings.Repeat("x", 300) // uvarint(300) = 0xac 0x02
	if got := ProofMessage(long, 1, "", ""); !bytes.HasPrefix(got, []byte("dlock-fence-v1\xac\x02x")) {
		t.Errorf("300-byte lock not prefixed with uvarint 0xac02: %q", got[:20])
	}
}

func TestProofMessageUnambiguous(t *testing.T) {
	// Pairs that would collide under plain concatenation.
	pairs := [][2][3]string{
		{{"ab", "c", "d"}, {"a", "bc", "d"}},
		{{"a", "b", "cd"}, {"a", "bc", "d"}},
		{{"a\x01", "", ""}, {"a", "\x01", ""}},
	}
	for _, p := range pairs {
		m1 := ProofMessage(p[0][0], 7, p[0][1], p[0][2])
		m2 := ProofMessage(p[1][0], 7, p[1][1], p[1][2])
		if bytes.Equal(m1, m2) {
			t.Errorf("%q and %q give the same message", p[0], p[1])
		}
	}
}

func TestKeyID(t *testing.T) {
	pub, _ := testKey(1)
	id := KeyIDOf(pub)
	if s := id.String(); len(s) != 16 || strings.Trim(s, "0123456789abcdef") != "" {
		t.Errorf("KeyID.String() = %q, want 16 lowercase hex digits", s)
	}
	back, err := parseKeyID(id.String())
	if err != nil || back != id {
		t.Errorf("parseKeyID(%s) = %v, %v", id, back, err)
	}
}

func TestSignProofLayout(t *testing.T) {
	pub, priv := testKey(1)
	proof := SignProof(priv, "l", 9, "c", "lease")
	if len(proof) != ProofEncodedLen {
		t.Fatalf("proof is %d characters, want %d", len(proof), ProofEncodedLen)
	}
	raw, err := base64.RawURLEncoding.DecodeString(proof)
	if err != nil {
		t.Fatal(err)
	}
	id := KeyIDOf(pub)
	if !bytes.Equal(raw[:8], id[:]) {
		t.Errorf("proof starts with %x, want key id %s", raw[:8], id)
	}
	if !ed25519.Verify(pub, ProofMessage("l", 9, "c", "lease"), raw[8:]) {
		t.Error("bytes 8..72 are not an Ed25519 signature of ProofMessage")
	}
}

func TestVerify(t *testing.T) {
	pub1, priv1 := testKey(1)
	pub2, priv2 := testKey(2) // rotated-to key
	_, stranger := testKey(3)
	ks := NewKeySet(pub2, pub1)
	const lock, token, client, lease = "billing/job", uint64(42), "worker-7", "0123456789abcdef0123456789abcdef"
	good := SignProof(priv2, lock, token, client, lease)
	// bounded is the set as the cluster publishes it after rotating from
	// key 1 to key 2 when token 42 was the last one granted.
	bounded := mustKeySet(NewKeyInfo(pub2, true), NewRetiredKeyInfo(pub1, token))

	// forged keeps the key id of a trusted key but signs with another key.
	forged := func() string {
		raw, _ := base64.RawURLEncoding.DecodeString(SignProof(stranger, lock, token, client, lease))
		id := KeyIDOf(pub2)
		copy(raw, id[:])
		return base64.RawURLEncoding.EncodeToString(raw)
	}()
	flipped := func() string {
		raw, _ := base64.RawURLEncoding.DecodeString(good)
		raw[40] ^= 1
		return base64.RawURLEncoding.EncodeToString(raw)
	}()

	tests := []struct {
		name    string
		ks      *KeySet
		lock    string
		token   uint64
		client  string
		lease   string
		proof   string
		wantErr error
	}{
		{"valid", ks, lock, token, client, lease, good, nil},
		{"retired key at its bound", bounded, lock, token, client, lease, SignProof(priv1, lock, token, client, lease), nil},
		{"retired key below its bound", bounded, lock, token - 1, client, lease, SignProof(priv1, lock, token-1, client, lease), nil},
		{"retired key above its bound", bounded, lock, token + 1, client, lease, SignProof(priv1, lock, token+1, client, lease), ErrTokenAboveKeyBound},
		{"retired key far above its bound", bounded, lock, 1 << 62, client, lease, SignProof(priv1, lock, 1<<62, client, lease), ErrTokenAboveKeyBound},
		{"retired key bound 0 verifies nothing", mustKeySet(NewKeyInfo(pub2, true), NewRetiredKeyInfo(pub1, 0)), lock, 1, client, lease, SignProof(priv1, lock, 1, client, lease), ErrTokenAboveKeyBound},
		{"current key unbounded", bounded, lock, 1 << 62, client, lease, SignProof(priv2, lock, 1<<62, client, lease), nil},
		{"over the bound and badly signed: the signature is checked first", bounded, lock, token + 1, client, lease, SignProof(priv1, lock, token, client, lease), ErrBadSignature},
		{"old key still trusted after rotation", ks, lock, token, client, lease, SignProof(priv1, lock, token, client, lease), nil},
		{"old key dropped from the set", NewKeySet(pub2), lock, token, client, lease, SignProof(priv1, lock, token, client, lease), ErrUnknownKey},
		{"forged signature", ks, lock, token, client, lease, forged, ErrBadSignature},
		{"bit flipped in signature", ks, lock, token, client, lease, flipped, ErrBadSignature},
		{"token changed", ks, lock, token + 1, client, lease, good, ErrBadSignature},
		{"lock changed", ks, "billing/other", token, client, lease, good, ErrBadSignature},
		{"client changed", ks, lock, token, "worker-8", lease, good, ErrBadSignature},
		{"lease changed", ks, lock, token, client, strings.Repeat("f", 32), good, ErrBadSignature},
		{"unknown key", ks, lock, token, client, lease, SignProof(stranger, lock, token, client, lease), ErrUnknownKey},
		{"nil key set trusts nothing", nil, lock, token, client, lease, good, ErrUnknownKey},
		{"empty", ks, lock, token, client, lease, "", ErrProofMalformed},
		{"too short", ks, lock, token, client, lease, good[:95], ErrProofMalformed},
		{"too long", ks, lock, token, client, lease, good + "A", ErrProofMalformed},
		{"padded", ks, lock, token, client, lease, good[:94] + "==", ErrProofMalformed},
		{"not base64url", ks, lock, token, client, lease, "!" + good[1:], ErrProofMalformed},
		{"standard base64 alphabet", ks, lock, token, client, lease, strings.Repeat("+", 96), ErrProofMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.ks.Verify(tt.lock, tt.token, tt.client, tt.lease, tt.proof)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("Verify = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Verify = %v, want %v", err, tt.wantErr)
			}
			if strings.Contains(err.Error(), tt.lease) {
				t.Errorf("error %q shows the lease id, which is a secret", err)
			}
		})
	}
}

// A proof produced in another implementation from the spec must verify:
// this pins the key id and message layout against accidental change.
func TestVerifyFixedVector(t *testing.T) {
	pub, priv := testKey(7)
	sig := ed25519.Sign(priv, []byte("dlock-fence-v1\x01L\x00\x00\x00\x00\x00\x00\x00\x05\x01C\x02ab"))
	id := KeyIDOf(pub)
	sum := sha256.Sum256(pub)
	wantID := hex.EncodeToString(sum[:8])
	if id.String() != wantID {
		t.Fatalf("KeyIDOf = %s, want %s", id, wantID)
	}
	proof := base64.RawURLEncoding.EncodeToString(append(id[:], sig...))
	if err := NewKeySet(pub).Verify("L", 5, "C", "ab", proof); err != nil {
		t.Fatal(err)
	}
}

func TestLeaseRef(t *testing.T) {
	id := "0123456789abcdef0123456789abcdef"
	ref := LeaseRef(id)
	if len(ref) != 32 || ref == id || strings.Contains(ref, id) {
		t.Fatalf("LeaseRef(%q) = %q", id, ref)
	}
	if LeaseRef(strings.ToUpper(id)) != ref {
		t.Fatal("LeaseRef depends on the case of the hex lease id")
	}
	if LeaseRef(id[:31]+"0") == ref {
		t.Fatal("different leases share a reference")
	}
	// Pinned: the cluster computes the same value, so it must never change.
	if want := "613a8c7ef20a468cbc4f6a649c173f8e"; ref != want {
		t.Fatalf("LeaseRef(%q) = %q, want %q", id, ref, want)
	}
}

func mustKeySet(keys ...KeyInfo) *KeySet {
	ks, err := NewKeySetFromDocument(KeySetDocument{Keys: keys})
	if err != nil {
		panic(err)
	}
	return ks
}

// A key rotated away because its seed may have leaked (a data directory,
// backup or snapshot) must not let the holder of the seed sign a proof for
// a token above the last one the cluster granted before the rotation: a
// Checker would accept the forged high token, and refuse every honest grant
// of that key as stale from then on. Genuine proofs the key made before it
// was retired still verify.
func TestRetiredKeyCannotSignAboveItsBound(t *testing.T) {
	oldPub, oldPriv := testKey(1) // leaked, then rotated away at token 999
	newPub, newPriv := testKey(2)
	const lastBeforeRotation = 999
	doc, err := json.Marshal(KeySetDocument{Keys: []KeyInfo{NewKeyInfo(newPub, true), NewRetiredKeyInfo(oldPub, lastBeforeRotation)}})
	if err != nil {
		t.Fatal(err)
	}
	ks, err := ParseKeySet(doc)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Open(filepath.Join(t.TempDir(), "f.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// write is what a resource does: verify the proof, then check the token.
	write := func(token uint64, client string, priv ed25519.PrivateKey) error {
		ref := LeaseRef("00000000000000000000000000000000")
		if err := ks.Verify("billing/job", token, client, ref, SignProof(priv, "billing/job", token, client, ref)); err != nil {
			return err
		}
		return c.Check("billing/job", token, client+"/"+ref)
	}

	const huge = uint64(1) << 62
	err = write(huge, "attacker", oldPriv)
	if !errors.Is(err, ErrTokenAboveKeyBound) {
		t.Fatalf("proof for token %d by the retired key: %v, want ErrTokenAboveKeyBound", huge, err)
	}
	if _, _, ok := c.Highest("billing/job"); ok {
		t.Fatal("the forged token reached the checker")
	}
	for _, tok := range []uint64{lastBeforeRotation + 1, lastBeforeRotation + 2} {
		if err := write(tok, "attacker", oldPriv); !errors.Is(err, ErrTokenAboveKeyBound) {
			t.Fatalf("token %d by the retired key: %v", tok, err)
		}
	}
	// A grant made before the rotation still writes; the next honest grant,
	// signed with the new key, follows it.
	if err := write(lastBeforeRotation, "old-holder", oldPriv); err != nil {
		t.Fatalf("the old key's last genuine proof: %v", err)
	}
	if err := write(lastBeforeRotation+1, "honest", newPriv); err != nil {
		t.Fatalf("the next honest grant: %v", err)
	}
	if !strings.Contains(ErrTokenAboveKeyBound.Error(), "retired key") {
		t.Errorf("error text %q does not say what happened", ErrTokenAboveKeyBound)
	}
}

// The published test vector of docs/fencing.md ("A test vector"), which the
// Python client's tests check too: any implementation must produce and
// accept exactly this proof.
func TestPublishedVector(t *testing.T) {
	seed := make([]byte, ed25519.SeedSize)
	for i := range seed {
		seed[i] = byte(i)
	}
	priv := ed25519.NewKeyFromSeed(seed)
	pub := priv.Public().(ed25519.PublicKey)
	if got, want := base64.StdEncoding.EncodeToString(pub), "A6EHv/POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg="; got != want {
		t.Fatalf("public key %s, want %s", got, want)
	}
	if got, want := KeyIDOf(pub).String(), "56475aa75463474c"; got != want {
		t.Fatalf("key id %s, want %s", got, want)
	}
	const want = "Vkdap1RjR0wNeeSlzrJzqRx_9ulRd08LoVKdnKaKovZj7tfCK37tvnm7DB2SxGrftbhOO6Z2ME4FLXqrP-GOD5W94L7vWHsJ"
	ref := LeaseRef("0123456789abcdef0123456789abcdef")
	if got := SignProof(priv, "billing/job", 42, "worker-7", ref); got != want {
		t.Fatalf("proof %s, want %s", got, want)
	}
	if err := NewKeySet(pub).Verify("billing/job", 42, "worker-7", ref, want); err != nil {
		t.Fatal(err)
	}
}
