package state

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/wire"
)

// ACL limits: the state machine refuses bigger tokens, so a token can never
// make a snapshot or an entry too large to replicate.
const (
	MaxACLTokens      = 10_000
	MaxACLRules       = 64
	MaxACLClientIDs   = 64
	MaxACLDescription = 256
	// MaxACLTokenTTLms bounds the TTL the service accepts for a token (about
	// ten years). Apply itself saturates the expiry time instead of refusing,
	// so entries it accepted before the bound replay the same.
	MaxACLTokenTTLms = 10 * 366 * 24 * 3600 * 1000
)

// ACLToken is one access token. Only the SHA-256 of its secret is kept.
type ACLToken struct {
	AccessorID  [16]byte
	SecretHash  [32]byte
	Description string
	Rules       []command.ACLRule
	ClientIDs   []string
	CreatedAt   int64 // leader ms timestamp of the entry that created it
	// ExpiresAt is when the token stops working (leader ms), 0 never. The
	// check is the API's, against its node's clock: the state only records it.
	ExpiresAt int64
	// CertCNs are the client-certificate common names bound to the token.
	CertCNs []string
}

// Expired reports whether the token has expired at nowMs.
func (t *ACLToken) Expired(nowMs int64) bool { return t.ExpiresAt != 0 && nowMs >= t.ExpiresAt }

// Allows reports whether the token grants perm on name.
func (t *ACLToken) Allows(perm uint8, name string) bool {
	for _, r := range t.Rules {
		if r.Perms&perm == perm && strings.HasPrefix(name, r.Prefix) {
			return true
		}
	}
	return false
}

// AllowsClient reports whether the token may act as clientID.
func (t *ACLToken) AllowsClient(clientID string) bool {
	if len(t.ClientIDs) == 0 {
		return true
	}
	for _, p := range t.ClientIDs {
		if pre, ok := strings.CutSuffix(p, "*"); ok {
			if strings.HasPrefix(clientID, pre) {
				return true
			}
		} else if p == clientID {
			return true
		}
	}
	return false
}

func validACLToken(b *command.SetACLToken) string {
	switch {
	case b.AccessorID == [16]byte{}:
		return "acl token accessor id is empty"
	case b.SecretHash == [32]byte{}:
		return "acl token secret hash is empty"
	case len(b.Description) > MaxACLDescription:
		return "acl token description too long"
	case len(b.Rules) > MaxACLRules || len(b.ClientIDs) > MaxACLClientIDs:
		return "acl token has too many rules or client ids"
	case b.TTLms < 0:
		return "acl token ttl is negative"
	}
	for _, r := range b.Rules {
		if r.Perms == 0 || r.Perms&^command.PermAll != 0 || len(r.Prefix) > command.MaxClientID*2 {
			return "acl rule has no or unknown permissions, or a too long prefix"
		}
	}
	for _, c := range b.ClientIDs {
		if c == "" || len(c) > command.MaxClientID {
			return "acl client id pattern is empty or too long"
		}
	}
	if len(b.CertCNs) > MaxACLClientIDs {
		return "acl token has too many certificate names"
	}
	for _, c := range b.CertCNs {
		if c == "" || len(c) > 256 {
			return "acl certificate name is empty or too long"
		}
	}
	return ""
}

func (s *State) setACLToken(e *command.Envelope, b *command.SetACLToken) command.Result {
	if msg := validACLToken(b); msg != "" {
		return invalid(msg)
	}
	if e.Version != 0 && e.Version < 7 {
		// The revoke permission came with command version 7: an earlier
		// entry with its bit was refused, and a replay refuses it again.
		for _, r := range b.Rules {
			if r.Perms&command.PermRevoke != 0 {
				return invalid("acl rule has no or unknown permissions, or a too long prefix")
			}
		}
	}
	if b.Bootstrap && len(s.aclTokens) > 0 {
		return invalid("ACLs are already bootstrapped")
	}
	if other, ok := s.aclBySecret[b.SecretHash]; ok && other != b.AccessorID {
		return invalid("acl token secret already in use")
	}
	for _, cn := range b.CertCNs {
		if other, ok := s.aclByCN[cn]; ok && other != b.AccessorID {
			return invalid("certificate name " + cn + " is already bound to another acl token")
		}
	}
	old, exists := s.aclTokens[b.AccessorID]
	if !exists && len(s.aclTokens) >= MaxACLTokens {
		return invalid("too many acl tokens")
	}
	t := &ACLToken{AccessorID: b.AccessorID, SecretHash: b.SecretHash, Description: b.Description,
		Rules: slices.Clone(b.Rules), ClientIDs: slices.Clone(b.ClientIDs), CreatedAt: s.ts, CertCNs: slices.Clone(b.CertCNs)}
	if b.TTLms > 0 {
		t.ExpiresAt = s.ts + b.TTLms
		if t.ExpiresAt < s.ts { // overflowed: as good as never
			t.ExpiresAt = math.MaxInt64
		}
	}
	if exists {
		t.CreatedAt = old.CreatedAt
		s.unindexACL(old)
		s.aclOut(old)
	}
	s.aclTokens[t.AccessorID] = t
	s.indexACL(t)
	s.aclIn(t)
	s.changed = true
	return command.Result{Status: command.StatusOK}
}

func (s *State) deleteACLToken(b *command.DeleteACLToken) command.Result {
	t, ok := s.aclTokens[b.AccessorID]
	if !ok {
		return command.Result{Status: command.StatusNotHolder, Message: "no such acl token"}
	}
	delete(s.aclTokens, b.AccessorID)
	s.unindexACL(t)
	s.aclOut(t)
	s.changed = true
	return command.Result{Status: command.StatusOK}
}

func (s *State) indexACL(t *ACLToken) {
	s.aclBySecret[t.SecretHash] = t.AccessorID
	for _, cn := range t.CertCNs {
		s.aclByCN[cn] = t.AccessorID
	}
}

func (s *State) unindexACL(t *ACLToken) {
	delete(s.aclBySecret, t.SecretHash)
	for _, cn := range t.CertCNs {
		delete(s.aclByCN, cn)
	}
}

// ACLTokenByCertCN finds the token a client-certificate common name is
// bound to.
func (s *State) ACLTokenByCertCN(cn string) (ACLToken, bool) {
	id, ok := s.aclByCN[cn]
	if !ok {
		return ACLToken{}, false
	}
	return *s.aclTokens[id], true
}

// ACLTokenBySecret finds a token by the SHA-256 of its secret.
func (s *State) ACLTokenBySecret(hash [32]byte) (ACLToken, bool) {
	id, ok := s.aclBySecret[hash]
	if !ok {
		return ACLToken{}, false
	}
	return *s.aclTokens[id], true
}

// ACLTokens lists every token in accessor order.
func (s *State) ACLTokens() []ACLToken {
	out := make([]ACLToken, 0, len(s.aclTokens))
	for _, id := range s.aclIDs() {
		out = append(out, *s.aclTokens[id])
	}
	return out
}

// ACLBootstrapped reports whether any token exists.
func (s *State) ACLBootstrapped() bool { return len(s.aclTokens) > 0 }

func (s *State) aclIDs() [][16]byte {
	ids := make([][16]byte, 0, len(s.aclTokens))
	for id := range s.aclTokens {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b [16]byte) int { return bytes.Compare(a[:], b[:]) })
	return ids
}

func (s *State) writeACL(w *wire.Writer) {
	ids := s.aclIDs()
	w.Uvarint(uint64(len(ids)))
	for _, id := range ids {
		writeACLToken(w, s.aclTokens[id])
	}
}

func writeACLToken(w *wire.Writer, t *ACLToken) {
	w.Fixed(t.AccessorID[:])
	w.Fixed(t.SecretHash[:])
	w.String(t.Description)
	w.Varint(t.CreatedAt)
	w.Varint(t.ExpiresAt)
	w.Uvarint(uint64(len(t.Rules)))
	for _, r := range t.Rules {
		w.String(r.Prefix)
		w.Byte(r.Perms)
	}
	w.Uvarint(uint64(len(t.ClientIDs)))
	for _, c := range t.ClientIDs {
		w.String(c)
	}
	w.Uvarint(uint64(len(t.CertCNs)))
	for _, c := range t.CertCNs {
		w.String(c)
	}
}

// readACL reads the ACL section. firstLayout is the layout of the first
// version 4 snapshots, before token expiry and certificate names were
// added (without a new snapshot version, so version 4 has both).
func (s *State) readACL(r *wire.Reader, firstLayout bool) error {
	n := r.Count(16 + 32 + 4)
	if n > MaxACLTokens {
		return fmt.Errorf("%d acl tokens exceed the limit %d", n, MaxACLTokens)
	}
	var prev [16]byte
	for ; n > 0 && r.Err() == nil; n-- {
		b := &command.SetACLToken{}
		r.Fixed(b.AccessorID[:])
		r.Fixed(b.SecretHash[:])
		b.Description = r.String()
		created := r.Varint()
		var expires int64
		if !firstLayout {
			expires = r.Varint()
		}
		if k := r.Count(2); k > 0 {
			b.Rules = make([]command.ACLRule, k)
			for i := range b.Rules {
				b.Rules[i] = command.ACLRule{Prefix: r.String(), Perms: r.Byte()}
			}
		}
		if k := r.Count(1); k > 0 {
			b.ClientIDs = make([]string, k)
			for i := range b.ClientIDs {
				b.ClientIDs[i] = r.String()
			}
		}
		if !firstLayout {
			if k := r.Count(1); k > 0 {
				b.CertCNs = make([]string, k)
				for i := range b.CertCNs {
					b.CertCNs[i] = r.String()
				}
			}
		}
		if r.Err() != nil {
			return nil // reported by the caller
		}
		if len(s.aclTokens) > 0 && bytes.Compare(prev[:], b.AccessorID[:]) >= 0 {
			return errors.New("acl tokens repeated or out of order")
		}
		prev = b.AccessorID
		if msg := validACLToken(b); msg != "" {
			return errors.New(msg)
		}
		if _, dup := s.aclBySecret[b.SecretHash]; dup {
			return errors.New("two acl tokens share a secret")
		}
		for _, cn := range b.CertCNs {
			if _, dup := s.aclByCN[cn]; dup {
				return errors.New("two acl tokens share a certificate name")
			}
		}
		t := &ACLToken{AccessorID: b.AccessorID, SecretHash: b.SecretHash, Description: b.Description,
			Rules: b.Rules, ClientIDs: b.ClientIDs, CreatedAt: created, ExpiresAt: expires, CertCNs: b.CertCNs}
		s.aclTokens[t.AccessorID] = t
		s.indexACL(t)
	}
	return nil
}
