package client

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"time"
)

// ACLRule grants permissions ("read", "lock", "elect", "watch", "admin" or
// "all") on every name that starts with Prefix.
type ACLRule struct {
	Prefix      string   `json:"prefix"`
	Permissions []string `json:"permissions"`
}

// ACLToken describes a token. SecretID is only set in the answer that
// created it: keep it, the cluster stores only its hash.
type ACLToken struct {
	AccessorID  string    `json:"accessor_id"`
	SecretID    string    `json:"secret_id,omitempty"`
	Description string    `json:"description,omitempty"`
	Rules       []ACLRule `json:"rules"`
	ClientIDs   []string  `json:"client_ids,omitempty"`
	CreatedAt   time.Time `json:"created_at,omitzero"`
	ExpiresAt   time.Time `json:"expires_at,omitzero"`
	CertCNs     []string  `json:"cert_cns,omitempty"`
}

// NewACLToken is what CreateACLToken asks for. ClientIDs limits the
// client_ids the token may act as ("worker-*" matches any suffix); empty
// means any.
type NewACLToken struct {
	Description string    `json:"description,omitempty"`
	Rules       []ACLRule `json:"rules"`
	ClientIDs   []string  `json:"client_ids,omitempty"`
	// TTLms > 0 makes the token expire that long after it is created.
	TTLms int64 `json:"ttl_ms,omitempty"`
	// CertCNs are client-certificate common names that authenticate as the
	// token over mutual TLS, without its secret.
	CertCNs []string `json:"cert_cns,omitempty"`
}

// ACLBootstrap creates the cluster's first management token. It works only
// while no token exists; the answer is the only copy of the secret.
//
// The cluster bootstraps on every request it gets while no token exists, so
// ACLBootstrap is not resent once it may have reached a node: if no answer
// comes back it fails with an error wrapping ErrOutcomeUnknown.
func (c *Client) ACLBootstrap(ctx context.Context) (*ACLToken, error) {
	var out ACLToken
	if _, err := c.do(ctx, call{method: http.MethodPost, path: "/acl/bootstrap", out: &out, what: "acl bootstrap", once: true,
		check: "call ACLBootstrap again to find out: if it answers permission_denied (already bootstrapped) and nobody else " +
			"bootstrapped, this call created the management token, and its secret, which was only in the lost answer, is lost"}); err != nil {
		return nil, err
	}
	return &out, nil
}

// CreateACLToken creates a token (the client's own token needs admin).
//
// Every request creates a new token, so CreateACLToken is not resent once it
// may have reached a node: if no answer comes back it fails with an error
// wrapping ErrOutcomeUnknown.
func (c *Client) CreateACLToken(ctx context.Context, t NewACLToken) (*ACLToken, error) {
	var out ACLToken
	if _, err := c.do(ctx, call{method: http.MethodPost, path: "/acl/tokens", body: t, out: &out, what: "acl token create", once: true,
		check: "list the ACL tokens (ListACLTokens) to see whether it was created; if it was, revoke it " +
			"(its secret was only in the lost answer) and create another"}); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListACLTokens lists tokens, without secrets (needs admin).
func (c *Client) ListACLTokens(ctx context.Context) ([]ACLToken, error) {
	var out struct {
		Tokens []ACLToken `json:"tokens"`
	}
	if _, err := c.do(ctx, call{method: http.MethodGet, path: "/acl/tokens", out: &out, what: "acl token list"}); err != nil {
		return nil, err
	}
	return out.Tokens, nil
}

// DeleteACLToken revokes a token by its accessor id (needs admin). When a
// retry is told the token does not exist after an attempt whose answer was
// lost, that attempt revoked it, and DeleteACLToken reports success.
func (c *Client) DeleteACLToken(ctx context.Context, accessorID string) error {
	_, err := c.do(ctx, call{method: http.MethodDelete, path: "/acl/tokens/" + url.PathEscape(accessorID), what: "acl token revoke",
		goneIsDone: true})
	if errors.Is(err, errDoneEarlier) {
		return nil
	}
	return err
}
