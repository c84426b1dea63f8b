// Package wsapi serves dlock's WebSocket API (GET /api/v1/ws): one persistent
// connection per client carrying JSON messages to acquire (with wait),
// release, renew and watch, with grants and events pushed when they happen.
// Like the other protocol packages it decodes, calls the service layer and
// encodes; it holds no lock semantics.
//
// Ownership: each connection has one context, cancelled when the connection
// ends (client close, network error, too slow a reader, server shutdown).
// Every goroutine the connection starts — one per blocking acquire, one per
// watch, the writer, the pinger and the serial worker — watches that context and is waited for
// before the handler returns, so a closed connection leaves no goroutine and,
// through the service, no queued wait behind.
package wsapi

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/service"
)

// Service is what the connection needs from the service layer;
// *service.Service satisfies it.
type Service interface {
	Acquire(ctx context.Context, req service.AcquireRequest) (*service.AcquireResponse, error)
	Release(ctx context.Context, req service.ReleaseRequest) (*service.ReleaseResponse, error)
	Renew(ctx context.Context, req service.RenewRequest) (*service.RenewResponse, error)
	Watch(ctx context.Context, req service.WatchRequest) (*service.Watcher, error)
	History(ctx context.Context, req service.HistoryRequest) (*service.HistoryResponse, error)
	Revoke(ctx context.Context, req service.RevokeRequest) (*service.RevokeResponse, error)
}

// Path is where the handler is mounted.
const Path = "/api/v1/ws"

// Defaults of Options.
const (
	DefaultMaxMessageBytes = 64 << 10
	DefaultMaxPending      = 64
	DefaultMaxWatches      = 16
)

// Options tunes the handler. The zero value is the documented behaviour.
type Options struct {
	// MaxMessageBytes bounds one client message (default 64 KiB, as HTTP
	// bodies); a larger one closes the connection with status 1009.
	MaxMessageBytes int64
	// MaxPending bounds the acquires in flight on one connection (default 64).
	MaxPending int
	// MaxWatches bounds the open watches on one connection (default 16).
	MaxWatches int
	// OriginPatterns lists other origins whose browser pages may connect
	// (path.Match patterns on the host). Same-origin pages and non-browser
	// clients (no Origin header) are always allowed; anything else is
	// refused, so a foreign web page cannot use a visitor's network position
	// to take locks.
	OriginPatterns []string
	// AllowOrigin accepts further browser origins by their whole value
	// ("http://host:port"); the server passes Service.MemberOrigin, so a
	// page served by one member may connect to the others.
	AllowOrigin func(origin string) bool
	// PingInterval is how often an idle connection is pinged (default 30 s),
	// so a client that vanished without closing is noticed and its waits are
	// withdrawn.
	PingInterval time.Duration
	// WriteTimeout bounds writing one message (default 10 s); a client that
	// does not read for that long is disconnected.
	WriteTimeout time.Duration
	// Limited, when set, counts each message refused by a per-connection
	// limit (the metrics).
	Limited func(limit string)
	// Authenticate, when set (ACLs on), checks the token a connection's
	// context carries; a connection must pass it before anything is served
	// (auth.go), and is closed when the returned context ends (its token
	// was revoked); stop is called when the connection ends. AuthTimeout
	// bounds the wait for the first-message authentication (default 5 s);
	// MaxUnauthenticatedPerIP caps the connections one client IP holds
	// while not yet authenticated (default 16).
	Authenticate            func(ctx context.Context) (authed context.Context, stop func(), err error)
	AuthTimeout             time.Duration
	MaxUnauthenticatedPerIP int
}

// Handler serves WebSocket connections. Close ends them all.
type Handler struct {
	svc  Service
	log  *slog.Logger
	opts Options

	// ctx is cancelled by Close. The HTTP server cannot end these
	// connections itself: they are hijacked, so http.Server.Shutdown neither
	// tracks nor closes them.
	ctx    context.Context
	cancel context.CancelFunc
	mu     sync.Mutex
	closed bool
	conns  sync.WaitGroup
	// unauth counts the connections still to authenticate, per client IP.
	unauth *ipSlots
}

// New returns the handler. A nil logger discards logs.
func New(svc Service, logger *slog.Logger, opts Options) *Handler {
	if svc == nil {
		panic("wsapi: New called with a nil Service")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if opts.MaxMessageBytes <= 0 {
		opts.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if opts.MaxPending <= 0 {
		opts.MaxPending = DefaultMaxPending
	}
	if opts.MaxWatches <= 0 {
		opts.MaxWatches = DefaultMaxWatches
	}
	if opts.PingInterval <= 0 {
		opts.PingInterval = 30 * time.Second
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = 10 * time.Second
	}
	if opts.AuthTimeout <= 0 {
		opts.AuthTimeout = DefaultAuthTimeout
	}
	if opts.MaxUnauthenticatedPerIP <= 0 {
		opts.MaxUnauthenticatedPerIP = DefaultMaxUnauthenticatedPerIP
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Handler{svc: svc, log: logger, opts: opts, ctx: ctx, cancel: cancel,
		unauth: &ipSlots{max: opts.MaxUnauthenticatedPerIP, n: map[string]int{}}}
}

// Close closes every connection (status 1001, going away), withdrawing their
// pending acquires, and waits until their goroutines have exited. New
// connections are refused from then on.
func (h *Handler) Close() {
	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
	h.cancel()
	h.conns.Wait()
}

// ServeHTTP upgrades the request and serves the connection until it ends.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Answer non-WebSocket requests in the API's JSON error shape rather than
	// the library's plain text.
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		writeHTTPError(w, apierror.New(apierror.MethodNotAllowed, "method %s is not allowed here; open a WebSocket with GET", r.Method))
		return
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		writeHTTPError(w, apierror.New(apierror.InvalidArgument, "%s is a WebSocket endpoint; connect with a WebSocket client (Upgrade: websocket)", Path))
		return
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		writeHTTPError(w, &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Message: "this node is shutting down; connect to another node"})
		return
	}
	h.conns.Add(1)
	h.mu.Unlock()
	defer h.conns.Done()

	// Every operation on the connection runs with the token it was opened
	// with (Authorization: Bearer, or the auth message); the service checks
	// it when ACLs are on.
	base := service.WithBearer(h.ctx, bearerOf(r))
	if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && len(r.TLS.VerifiedChains[0]) > 0 {
		base = service.WithCertIdentity(base, r.TLS.VerifiedChains[0][0].Subject.CommonName)
	}
	needAuth := false
	releaseUnauth := func() {}
	if h.opts.Authenticate != nil {
		if hasCredentials(r) {
			authed, stop, err := h.opts.Authenticate(base)
			if err != nil {
				writeHTTPError(w, apierror.From(err))
				return
			}
			defer stop()
			base = authed
		} else {
			release, ok := h.unauth.take(clientIP(r))
			if !ok {
				h.limited(limitUnauthenticated)
				writeHTTPError(w, &apierror.Error{Code: apierror.RateLimited, RetryAfter: h.opts.AuthTimeout,
					Message: fmt.Sprintf("this address already has %d WebSocket connections that have not authenticated (the limit); send Authorization: Bearer <secret> on the upgrade, or authenticate the open ones", h.opts.MaxUnauthenticatedPerIP)})
				return
			}
			needAuth, releaseUnauth = true, release
			defer release()
		}
	}

	liftDeadlines(w)
	hw := &handshakeWriter{ResponseWriter: w}
	accept := &websocket.AcceptOptions{OriginPatterns: h.opts.OriginPatterns}
	if o := r.Header.Get("Origin"); o != "" && h.opts.AllowOrigin != nil && h.opts.AllowOrigin(o) {
		// The library's own check compares hosts with the request's; this
		// origin was accepted above by its whole value.
		accept.InsecureSkipVerify = true
	}
	ws, err := websocket.Accept(hw, r, accept)
	if err != nil {
		h.log.Debug("websocket upgrade refused", "err", err)
		hw.answer()
		return
	}
	ws.SetReadLimit(h.opts.MaxMessageBytes)
	if needAuth {
		authed, stop, ok := h.authenticate(ws, base)
		releaseUnauth()
		if !ok {
			_ = ws.CloseNow()
			return
		}
		defer stop()
		base = authed
	}
	ctx, cancel := context.WithCancel(base)
	ctx = service.WithRemote(ctx, "ws", r.RemoteAddr)
	c := &conn{h: h, ws: ws, ctx: ctx, cancel: cancel, auth: base, out: make(chan []byte, outQueue),
		serial: make(chan *message, h.opts.MaxPending), ops: map[string]*op{}}
	h.log.Debug("websocket connected", "remote", r.RemoteAddr)
	c.serve()
	h.log.Debug("websocket closed", "remote", r.RemoteAddr)
}

// outQueue is how many answers may wait for the writer. When it is full,
// producers block (each on its own goroutine, bounded by the connection's
// context) and a watch's own buffer in the event hub fills instead, which
// cuts that watch off rather than slowing anything else.
const outQueue = 256

type conn struct {
	h      *Handler
	ws     *websocket.Conn
	ctx    context.Context
	cancel context.CancelFunc
	// auth is the connection's context before its own cancel: under ACLs
	// it ends when the connection's token is revoked (Options.Authenticate).
	auth context.Context
	out  chan []byte
	// serial queues the ops that run in arrival order (all but acquire).
	serial chan *message
	wg     sync.WaitGroup

	mu               sync.Mutex
	ops              map[string]*op // pending acquires and open watches by message id
	pending, watches int
}

// op is a long-running message: a blocking acquire or a watch.
type op struct {
	kind   string
	cancel context.CancelFunc
	done   chan struct{}
}

func (c *conn) serve() {
	c.wg.Add(3)
	go c.writer()
	go c.supervise()
	go c.worker()
	// Reading needs no context of its own: every way a connection ends closes
	// the socket, which ends Read.
	for {
		typ, b, err := c.ws.Read(context.Background())
		if err != nil {
			break
		}
		if typ != websocket.MessageText {
			c.send(c.ctx, &answer{Error: errorOf(apierror.New(apierror.InvalidArgument, "send each message as a JSON text message, not binary"))})
			continue
		}
		c.handle(b)
	}
	c.cancel()
	c.wg.Wait()
	_ = c.ws.CloseNow()
}

// writer is the connection's only writer, so messages go out whole and in the
// order they were queued.
func (c *conn) writer() {
	defer c.wg.Done()
	for {
		select {
		case <-c.ctx.Done():
			return
		case b := <-c.out:
			ctx, cancel := context.WithTimeout(c.ctx, c.h.opts.WriteTimeout)
			err := c.ws.Write(ctx, websocket.MessageText, b)
			cancel()
			if err != nil {
				// The library closed the socket; the read loop ends next.
				c.cancel()
				return
			}
		}
	}
}

// supervise pings the client and closes the connection cleanly when the
// server shuts down.
func (c *conn) supervise() {
	defer c.wg.Done()
	t := time.NewTicker(c.h.opts.PingInterval)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			// The read loop waits on the socket, not on the context: on a
			// shutdown the socket must be closed here. (Every other way the
			// context ends has already closed it.)
			switch {
			case c.h.ctx.Err() != nil:
				_ = c.ws.Close(websocket.StatusGoingAway, "dlock node shutting down; reconnect to another node")
			case c.auth.Err() != nil:
				_ = c.ws.Close(websocket.StatusPolicyViolation, "the ACL token of this connection was revoked, replaced or has expired; reconnect with a valid token")
			}
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
			err := c.ws.Ping(ctx)
			cancel()
			if err != nil {
				c.cancel()
				_ = c.ws.CloseNow()
				return
			}
		}
	}
}

// send queues an answer; it gives up when ctx ends (the connection or the
// op is gone, so nobody is left to tell).
func (c *conn) send(ctx context.Context, a *answer) bool {
	b, err := json.Marshal(a)
	if err != nil {
		b, _ = json.Marshal(&answer{ID: a.ID, Op: a.Op, Error: errorOf(apierror.Wrap(apierror.Internal, err, "could not encode the answer"))})
	}
	select {
	case c.out <- b:
		return true
	case <-ctx.Done():
		return false
	}
}

// errorBody is the API's one error shape.
type errorBody struct {
	Code    apierror.Code `json:"code"`
	Message string        `json:"message"`
	// RetryAfterMs is, with lock_delayed, the lock-delay's time left.
	RetryAfterMs int64 `json:"retry_after_ms,omitempty"`
}

func writeHTTPError(w http.ResponseWriter, e *apierror.Error) {
	b, _ := json.Marshal(struct {
		Error errorBody `json:"error"`
	}{errorBody{Code: e.Code, Message: e.Message}})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if secs, ok := apierror.RetryAfterSeconds(e); ok {
		w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	}
	w.WriteHeader(apierror.HTTPStatus(e.Code))
	_, _ = w.Write(append(b, '\n'))
}

// handshakeWriter holds back the plain-text error the WebSocket library
// writes when it refuses a handshake (bad headers, a foreign Origin), so the
// client gets the API's JSON error shape instead. A successful upgrade passes
// straight through; Unwrap lets the library reach the connection to hijack it.
type handshakeWriter struct {
	http.ResponseWriter
	status int
	msg    []byte
}

func (hw *handshakeWriter) Unwrap() http.ResponseWriter { return hw.ResponseWriter }

func (hw *handshakeWriter) WriteHeader(code int) {
	if code >= 400 {
		hw.status = code
		return
	}
	hw.ResponseWriter.WriteHeader(code)
}

func (hw *handshakeWriter) Write(b []byte) (int, error) {
	if hw.status != 0 {
		if len(hw.msg) < 1024 {
			hw.msg = append(hw.msg, b...)
		}
		return len(b), nil
	}
	return hw.ResponseWriter.Write(b)
}

// answer writes the held-back refusal, if any, as a JSON error.
func (hw *handshakeWriter) answer() {
	if hw.status == 0 {
		return
	}
	code := apierror.InvalidArgument
	switch {
	case hw.status == http.StatusForbidden:
		code = apierror.PermissionDenied
	case hw.status >= 500:
		code = apierror.Internal
	}
	msg := strings.TrimSpace(string(hw.msg))
	if msg == "" {
		msg = http.StatusText(hw.status)
	}
	h := hw.ResponseWriter.Header()
	h.Del("X-Content-Type-Options")
	writeHTTPError(hw.ResponseWriter, apierror.New(code, "WebSocket handshake refused: %s", msg))
}

// publicError is what a client may see of err.
func (c *conn) publicError(ctx context.Context, err error) *errorBody {
	e, internal := apierror.Public(ctx, err)
	if internal {
		// The cause may hold internals a client has no business seeing.
		c.h.log.Error("internal error on a websocket connection", "code", string(e.Code), "error", err.Error())
		return &errorBody{Code: apierror.Internal, Message: "internal error; see the server log"}
	}
	return errorOf(e)
}

func errorOf(e *apierror.Error) *errorBody {
	msg := e.Message
	if msg == "" {
		msg = strings.ReplaceAll(string(e.Code), "_", " ")
	}
	b := &errorBody{Code: e.Code, Message: msg}
	if e.Code == apierror.LockDelayed {
		b.RetryAfterMs = max(e.RetryAfter.Milliseconds(), 1)
	}
	return b
}

func bearerOf(r *http.Request) string {
	scheme, secret, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(secret)
}
