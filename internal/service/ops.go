package service

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/state"
)

// Operating locks: the grant history an operator reads after an incident,
// and the forced release (revoke) that frees a lock whose holder is stuck.

// History limits: a name keeps at most state.MaxHistoryPerName ended grants,
// plus the current one.
const MaxHistoryLimit = state.MaxHistoryPerName + 1

// HistoryRequest reads the grants of one lock or election, newest first.
type HistoryRequest struct {
	Name     string
	Election bool
	// Limit is how many grants to return: 0 means all that are kept.
	Limit int
	Stale bool
}

// GrantView is one grant in a history. EndedAt and EndCause are empty for
// the grant that still holds the lock.
type GrantView struct {
	FencingToken uint64    `json:"fencing_token"`
	ClientID     string    `json:"client_id"`
	Value        string    `json:"value,omitempty"`
	GrantedAt    time.Time `json:"granted_at"`
	EndedAt      time.Time `json:"ended_at,omitzero"`
	// EndCause is released, expired, session_deleted, revoked, taken_over
	// or resigned; empty while the grant holds.
	EndCause    string `json:"end_cause,omitempty"`
	Reason      string `json:"reason,omitempty"`
	TTLms       int64  `json:"ttl_ms"`
	LockDelayMs int64  `json:"lock_delay_ms,omitempty"`
}

// HistoryResponse is a lock's or election's recent grants, newest first.
type HistoryResponse struct {
	Name     string      `json:"name"`
	Grants   []GrantView `json:"grants"`
	Revision uint64      `json:"revision"`
	Stale    *StaleRead  `json:"-"`
}

func grantView(g state.GrantRecord) GrantView {
	v := GrantView{FencingToken: g.Token, ClientID: g.ClientID, Value: g.Value, GrantedAt: ms(g.GrantedAt),
		Reason: g.Reason, TTLms: int64(g.TTLms), LockDelayMs: int64(g.LockDelayMs)}
	if g.Cause != 0 {
		v.EndedAt, v.EndCause = ms(g.EndedAt), g.Cause.String()
	}
	return v
}

// History returns the recent grants of a lock (or an election), the one
// that holds it first. It needs read permission on the name.
func (s *Service) History(ctx context.Context, req HistoryRequest) (_ *HistoryResponse, err error) {
	defer s.observe("history", time.Now(), &err)
	limit := req.Limit
	switch {
	case limit == 0:
		limit = MaxHistoryLimit
	case limit < 0 || limit > MaxHistoryLimit:
		return nil, invalid("limit must be between 1 and %d", MaxHistoryLimit)
	}
	name, err := s.admitRead(ctx, req.Name, req.Stale)
	if err != nil {
		return nil, err
	}
	key := name
	if req.Election {
		key = command.ElectionKey(name)
	}
	out := &HistoryResponse{Name: name, Grants: []GrantView{}, Stale: s.staleRead(req.Stale)}
	if err := s.readOwned(key, func(st *state.State) {
		for _, g := range st.History(key, limit) {
			out.Grants = append(out.Grants, grantView(g))
		}
		out.Revision = st.Revision()
	}); err != nil {
		return nil, err
	}
	return out, nil
}

// RevokeRequest ends a grant by force. Without FencingToken every grant of
// the lock is revoked.
type RevokeRequest struct {
	Name         string `json:"-"`
	Election     bool   `json:"-"`
	FencingToken uint64 `json:"fencing_token,omitempty"`
	// Reason is kept in the history and the watch event (at most 256 bytes).
	Reason string `json:"reason"`
	// ClientID names the operator (optional): it shows in the server's log,
	// and with request_id it makes a retry safe.
	ClientID  string `json:"client_id,omitempty"`
	RequestID string `json:"request_id,omitempty"`
}

// RevokeResponse answers a revoke: the token revoked, or with no token
// asked for, every token revoked.
type RevokeResponse struct {
	Revoked       bool     `json:"revoked"`
	FencingToken  uint64   `json:"fencing_token,omitempty"`
	FencingTokens []uint64 `json:"fencing_tokens,omitempty"`
	Revision      uint64   `json:"revision"`
}

// revokeClient is the client_id of a revoke sent without one.
const revokeClient = "dlock-operator"

// Revoke ends a grant without its holder's consent: the lock goes to the
// next waiter at once (after the grant's lock-delay, if it set one), and the
// holder's next renew answers lock_lost. Fencing makes this safe: the next
// holder's token is higher. With ACLs on it needs the revoke permission on
// the name, or admin.
func (s *Service) Revoke(ctx context.Context, req RevokeRequest) (_ *RevokeResponse, err error) {
	defer s.observe("revoke", time.Now(), &err)
	if err = s.admit(ctx, req.ClientID); err != nil {
		return nil, err
	}
	name, err := normalize(req.Name)
	if err != nil {
		return nil, err
	}
	if err := checkID("client_id", req.ClientID, false); err != nil {
		return nil, err
	}
	if err := checkID("request_id", req.RequestID, false); err != nil {
		return nil, err
	}
	switch {
	case strings.TrimSpace(req.Reason) == "":
		return nil, invalid("reason is required: say why the grant is revoked (it is kept in the lock's history)")
	case len(req.Reason) > command.MaxReasonLen:
		return nil, invalid("reason is %d bytes; the limit is %d", len(req.Reason), command.MaxReasonLen)
	}
	if err := s.authorizeRevoke(ctx, name, req.ClientID); err != nil {
		return nil, err
	}
	key, what := name, "lock"
	if req.Election {
		key, what = command.ElectionKey(name), "election"
	}
	clientID := req.ClientID
	if clientID == "" {
		clientID = revokeClient
	}
	resp, err := s.node.Apply(ctx, envelope(clientID, req.RequestID, &command.Revoke{Name: key, Token: req.FencingToken, Reason: req.Reason}))
	if err != nil {
		return nil, err
	}
	r := resp.Result
	switch r.Status {
	case command.StatusOK:
	case command.StatusNotHolder:
		if req.FencingToken != 0 {
			return nil, apierror.New(apierror.NotFound, "no grant with fencing token %d holds %s %q (it may have ended already); see its history", req.FencingToken, what, name)
		}
		return nil, apierror.New(apierror.NotFound, "nobody holds %s %q; nothing to revoke", what, name)
	default:
		return nil, statusErr(r, "revoke")
	}
	s.logger.Warn("grant revoked", "name", name, "election", req.Election, "fencing_token", r.Token, "by", clientID, "reason", req.Reason)
	out := &RevokeResponse{Revoked: true, Revision: r.Revision}
	if req.FencingToken != 0 {
		out.FencingToken = r.Token
		return out, nil
	}
	for _, f := range strings.Fields(r.Message) {
		if t, err := strconv.ParseUint(f, 10, 64); err == nil {
			out.FencingTokens = append(out.FencingTokens, t)
		}
	}
	return out, nil
}

// authorizeRevoke: the revoke permission on the name, or admin on it.
func (s *Service) authorizeRevoke(ctx context.Context, name, clientID string) error {
	if !s.aclOn {
		return nil
	}
	if _, err := s.authToken(ctx, command.PermRevoke, name, clientID); err == nil {
		return nil
	} else if apierror.CodeOf(err) != apierror.PermissionDenied {
		return err
	}
	_, err := s.authToken(ctx, command.PermAdmin, name, clientID)
	if apierror.CodeOf(err) == apierror.PermissionDenied {
		return apierror.New(apierror.PermissionDenied, "this token may not revoke grants of %q; ask for a token with a rule granting \"revoke\" (or \"admin\") on a prefix of it", name)
	}
	return err
}
