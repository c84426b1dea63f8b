package client

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// line is one kind of seat a client waits in line for — a lock or an
// election — as waitInLine needs it: the kinds differ only in the requests
// they send.
type line struct {
	what    string // "lock" or "campaign", for errors
	name    string
	ttl     time.Duration
	session *Session
	// wait is false for a try that must not queue (TryLock).
	wait bool
	// send is one logical request under requestID, waiting in line up to
	// wait; it returns when the first attempt that may have reached a node
	// was sent (zero if none may have).
	send func(ctx context.Context, requestID string, wait time.Duration) (*Grant, time.Time, error)
	// withdraw repeats an abandoned request without waiting, so that a wait
	// still in line leaves it and a seat won meanwhile is given back.
	withdraw func(ctx context.Context, requestID string)
	// giveBack gives up a seat nobody will use.
	giveBack func(ctx context.Context, g *Grant)
	// renew renews a granted seat's lease once.
	renew func(ctx context.Context, g *Grant) (time.Time, error)
	// sessionEnded is the error when the session the wait was under ended.
	sessionEnded func(cause error) error
}

// waitInLine asks for the seat until it is granted, the caller gives up
// (ctx), or its session ends, and leaves nothing behind when it does not
// return a grant: a wait that may have reached a node is withdrawn, a seat
// won too late is given back. It returns the grant and the moment its lease's
// bound counts from (a send time, never later than the grant).
func (c *Client) waitInLine(ctx context.Context, l line) (*Grant, time.Time, error) {
	s := l.session
	if s != nil {
		if err := s.Err(); err != nil {
			return nil, time.Time{}, l.sessionEnded(err)
		}
	}
	// wctx ends when ctx does, and when the session does: a wait under a
	// session the client counts as lost must not turn into a seat, which
	// would be lost the moment it is handed out while the server keeps it
	// until the session expires there.
	wctx, wcancel := untilSessionEnds(ctx, s)
	defer wcancel()
	// stopped is the error once wctx ended: ctx's, or the session's.
	stopped := func(last error) error {
		if ctx.Err() == nil && s != nil && s.Err() != nil {
			return l.sessionEnded(s.Err())
		}
		return waitCtxError(ctx, l.what, l.name, l.wait, last)
	}
	backoff := backoffMin
	retry := func() {
		sleep(wctx, jitter(backoff))
		backoff = min(2*backoff, backoffMax)
	}
	for {
		if wctx.Err() != nil {
			return nil, time.Time{}, stopped(nil)
		}
		requestID := newRequestID()
		var wait time.Duration
		if l.wait {
			wait = waitFor(ctx)
		}
		g, sent, err := l.send(wctx, requestID, wait)
		switch {
		case err == nil:
		case wctx.Err() != nil:
			if !sent.IsZero() {
				l.withdraw(ctx, requestID)
			}
			return nil, time.Time{}, stopped(err)
		case l.wait && errors.Is(err, ErrWaitTimeout) && waitAgain(ctx, sent, wait):
			retry()
			continue
		case errors.Is(err, ErrLockLost):
			// Granted to an earlier attempt and lapsed before we heard of
			// it (only a retry across a failover can see this): try again.
			retry()
			continue
		case s != nil && errors.Is(err, ErrSessionExpired):
			return nil, time.Time{}, l.sessionEnded(err)
		default:
			if errors.Is(err, ErrUnavailable) && !sent.IsZero() {
				// Given up on an unreachable cluster: a wait that did
				// reach a node must not be granted to nobody.
				l.withdraw(ctx, requestID)
			}
			return nil, time.Time{}, fmt.Errorf("%s %q: %w", l.what, l.name, err)
		}
		// s.Err as well as wctx: the session may have ended an instant ago,
		// before the goroutine above cancelled wctx.
		if wctx.Err() != nil || (s != nil && s.Err() != nil) {
			// Granted after the caller gave up, or after the session ended.
			l.giveBack(ctx, g)
			return nil, time.Time{}, stopped(nil)
		}
		if s == nil && time.Since(sent) > l.ttl/3 {
			// The grant's send time is old (a wait in line, or slow
			// retries), so the bound it gives is short or already past.
			// Renew now for a fresh one before handing the seat out.
			rctx, cancel := context.WithTimeout(ctx, l.ttl)
			rsent, rerr := l.renew(rctx, g)
			cancel()
			if rerr != nil {
				l.giveBack(ctx, g)
				if ctx.Err() != nil {
					return nil, time.Time{}, stopped(rerr)
				}
				if !l.wait {
					return nil, time.Time{}, fmt.Errorf("%s %q: confirming a slow grant: %w", l.what, l.name, rerr)
				}
				// Queue again. A grant the server still counts as ours (the
				// give-back failed too) holds the new request up until its
				// TTL ends: a new lease of the same client id takes nothing
				// over unless asked to (WithTakeover).
				c.log.Debug("dlock: could not confirm a grant; asking again", l.what, l.name, "err", rerr)
				continue
			}
			sent = rsent
		}
		return g, sent, nil
	}
}
