package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// Session is a lease the client keeps alive with one keepalive loop, to hold
// many locks (WithSession): they are all lost together when it is, and all
// released when it is closed.
type Session struct {
	c  *Client
	id string // the session's secret; never logged
	k  *keeper

	mu sync.Mutex
	// held are the grants kept under the session, by fencing token (unique
	// across the cluster): a keepalive that lists one as lost ends it.
	held map[uint64]*held
	// lost remembers the last lost grants the server listed, for a grant
	// whose Lock was answered after the keepalive that told of its loss.
	lost      map[uint64]error
	lostOrder []uint64
	// lostAfter is the revision up to which lost grants were heard of (the
	// keepalive goroutine's alone).
	lostAfter uint64
}

// maxLostRemembered bounds Session.lost.
const maxLostRemembered = 1024

// NewSession creates a session with the given TTL (1 s to 600 s) and keeps
// it alive every TTL/3 until Close or until it is lost.
func (c *Client) NewSession(ctx context.Context, ttl time.Duration) (*Session, error) {
	if err := checkTTL(ttl); err != nil {
		return nil, err
	}
	id := newRequestID()
	var out sessionResponse
	sent, err := c.do(ctx, call{method: http.MethodPost, path: "/sessions", out: &out, requestID: id,
		body: sessionRequest{ClientID: c.id, TTLms: ttl.Milliseconds(), RequestID: id}})
	if err != nil {
		return nil, fmt.Errorf("create session: %w", err)
	}
	if out.SessionID == "" {
		return nil, errors.New("dlock: create session: the server answered without a session id")
	}
	s := &Session{c: c, id: out.SessionID, k: newKeeper(c, "session", ttl, sent), held: map[uint64]*held{}, lost: map[uint64]error{}}
	if err := c.track(s.k); err != nil {
		s.delete(ctx)
		return nil, err
	}
	s.k.arm()
	go s.k.keepAlive(func(ctx context.Context) (time.Time, error) {
		rid := newRequestID()
		var out keepAliveResponse
		sent, err := c.do(ctx, call{method: http.MethodPost, path: s.path() + "/keepalive", what: "POST /sessions/{id}/keepalive",
			timeout: renewAttemptTimeout(ttl, c.reqTimeout), requestID: rid, out: &out,
			body: keepAliveRequest{ClientID: c.id, RequestID: rid, LostAfter: s.lostAfter}})
		if err == nil {
			s.heard(&out)
		}
		return sent, err
	})
	return s, nil
}

// heard ends the grants a keepalive answer lists as lost. The answer lists
// every grant lost up to its revision (and maybe later ones), so the next
// keepalive asks only for those after it.
func (s *Session) heard(out *keepAliveResponse) {
	for _, g := range out.Lost {
		err := g.err()
		s.mu.Lock()
		h := s.held[g.FencingToken]
		if _, dup := s.lost[g.FencingToken]; !dup {
			s.lost[g.FencingToken] = err
			s.lostOrder = append(s.lostOrder, g.FencingToken)
			if len(s.lostOrder) > maxLostRemembered {
				delete(s.lost, s.lostOrder[0])
				s.lostOrder = s.lostOrder[1:]
			}
		}
		s.mu.Unlock()
		if h != nil && h.name == g.Name && h.k.end(lost(err)) {
			s.c.log.Warn("dlock: "+h.k.what+" lost", "err", err)
		}
		s.lostAfter = max(s.lostAfter, g.Revision)
	}
	s.lostAfter = max(s.lostAfter, out.Revision)
}

// err is what a grant lost this way ends with: lock_lost for a revoke (as
// the renew of a lock of its own would answer), not_holder for a takeover.
func (g *lostGrant) err() error {
	if g.Cause == "revoked" {
		msg := fmt.Sprintf("%s %q: the grant with fencing token %d was revoked by an operator", g.Kind, g.Name, g.FencingToken)
		if g.Reason != "" {
			msg += fmt.Sprintf(" (reason: %q)", g.Reason)
		}
		return &APIError{Code: CodeLockLost, HTTPStatus: http.StatusConflict, FencingToken: g.FencingToken,
			Message: msg + "; stop using the resource and acquire again"}
	}
	return &APIError{Code: CodeNotHolder, HTTPStatus: http.StatusConflict, Message: fmt.Sprintf(
		"%s %q: the grant with fencing token %d ended under this session (%s); stop using the resource", g.Kind, g.Name, g.FencingToken, g.Cause)}
}

// adopt keeps h, a grant held under the session, until it ends; a grant the
// session already heard was lost ends at once.
func (s *Session) adopt(h *held) {
	s.mu.Lock()
	err, gone := s.lost[h.token]
	if !gone {
		s.held[h.token] = h
	}
	s.mu.Unlock()
	if gone && h.k.end(lost(err)) {
		s.c.log.Warn("dlock: "+h.k.what+" lost", "err", err)
	}
}

func (s *Session) forget(h *held) {
	s.mu.Lock()
	if s.held[h.token] == h {
		delete(s.held, h.token)
	}
	s.mu.Unlock()
}

func (s *Session) path() string { return "/sessions/" + url.PathEscape(s.id) }

// TTL is the session's TTL.
func (s *Session) TTL() time.Duration { return s.k.ttl }

// Done is closed when the session ends: lost (no keepalive answered by
// ExpiresAt, or the server no longer knows it) or closed.
func (s *Session) Done() <-chan struct{} { return s.k.done }

// Err is nil while the session lives; after Done it is ErrReleased (Close)
// or an error wrapping ErrLeaseLost and the cause (ErrSessionExpired when
// the server no longer knows the session).
func (s *Session) Err() error { return s.k.errValue() }

// ExpiresAt is when the client will consider the session lost unless a
// keepalive is answered before (send time of the last answered one plus the
// TTL, on the local monotonic clock).
func (s *Session) ExpiresAt() time.Time { return s.k.expiresAt() }

// Close stops the keepalive and deletes the session, which releases its
// locks (each handed to its next waiter) and drops its waits.
func (s *Session) Close(ctx context.Context) error {
	s.k.end(ErrReleased)
	<-s.k.finished
	return s.delete(ctx)
}

func (s *Session) delete(ctx context.Context) error {
	id := newRequestID()
	_, err := s.c.do(ctx, call{method: http.MethodDelete, path: s.path(), what: "DELETE /sessions/{id}", requestID: id,
		body: sessionRequest{ClientID: s.c.id, RequestID: id}})
	return err
}
