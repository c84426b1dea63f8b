// Package grpcapi serves dlock's gRPC API (api/dlock/v1): it decodes requests,
// calls the service layer and encodes answers. It holds no lock semantics;
// errors become gRPC statuses only through apierror's one table.
package grpcapi

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	dlockv1 "github.com/dlock/dlock/api/dlock/v1"
	"github.com/dlock/dlock/fence"
	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/service"
)

// Service is what the handlers need from the service layer; *service.Service
// satisfies it. Declared here, by its consumer, so the handlers can be tested
// against a fake.
type Service interface {
	Acquire(ctx context.Context, req service.AcquireRequest) (*service.AcquireResponse, error)
	Release(ctx context.Context, req service.ReleaseRequest) (*service.ReleaseResponse, error)
	Renew(ctx context.Context, req service.RenewRequest) (*service.RenewResponse, error)
	GetLock(ctx context.Context, name string, stale bool) (*service.LockView, error)
	ListLocks(ctx context.Context, req service.ListRequest) (*service.ListResponse, error)
	History(ctx context.Context, req service.HistoryRequest) (*service.HistoryResponse, error)
	Revoke(ctx context.Context, req service.RevokeRequest) (*service.RevokeResponse, error)
	CreateSession(ctx context.Context, req service.CreateSessionRequest) (*service.SessionResponse, error)
	KeepAlive(ctx context.Context, req service.KeepAliveRequest) (*service.KeepAliveResponse, error)
	DeleteSession(ctx context.Context, req service.DeleteSessionRequest) (*service.DeleteSessionResponse, error)
	Campaign(ctx context.Context, req service.CampaignRequest) (*service.CampaignResponse, error)
	GetElection(ctx context.Context, name string, stale bool) (*service.ElectionView, error)
	Proclaim(ctx context.Context, req service.ProclaimRequest) (*service.ProclaimResponse, error)
	Resign(ctx context.Context, req service.ResignRequest) (*service.ResignResponse, error)
	RenewElection(ctx context.Context, req service.RenewRequest) (*service.RenewResponse, error)
	Watch(ctx context.Context, req service.WatchRequest) (*service.Watcher, error)
	Observe(ctx context.Context, name string, stale bool) (*service.ElectionView, *service.Watcher, error)
	Cluster(ctx context.Context) (*service.ClusterInfo, error)
	AddMember(ctx context.Context, req service.MemberRequest) (*service.ClusterInfo, error)
	RemoveMember(ctx context.Context, id string) (*service.ClusterInfo, error)
	TransferLeadership(ctx context.Context, req service.TransferRequest) (*service.ClusterInfo, error)
	TokenKeys(ctx context.Context) (*fence.KeySetDocument, error)
	RotateTokenKey(ctx context.Context, req service.RotateTokenKeyRequest) (*fence.KeySetDocument, error)
}

// DefaultMaxMessageBytes matches the HTTP body limit of design.md §5 (64 KiB).
const DefaultMaxMessageBytes = 64 << 10

// RequestIDKey is the metadata key that carries a call's tracing id in both
// directions, like HTTP's X-Request-Id.
const RequestIDKey = "x-request-id"

// RevisionKey is the response header of Watch and Observe: the revision the
// stream starts after. It is sent as soon as the stream is in place, so a
// client that waits for the header knows no later change can be missed.
const RevisionKey = "dlock-revision"

// Options tunes the server. The zero value is the default behaviour.
type Options struct {
	// MaxMessageBytes bounds a request message (default 64 KiB). gRPC itself
	// refuses larger ones with RESOURCE_EXHAUSTED before dlock sees them.
	MaxMessageBytes int
	// KeepaliveTime is how long a connection may be idle before the server
	// pings it (default 30 s). The ping is how a client that vanished without
	// closing its TCP connection is noticed, so that its waiting acquires are
	// withdrawn and its streams end instead of lingering.
	KeepaliveTime time.Duration
	// SendTimeout bounds how long one message of a stream (watch or
	// observe) may wait for the client to take it — gRPC flow control
	// holds a send while the client reads nothing — before the stream ends
	// UNAVAILABLE (default 30 s, as the HTTP streams' write deadline). A
	// stream whose client stops reading ends sooner if its watcher falls
	// behind (watch.ErrSlow).
	SendTimeout time.Duration
	// Connection limits (limits.go); zero values take their defaults.
	Limits ConnLimits
	// PeerIdentity, if set, names the verified client certificate of the
	// connection from addr ("" for none). TLS sits on the listener, below
	// gRPC, so the server tells gRPC what the handshake found.
	PeerIdentity func(addr string) string
}

// Server is the gRPC server of one node.
type Server struct {
	*grpc.Server
	api *api
}

type api struct {
	svc         Service
	peerID      func(addr string) string
	log         *slog.Logger
	closing     chan struct{}
	once        sync.Once
	sendTimeout time.Duration
}

// New builds the gRPC server with every dlock service and server reflection
// registered (reflection lets generic tools list and call the API without the
// .proto file). A nil logger discards logs.
func New(svc Service, logger *slog.Logger, opts Options) *Server {
	if svc == nil {
		panic("grpcapi: New called with a nil Service")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if opts.MaxMessageBytes <= 0 {
		opts.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if opts.KeepaliveTime <= 0 {
		opts.KeepaliveTime = 30 * time.Second
	}
	if opts.SendTimeout <= 0 {
		opts.SendTimeout = 30 * time.Second
	}
	a := &api{svc: svc, peerID: opts.PeerIdentity, log: logger, closing: make(chan struct{}), sendTimeout: opts.SendTimeout}
	gs := grpc.NewServer(append(opts.Limits.serverOptions(),
		grpc.MaxRecvMsgSize(opts.MaxMessageBytes),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: opts.KeepaliveTime, Timeout: 10 * time.Second, MaxConnectionIdle: opts.Limits.IdleTimeout}),
		// Clients may ping to keep idle connections (and their long waits)
		// open through NATs, but not often enough to be a nuisance.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.ChainUnaryInterceptor(a.unaryInterceptor),
		grpc.ChainStreamInterceptor(a.streamInterceptor),
	)...)
	dlockv1.RegisterLockServiceServer(gs, &lockServer{a})
	dlockv1.RegisterSessionServiceServer(gs, &sessionServer{a})
	dlockv1.RegisterElectionServiceServer(gs, &electionServer{a})
	dlockv1.RegisterWatchServiceServer(gs, &watchServer{a})
	dlockv1.RegisterClusterServiceServer(gs, &clusterServer{a})
	reflection.Register(gs)
	return &Server{Server: gs, api: a}
}

// Shutdown stops accepting calls and lets open ones finish until ctx ends,
// then cuts the rest. Keepalive streams end at once (their clients reconnect
// elsewhere); watch streams end when the service closes its event hub.
func (s *Server) Shutdown(ctx context.Context) error {
	s.api.once.Do(func() { close(s.api.closing) })
	done := make(chan struct{})
	go func() {
		s.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.Server.Stop()
		<-done
		return ctx.Err()
	}
}

// Stop cuts every connection at once.
func (s *Server) Stop() {
	s.api.once.Do(func() { close(s.api.closing) })
	s.Server.Stop()
}

type ctxKey struct{}

type callInfo struct {
	id  string
	log *slog.Logger
}

// requestID takes the caller's id if it is short visible ASCII (it ends up in
// log lines), else makes one, as the HTTP API does.
func requestID(ctx context.Context) string {
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get(RequestIDKey); len(v) == 1 && validRequestID(v[0]) {
			return v[0]
		}
	}
	return rand.Text()
}

// bearerToken reads the "authorization: Bearer <secret>" metadata, as the
// HTTP API reads its header; the service checks it when ACLs are on.
func bearerToken(ctx context.Context) string {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok {
		return ""
	}
	v := md.Get("authorization")
	if len(v) != 1 {
		return ""
	}
	scheme, secret, ok := strings.Cut(v[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(secret)
}

func validRequestID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			return false
		}
	}
	return true
}

// tag gives the call an id (echoed in the response header) and a logger that
// carries it.
func (a *api) tag(ctx context.Context, method string) (context.Context, *callInfo) {
	id := requestID(ctx)
	_ = grpc.SetHeader(ctx, metadata.Pairs(RequestIDKey, id))
	ci := &callInfo{id: id, log: a.log.With(slog.String("request_id", id), slog.String("method", method))}
	out := service.WithBearer(context.WithValue(ctx, ctxKey{}, ci), bearerToken(ctx))
	if a.peerID != nil {
		if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
			out = service.WithCertIdentity(out, a.peerID(p.Addr.String()))
		}
	}
	return out, ci
}

func info(ctx context.Context, fallback *slog.Logger) *callInfo {
	if ci, ok := ctx.Value(ctxKey{}).(*callInfo); ok {
		return ci
	}
	return &callInfo{log: fallback}
}

// recovered turns a handler panic into an internal error, so one bad call
// does not take the node down.
func (a *api) recovered(ci *callInfo, v any) error {
	ci.log.Error("panic serving gRPC call", "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
	return status.Error(codes.Internal, "internal error; see the server log for request id "+ci.id)
}

func (a *api) unaryInterceptor(ctx context.Context, req any, si *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
	start := time.Now()
	ctx, ci := a.tag(ctx, si.FullMethod)
	ctx = withRemote(ctx)
	defer func() {
		if v := recover(); v != nil {
			resp, err = nil, a.recovered(ci, v)
		}
		ci.log.Debug("grpc call", "code", status.Code(err).String(), "duration", time.Since(start))
	}()
	return h(ctx, req)
}

// taggedStream hands the handler the tagged context.
type taggedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *taggedStream) Context() context.Context { return s.ctx }

func (a *api) streamInterceptor(srv any, ss grpc.ServerStream, si *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
	start := time.Now()
	ctx, ci := a.tag(ss.Context(), si.FullMethod)
	ctx = withRemote(ctx)
	defer func() {
		if v := recover(); v != nil {
			err = a.recovered(ci, v)
		}
		ci.log.Debug("grpc stream", "code", status.Code(err).String(), "duration", time.Since(start))
	}()
	return h(srv, &taggedStream{ServerStream: ss, ctx: ctx})
}

// status turns a service error into a gRPC status: the code from apierror's
// table, the same message HTTP sends, and an ErrorDetail with the dlock code
// (several dlock codes share one gRPC code). detail may carry more (holder).
func (a *api) status(ctx context.Context, err error, detail *dlockv1.ErrorDetail) error {
	e, internal := apierror.Public(ctx, err)
	code := apierror.GRPCCode(e.Code)
	msg := e.Message
	if msg == "" {
		msg = string(e.Code)
	}
	if internal {
		// The cause may hold internals a client has no business seeing: log
		// it, and show only where to find it.
		ci := info(ctx, a.log)
		ci.log.Error("internal error", "code", string(e.Code), "error", err.Error())
		e = &apierror.Error{Code: apierror.Internal}
		msg = "internal error; see the server log for request id " + ci.id
	}
	if detail == nil {
		detail = &dlockv1.ErrorDetail{}
	}
	detail.Code = string(e.Code)
	if code == codes.Unavailable || code == codes.ResourceExhausted {
		// Never 0: that would invite a retry storm.
		detail.RetryAfterMs = max(e.RetryAfter.Milliseconds(), 1000)
	}
	if e.Code == apierror.LockDelayed {
		detail.RetryAfterMs = max(e.RetryAfter.Milliseconds(), 1)
	}
	if e.FencingToken != 0 {
		detail.FencingToken = e.FencingToken // a renew's lock_lost
	}
	st, derr := status.New(code, msg).WithDetails(detail)
	if derr != nil {
		return status.Error(code, msg)
	}
	return st.Err()
}

// reply answers a unary call: the error if there is one, else resp encoded.
func reply[S, P any](a *api, ctx context.Context, resp *S, err error, encode func(*S) P) (P, error) {
	var zero P
	if err != nil {
		return zero, a.status(ctx, err, nil)
	}
	if resp == nil {
		return zero, a.status(ctx, errors.New("service returned neither an answer nor an error"), nil)
	}
	return encode(resp), nil
}
