// Package httpapi serves dlock's HTTP/JSON API (design.md §5): it decodes requests, calls the service layer and encodes answers. It holds no lock semantics.
package httpapi

import (
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dlock/dlock/fence"
	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/service"
)

// Service is what the handlers need from the service layer; *service.Service
// satisfies it. It is declared here, by its consumer, so the handlers can be
// tested against a fake without a cluster.
type Service interface {
	Acquire(ctx context.Context, req service.AcquireRequest) (*service.AcquireResponse, error)
	Release(ctx context.Context, req service.ReleaseRequest) (*service.ReleaseResponse, error)
	Renew(ctx context.Context, req service.RenewRequest) (*service.RenewResponse, error)
	GetLock(ctx context.Context, name string, stale bool) (*service.LockView, error)
	ListLocks(ctx context.Context, req service.ListRequest) (*service.ListResponse, error)
	ListElections(ctx context.Context, req service.ListRequest) (*service.ElectionListResponse, error)
	History(ctx context.Context, req service.HistoryRequest) (*service.HistoryResponse, error)
	Revoke(ctx context.Context, req service.RevokeRequest) (*service.RevokeResponse, error)
	CreateSession(ctx context.Context, req service.CreateSessionRequest) (*service.SessionResponse, error)
	KeepAlive(ctx context.Context, req service.KeepAliveRequest) (*service.KeepAliveResponse, error)
	DeleteSession(ctx context.Context, req service.DeleteSessionRequest) (*service.DeleteSessionResponse, error)
	Cluster(ctx context.Context) (*service.ClusterInfo, error)
	ClusterHealth(ctx context.Context) (*service.ClusterInfo, error)
	Campaign(ctx context.Context, req service.CampaignRequest) (*service.CampaignResponse, error)
	GetElection(ctx context.Context, name string, stale bool) (*service.ElectionView, error)
	Proclaim(ctx context.Context, req service.ProclaimRequest) (*service.ProclaimResponse, error)
	Resign(ctx context.Context, req service.ResignRequest) (*service.ResignResponse, error)
	RenewElection(ctx context.Context, req service.RenewRequest) (*service.RenewResponse, error)
	Watch(ctx context.Context, req service.WatchRequest) (*service.Watcher, error)
	Observe(ctx context.Context, name string, stale bool) (*service.ElectionView, *service.Watcher, error)
	AddMember(ctx context.Context, req service.MemberRequest) (*service.ClusterInfo, error)
	RemoveMember(ctx context.Context, id string) (*service.ClusterInfo, error)
	TransferLeadership(ctx context.Context, req service.TransferRequest) (*service.ClusterInfo, error)
	SplitShard(ctx context.Context, req service.SplitRequest) (*service.ClusterInfo, error)
	MoveShard(ctx context.Context, req service.MoveRequest) (*service.ClusterInfo, error)
	Snapshot(ctx context.Context) ([]byte, uint64, error)
	TokenKeys(ctx context.Context) (*fence.KeySetDocument, error)
	RotateTokenKey(ctx context.Context, req service.RotateTokenKeyRequest) (*fence.KeySetDocument, error)
	ACLBootstrap(ctx context.Context) (*service.ACLTokenView, error)
	CreateACLToken(ctx context.Context, req service.ACLTokenRequest) (*service.ACLTokenView, error)
	ListACLTokens(ctx context.Context) (*service.ACLTokenList, error)
	DeleteACLToken(ctx context.Context, accessorID string) error
	Healthy() error
	Ready() error
}

// DefaultMaxBodyBytes is the request body limit of design.md §5 (64 KiB).
const DefaultMaxBodyBytes = 64 << 10

// Options tunes the handler. The zero value is the design.md §5 behaviour.
type Options struct {
	// MaxBodyBytes bounds a request body; larger bodies get 413 too_large.
	// 0 (or less) means DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// Metrics, when set, is served at /metrics (design.md §5 puts it at the root
	// beside /healthz). It is an option rather than something the caller mounts
	// beside this handler because putting this handler behind an http.ServeMux
	// would bring back the ServeMux's path cleaning and its 301 redirects, which
	// must never answer a bad lock name.
	Metrics http.Handler
	// Debug, when set, serves /debug/pprof/ (the --enable-pprof flag).
	Debug http.Handler
	// WatchHeartbeat is how often an idle event stream sends a comment line so
	// proxies keep it open (default 15 s).
	WatchHeartbeat time.Duration
	// WriteTimeout is the http.Server's write timeout for plain requests
	// (default DefaultWriteTimeout); blocking acquires and event streams move
	// their own deadlines by it (deadlines.go).
	WriteTimeout time.Duration
	// AllowOrigin accepts browser origins other than the server's own
	// (browser.go); the server passes Service.MemberOrigin. nil: none.
	AllowOrigin func(origin string) bool
	// TrustHost accepts the Host header (host:port) of a browser request:
	// a browser that reached this node under another name is refused
	// (DNS rebinding; browser.go). nil accepts every host.
	TrustHost func(hostport string) bool
	// Console, when set, serves the web console under ConsolePrefix
	// (internal/console). Like Metrics it is mounted here, not beside this
	// handler, so no ServeMux comes between a lock name and its route.
	Console http.Handler
}

// ConsolePrefix is where the web console lives (console.Prefix); "/" and
// "/ui" redirect to it.
const ConsolePrefix = "/ui/"

// API paths. Fixed segments are matched in their escaped form: only lock names
// and session ids are unescaped, so "%2F" can carry a slash inside a name.
const (
	apiPrefix      = "/api/v1"
	locksPrefix    = apiPrefix + "/locks"
	sessionsPrefix = apiPrefix + "/sessions"
)

// Lock actions: the last path segment of POST /api/v1/locks/{name}/{action}.
const (
	actionAcquire = "acquire"
	actionRelease = "release"
	actionRenew   = "renew"
)

const (
	allowGet = "GET, HEAD"
	// Event streams refuse HEAD: a HEAD answer ends with its headers, so a
	// stream behind it would never end and would hold its keep-alive
	// connection (and a watcher slot) for as long as the client keeps it.
	allowStream = "GET"
	allowPost   = "POST"
	allowDelete = "DELETE"
	allowLock   = "GET, HEAD, POST"
)

type api struct {
	svc       Service
	log       *slog.Logger
	maxBody   int64
	metrics   http.Handler
	heartbeat time.Duration
	debug     http.Handler
	console   http.Handler
	// writeTimeout: see Options.WriteTimeout.
	writeTimeout time.Duration
	allowOrigin  func(origin string) bool
	trustHost    func(hostport string) bool
}

// New returns the handler for the whole HTTP API: /api/v1/..., /healthz,
// /readyz and, if Options.Metrics is set, /metrics.
//
// Use it as the http.Server's Handler directly, not behind an http.ServeMux:
// a ServeMux cleans paths and 301-redirects "a//b" or "a/../b" before any
// handler runs, while design.md §5 wants such lock names refused with 400. This
// handler routes on r.URL.EscapedPath() itself and never redirects.
//
// A nil logger discards logs. Blocking acquires and event streams set their
// own write deadlines (deadlines.go), so the server's WriteTimeout need only
// fit plain requests; give the same value as Options.WriteTimeout.
func New(svc Service, logger *slog.Logger, opts Options) http.Handler {
	if svc == nil {
		panic("httpapi: New called with a nil Service")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.WatchHeartbeat <= 0 {
		opts.WatchHeartbeat = 15 * time.Second
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = DefaultWriteTimeout
	}
	a := &api{svc: svc, log: logger, maxBody: opts.MaxBodyBytes, metrics: opts.Metrics, heartbeat: opts.WatchHeartbeat, debug: untimed(opts.Debug),
		writeTimeout: opts.WriteTimeout, allowOrigin: opts.AllowOrigin, trustHost: opts.TrustHost, console: opts.Console}
	return a.middleware(http.HandlerFunc(a.route))
}

// route dispatches on the escaped path. It does not use http.ServeMux on
// purpose; see New.
func (a *api) route(w http.ResponseWriter, r *http.Request) {
	r = withBearer(r)
	if !a.browserChecks(w, r) {
		return
	}
	p := r.URL.EscapedPath()
	switch p {
	case "/healthz":
		a.health(w, r, a.svc.Healthy)
		return
	case "/readyz":
		a.health(w, r, a.svc.Ready)
		return
	case "/metrics":
		if a.metrics != nil {
			a.metrics.ServeHTTP(w, r)
			return
		}
	}
	if a.debug != nil && strings.HasPrefix(p, "/debug/pprof/") {
		a.debug.ServeHTTP(w, r)
		return
	}
	if a.console != nil && (p == "/" || p == "/ui" || strings.HasPrefix(p, ConsolePrefix)) {
		a.serveConsole(w, r, p)
		return
	}

	if rest, ok := cutSegments(p, locksPrefix); ok {
		// "/api/v1/locks" and "/api/v1/locks/" are both the collection.
		if rest == "" || rest == "/" {
			a.listLocks(w, r)
		} else {
			a.lock(w, r, rest[1:])
		}
		return
	}
	if rest, ok := cutSegments(p, sessionsPrefix); ok {
		if rest == "" || rest == "/" {
			a.sessions(w, r)
			return
		}
		id, sub, hasSub := strings.Cut(rest[1:], "/")
		switch {
		case !hasSub:
			a.session(w, r, id)
		case sub == "keepalive":
			a.keepAlive(w, r, id)
		default:
			a.notFound(w, r)
		}
		return
	}
	if rest, ok := cutSegments(p, historyPrefix); ok && len(rest) > 1 {
		a.history(w, r, rest[1:])
		return
	}
	if rest, ok := cutSegments(p, electionsPrefix); ok {
		if rest == "" || rest == "/" {
			a.listElections(w, r)
		} else {
			a.election(w, r, rest[1:])
		}
		return
	}
	if p == apiPrefix+"/watch" {
		a.watch(w, r)
		return
	}
	if p == openAPIPath {
		a.openAPI(w, r)
		return
	}
	if rest, ok := cutSegments(p, clusterPrefix); ok {
		a.clusterRoutes(w, r, rest)
		return
	}
	if rest, ok := cutSegments(p, aclPrefix); ok {
		a.aclRoutes(w, r, rest)
		return
	}
	a.notFound(w, r)
}

// cutSegments reports whether p is prefix itself or prefix followed by more
// segments, and returns what follows ("" or starting with "/"), so that
// "/api/v1/lockstep" does not count as under "/api/v1/locks".
func cutSegments(p, prefix string) (string, bool) {
	rest, ok := strings.CutPrefix(p, prefix)
	if !ok || (rest != "" && rest[0] != '/') {
		return "", false
	}
	return rest, true
}

func (a *api) notFound(w http.ResponseWriter, r *http.Request) {
	a.writeError(w, r, apierror.New(apierror.NotFound,
		"no endpoint at this path; the API is under %s (locks, history, sessions, elections, watch, cluster, acl; described at %s), health at /healthz and /readyz", apiPrefix, openAPIPath))
}

func (a *api) methodNotAllowed(w http.ResponseWriter, r *http.Request, allow string) {
	w.Header().Set("Allow", allow)
	a.writeError(w, r, apierror.New(apierror.MethodNotAllowed,
		"method %s is not allowed here; use %s", r.Method, allow))
}

// plainPost answers 405 to anything but POST and 400 to any query
// parameter; it reports whether the request may go on.
func (a *api) plainPost(w http.ResponseWriter, r *http.Request) bool {
	if r.Method != http.MethodPost {
		a.methodNotAllowed(w, r, allowPost)
		return false
	}
	if _, aerr := parseQuery(r); aerr != nil {
		a.writeError(w, r, aerr)
		return false
	}
	return true
}

func isGet(r *http.Request) bool { return r.Method == http.MethodGet || r.Method == http.MethodHead }

// lockName turns the escaped name part of a path into a canonical lock name.
// Unescaping the whole part at once is what lets "billing%2Fjob" and
// "billing/job" name the same lock.
func lockName(escaped string) (string, *apierror.Error) {
	raw, err := url.PathUnescape(escaped)
	if err != nil {
		return "", apierror.New(apierror.InvalidArgument, "lock name in the path has a bad %%-escape")
	}
	name, err := command.NormalizeName(raw)
	if err != nil {
		return "", apierror.New(apierror.InvalidArgument, "bad lock name: %v", err)
	}
	return name, nil
}

// sessionID unescapes the {id} segment. Its format is the service's business;
// only an empty id is refused here, since it cannot name anything.
func sessionID(escaped string) (string, *apierror.Error) {
	id, err := url.PathUnescape(escaped)
	if err != nil {
		return "", apierror.New(apierror.InvalidArgument, "session id in the path has a bad %%-escape")
	}
	if id == "" {
		return "", apierror.New(apierror.InvalidArgument, "session id in the path is empty")
	}
	return id, nil
}

// lock serves /api/v1/locks/{rest}: for GET the whole rest is the name, for
// POST the last segment is the action (design.md §5), so a lock may itself be
// called ".../acquire" and still be read.
func (a *api) lock(w http.ResponseWriter, r *http.Request, rest string) {
	switch {
	case isGet(r):
		q, aerr := parseQuery(r, "stale")
		if aerr != nil {
			a.writeError(w, r, aerr)
			return
		}
		stale, aerr := parseStale(q)
		if aerr != nil {
			a.writeError(w, r, aerr)
			return
		}
		name, aerr := lockName(rest)
		if aerr != nil {
			a.writeError(w, r, aerr)
			return
		}
		view, err := a.svc.GetLock(r.Context(), name, stale)
		if err == nil {
			staleHeaders(w, view.Stale)
		}
		reply(a, w, r, http.StatusOK, view, err)
	case r.Method == http.MethodPost:
		a.lockAction(w, r, rest)
	default:
		a.methodNotAllowed(w, r, allowLock)
	}
}

func (a *api) lockAction(w http.ResponseWriter, r *http.Request, rest string) {
	name, action, ok := a.splitAction(w, r, rest, "lock", locksPrefix, actionAcquire, actionRelease, actionRenew, actionRevoke)
	if !ok {
		return
	}
	switch action {
	case actionAcquire:
		// r.Context() is cancelled when the client hangs up, which is how a
		// waiting acquirer withdraws from the queue (design.md §5); no timeout is
		// added here because the wait bound is the service's.
		var req service.AcquireRequest
		if aerr := a.decodeBody(w, r, &req, true); aerr != nil {
			a.writeError(w, r, aerr)
			return
		}
		req.Name = name
		a.holdOpen(w, req.WaitTimeoutMs)
		resp, err := a.svc.Acquire(r.Context(), req)
		if isConflict(err) && resp != nil {
			a.writeAcquireConflict(w, r, resp, apierror.From(err))
			return
		}
		reply(a, w, r, http.StatusOK, resp, err)
	case actionRelease:
		decodeAndCall(a, w, r, http.StatusOK, true, func(q *service.ReleaseRequest) { q.Name = name }, a.svc.Release)
	case actionRenew:
		decodeAndCall(a, w, r, http.StatusOK, true, func(q *service.RenewRequest) { q.Name = name }, a.svc.Renew)
	case actionRevoke:
		decodeAndCall(a, w, r, http.StatusOK, true, func(q *service.RevokeRequest) { q.Name = name }, a.svc.Revoke)
	}
}

// splitAction parses "{name}/{action}" for POST under prefix, refusing an
// unknown action (404), a bad name (400) or any query parameter (400).
func (a *api) splitAction(w http.ResponseWriter, r *http.Request, rest, kind, prefix string, actions ...string) (string, string, bool) {
	namePart, action := "", rest
	if i := strings.LastIndexByte(rest, '/'); i >= 0 {
		namePart, action = rest[:i], rest[i+1:]
	}
	if !slices.Contains(actions, action) {
		a.writeError(w, r, apierror.New(apierror.NotFound,
			"unknown %s action %q; POST to %s/{name}/ followed by one of: %s", kind, action, prefix, strings.Join(actions, ", ")))
		return "", "", false
	}
	name, aerr := lockName(namePart)
	if aerr != nil {
		a.writeError(w, r, aerr)
		return "", "", false
	}
	if _, aerr := parseQuery(r); aerr != nil {
		a.writeError(w, r, aerr)
		return "", "", false
	}
	return name, action, true
}

// isConflict reports the acquire outcomes answered with more than the error:
// who holds the lock, (lock_lost) the token of the grant that was lost, or
// (limit_mismatch) the lock's limit.
func isConflict(err error) bool {
	c := apierror.CodeOf(err)
	return c == apierror.LockHeld || c == apierror.WaitTimeout || c == apierror.LockLost || c == apierror.LimitMismatch
}

// decodeAndCall decodes the body into a Req, lets fill add what came from the
// path, calls the service and answers with status.
func decodeAndCall[Req, Resp any](a *api, w http.ResponseWriter, r *http.Request, status int, bodyRequired bool,
	fill func(*Req), call func(context.Context, Req) (*Resp, error)) {
	var req Req
	if aerr := a.decodeBody(w, r, &req, bodyRequired); aerr != nil {
		a.writeError(w, r, aerr)
		return
	}
	if fill != nil {
		fill(&req)
	}
	resp, err := call(r.Context(), req)
	reply(a, w, r, status, resp, err)
}

func (a *api) listLocks(w http.ResponseWriter, r *http.Request) {
	list(a, w, r, a.svc.ListLocks, func(l *service.ListResponse) *service.StaleRead { return l.Stale })
}

func (a *api) listElections(w http.ResponseWriter, r *http.Request) {
	list(a, w, r, a.svc.ListElections, func(l *service.ElectionListResponse) *service.StaleRead { return l.Stale })
}

// list serves a paged listing by name prefix (GET ?prefix&after&limit&stale).
func list[Resp any](a *api, w http.ResponseWriter, r *http.Request,
	call func(context.Context, service.ListRequest) (*Resp, error), stale func(*Resp) *service.StaleRead) {
	if !isGet(r) {
		a.methodNotAllowed(w, r, allowGet)
		return
	}
	q, aerr := parseQuery(r, "prefix", "after", "limit", "stale")
	if aerr != nil {
		a.writeError(w, r, aerr)
		return
	}
	req, aerr := listRequest(q)
	if aerr != nil {
		a.writeError(w, r, aerr)
		return
	}
	resp, err := call(r.Context(), req)
	if err == nil && resp != nil {
		staleHeaders(w, stale(resp))
	}
	reply(a, w, r, http.StatusOK, resp, err)
}

// serveConsole hands /ui/... to the console. The bare root and "/ui"
// redirect to "/ui/", so an operator who types the node's address lands
// on the console; every other path stays the API's.
func (a *api) serveConsole(w http.ResponseWriter, r *http.Request, p string) {
	if p == "/" || p == "/ui" {
		if !isGet(r) {
			a.methodNotAllowed(w, r, allowGet)
			return
		}
		http.Redirect(w, r, ConsolePrefix, http.StatusFound)
		return
	}
	a.console.ServeHTTP(w, r)
}

func (a *api) sessions(w http.ResponseWriter, r *http.Request) {
	if !a.plainPost(w, r) {
		return
	}
	decodeAndCall(a, w, r, http.StatusCreated, true, nil, a.svc.CreateSession)
}

// sessionCall checks method, id and query of /sessions/{id}[/keepalive] and
// returns the unescaped id.
func (a *api) sessionCall(w http.ResponseWriter, r *http.Request, escapedID, method, allow string) (string, bool) {
	if r.Method != method {
		a.methodNotAllowed(w, r, allow)
		return "", false
	}
	id, aerr := sessionID(escapedID)
	if aerr == nil {
		_, aerr = parseQuery(r)
	}
	if aerr != nil {
		a.writeError(w, r, aerr)
		return "", false
	}
	return id, true
}

func (a *api) session(w http.ResponseWriter, r *http.Request, escapedID string) {
	if id, ok := a.sessionCall(w, r, escapedID, http.MethodDelete, allowDelete); ok {
		decodeAndCall(a, w, r, http.StatusOK, false, func(q *service.DeleteSessionRequest) { q.SessionID = id }, a.svc.DeleteSession)
	}
}

func (a *api) keepAlive(w http.ResponseWriter, r *http.Request, escapedID string) {
	if id, ok := a.sessionCall(w, r, escapedID, http.MethodPost, allowPost); ok {
		decodeAndCall(a, w, r, http.StatusOK, false, func(q *service.KeepAliveRequest) { q.SessionID = id }, a.svc.KeepAlive)
	}
}

func (a *api) cluster(w http.ResponseWriter, r *http.Request) {
	if !isGet(r) {
		a.methodNotAllowed(w, r, allowGet)
		return
	}
	q, aerr := parseQuery(r, "health")
	if aerr != nil {
		a.writeError(w, r, aerr)
		return
	}
	health, aerr := parseBool(q, "health")
	if aerr != nil {
		a.writeError(w, r, aerr)
		return
	}
	call := a.svc.Cluster
	if health {
		call = a.svc.ClusterHealth
	}
	info, err := call(r.Context())
	reply(a, w, r, http.StatusOK, info, err)
}

// health serves /healthz and /readyz. Probes only look at the status, so any
// failure is a 503 whatever code the check returned, and the query string is
// ignored rather than refused.
func (a *api) health(w http.ResponseWriter, r *http.Request, check func() error) {
	if !isGet(r) {
		a.methodNotAllowed(w, r, allowGet)
		return
	}
	if err := check(); err != nil {
		e := apierror.From(err)
		if apierror.HTTPStatus(e.Code) != http.StatusServiceUnavailable {
			// A plain error's text is the reason an operator needs to see;
			// apierror.From would have hidden it behind a generic message.
			e = &apierror.Error{Code: apierror.Unavailable, Message: err.Error(), RetryAfter: e.RetryAfter, Err: err}
		}
		a.writeError(w, r, e)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// Headers of a ?stale=true answer (Consul's X-Consul-KnownLeader and
// X-Consul-LastContact): did the answering node know a leader, and how many
// milliseconds ago did it last hear from it (0 on the leader; absent if never).
const (
	headerKnownLeader = "X-Dlock-Known-Leader"
	headerLastContact = "X-Dlock-Last-Contact"
)

// staleHeaders describes a stale answer's freshness; nil (a linearizable
// answer) sets nothing.
func staleHeaders(w http.ResponseWriter, sr *service.StaleRead) {
	if sr == nil {
		return
	}
	w.Header().Set(headerKnownLeader, strconv.FormatBool(sr.KnownLeader))
	if ms, ok := sr.LastContactMs(); ok {
		w.Header().Set(headerLastContact, strconv.FormatInt(ms, 10))
	}
}
