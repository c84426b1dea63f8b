package fence

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"
)

// TokenKeyPath is where a dlock node serves its KeySetDocument.
const TokenKeyPath = "/api/v1/cluster/token-key"

// AlgorithmEd25519 is the only signing algorithm of format v1.
const AlgorithmEd25519 = "ed25519"

// maxKeySetBytes bounds the document FetchKeySet reads: a few keys are a few
// hundred bytes, and a resource must not be made to buffer an endless body.
const maxKeySetBytes = 1 << 20

// KeyInfo is one public key in a KeySetDocument.
type KeyInfo struct {
	ID        string `json:"id"`         // KeyIDOf(key), 16 hex digits
	Algorithm string `json:"algorithm"`  // "ed25519"
	PublicKey string `json:"public_key"` // standard base64 of the 32-byte key
	Current   bool   `json:"current"`    // the key new grants are signed with
	// MaxToken is set on a retired key only: the highest fencing token it
	// can have signed (the cluster's token counter when it was rotated
	// away; tokens only grow, so every genuine proof by it is at or below).
	// Verify refuses a proof by this key for a higher token with
	// ErrTokenAboveKeyBound: that proof was forged with a leaked seed.
	// Absent (nil) on the current key, and on retired keys listed by a
	// cluster older than this field, which then verify any token.
	MaxToken *uint64 `json:"max_token,omitempty"`
}

// KeySetDocument is the body of GET /api/v1/cluster/token-key. The cluster
// builds it with NewKeySetDocument; resources read it with ParseKeySet.
type KeySetDocument struct {
	Keys []KeyInfo `json:"keys"`
}

// NewKeySetDocument describes the current signing key and the older ones
// still trusted after a rotation (grants signed before it stay verifiable
// until their holders are done). The older keys get no MaxToken, so they
// verify proofs for any token; the cluster lists its retired keys with
// NewRetiredKeyInfo instead.
func NewKeySetDocument(current ed25519.PublicKey, older ...ed25519.PublicKey) KeySetDocument {
	doc := KeySetDocument{Keys: []KeyInfo{NewKeyInfo(current, true)}}
	for _, k := range older {
		doc.Keys = append(doc.Keys, NewKeyInfo(k, false))
	}
	return doc
}

// NewKeyInfo describes one public key for a KeySetDocument.
func NewKeyInfo(pub ed25519.PublicKey, current bool) KeyInfo {
	return KeyInfo{
		ID:        KeyIDOf(pub).String(),
		Algorithm: AlgorithmEd25519,
		PublicKey: base64.StdEncoding.EncodeToString(pub),
		Current:   current,
	}
}

// NewRetiredKeyInfo describes a retired key that can have signed no token
// above maxToken.
func NewRetiredKeyInfo(pub ed25519.PublicKey, maxToken uint64) KeyInfo {
	k := NewKeyInfo(pub, false)
	k.MaxToken = &maxToken
	return k
}

// KeySet is an immutable set of trusted public keys, each with an optional
// bound on the tokens it verifies. Replace the whole set to follow a
// rotation (an atomic.Pointer works well); a nil *KeySet trusts nothing.
type KeySet struct {
	keys map[KeyID]trustedKey
}

type trustedKey struct {
	pub      ed25519.PublicKey
	maxToken uint64
	bounded  bool // maxToken applies
}

// NewKeySet trusts exactly pubs, for any token. Keys of the wrong length are
// skipped, since they could never verify anything. To honour retired keys'
// bounds, build the set from the cluster's document (ParseKeySet,
// FetchKeySet, NewKeySetFromDocument).
func NewKeySet(pubs ...ed25519.PublicKey) *KeySet {
	ks := &KeySet{keys: make(map[KeyID]trustedKey, len(pubs))}
	for _, p := range pubs {
		if len(p) == ed25519.PublicKeySize {
			ks.keys[KeyIDOf(p)] = trustedKey{pub: slices.Clone(p)}
		}
	}
	return ks
}

func (ks *KeySet) key(id KeyID) (trustedKey, bool) {
	if ks == nil {
		return trustedKey{}, false
	}
	k, ok := ks.keys[id]
	return k, ok
}

// MaxToken reports the highest token the key id verifies; bounded is false
// for a key that verifies any token (the current key), and for a key not in
// the set.
func (ks *KeySet) MaxToken(id KeyID) (maxToken uint64, bounded bool) {
	k, _ := ks.key(id)
	return k.maxToken, k.bounded
}

// IDs lists the ids of the trusted keys in ascending order (for logs).
func (ks *KeySet) IDs() []KeyID {
	if ks == nil {
		return nil
	}
	ids := make([]KeyID, 0, len(ks.keys))
	for id := range ks.keys {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b KeyID) int { return bytes.Compare(a[:], b[:]) })
	return ids
}

// ParseKeySet reads a KeySetDocument. Every key must be an Ed25519 key whose
// id matches it; one bad entry rejects the whole document, because a partly
// understood key set is a sign of a misconfigured or tampered source.
// Unknown fields are ignored so that newer clusters can add some. A retired
// key's max_token is honoured by Verify.
func ParseKeySet(data []byte) (*KeySet, error) {
	var doc KeySetDocument
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("fence: key set is not a JSON key-set document: %w", err)
	}
	return NewKeySetFromDocument(doc)
}

// NewKeySetFromDocument checks a KeySetDocument as ParseKeySet does and
// trusts its keys, each within its MaxToken. It serves a document that
// arrived some other way than JSON (the gRPC GetTokenKeys answer, say).
func NewKeySetFromDocument(doc KeySetDocument) (*KeySet, error) {
	if len(doc.Keys) == 0 {
		return nil, errors.New(`fence: key set has no keys; the document must be {"keys":[{"id","algorithm","public_key","current"}...]}`)
	}
	ks := &KeySet{keys: make(map[KeyID]trustedKey, len(doc.Keys))}
	for i, k := range doc.Keys {
		pub, id, err := parseKeyInfo(k)
		if err != nil {
			return nil, fmt.Errorf("fence: key set entry %d: %w", i, err)
		}
		if _, dup := ks.keys[id]; dup {
			return nil, fmt.Errorf("fence: key set entry %d: key %s is listed twice", i, id)
		}
		tk := trustedKey{pub: pub}
		if k.MaxToken != nil {
			tk.maxToken, tk.bounded = *k.MaxToken, true
		}
		ks.keys[id] = tk
	}
	return ks, nil
}

func parseKeyInfo(k KeyInfo) (ed25519.PublicKey, KeyID, error) {
	if k.Algorithm != AlgorithmEd25519 {
		return nil, KeyID{}, fmt.Errorf("algorithm %q is not supported (only %q); upgrade this resource's fence package", k.Algorithm, AlgorithmEd25519)
	}
	raw, err := base64.StdEncoding.DecodeString(k.PublicKey)
	if err != nil {
		return nil, KeyID{}, fmt.Errorf("public_key is not standard base64: %w", err)
	}
	if len(raw) != ed25519.PublicKeySize {
		return nil, KeyID{}, fmt.Errorf("public_key is %d bytes; an Ed25519 key is %d", len(raw), ed25519.PublicKeySize)
	}
	id, err := parseKeyID(k.ID)
	if err != nil {
		return nil, KeyID{}, err
	}
	pub := ed25519.PublicKey(raw)
	if want := KeyIDOf(pub); id != want {
		return nil, KeyID{}, fmt.Errorf("id %s does not match its public key (whose id is %s); the document is corrupt", id, want)
	}
	if k.Current && k.MaxToken != nil {
		// The current key signs every new grant: a bound on it would
		// refuse the cluster's own next grants. The cluster never writes it.
		return nil, KeyID{}, fmt.Errorf("key %s is current but has max_token %d; only retired keys are bounded, so the document is corrupt", id, *k.MaxToken)
	}
	return pub, id, nil
}

// FetchKeySet gets the key set from a dlock node, e.g. baseURL
// "http://127.0.0.1:7070". A nil client uses one with a 10 s timeout; ctx
// bounds the call as well. Fetch over TLS, or from a trusted network: whoever
// can answer this request decides which proofs the resource accepts.
func FetchKeySet(ctx context.Context, client *http.Client, baseURL string) (*KeySet, error) {
	if client == nil {
		client = &http.Client{Timeout: 10 * time.Second}
	}
	url := strings.TrimRight(baseURL, "/") + TokenKeyPath
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("fence: bad cluster URL %q (want e.g. http://127.0.0.1:7070): %w", baseURL, err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fence: fetch key set: %w (is a dlock node serving at %s?)", err, baseURL)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxKeySetBytes+1))
	if err != nil {
		return nil, fmt.Errorf("fence: read key set from %s: %w", url, err)
	}
	if len(body) > maxKeySetBytes {
		return nil, fmt.Errorf("fence: key set from %s is over %d bytes; that is not a key-set document", url, maxKeySetBytes)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fence: GET %s: %s: %s (the node must be a dlock version that signs grants)", url, resp.Status, errorMessage(body))
	}
	ks, err := ParseKeySet(body)
	if err != nil {
		return nil, fmt.Errorf("%w (from %s)", err, url)
	}
	return ks, nil
}

// errorMessage extracts the message of a dlock error body, or a short
// excerpt of whatever else came back.
func errorMessage(body []byte) string {
	var e struct {
		Error struct{ Code, Message string }
	}
	if json.Unmarshal(body, &e) == nil && e.Error.Message != "" {
		return e.Error.Code + ": " + e.Error.Message
	}
	s := strings.TrimSpace(string(body))
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
