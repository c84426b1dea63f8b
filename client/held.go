package client

import (
	"context"
	"time"
)

// held is a grant this client keeps, whether a lock's (Lease) or an
// election's (Leadership): its token, proof and lease, and the keeper that
// renews the lease every TTL/3 (or follows the session it was granted under)
// and ends the grant the moment it may be lost.
type held struct {
	k        *keeper
	name     string
	token    uint64
	leaseID  string
	proof    string
	leaseRef string
	session  *Session
}

// keep starts keeping a grant: following its session s, or renewing its
// lease with renew from sent, the send time its first bound counts from.
// what names the grant in errors and logs.
func (c *Client) keep(what, name string, g *Grant, sent time.Time, ttl time.Duration, s *Session,
	renew func(ctx context.Context, h *held) (time.Time, error)) (*held, error) {
	h := &held{name: name, token: g.FencingToken, leaseID: g.LeaseID, proof: g.TokenProof, leaseRef: g.LeaseRef, session: s}
	if s != nil {
		h.k = newKeeper(c, what, s.k.ttl, time.Time{})
	} else {
		h.k = newKeeper(c, what, ttl, sent)
	}
	if err := c.track(h.k); err != nil {
		return nil, err
	}
	if s != nil {
		s.adopt(h)
		go func() {
			h.k.follow(s.k)
			s.forget(h)
		}()
		return h, nil
	}
	h.k.arm()
	go h.k.keepAlive(func(ctx context.Context) (time.Time, error) { return renew(ctx, h) })
	return h, nil
}

// Name is the lock's or the election's name.
func (h *held) Name() string { return h.name }

// Token is the fencing token of this grant: pass it to the resource the lock
// (or the leader) writes to, so it can refuse writes from an older holder.
func (h *held) Token() uint64 { return h.token }

// TokenProof is the cluster's signature of this grant, for a fenced resource
// (docs/fencing.md); an election's proof signs its key "@e/<name>". "" if
// the server predates token proofs.
func (h *held) TokenProof() string { return h.proof }

// LeaseRef is the reference to this grant's lease that the token proof
// binds. Send it with the token and proof to a fenced resource; never send
// the lease id, which can release the grant.
func (h *held) LeaseRef() string { return h.leaseRef }

// Done is closed when the grant ends: when it may be lost (no renewal
// answered by ExpiresAt, the server said this client no longer holds it, or
// its session ended) and on Unlock or Resign. From that moment another
// client may hold it.
func (h *held) Done() <-chan struct{} { return h.k.done }

// Err is nil while the grant is held. After Done is closed it says why:
// ErrReleased after Unlock or Resign, else an error wrapping ErrLeaseLost and
// the cause.
func (h *held) Err() error { return h.k.errValue() }

// ExpiresAt is when the client will count the grant lost unless a renewal is
// answered before: the send time of the last successful acquire (campaign)
// or renew plus the TTL, on the local monotonic clock. The server keeps the
// grant at least that long. Under a session it is the session's.
func (h *held) ExpiresAt() time.Time {
	if h.session != nil {
		return h.session.ExpiresAt()
	}
	return h.k.expiresAt()
}
