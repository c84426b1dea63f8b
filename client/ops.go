package client

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Limits the server enforces, checked here so a bad call fails at once.
const (
	maxValueLen  = 4096
	maxLockDelay = 60 * time.Second
	maxReasonLen = 256
)

// HistoryOptions narrow a History call.
type HistoryOptions struct {
	// Limit is how many grants to return, newest first; 0 means all that
	// the cluster keeps.
	Limit int
	// Election reads an election's history instead of a lock's.
	Election bool
}

// History returns the recent grants of the lock called name, newest first:
// the one that holds it now (EndCause ""), then those that ended and how —
// released, expired, session_deleted, revoked (with the operator's reason),
// taken_over or resigned. The cluster keeps it replicated, within the
// retention its leader was started with (dlock serve --history-*). It is a
// linearizable read.
func (c *Client) History(ctx context.Context, name string, opts HistoryOptions) (*History, error) {
	p, err := lockPath(name, "")
	if err != nil {
		return nil, err
	}
	if opts.Limit < 0 {
		return nil, invalidf("history limit %d is negative", opts.Limit)
	}
	p = "/history/" + strings.TrimPrefix(p, "/locks/")
	q := []string{}
	if opts.Limit > 0 {
		q = append(q, fmt.Sprintf("limit=%d", opts.Limit))
	}
	if opts.Election {
		q = append(q, "kind=election")
	}
	if len(q) > 0 {
		p += "?" + strings.Join(q, "&")
	}
	var out History
	if _, err := c.do(ctx, call{method: http.MethodGet, path: p, out: &out}); err != nil {
		return nil, err
	}
	return &out, nil
}

// Revoke ends the grant of the lock called name whose fencing token is token
// (0: whoever holds it) without its holder's consent, and returns the tokens
// it revoked. The next waiter gets the lock at once with a higher token (or
// after the grant's lock-delay), the reason goes into the history and the
// watch event, and the holder's Lease ends with ErrLockLost at its next
// renewal (under a Session, at the session's next keepalive). When
// no such grant holds the lock it fails with an *APIError of code
// "not_found". With ACLs it needs a token with the revoke permission on the
// name (or admin). It is retried safely: it carries a request id.
func (c *Client) Revoke(ctx context.Context, name string, token uint64, reason string) ([]uint64, error) {
	p, err := lockPath(name, "revoke")
	if err != nil {
		return nil, err
	}
	return c.revoke(ctx, p, "lock", token, reason)
}

// RevokeElection is Revoke for the election called name: it ends the seat
// of the leader whose fencing token is token (0: whoever leads) without its
// consent; the next campaigner is elected at once with a higher token. The
// revoked leader's Leadership ends (Done, ErrLockLost) at its next renewal
// or, under a Session, its session's next keepalive.
func (c *Client) RevokeElection(ctx context.Context, name string, token uint64, reason string) ([]uint64, error) {
	p, err := electionPath(name, "revoke")
	if err != nil {
		return nil, err
	}
	return c.revoke(ctx, p, "election", token, reason)
}

func (c *Client) revoke(ctx context.Context, p, kind string, token uint64, reason string) ([]uint64, error) {
	if strings.TrimSpace(reason) == "" || len(reason) > maxReasonLen {
		return nil, invalidf("a revoke needs a reason of 1 to %d bytes (it is kept in the %s's history)", maxReasonLen, kind)
	}
	id := newRequestID()
	var out revokeResponse
	if _, err := c.do(ctx, call{method: http.MethodPost, path: p, out: &out, requestID: id,
		body: revokeRequest{FencingToken: token, Reason: reason, ClientID: c.id, RequestID: id}}); err != nil {
		return nil, err
	}
	if out.FencingToken != 0 {
		return []uint64{out.FencingToken}, nil
	}
	return out.FencingTokens, nil
}
