package main

import (
	"fmt"
	"math"
	"time"

	"github.com/spf13/pflag"

	"github.com/dlock/dlock/internal/server"
	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/wsapi"
)

// limitFlags are the abuse limits and listener timeouts shared by serve and
// dev (docs/security.md#limits).
type limitFlags struct {
	rate                               float64
	burst                              int
	waiters, leases, watchers, perConn int
	readHeader, read, write, idle      time.Duration
	maxHeader                          int
	wsAuth                             time.Duration
	unauthPerIP                        int
}

func (f *limitFlags) register(fs *pflag.FlagSet) {
	// Off by default: a limit that suits one deployment starves another, and
	// the caps below already bound what one client can make a node hold.
	fs.Float64Var(&f.rate, "rate-limit", 0, "requests per second one client may send to this node: a client_id from one IP, or an IP for requests without a client_id; 0 = no rate limit")
	fs.IntVar(&f.burst, "rate-burst", 0, "requests one client may send in a burst before --rate-limit applies; 0 = two seconds' worth")
	fs.IntVar(&f.waiters, "max-waiters-per-lock", 1000, "most acquires (or campaigns) waiting in one lock's queue; 0 = no limit")
	fs.IntVar(&f.leases, "max-leases-per-client", 10000, "most sessions and ttl_ms leases one client_id may own; 0 = no limit")
	fs.IntVar(&f.watchers, "max-watchers", 10000, "most open watch and observe streams on this node; 0 = no limit")
	fs.IntVar(&f.perConn, "max-watchers-per-conn", 16, "most open watch and observe streams on one client connection; 0 = no limit")
	fs.DurationVar(&f.readHeader, "read-header-timeout", server.DefaultReadHeaderTimeout, "time a client has to send a request's headers (gRPC: the connection handshake)")
	fs.DurationVar(&f.read, "read-timeout", server.DefaultReadTimeout, "time a client has to send a whole request with its body")
	fs.DurationVar(&f.write, "write-timeout", server.DefaultWriteTimeout, "time to answer a plain request (blocking acquires and streams get their own)")
	fs.DurationVar(&f.idle, "idle-timeout", server.DefaultIdleTimeout, "close a kept-alive HTTP connection, or a gRPC connection without calls, idle this long")
	fs.IntVar(&f.maxHeader, "max-header-bytes", server.DefaultMaxHeaderBytes, "largest accepted request headers (gRPC: metadata)")
	fs.DurationVar(&f.wsAuth, "ws-auth-timeout", wsapi.DefaultAuthTimeout, "with --acl, time a WebSocket opened without a token has to send its auth message before it is closed")
	fs.IntVar(&f.unauthPerIP, "max-unauthenticated-per-ip", wsapi.DefaultMaxUnauthenticatedPerIP, "with --acl, most WebSocket connections one client IP may hold before they authenticate")
}

func (f *limitFlags) limits() (server.Limits, error) {
	if f.rate < 0 || math.IsNaN(f.rate) || math.IsInf(f.rate, 0) {
		return server.Limits{}, fmt.Errorf("--rate-limit %g: give requests per second, or 0 for no limit", f.rate)
	}
	for _, c := range []struct {
		name string
		v    int
	}{{"rate-burst", f.burst}, {"max-waiters-per-lock", f.waiters}, {"max-leases-per-client", f.leases},
		{"max-watchers", f.watchers}, {"max-watchers-per-conn", f.perConn}} {
		if c.v < 0 {
			return server.Limits{}, fmt.Errorf("--%s %d must not be negative (0 turns the limit off; see dlock serve -h)", c.name, c.v)
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"read-header-timeout", f.readHeader}, {"read-timeout", f.read}, {"write-timeout", f.write}, {"idle-timeout", f.idle}, {"ws-auth-timeout", f.wsAuth}} {
		if d.v <= 0 {
			return server.Limits{}, fmt.Errorf("--%s %s: give a positive duration such as 30s", d.name, d.v)
		}
	}
	if f.unauthPerIP < 1 {
		return server.Limits{}, fmt.Errorf("--max-unauthenticated-per-ip %d: give at least 1", f.unauthPerIP)
	}
	if f.maxHeader < 4096 {
		return server.Limits{}, fmt.Errorf("--max-header-bytes %d: give at least 4096", f.maxHeader)
	}
	return server.Limits{
		Service: service.Limits{Rate: f.rate, Burst: f.burst, MaxWaitersPerLock: f.waiters, MaxLeasesPerClient: f.leases,
			MaxWatchers: f.watchers, MaxWatchersPerConn: f.perConn},
		ReadHeaderTimeout: f.readHeader, ReadTimeout: f.read, WriteTimeout: f.write, IdleTimeout: f.idle, MaxHeaderBytes: f.maxHeader,
		WSAuthTimeout: f.wsAuth, MaxUnauthenticatedPerIP: f.unauthPerIP,
	}, nil
}
