package state

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"errors"
	"fmt"

	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/wire"
)

// MaxTokenKeys bounds the signing keys kept: the current one and the most
// recent retired ones, whose public halves still verify older proofs.
const MaxTokenKeys = 8

// TokenKey is one of the cluster's token-signing keys. Only the current key
// keeps its seed; a retired key keeps only its public half.
type TokenKey struct {
	ID        [8]byte
	Public    ed25519.PublicKey
	Seed      [32]byte // zero once retired
	CreatedAt int64    // leader ms timestamp of the entry that installed it
	Current   bool
	// MaxToken, on a retired key only (0 on the current one), is the
	// cluster's fencing-token counter when the key was retired. The service
	// signs a grant only after applying it, with the key current at that
	// point, so every proof this key ever made is for a token at or below
	// it (tokens are strictly increasing globally). A proof by it for a
	// higher token was forged with its seed; fence refuses it.
	MaxToken uint64
}

// tokenKeyID must equal fence.KeyIDOf: the first 8 bytes of SHA-256 of the
// public key (the service tests check them against each other).
func tokenKeyID(pub ed25519.PublicKey) (id [8]byte) {
	sum := sha256.Sum256(pub)
	copy(id[:], sum[:8])
	return id
}

func (s *State) setTokenKey(b *command.SetTokenKey) command.Result {
	if b.Seed == ([32]byte{}) {
		return invalid("token key seed is empty")
	}
	if b.RevokeRetired && !b.Rotate {
		return invalid("revoking the retired token keys needs a rotation")
	}
	hasCurrent := len(s.tokenKeys) > 0 && s.tokenKeys[len(s.tokenKeys)-1].Current
	if hasCurrent && !b.Rotate {
		return command.Result{Status: command.StatusOK} // bootstrap already done
	}
	pub := ed25519.NewKeyFromSeed(b.Seed[:]).Public().(ed25519.PublicKey)
	id := tokenKeyID(pub)
	for _, k := range s.tokenKeys {
		if k.ID == id {
			return command.Result{Status: command.StatusOK} // the same key again
		}
	}
	if hasCurrent {
		old := &s.tokenKeys[len(s.tokenKeys)-1]
		old.Current = false
		old.Seed = [32]byte{}
		// Replicated state only, so every replica records the same bound.
		old.MaxToken = s.lastToken
	}
	if b.RevokeRetired {
		// The retired keys may have leaked: stop trusting any of them, at
		// the price of every proof they signed.
		s.tokenKeys = nil
	}
	s.tokenKeys = append(s.tokenKeys, TokenKey{ID: id, Public: pub, Seed: b.Seed, CreatedAt: s.ts, Current: true})
	if n := len(s.tokenKeys); n > MaxTokenKeys {
		s.tokenKeys = append([]TokenKey(nil), s.tokenKeys[n-MaxTokenKeys:]...)
	}
	s.changed = true
	return command.Result{Status: command.StatusOK}
}

// TokenKeys returns the public view of the signing keys, oldest first. The
// seeds are not included.
func (s *State) TokenKeys() []TokenKey {
	out := make([]TokenKey, len(s.tokenKeys))
	for i, k := range s.tokenKeys {
		out[i] = TokenKey{ID: k.ID, Public: k.Public, CreatedAt: k.CreatedAt, Current: k.Current, MaxToken: k.MaxToken}
	}
	return out
}

// SigningKey returns the seed and id of the current signing key, if the
// cluster has one. It returns the seed, not the derived key: deriving costs a
// scalar multiplication, which callers pay once per key (by id), not once per
// grant.
func (s *State) SigningKey() (seed [32]byte, id [8]byte, ok bool) {
	if n := len(s.tokenKeys); n > 0 && s.tokenKeys[n-1].Current {
		k := s.tokenKeys[n-1]
		return k.Seed, k.ID, true
	}
	return seed, id, false
}

func (s *State) writeTokenKeys(w *wire.Writer) {
	w.Uvarint(uint64(len(s.tokenKeys)))
	for i := range s.tokenKeys {
		writeTokenKey(w, &s.tokenKeys[i])
	}
}

func writeTokenKey(w *wire.Writer, k *TokenKey) {
	w.Fixed(k.ID[:])
	w.Fixed(k.Public)
	w.Fixed(k.Seed[:])
	w.Varint(k.CreatedAt)
	w.Bool(k.Current)
	w.Uvarint(k.MaxToken) // snapshot version 6
}

// readTokenKeys reads the key table of a snapshot of format version v (3 or
// later). lastToken must already be restored.
func (s *State) readTokenKeys(r *wire.Reader, v byte) error {
	n := r.Count(8 + 32 + 32 + 2)
	if n > MaxTokenKeys {
		return fmt.Errorf("%d token keys exceed the limit %d", n, MaxTokenKeys)
	}
	for ; n > 0 && r.Err() == nil; n-- {
		var k TokenKey
		r.Fixed(k.ID[:])
		k.Public = make(ed25519.PublicKey, ed25519.PublicKeySize)
		r.Fixed(k.Public)
		r.Fixed(k.Seed[:])
		k.CreatedAt = r.Varint()
		k.Current = r.Bool()
		if v >= 6 {
			k.MaxToken = r.Uvarint()
		} else if !k.Current {
			// Before version 6 no bound was recorded. The snapshot's token
			// counter is a valid one: the key was retired at or before
			// this snapshot, when the counter was at most what it is now,
			// so no genuine proof by it has a higher token. It is looser
			// than the bound rotation records (tokens granted between the
			// key's retirement and the snapshot pass too), never tighter.
			k.MaxToken = s.lastToken
		}
		s.tokenKeys = append(s.tokenKeys, k)
	}
	if r.Err() != nil {
		return nil // reported by the caller
	}
	var prevBound uint64
	for i, k := range s.tokenKeys {
		if k.ID != tokenKeyID(k.Public) {
			return errors.New("a token key id does not match its public key")
		}
		last := i == len(s.tokenKeys)-1
		switch {
		case k.Current && !last:
			return errors.New("a token key other than the newest is marked current")
		case k.Current && !bytes.Equal(ed25519.NewKeyFromSeed(k.Seed[:]).Public().(ed25519.PublicKey), k.Public):
			return errors.New("the current token key's seed does not match its public key")
		case !k.Current && k.Seed != [32]byte{}:
			return errors.New("a retired token key still has its seed")
		case k.Current && k.MaxToken != 0:
			return errors.New("the current token key has a token bound")
		case !k.Current && k.MaxToken > s.lastToken:
			return fmt.Errorf("a retired token key's bound %d is above the last token granted (%d)", k.MaxToken, s.lastToken)
		case !k.Current && k.MaxToken < prevBound:
			// Keys retire in order while the counter only grows.
			return errors.New("a retired token key's bound is below an older key's")
		}
		if !k.Current {
			prevBound = k.MaxToken
		}
	}
	return nil
}

// RetireSigningKey retires the current signing key as a rotation does — its
// seed dropped, its bound the token counter now — and leaves the state with
// no current key, so the next leader installs a fresh one (ensureTokenKey)
// before it grants anything. A cluster seeded from a snapshot calls it: the
// snapshot holds the old cluster's seed, and two clusters signing with one
// key from one token counter would mint the same signed tokens, which a
// fenced resource could not tell apart. The retired key still verifies the
// proofs of grants the snapshot carries (tokens up to the bound). It is
// deterministic, so every member seeded from the same snapshot agrees.
func (s *State) RetireSigningKey() (retired TokenKey, ok bool) {
	n := len(s.tokenKeys)
	if n == 0 || !s.tokenKeys[n-1].Current {
		return TokenKey{}, false
	}
	k := &s.tokenKeys[n-1]
	k.Current = false
	k.Seed = [32]byte{}
	k.MaxToken = s.lastToken
	return TokenKey{ID: k.ID, Public: k.Public, CreatedAt: k.CreatedAt, MaxToken: k.MaxToken}, true
}
