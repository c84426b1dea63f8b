package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// Session is a lease the client keeps alive with one keepalive loop, to hold
// many locks (WithSession): they are all lost together when it is, and all
// released when it is closed.
type Session struct {
	c  *Client
	id string // the session's secret; never logged
	k  *keeper
}

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
	s := &Session{c: c, id: out.SessionID, k: newKeeper(c, "session", ttl, sent)}
	if err := c.track(s.k); err != nil {
		s.delete(ctx)
		return nil, err
	}
	s.k.arm()
	go s.k.keepAlive(func(ctx context.Context) (time.Time, error) {
		rid := newRequestID()
		return c.do(ctx, call{method: http.MethodPost, path: s.path() + "/keepalive", what: "POST /sessions/{id}/keepalive",
			timeout: renewAttemptTimeout(ttl, c.reqTimeout), requestID: rid,
			body: sessionRequest{ClientID: c.id, RequestID: rid}})
	})
	return s, nil
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
