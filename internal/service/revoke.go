package service

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/state"
)

// errTokenRevoked ends what an ACL token started (watch streams, queued
// acquires) once the token is revoked, replaced or expires: authorization is
// checked when a call starts, and a call that lasts must not outlive it.
var errTokenRevoked = errors.New("the ACL token was revoked, replaced or expired")

// revokedErr is the client's answer for something errTokenRevoked ended.
func revokedErr(what string) *apierror.Error {
	return apierror.Wrap(apierror.PermissionDenied, errTokenRevoked,
		"the ACL token %s was revoked, replaced or has expired; start again with a valid token", what)
}

// tokenUses tracks, per ACL token, the lasting calls it authorized on this
// node. It is an fsm.Observer: EventACLChanged (a token revoked or replaced)
// cancels the contexts of that token's calls, and a restored snapshot cancels
// those whose token is gone or changed. It only cancels contexts, which
// never blocks.
type tokenUses struct {
	mu sync.Mutex
	m  map[[16]byte]map[*tokenUse]struct{}
}

type tokenUse struct {
	tok    state.ACLToken
	cancel context.CancelCauseFunc
}

func newTokenUses() *tokenUses {
	return &tokenUses{m: map[[16]byte]map[*tokenUse]struct{}{}}
}

// Applied implements fsm.Observer.
func (u *tokenUses) Applied(_ uint64, events []state.Event) {
	for i := range events {
		if events[i].Type != state.EventACLChanged {
			continue
		}
		u.mu.Lock()
		for use := range u.m[events[i].Accessor] {
			use.cancel(errTokenRevoked)
		}
		u.mu.Unlock()
	}
}

// Restored implements fsm.Observer: the snapshot may have revoked or
// replaced any token.
func (u *tokenUses) Restored(st *state.State) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.m) == 0 {
		return
	}
	now := map[[16]byte]state.ACLToken{}
	for _, t := range st.ACLTokens() {
		now[t.AccessorID] = t
	}
	for acc, uses := range u.m {
		for use := range uses {
			if t, ok := now[acc]; !ok || !sameToken(t, use.tok) {
				use.cancel(errTokenRevoked)
			}
		}
	}
}

func sameToken(a, b state.ACLToken) bool {
	return a.SecretHash == b.SecretHash && a.ExpiresAt == b.ExpiresAt &&
		slices.Equal(a.Rules, b.Rules) && slices.Equal(a.ClientIDs, b.ClientIDs) && slices.Equal(a.CertCNs, b.CertCNs)
}

func (u *tokenUses) add(use *tokenUse) {
	u.mu.Lock()
	defer u.mu.Unlock()
	set := u.m[use.tok.AccessorID]
	if set == nil {
		set = map[*tokenUse]struct{}{}
		u.m[use.tok.AccessorID] = set
	}
	set[use] = struct{}{}
}

func (u *tokenUses) remove(use *tokenUse) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if set := u.m[use.tok.AccessorID]; set != nil {
		delete(set, use)
		if len(set) == 0 {
			delete(u.m, use.tok.AccessorID)
		}
	}
}

// trackToken binds a lasting call to the token that authorized it (tok, from
// authToken; nil with ACLs off): the returned context is cancelled with
// cause errTokenRevoked once the token is revoked, replaced or expires.
// stop must be called when the call ends.
func (s *Service) trackToken(ctx context.Context, tok *state.ACLToken) (context.Context, func()) {
	if tok == nil {
		return ctx, func() {}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	use := &tokenUse{tok: *tok, cancel: cancel}
	s.tokens.add(use)
	var timer *time.Timer
	if tok.ExpiresAt != 0 {
		timer = time.AfterFunc(time.Until(ms(tok.ExpiresAt)), func() { cancel(errTokenRevoked) })
	}
	// A revocation applied between authToken's read and add above was not
	// seen by the observer: look again now that the use is registered.
	var still bool
	s.acl.Read(func(st *state.State) {
		t, ok := st.ACLTokenBySecret(tok.SecretHash)
		still = ok && sameToken(t, *tok)
	})
	if !still {
		cancel(errTokenRevoked)
	}
	return ctx, func() {
		if timer != nil {
			timer.Stop()
		}
		s.tokens.remove(use)
		cancel(context.Canceled)
	}
}

// revoked reports whether ctx was ended by trackToken's revocation.
func revoked(ctx context.Context) bool {
	return ctx.Err() != nil && errors.Is(context.Cause(ctx), errTokenRevoked)
}
