package service

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/fsm"
	"github.com/dlock/dlock/internal/state"
)

// ACLs (docs/security.md): with ACLs enabled every call needs a bearer
// token whose rules grant the permission on the name, and a client_id the
// token may act as. Tokens live in the replicated state (only the SHA-256 of
// the secret), so creating or revoking one is a Raft command and every node
// enforces the same set; the check itself reads this node's applied state.

type bearerKey struct{}

// WithBearer returns a context carrying the caller's token secret (from an
// Authorization: Bearer header or gRPC metadata); the protocol APIs call it.
func WithBearer(ctx context.Context, secret string) context.Context {
	if secret == "" {
		return ctx
	}
	return context.WithValue(ctx, bearerKey{}, secret)
}

type certKey struct{}

// WithCertIdentity returns a context carrying the common name of the
// caller's client certificate, verified against the API's CA (mutual TLS);
// the protocol APIs call it. A token bound to that name (cert_cns)
// authenticates requests that carry no bearer secret.
func WithCertIdentity(ctx context.Context, cn string) context.Context {
	if cn == "" {
		return ctx
	}
	return context.WithValue(ctx, certKey{}, cn)
}

// Credentials are what WithBearer and WithCertIdentity put in ctx: the shard
// router hands them on with a call it sends to another node, which
// authorizes it as this one would.
func Credentials(ctx context.Context) (secret, certCN string) {
	return bearer(ctx), certIdentity(ctx)
}

func certIdentity(ctx context.Context) string {
	v, _ := ctx.Value(certKey{}).(string)
	return v
}

func bearer(ctx context.Context) string {
	v, _ := ctx.Value(bearerKey{}).(string)
	return v
}

// EnableACL turns enforcement on (dlock serve --acl). Call before serving.
func (s *Service) EnableACL(on bool) { s.aclOn = on }

// ACLEnabled reports whether this node enforces ACLs.
func (s *Service) ACLEnabled() bool { return s.aclOn }

// SetACLState makes the service authorize from the ACL tokens in another
// group's state (a sharded node's meta group, where ACL commands go),
// instead of its own group's. Call before serving.
func (s *Service) SetACLState(f *fsm.FSM, r linearReader) {
	s.acl, s.aclRead = f, r
	s.aclShared.Store(true)
	f.AddObserver(s.tokens)
}

// ownACL passes this group's ACL events to the tracked token uses while
// the tokens live in this group's state: once they live elsewhere
// (SetACLState) this state's empty token table must not revoke them.
type ownACL struct{ s *Service }

func (o ownACL) Applied(index uint64, events []state.Event) {
	if !o.s.aclShared.Load() {
		o.s.tokens.Applied(index, events)
	}
}

func (o ownACL) Restored(st *state.State) {
	if !o.s.aclShared.Load() {
		o.s.tokens.Restored(st)
	}
}

var permNames = []struct {
	bit  uint8
	name string
}{{command.PermRead, "read"}, {command.PermLock, "lock"}, {command.PermElect, "elect"}, {command.PermWatch, "watch"}, {command.PermAdmin, "admin"},
	{command.PermRevoke, "revoke"}}

func permString(p uint8) string {
	var out []string
	for _, n := range permNames {
		if p&n.bit != 0 {
			out = append(out, n.name)
		}
	}
	return strings.Join(out, ",")
}

// ParsePerms reads permission names ("lock", "read", ...; "all").
func ParsePerms(names []string) (uint8, error) {
	var p uint8
	for _, n := range names {
		if n == "all" {
			p |= command.PermAll
			continue
		}
		found := false
		for _, pn := range permNames {
			if pn.name == n {
				p |= pn.bit
				found = true
			}
		}
		if !found {
			return 0, fmt.Errorf("unknown permission %q: use read, lock, elect, watch, admin, revoke or all", n)
		}
	}
	return p, nil
}

// authorize checks the caller's token: perm on name (perm 0: any valid
// token), and clientID ("" skips the check) among the ids it may act as.
func (s *Service) authorize(ctx context.Context, perm uint8, name, clientID string) error {
	_, err := s.authToken(ctx, perm, name, clientID)
	return err
}

// Authenticate checks that ctx carries a valid ACL token, whatever it may
// do, for a connection that must authenticate before it is served (the
// WebSocket API). The returned context ends once that token is revoked,
// replaced or expires, so the connection can end with it; stop must be
// called when the connection ends. With ACLs off it returns ctx.
func (s *Service) Authenticate(ctx context.Context) (_ context.Context, stop func(), _ error) {
	tok, err := s.authToken(ctx, 0, "", "")
	if err != nil {
		return nil, nil, err
	}
	ctx, stop = s.trackToken(ctx, tok)
	return ctx, stop, nil
}

// authToken is authorize that also returns the token that allowed the call
// (nil with ACLs off), for calls that last (trackToken).
func (s *Service) authToken(ctx context.Context, perm uint8, name, clientID string) (*state.ACLToken, error) {
	if !s.aclOn {
		return nil, nil
	}
	secret, cn := bearer(ctx), certIdentity(ctx)
	if secret == "" && cn == "" {
		return nil, apierror.New(apierror.Unauthenticated, "this cluster requires an ACL token: send Authorization: Bearer <secret> (CLI: --acl-token or DLOCK_ACL_TOKEN), or a client certificate bound to a token")
	}
	var tok state.ACLToken
	var ok bool
	lookup := func() {
		if secret != "" {
			hash := sha256.Sum256([]byte(secret))
			s.acl.Read(func(st *state.State) { tok, ok = st.ACLTokenBySecret(hash) })
		} else {
			s.acl.Read(func(st *state.State) { tok, ok = st.ACLTokenByCertCN(cn) })
		}
	}
	lookup()
	if !ok {
		// A token created a moment ago through another node may not be
		// applied here yet: once this node has applied all that was
		// committed before the call, an unknown token really is unknown.
		rctx, cancel := context.WithTimeout(ctx, aclMissWait)
		err := s.aclRead.LinearizableRead(rctx)
		cancel()
		if err == nil {
			lookup()
		}
	}
	if !ok {
		return nil, apierror.New(apierror.Unauthenticated, "the ACL token is unknown or revoked; ask an operator for a valid one")
	}
	if tok.Expired(time.Now().UnixMilli()) {
		return nil, apierror.New(apierror.Unauthenticated, "the ACL token expired at %s; ask an operator for a new one", ms(tok.ExpiresAt).Format(time.RFC3339))
	}
	if perm != 0 && !tok.Allows(perm, name) {
		s.logger.Warn("acl: permission denied", "accessor", hex.EncodeToString(tok.AccessorID[:]), "permission", permString(perm), "name", name)
		return nil, apierror.New(apierror.PermissionDenied, "this token may not %s %q; ask for a token with a rule granting %q on a prefix of it", permString(perm), name, permString(perm))
	}
	if clientID != "" && !tok.AllowsClient(clientID) {
		s.logger.Warn("acl: client id denied", "accessor", hex.EncodeToString(tok.AccessorID[:]), "client_id", clientID)
		return nil, apierror.New(apierror.PermissionDenied, "this token may not act as client_id %q; use one of %v", clientID, tok.ClientIDs)
	}
	return &tok, nil
}

// aclMissWait bounds the read an unknown token waits for (authToken).
const aclMissWait = 2 * time.Second

// linearReader is what a token lookup that missed needs of the group
// holding the ACL state: a read after everything committed before it.
type linearReader interface {
	LinearizableRead(ctx context.Context) error
}

// ACLRule is one rule in the API.
type ACLRule struct {
	Prefix      string   `json:"prefix"`
	Permissions []string `json:"permissions"`
}

// ACLTokenRequest creates a token.
type ACLTokenRequest struct {
	Description string    `json:"description,omitempty"`
	Rules       []ACLRule `json:"rules"`
	ClientIDs   []string  `json:"client_ids,omitempty"`
	// TTLms > 0 makes the token expire that long after it is created.
	TTLms int64 `json:"ttl_ms,omitempty"`
	// CertCNs are client-certificate common names that authenticate as
	// this token over mutual TLS, without the secret.
	CertCNs []string `json:"cert_cns,omitempty"`
}

// ACLTokenView describes a token; SecretID is only ever returned when the
// token is created.
type ACLTokenView struct {
	AccessorID  string    `json:"accessor_id"`
	SecretID    string    `json:"secret_id,omitempty"`
	Description string    `json:"description,omitempty"`
	Rules       []ACLRule `json:"rules"`
	ClientIDs   []string  `json:"client_ids,omitempty"`
	CreatedAt   time.Time `json:"created_at,omitzero"`
	ExpiresAt   time.Time `json:"expires_at,omitzero"`
	CertCNs     []string  `json:"cert_cns,omitempty"`
}

// ACLTokenList lists tokens.
type ACLTokenList struct {
	Tokens []ACLTokenView `json:"tokens"`
}

func tokenView(t state.ACLToken) ACLTokenView {
	v := ACLTokenView{AccessorID: hex.EncodeToString(t.AccessorID[:]), Description: t.Description, ClientIDs: t.ClientIDs, CreatedAt: ms(t.CreatedAt), Rules: []ACLRule{}, CertCNs: t.CertCNs}
	if t.ExpiresAt != 0 {
		v.ExpiresAt = ms(t.ExpiresAt)
	}
	for _, r := range t.Rules {
		var perms []string
		for _, pn := range permNames {
			if r.Perms&pn.bit != 0 {
				perms = append(perms, pn.name)
			}
		}
		v.Rules = append(v.Rules, ACLRule{Prefix: r.Prefix, Permissions: perms})
	}
	return v
}

func randomHex16() (out [16]byte, s string) {
	if _, err := rand.Read(out[:]); err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err))
	}
	return out, hex.EncodeToString(out[:])
}

func (s *Service) putToken(ctx context.Context, req ACLTokenRequest, bootstrap bool) (*ACLTokenView, error) {
	if req.TTLms < 0 || req.TTLms > state.MaxACLTokenTTLms {
		return nil, invalid("ttl_ms must be between 0 (the token never expires) and %d (about ten years), got %d", int64(state.MaxACLTokenTTLms), req.TTLms)
	}
	body := &command.SetACLToken{Description: req.Description, ClientIDs: req.ClientIDs, Bootstrap: bootstrap, TTLms: req.TTLms, CertCNs: req.CertCNs}
	if len(req.Rules) == 0 {
		return nil, invalid("a token needs at least one rule, e.g. {\"prefix\":\"billing/\",\"permissions\":[\"lock\",\"read\"]}")
	}
	for _, r := range req.Rules {
		p, err := ParsePerms(r.Permissions)
		if err != nil {
			return nil, invalid("%v", err)
		}
		if p == 0 {
			return nil, invalid("rule for prefix %q has no permissions", r.Prefix)
		}
		body.Rules = append(body.Rules, command.ACLRule{Prefix: strings.TrimPrefix(r.Prefix, "/"), Perms: p})
	}
	var secret string
	body.AccessorID, _ = randomHex16()
	_, secret = randomHex16()
	body.SecretHash = sha256.Sum256([]byte(secret))
	resp, err := s.node.Apply(ctx, envelope("dlock-acl", "", body))
	if err != nil {
		return nil, err
	}
	if resp.Result.Status != command.StatusOK {
		if bootstrap {
			return nil, errBootstrapped()
		}
		return nil, invalid("%s", resp.Result.Message)
	}
	// Let the token work through this node at once; but the secret exists
	// only in this answer, so a node that cannot catch up still returns it.
	_ = s.catchUp(ctx, resp.Index)
	v := ACLTokenView{AccessorID: hex.EncodeToString(body.AccessorID[:]), SecretID: secret, Description: req.Description, Rules: req.Rules, ClientIDs: req.ClientIDs, CertCNs: req.CertCNs}
	return &v, nil
}

func errBootstrapped() error {
	return apierror.New(apierror.PermissionDenied, "ACLs are already bootstrapped: use a management token to create more tokens")
}

// ACLBootstrap creates the first management token (all permissions on every
// name) and returns its secret. It works once: while no token exists.
//
// It is the one write anyone may send without a token, so it counts against
// the caller's rate limit and, once this node knows of a token, is refused
// before anything is proposed: a repeated call must not cost a Raft entry.
// Two first calls racing on different nodes are settled by the state
// machine, which grants only the first.
func (s *Service) ACLBootstrap(ctx context.Context) (_ *ACLTokenView, err error) {
	defer s.observe("acl_bootstrap", time.Now(), &err)
	if err := s.admit(ctx, ""); err != nil {
		return nil, err
	}
	var done bool
	s.acl.Read(func(st *state.State) { done = st.ACLBootstrapped() })
	if done {
		return nil, errBootstrapped()
	}
	return s.putToken(ctx, ACLTokenRequest{Description: "bootstrap management token", Rules: []ACLRule{{Prefix: "", Permissions: []string{"all"}}}}, true)
}

// CreateACLToken creates a token (needs admin).
func (s *Service) CreateACLToken(ctx context.Context, req ACLTokenRequest) (_ *ACLTokenView, err error) {
	defer s.observe("acl_token_create", time.Now(), &err)
	if err := s.authorize(ctx, command.PermAdmin, "", ""); err != nil {
		return nil, err
	}
	if len(req.Description) > state.MaxACLDescription {
		return nil, invalid("description is over %d bytes", state.MaxACLDescription)
	}
	return s.putToken(ctx, req, false)
}

// ListACLTokens lists tokens without their secrets (needs admin).
func (s *Service) ListACLTokens(ctx context.Context) (_ *ACLTokenList, err error) {
	defer s.observe("acl_token_list", time.Now(), &err)
	if err := s.authorize(ctx, command.PermAdmin, "", ""); err != nil {
		return nil, err
	}
	// Linearizable like every read by default: a token created or revoked
	// through another node a moment ago is listed as it now stands.
	if err := s.aclRead.LinearizableRead(ctx); err != nil {
		return nil, err
	}
	out := &ACLTokenList{Tokens: []ACLTokenView{}}
	s.acl.Read(func(st *state.State) {
		for _, t := range st.ACLTokens() {
			out.Tokens = append(out.Tokens, tokenView(t))
		}
	})
	return out, nil
}

// DeleteACLToken revokes a token (needs admin). It answers once the
// revocation is applied on this node; the others apply it within
// milliseconds.
func (s *Service) DeleteACLToken(ctx context.Context, accessorID string) (err error) {
	defer s.observe("acl_token_delete", time.Now(), &err)
	if err := s.authorize(ctx, command.PermAdmin, "", ""); err != nil {
		return err
	}
	var id [16]byte
	b, derr := hex.DecodeString(accessorID)
	if derr != nil || len(b) != 16 {
		return invalid("accessor id must be 32 hex digits (dlock acl token list shows them)")
	}
	copy(id[:], b)
	resp, err := s.node.Apply(ctx, envelope("dlock-acl", "", &command.DeleteACLToken{AccessorID: id}))
	if err != nil {
		return err
	}
	if resp.Result.Status != command.StatusOK {
		return apierror.New(apierror.NotFound, "no ACL token with accessor id %s", accessorID)
	}
	return s.catchUp(ctx, resp.Index)
}
