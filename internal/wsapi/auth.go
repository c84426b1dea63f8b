package wsapi

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/service"
)

// Authentication (Options.Authenticate, set when ACLs are on). A connection
// that brings its token on the upgrade request (Authorization: Bearer, or a
// client certificate) is checked then, and refused with 401 before the
// upgrade if the token is not valid. One without — a browser, which cannot
// set headers on a WebSocket — must send {"id","op":"auth","token"} as its
// first message within AuthTimeout, or is closed; until then it is
// "unauthenticated", and each client IP may hold only
// MaxUnauthenticatedPerIP such connections. Nothing else is served before
// authentication, so an anonymous connection costs a socket for seconds,
// not for ever.

// Defaults of the authentication options.
const (
	DefaultAuthTimeout             = 5 * time.Second
	DefaultMaxUnauthenticatedPerIP = 16
)

const opAuth = "auth"

// ipSlots counts connections per client IP against a cap.
type ipSlots struct {
	max int
	mu  sync.Mutex
	n   map[string]int
}

// take reserves a slot for ip; release gives it back (once).
func (s *ipSlots) take(ip string) (release func(), ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n[ip] >= s.max {
		return nil, false
	}
	s.n[ip]++
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.n[ip]--; s.n[ip] <= 0 {
				delete(s.n, ip)
			}
		})
	}, true
}

func clientIP(r *http.Request) string {
	ip, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return ip
}

// hasCredentials reports whether the upgrade request brought a token or a
// verified client certificate.
func hasCredentials(r *http.Request) bool {
	return bearerOf(r) != "" || (r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && len(r.TLS.VerifiedChains[0]) > 0)
}

// authenticate runs the first-message authentication of a connection that
// brought no credentials. It returns the context to serve it with and the
// stop of Options.Authenticate, or false after closing the connection.
func (h *Handler) authenticate(ws *websocket.Conn, base context.Context) (context.Context, func(), bool) {
	ctx, cancel := context.WithTimeout(h.ctx, h.opts.AuthTimeout)
	defer cancel()
	typ, b, err := ws.Read(ctx)
	if err != nil {
		// The deadline passed (the library has closed the connection), the
		// client left, or the node is shutting down.
		_ = ws.Close(websocket.StatusPolicyViolation, "authenticate first: send {\"op\":\"auth\",\"token\":...} within "+h.opts.AuthTimeout.String())
		return nil, nil, false
	}
	refuse := func(id string, e *apierror.Error) (context.Context, func(), bool) {
		h.writeNow(ws, &answer{ID: id, Op: opAuth, Error: errorOf(e)})
		_ = ws.Close(websocket.StatusPolicyViolation, "not authenticated")
		return nil, nil, false
	}
	if typ != websocket.MessageText {
		return refuse("", apierror.New(apierror.Unauthenticated, "this cluster requires an ACL token: send {\"id\":\"1\",\"op\":\"auth\",\"token\":\"<secret>\"} first, as a JSON text message"))
	}
	m, derr := decode(b)
	if derr == nil && m.Op != opAuth {
		derr = apierror.New(apierror.Unauthenticated, "this cluster requires an ACL token: send {\"id\":\"1\",\"op\":\"auth\",\"token\":\"<secret>\"} before any other message, or Authorization: Bearer <secret> on the upgrade request")
	}
	if derr != nil {
		return refuse(m.ID, apierror.From(derr))
	}
	authed, stop, err := h.opts.Authenticate(service.WithBearer(base, m.Token))
	if err != nil {
		return refuse(m.ID, apierror.From(err))
	}
	h.writeNow(ws, &answer{ID: m.ID, Op: opAuth, Result: map[string]bool{"authenticated": true}})
	return authed, stop, true
}

// writeNow writes one answer before the connection's writer runs.
func (h *Handler) writeNow(ws *websocket.Conn, a *answer) {
	ctx, cancel := context.WithTimeout(h.ctx, h.opts.WriteTimeout)
	defer cancel()
	b, _ := json.Marshal(a)
	_ = ws.Write(ctx, websocket.MessageText, b)
}
