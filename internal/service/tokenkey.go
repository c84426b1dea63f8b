package service

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"time"

	"github.com/dlock/dlock/fence"
	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/state"
)

// Every grant carries a token proof: an Ed25519 signature, by the cluster's
// replicated key, over the lock-table key (the lock name; "@e/<name>" for an
// election), the fencing token, the client id and the lease's reference
// (fence.LeaseRef: a one-way digest, since the lease id itself can release
// the lock and must not be handed to resources). A fenced
// resource verifies it with the public keys (GET /api/v1/cluster/token-key)
// and the fence package, without asking the cluster, so a forged token is
// refused. Ed25519 signatures are deterministic: every node signs a grant
// with the same bytes, whichever answers.

// signer caches the derived private key of the current signing key.
type signer struct {
	id   [8]byte
	priv ed25519.PrivateKey
}

// proof signs a grant, or returns "" while the cluster has no key yet (only
// in the moment between a new cluster's first election and its key entry).
func (s *Service) proof(key string, token uint64, clientID, leaseRef string) string {
	var seed [32]byte
	var id [8]byte
	var ok bool
	s.fsm.Read(func(st *state.State) { seed, id, ok = st.SigningKey() })
	if !ok {
		return ""
	}
	cur := s.signer.Load()
	if cur == nil || cur.id != id {
		// Derived once per key: NewKeyFromSeed costs a scalar
		// multiplication, as much as the signature itself.
		cur = &signer{id: id, priv: ed25519.NewKeyFromSeed(seed[:])}
		s.signer.Store(cur)
	}
	return fence.SignProof(cur.priv, key, token, clientID, leaseRef)
}

// TokenKeys returns the public keys that verify token proofs: the current
// one and the retired ones still kept, each retired key with the highest
// token it can have signed (max_token), so a proof forged with a leaked
// retired key for a later token is refused.
func (s *Service) TokenKeys(ctx context.Context) (_ *fence.KeySetDocument, err error) {
	defer s.observe("token_keys", time.Now(), &err)
	if err = s.admit(ctx, ""); err != nil {
		return nil, err
	}
	var keys []state.TokenKey
	s.fsm.Read(func(st *state.State) { keys = st.TokenKeys() })
	doc := &fence.KeySetDocument{Keys: []fence.KeyInfo{}}
	for i := len(keys) - 1; i >= 0; i-- { // current first
		k := keys[i]
		if k.Current {
			doc.Keys = append(doc.Keys, fence.NewKeyInfo(k.Public, true))
		} else {
			doc.Keys = append(doc.Keys, fence.NewRetiredKeyInfo(k.Public, k.MaxToken))
		}
	}
	return doc, nil
}

// RotateTokenKey installs a new signing key. Proofs signed with the old key
// stay verifiable up to the last token granted before the rotation: it is
// kept (public half only, with that bound) among the last
// state.MaxTokenKeys keys. With req.RevokeRetired every retired key is
// dropped instead, and every proof they signed stops verifying.
func (s *Service) RotateTokenKey(ctx context.Context, req RotateTokenKeyRequest) (_ *fence.KeySetDocument, err error) {
	defer s.observe("rotate_token_key", time.Now(), &err)
	if err = s.admit(ctx, ""); err != nil {
		return nil, err
	}
	if err := s.authorize(ctx, command.PermAdmin, "", ""); err != nil {
		return nil, err
	}
	body := &command.SetTokenKey{Rotate: true, RevokeRetired: req.RevokeRetired}
	if _, err := rand.Read(body.Seed[:]); err != nil {
		return nil, fmt.Errorf("draw a token key: %w", err)
	}
	resp, err := s.node.Apply(ctx, envelope("dlock", "", body))
	if err != nil {
		return nil, err
	}
	if err := s.catchUp(ctx, resp.Index); err != nil {
		return nil, err
	}
	return s.TokenKeys(ctx)
}
