package service

import (
	"encoding/hex"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/state"
)

// Takeover (an acquire or campaign with takeover set) takes a lock, or a
// place in its queue, from another lease of the same client_id. Knowing a
// client_id must not be enough for that — the lock_held answer names the
// holder's — so under ACLs a takeover needs more than a token that may act
// as any client: one that names this client_id in its client_ids (a
// trailing "*" pattern counts), or a management token (admin on every
// name), which could mint such a token anyway.

// authorizeTakeover checks that tok, the token authToken admitted the call
// with (nil without ACLs), may take over clientID's leases, if the call asks
// to.
func (s *Service) authorizeTakeover(tok *state.ACLToken, takeover bool, clientID string) error {
	switch {
	case !takeover || tok == nil:
		return nil
	case tok.Allows(command.PermAdmin, ""):
		return nil
	case len(tok.ClientIDs) > 0 && tok.AllowsClient(clientID):
		return nil
	}
	s.logger.Warn("acl: takeover denied", "accessor", hex.EncodeToString(tok.AccessorID[:]), "client_id", clientID)
	return apierror.New(apierror.PermissionDenied,
		"takeover needs a token whose client_ids include %q (a token without client_ids may act as any client_id, but not take over its locks); ask an operator for one (dlock acl create --client-ids %s), or acquire without takeover",
		clientID, clientID)
}
