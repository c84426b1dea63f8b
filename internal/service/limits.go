package service

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/command"
)

// Limits are this node's abuse limits (design.md §5: 429 rate_limited). They are
// per-node configuration, checked here before anything is proposed. Apply
// must not depend on a node's flags: the one limit the state machine
// enforces, the waiter cap, travels inside the acquire it limits. Zero means
// no limit for every field.
type Limits struct {
	// Rate is the requests per second allowed to one client (a client_id
	// from one remote IP, or a remote IP for requests without a client_id;
	// see admit); Burst is the bucket size (0: two seconds' worth, at least 1).
	Rate  float64
	Burst int
	// MaxWaitersPerLock caps a lock's (or election's) queue. Each waiting
	// acquire carries it (command.Acquire.MaxWaiters), so the state machine
	// holds the cap exactly however many waits race (caps.go).
	MaxWaitersPerLock int
	// MaxLeasesPerClient caps the sessions and implicit leases one client_id
	// owns.
	MaxLeasesPerClient int
	// MaxWatchers caps the open watch and observe streams of this node;
	// MaxWatchersPerConn those of one client connection.
	MaxWatchers, MaxWatchersPerConn int
}

// Names of the limits, as the metrics label them.
const (
	limitRateClient      = "rate_client"
	limitRateRemote      = "rate_remote"
	limitWaiters         = "waiters_per_lock"
	limitLeases          = "leases_per_client"
	limitWatchers        = "watchers"
	limitWatchersPerConn = "watchers_per_conn"
)

// LimitRecorder counts requests refused by a limit (the metrics package). A
// Recorder that also implements it is told.
type LimitRecorder interface {
	Limited(limit string)
}

// limiter is the service's share of the limits; nil fields are off.
type limiter struct {
	cfg    Limits
	rate   *rateLimiter
	leases *leaseCounts
	slots  *watchSlots
}

// SetLimits installs the limits; call before serving.
func (s *Service) SetLimits(l Limits) {
	lim := &limiter{cfg: l, slots: newWatchSlots(l.MaxWatchers, l.MaxWatchersPerConn), leases: newLeaseCounts(nil)}
	if l.Rate > 0 {
		if l.Burst <= 0 {
			lim.cfg.Burst = max(1, int(2*l.Rate))
		}
		lim.rate = newRateLimiter(l.Rate, lim.cfg.Burst, nil)
	}
	s.lim = lim
}

type remoteKey struct{}

type remote struct{ conn, ip string }

// WithRemote tags a request's context with the client connection it came
// from: listener names the protocol listener ("http", "grpc") and addr is the
// peer's host:port. The protocol packages call it; the service keys the rate
// limit of requests without a client_id by the IP, and the per-connection
// watcher limit by the connection.
func WithRemote(ctx context.Context, listener, addr string) context.Context {
	if addr == "" {
		return ctx
	}
	ip, _, err := net.SplitHostPort(addr)
	if err != nil {
		ip = addr
	}
	return context.WithValue(ctx, remoteKey{}, remote{conn: listener + " " + addr, ip: ip})
}

func remoteOf(ctx context.Context) remote {
	r, _ := ctx.Value(remoteKey{}).(remote)
	return r
}

func (s *Service) limited(limit string) {
	if lr, ok := s.rec.(LimitRecorder); ok {
		lr.Limited(limit)
	}
}

// admit takes a token from the caller's bucket: the client_id's when the
// request names a plausible one, else the remote IP's. In-process callers
// with neither are not limited.
//
// A client_id is the caller's claim, not an identity (there is no
// authentication yet): the key is the pair (client_id, IP), so nobody can
// drain another host's bucket by sending its client_id.
func (s *Service) admit(ctx context.Context, clientID string) error {
	if s.lim == nil || s.lim.rate == nil {
		return nil
	}
	r := remoteOf(ctx)
	key, limit, who := "i "+r.ip, limitRateRemote, "requests without a client_id from "+r.ip
	if clientID != "" && len(clientID) <= command.MaxClientID {
		key, limit, who = "c "+clientID+" "+r.ip, limitRateClient, fmt.Sprintf("client_id %q", clientID)
	} else if r.ip == "" {
		return nil
	}
	ok, wait := s.lim.rate.allow(key)
	if ok {
		return nil
	}
	s.limited(limit)
	return limitErr(wait, "too many requests for %s: this node allows %g requests/s with bursts of %d per client (dlock serve --rate-limit, --rate-burst); slow down and retry after %s",
		who, s.lim.cfg.Rate, s.lim.cfg.Burst, wait.Round(time.Millisecond))
}

// limitErr is a refusal by a limit: 429 rate_limited (gRPC RESOURCE_EXHAUSTED)
// with a Retry-After.
func limitErr(retry time.Duration, format string, args ...any) *apierror.Error {
	e := apierror.New(apierror.RateLimited, format, args...)
	e.RetryAfter = retry
	return e
}
