package grpcapi

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"

	"github.com/dlock/dlock/internal/service"
)

// ConnLimits bound what one client connection may hold, so a slow or idle
// client cannot pin the server's resources. None of them cuts a long call:
// gRPC has no per-call write timeout, and a waiting Acquire or a Watch lives
// as long as its connection answers the keepalive pings.
type ConnLimits struct {
	// HandshakeTimeout bounds a new connection's (TLS and) HTTP/2 handshake
	// (default 10 s, as the HTTP API's header timeout); gRPC's own default
	// is 2 minutes, long enough for a slowloris.
	HandshakeTimeout time.Duration
	// IdleTimeout closes a connection without calls for this long (0: never).
	// Clients reconnect on their next call.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a call's metadata (default 64 KiB, as HTTP
	// headers; gRPC's own default is 16 MiB).
	MaxHeaderBytes int
	// MaxStreams bounds the concurrent calls on one connection (default
	// 1024). A client over it waits for a free stream rather than failing.
	MaxStreams int
}

// Defaults of ConnLimits.
const (
	DefaultHandshakeTimeout = 10 * time.Second
	DefaultMaxHeaderBytes   = 64 << 10
	DefaultMaxStreams       = 1024
)

func (l ConnLimits) serverOptions() []grpc.ServerOption {
	if l.HandshakeTimeout <= 0 {
		l.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if l.MaxHeaderBytes <= 0 {
		l.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if l.MaxStreams <= 0 {
		l.MaxStreams = DefaultMaxStreams
	}
	return []grpc.ServerOption{
		grpc.ConnectionTimeout(l.HandshakeTimeout),
		grpc.MaxHeaderListSize(uint32(l.MaxHeaderBytes)),
		grpc.MaxConcurrentStreams(uint32(l.MaxStreams)),
	}
}

// withRemote tells the service which connection a call came on: the rate
// limit of calls without a client_id is per remote IP, the watcher limit
// per connection (one peer address per connection).
func withRemote(ctx context.Context) context.Context {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return service.WithRemote(ctx, "grpc", p.Addr.String())
	}
	return ctx
}
