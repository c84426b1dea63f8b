package server

import (
	"math"
	"net/http"
	"time"

	"github.com/dlock/dlock/internal/grpcapi"
	"github.com/dlock/dlock/internal/service"
)

// Limits are a node's abuse limits (docs/security.md#limits): the service's
// rate limit and caps, and the timeouts and sizes of the API listeners.
type Limits struct {
	// Service holds the rate limit and the caps; zero fields are off
	// (dlock serve's flags turn the caps on by default).
	Service service.Limits
	// ReadHeaderTimeout bounds receiving a request's headers (and, for gRPC,
	// a connection's handshake): what stops a slowloris. ReadTimeout bounds
	// receiving a whole request with its body; WriteTimeout answering a plain
	// request. Blocking acquires and event streams set their own longer
	// deadlines (httpapi/deadlines.go). IdleTimeout closes a kept-alive
	// connection (HTTP) or one without calls (gRPC) after that long.
	ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's headers (gRPC: its metadata).
	MaxHeaderBytes int
	// WSAuthTimeout is how long a WebSocket opened without a token has to
	// authenticate under --acl, and MaxUnauthenticatedPerIP how many such
	// connections one client IP may hold meanwhile (0: the wsapi defaults).
	WSAuthTimeout           time.Duration
	MaxUnauthenticatedPerIP int
}

// Defaults of Limits' listener fields (zero takes them).
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	DefaultWriteTimeout      = 30 * time.Second
	DefaultIdleTimeout       = 2 * time.Minute
	DefaultMaxHeaderBytes    = 64 << 10
)

func (l Limits) withDefaults() Limits {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&l.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	def(&l.ReadTimeout, DefaultReadTimeout)
	def(&l.WriteTimeout, DefaultWriteTimeout)
	def(&l.IdleTimeout, DefaultIdleTimeout)
	if l.MaxHeaderBytes <= 0 {
		l.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	return l
}

func (l Limits) applyHTTP(hs *http.Server) {
	hs.ReadHeaderTimeout = l.ReadHeaderTimeout
	hs.ReadTimeout = l.ReadTimeout
	hs.WriteTimeout = l.WriteTimeout
	hs.IdleTimeout = l.IdleTimeout
	hs.MaxHeaderBytes = l.MaxHeaderBytes
}

func (l Limits) grpc() grpcapi.ConnLimits {
	return grpcapi.ConnLimits{HandshakeTimeout: l.ReadHeaderTimeout, IdleTimeout: l.IdleTimeout, MaxHeaderBytes: l.MaxHeaderBytes}
}

// wsWatches is the WebSocket API's per-connection watch limit: the same as
// the service's, where 0 means none (the WebSocket API's 0 would mean its
// default).
func (l Limits) wsWatches() int {
	if n := l.Service.MaxWatchersPerConn; n > 0 {
		return n
	}
	return math.MaxInt
}
