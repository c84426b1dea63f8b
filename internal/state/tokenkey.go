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
		out[i] = TokenKey{ID: k.ID, Public: k.Public, CreatedAt: k.CreatedAt, Current: k.Current}
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
	for _, k := range s.tokenKeys {
		w.Fixed(k.ID[:])
		w.Fixed(k.Public)
		w.Fixed(k.Seed[:])
		w.Varint(k.CreatedAt)
		w.Bool(k.Current)
	}
}

func (s *State) readTokenKeys(r *wire.Reader) error {
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
		s.tokenKeys = append(s.tokenKeys, k)
	}
	if r.Err() != nil {
		return nil // reported by the caller
	}
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
		}
	}
	return nil
}
