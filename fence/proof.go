package fence

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// proofPrefix names the format and version, so a signature made for anything
// else (or for a later format) can never be read as a proof of this one.
const proofPrefix = "dlock-fence-v1"

const (
	keyIDLen = 8
	// proofLen is the decoded proof: key id, then the Ed25519 signature.
	proofLen = keyIDLen + ed25519.SignatureSize
	// ProofEncodedLen is the length of a proof string (unpadded base64url of
	// 72 bytes). Anything longer is refused before it is decoded.
	ProofEncodedLen = (proofLen*8 + 5) / 6
)

// Errors of Verify; each is wrapped with the details.
var (
	ErrProofMalformed = errors.New("fence: token proof is malformed (send the token_proof string exactly as the lock cluster returned it with the grant)")
	ErrUnknownKey     = errors.New("fence: token proof is signed by a key this resource does not trust (refresh the key set from the cluster's GET /api/v1/cluster/token-key; if it persists, the proof comes from another cluster)")
	ErrBadSignature   = errors.New("fence: token proof does not match this lock, token, client and lease (it was made for another grant, or forged: use the token_proof that came with this very grant)")
	// ErrTokenAboveKeyBound: the proof is signed by a retired key, but for
	// a token above the highest that key can have signed before it was
	// rotated away. The cluster never made it: whoever holds that key's
	// seed (a leaked data directory, backup or snapshot) forged it.
	ErrTokenAboveKeyBound = errors.New("fence: token proof is signed by a retired key for a token above the last one that key can have signed (forged with a leaked, rotated-away key): refuse the write and check where the cluster's data, backups or snapshots went")
)

// ProofMessage is the canonical byte string a token proof signs:
//
//	"dlock-fence-v1" || uvarint(len(lock)) || lock || token (8 bytes, big-endian)
//	|| uvarint(len(clientID)) || clientID || uvarint(len(leaseRef)) || leaseRef
//
// Every variable-length field is length-prefixed, so no two different
// argument lists give the same bytes, whatever the strings contain.
func ProofMessage(lock string, token uint64, clientID string, leaseRef string) []byte {
	n := len(proofPrefix) + 8 + 3*binary.MaxVarintLen64 + len(lock) + len(clientID) + len(leaseRef)
	b := make([]byte, 0, n)
	b = append(b, proofPrefix...)
	b = appendString(b, lock)
	b = binary.BigEndian.AppendUint64(b, token)
	b = appendString(b, clientID)
	b = appendString(b, leaseRef)
	return b
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// LeaseRef is the public reference to a grant's lease that a proof binds:
// 32 hex digits, the first 16 bytes of SHA-256 of "dlock-lease-ref-v1", a zero
// byte and the lease id in lowercase. The lease id itself can renew and release
// the lock, so it stays with the holder; a resource only ever sees this
// one-way digest of it. The cluster returns it with every grant as lease_ref.
func LeaseRef(leaseID string) string {
	h := sha256.New()
	h.Write([]byte(leaseRefPrefix))
	h.Write([]byte{0})
	h.Write([]byte(strings.ToLower(leaseID)))
	return hex.EncodeToString(h.Sum(nil)[:16])
}

const leaseRefPrefix = "dlock-lease-ref-v1"

// KeyID names a signing key: the first 8 bytes of SHA-256 of its Ed25519
// public key. A proof carries it so the verifier can pick the right key
// after a rotation without trying them all.
type KeyID [keyIDLen]byte

// KeyIDOf returns the id of pub.
func KeyIDOf(pub ed25519.PublicKey) KeyID {
	sum := sha256.Sum256(pub)
	var id KeyID
	copy(id[:], sum[:keyIDLen])
	return id
}

// String is the id as 16 lowercase hex digits, as in the key-set document.
func (id KeyID) String() string { return hex.EncodeToString(id[:]) }

func parseKeyID(s string) (KeyID, error) {
	var id KeyID
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != keyIDLen {
		return id, fmt.Errorf("key id %q is not %d hex digits", s, 2*keyIDLen)
	}
	copy(id[:], b)
	return id, nil
}

// SignProof signs one grant. The result is base64.RawURLEncoding of
// KeyIDOf(public key) (8 bytes) followed by the Ed25519 signature of
// ProofMessage (64 bytes): 96 characters, safe in URLs, headers and JSON.
func SignProof(priv ed25519.PrivateKey, lock string, token uint64, clientID, leaseRef string) string {
	id := KeyIDOf(priv.Public().(ed25519.PublicKey))
	raw := make([]byte, 0, proofLen)
	raw = append(raw, id[:]...)
	raw = append(raw, ed25519.Sign(priv, ProofMessage(lock, token, clientID, leaseRef))...)
	return base64.RawURLEncoding.EncodeToString(raw)
}

// Verify checks that proof was signed by a key in the set for exactly this
// lock, token, client and lease, and that the token is within the key's
// bound if it has one (a retired key's MaxToken). The error wraps
// ErrProofMalformed, ErrUnknownKey, ErrBadSignature or
// ErrTokenAboveKeyBound.
func (ks *KeySet) Verify(lock string, token uint64, clientID, leaseRef, proof string) error {
	if len(proof) != ProofEncodedLen {
		return fmt.Errorf("%w: it is %d characters, a proof is %d", ErrProofMalformed, len(proof), ProofEncodedLen)
	}
	raw, err := base64.RawURLEncoding.Strict().DecodeString(proof)
	if err != nil {
		return fmt.Errorf("%w: not unpadded base64url: %v", ErrProofMalformed, err)
	}
	var id KeyID
	copy(id[:], raw[:keyIDLen])
	k, ok := ks.key(id)
	if !ok {
		return fmt.Errorf("%w: key id %s", ErrUnknownKey, id)
	}
	if !ed25519.Verify(k.pub, ProofMessage(lock, token, clientID, leaseRef), raw[keyIDLen:]) {
		return fmt.Errorf("%w: lock %q, token %d, client %q, key %s", ErrBadSignature, lock, token, clientID, id)
	}
	// Checked after the signature, so this error always means "signed by
	// the key, yet beyond what it can have signed".
	if k.bounded && token > k.maxToken {
		return fmt.Errorf("%w: lock %q, token %d, client %q, key %s retired at token %d", ErrTokenAboveKeyBound, lock, token, clientID, id, k.maxToken)
	}
	return nil
}
