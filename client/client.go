// Package client is the Go client of dlock, the distributed lock service.
//
// A Client talks HTTP/JSON to a dlock cluster. It finds the leader and sends
// requests to it directly, fails over to any other node when a node is down,
// and retries with jittered exponential backoff under one request id, so a
// retried request never acts twice. The few administrative calls the cluster
// keeps no request id for (ACLBootstrap, CreateACLToken, TransferLeadership
// to any voter) are resent only when the cluster certainly did not act on
// them; otherwise they fail with ErrOutcomeUnknown.
//
// Most programs need only WithLock, or a Mutex:
//
//	c, err := client.New(client.Config{Endpoints: []string{"http://10.0.0.1:7070", "http://10.0.0.2:7070"}})
//	...
//	err = c.WithLock(ctx, "billing/batch-job", func(ctx context.Context, l *client.Lease) error {
//		return store.Write(ctx, l.Token(), data) // the store refuses tokens older than the newest it saw
//	})
//
// A lock is held through a Lease that renews itself at a third of its TTL.
// The client treats the lease as lost at the moment it sent the last acquire
// or renew the server answered with success, plus the TTL, measured on its own
// monotonic clock. The server never gives the lock to anyone else before that
// moment, so while Lease.Done is open no one else holds the lock. Nothing can
// stop a process that pauses (GC, SIGSTOP) from acting late, which is what the
// fencing token (Lease.Token) is for: pass it to the protected resource and
// let it refuse tokens older than the newest it has seen.
//
// An Election (NewElection) picks one leader at a time among candidates
// waiting in line: Campaign returns a Leadership that renews itself and
// closes Done under the same bound, and Observe reports every leader and
// vacancy. Watch streams every change from a revision on (list with
// ListWithRevision, then watch from its revision + 1), resuming on another
// node when one fails, without losing or repeating events.
package client

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Config configures a Client.
type Config struct {
	// Endpoints are base URLs of some or all nodes, e.g.
	// "http://10.0.0.1:7070". A bare "host:port" means http. Required.
	Endpoints []string
	// HTTPClient sends the requests (set it for TLS or a proxy). Leave its
	// Timeout zero: a wait in line is one long request, and the client bounds
	// every request itself. Default: a client of its own.
	HTTPClient *http.Client
	// TLS is the client side of https endpoints when HTTPClient is not
	// set: the CAs to trust (RootCAs; nil means the system's) and, for a
	// cluster that asks for client certificates, this client's
	// (Certificates). LoadTLSConfig builds one from PEM files. With TLS set,
	// a bare "host:port" endpoint means https.
	TLS *tls.Config
	// Logger receives retries (debug) and lost leases (warn). Default: none.
	Logger *slog.Logger
	// ClientID names this holder to the cluster. It should be unique per
	// process: holders are shown by it, and a process that restarts with
	// the same ClientID may take its previous incarnation's locks over at
	// once, but only when it asks to (WithTakeover; with ACLs, a token
	// naming this ClientID). Without that, the same ClientID under a new
	// lease waits like anyone else. Default: hostname-pid-random.
	ClientID string
	// RequestTimeout bounds one attempt of a request that does not wait in
	// line. Default 10 s.
	RequestTimeout time.Duration
	// Token is the ACL token's secret, sent as "Authorization: Bearer" on
	// every request; needed when the cluster runs with --acl.
	Token string
	// UnreachableTimeout, when positive, ends a request with ErrUnavailable
	// once no node has answered it for this long (every node refused the
	// connection, or answered 502/503/504), instead of retrying until the
	// context ends. A wait in line that a node holds open counts as an
	// answer, so this bounds an unreachable cluster, not a long wait.
	UnreachableTimeout time.Duration
}

const (
	defaultRequestTimeout = 10 * time.Second
	// waitMargin is the most a wait in line asks the server for less than
	// the time left before ctx's deadline (see waitFor).
	waitMargin = time.Second
	// minTTL and maxTTL are the server's limits on a lease TTL.
	minTTL = time.Second
	maxTTL = 600 * time.Second
	// discoverEvery limits how often the client asks for the leader.
	discoverEvery = time.Second
	// distrustFor is how long a leader address that could not be dialled
	// is not used.
	distrustFor = 10 * time.Second
	// heldFor is how long a node must have held an attempt that then failed
	// for the cluster to count as reachable (see Config.UnreachableTimeout).
	heldFor = time.Second
	// cleanupTimeout bounds the clean-up after a cancelled acquire.
	cleanupTimeout = 3 * time.Second
	backoffMin     = 20 * time.Millisecond
	backoffMax     = time.Second
	maxAnswer      = 4 << 20
)

// maxWait is the server's limit on wait_timeout_ms. A variable so that tests
// can see a wait outlast it without taking an hour.
var maxWait = time.Hour

// Client is a connection to a dlock cluster. It is safe for concurrent use.
type Client struct {
	endpoints  []string
	hc         *http.Client
	ownHC      bool
	log        *slog.Logger
	id         string
	reqTimeout time.Duration
	// unreachable: Config.UnreachableTimeout.
	unreachable time.Duration
	token       string
	locals      localLocks

	mu        sync.Mutex
	leader    string // base URL of the leader, "" when unknown
	lastAsked time.Time
	next      int                  // round-robin position in endpoints
	notBefore map[string]time.Time // Retry-After per base URL
	distrust  map[string]time.Time // leader addresses that could not be dialled, until when
	live      map[*keeper]struct{} // leases and sessions this client keeps alive
	closed    bool
}

// New returns a client for the cluster at cfg.Endpoints. It does not contact
// the cluster.
func New(cfg Config) (*Client, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, invalidf("Config.Endpoints is empty; give the URL of at least one node, e.g. http://127.0.0.1:7070")
	}
	c := &Client{hc: cfg.HTTPClient, log: cfg.Logger, id: cfg.ClientID, reqTimeout: cfg.RequestTimeout, token: cfg.Token, unreachable: cfg.UnreachableTimeout,
		notBefore: map[string]time.Time{}, distrust: map[string]time.Time{}, live: map[*keeper]struct{}{}}
	if cfg.TLS != nil && cfg.HTTPClient != nil {
		return nil, invalidf("Config.TLS and Config.HTTPClient are both set; set TLSClientConfig on your HTTPClient's transport instead")
	}
	seen := map[string]bool{}
	for _, e := range cfg.Endpoints {
		if cfg.TLS != nil && !strings.Contains(e, "://") {
			e = "https://" + strings.TrimSpace(e)
		}
		base, err := normalizeEndpoint(e)
		if err != nil {
			return nil, err
		}
		if !seen[base] {
			seen[base] = true
			c.endpoints = append(c.endpoints, base)
		}
	}
	if c.hc == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = cfg.TLS.Clone() // nil stays nil
		c.hc = &http.Client{Transport: tr}
		c.ownHC = true
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if c.id == "" {
		c.id = defaultClientID()
	} else if err := checkID("ClientID", c.id); err != nil {
		return nil, err
	}
	if c.reqTimeout <= 0 {
		c.reqTimeout = defaultRequestTimeout
	}
	// Start at a different node in each process, so that clients spread
	// their first requests.
	c.next = rand.IntN(len(c.endpoints))
	return c, nil
}

// ClientID is the id this client uses as holder.
func (c *Client) ClientID() string { return c.id }

// Close stops renewing every lease and session of this client (their Done
// channels close, Err wraps ErrClosed) and releases nothing: Unlock and
// Session.Close first to hand locks on at once; otherwise they expire after
// their TTL.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	live := make([]*keeper, 0, len(c.live))
	for k := range c.live {
		live = append(live, k)
	}
	c.mu.Unlock()
	for _, k := range live {
		k.end(lost(ErrClosed))
		<-k.finished
	}
	if c.ownHC {
		c.hc.CloseIdleConnections()
	}
	return nil
}

func normalizeEndpoint(e string) (string, error) {
	e = strings.TrimSpace(e)
	if !strings.Contains(e, "://") {
		e = "http://" + e
	}
	u, err := url.Parse(e)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return "", invalidf("endpoint %q: want a base URL like http://127.0.0.1:7070", e)
	}
	return u.Scheme + "://" + u.Host, nil
}

func checkID(field, v string) error {
	if len(v) == 0 || len(v) > 128 {
		return invalidf("%s must be 1 to 128 characters", field)
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x21 || v[i] > 0x7e {
			return invalidf("%s %q may contain only printable ASCII without spaces", field, v)
		}
	}
	return nil
}

// defaultClientID is unique per process and says where the holder runs,
// which is what an operator looking at GET /locks wants to know.
func defaultClientID() string {
	host, _ := os.Hostname()
	var b strings.Builder
	for _, r := range host {
		if r > 0x20 && r < 0x7f {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	h := b.String()
	if h == "" {
		h = "host"
	}
	if len(h) > 80 {
		h = h[:80]
	}
	return fmt.Sprintf("%s-%d-%s", h, os.Getpid(), crand.Text()[:8])
}

// newRequestID names one logical request; every retry of it carries the
// same id, so the server answers a retry with the first result.
func newRequestID() string { return "c-" + crand.Text() }

// call is one logical request.
type call struct {
	method string
	path   string // escaped, under /api/v1
	body   any
	out    any
	// timeout bounds each attempt (0: RequestTimeout).
	timeout time.Duration
	// what names the request in errors and logs (default: method and
	// path); it must not show a session id, which is a secret.
	what string
	// requestID is sent as X-Request-Id so the server's log lines of every
	// attempt carry it.
	requestID string
	// once marks a request the server acts on every time it receives it:
	// it keeps no request id for it, so a resend after an attempt that may
	// have taken effect would act twice (a second token, a second transfer).
	// Such a request is resent only after attempts that certainly did
	// nothing; otherwise do gives up with ErrOutcomeUnknown and check, which
	// tells the caller how to find out what happened.
	once  bool
	check string
	// goneIsDone marks a removal: a not_found answer to a resend that
	// follows an attempt of unknown outcome means that attempt removed it,
	// and do returns errDoneEarlier instead of the not_found.
	goneIsDone bool
}

// errDoneEarlier: see call.goneIsDone.
var errDoneEarlier = errors.New("dlock: an earlier attempt already did it")

// notApplied reports whether an error answer certainly means the request
// had no effect, so that even a once request may be resent. A rate limit
// refuses before the request goes any further, and the server answers
// no_leader only when every try to reach a leader failed before proposing
// (an outcome it does not know it answers as unavailable). 502 and 504 come
// from a proxy that may have passed the request on: outcome unknown.
func notApplied(status int, e *APIError) bool {
	return status == http.StatusTooManyRequests ||
		(status == http.StatusServiceUnavailable && e.Code == CodeNoLeader)
}

// do sends a request, retrying on other nodes until an answer that is not a
// transient failure, or until ctx ends. It returns when the first attempt
// that may have reached a node was sent (zero if none may have): an effect of
// the request happened after that moment whichever attempt caused it, so it
// is the safe start for a lease's TTL.
func (c *Client) do(ctx context.Context, r call) (time.Time, error) {
	var body []byte
	if r.body != nil {
		var err error
		if body, err = json.Marshal(r.body); err != nil {
			return time.Time{}, fmt.Errorf("dlock: encode request: %w", err)
		}
	}
	if r.timeout <= 0 {
		r.timeout = c.reqTimeout
	}
	if r.what == "" {
		r.what = r.method + " " + r.path
	}
	var first time.Time
	var lastErr error
	// unknown is why an attempt may have taken effect without this client
	// hearing of it; nil while every attempt certainly did nothing.
	var unknown error
	backoff := backoffMin
	// reached is when a node last answered or held the request: the start of
	// the current stretch of unreachability (see Config.UnreachableTimeout).
	reached := time.Now()
	for {
		if err := ctx.Err(); err != nil {
			return first, giveUp(r, err, lastErr)
		}
		if c.unreachable > 0 && lastErr != nil && time.Since(reached) >= c.unreachable {
			return first, fmt.Errorf("%s: %w: no node answered for %s; check the endpoints and that the cluster is up (last error: %w)",
				r.what, ErrUnavailable, c.unreachable.Round(time.Millisecond), lastErr)
		}
		c.discover(ctx)
		base, wait := c.target()
		if wait > 0 {
			// Every node asked us to come back later (Retry-After).
			sleep(ctx, wait)
			continue
		}
		start := time.Now()
		status, hdr, data, err := c.attempt(ctx, base, r, body)
		if first.IsZero() && !notSent(err) {
			first = start
		}
		if (err == nil && status != http.StatusBadGateway && status != http.StatusServiceUnavailable && status != http.StatusGatewayTimeout) ||
			(err != nil && !notSent(err) && time.Since(start) >= heldFor) {
			reached = time.Now()
		}
		switch {
		case err != nil:
			sent := !notSent(err)
			// The url.Error around err repeats the method and URL.
			var uerr *url.Error
			if errors.As(err, &uerr) {
				err = uerr.Err
			}
			if ctx.Err() != nil {
				if r.once && sent {
					return first, outcomeUnknown(r, fmt.Errorf("%s: %w", base, err), ctx.Err())
				}
				continue
			}
			lastErr = fmt.Errorf("%w: %s: %w", ErrUnavailable, base, err)
			c.failed(base, 0, !sent)
			if sent {
				unknown = fmt.Errorf("%s: %w", base, err)
				if r.once {
					return first, outcomeUnknown(r, unknown, nil)
				}
			}
		case status >= 200 && status < 300:
			if r.out != nil {
				if err := json.Unmarshal(data, r.out); err != nil {
					return first, fmt.Errorf("dlock: %s: bad answer from %s: %w", r.what, base, err)
				}
			}
			return first, nil
		default:
			aerr := decodeError(status, data)
			if r.goneIsDone && unknown != nil && status == http.StatusNotFound && aerr.Code == codeNotFound {
				return first, errDoneEarlier
			}
			if !retryable(status) {
				return first, aerr
			}
			lastErr = aerr
			c.failed(base, retryAfter(hdr), false)
			if !notApplied(status, aerr) {
				unknown = fmt.Errorf("%s: %w", base, aerr)
				if r.once {
					return first, outcomeUnknown(r, unknown, nil)
				}
			}
		}
		c.log.Debug("dlock: retrying", "request", r.what, "node", base, "err", lastErr)
		sleep(ctx, jitter(backoff))
		backoff = min(2*backoff, backoffMax)
	}
}

// attempt sends one try to one node and reads the whole answer.
func (c *Client) attempt(ctx context.Context, base string, r call, body []byte) (int, http.Header, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, r.method, base+"/api/v1"+r.path, rd)
	if err != nil {
		return 0, nil, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "dlock-go-client")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if r.requestID != "" {
		req.Header.Set("X-Request-Id", r.requestID)
	}
	res, err := c.hc.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer res.Body.Close()
	data, err := io.ReadAll(io.LimitReader(res.Body, maxAnswer))
	if err != nil {
		return 0, nil, nil, err
	}
	return res.StatusCode, res.Header, data, nil
}

// notSent reports whether an attempt certainly never reached a node: the
// connection could not even be opened.
func notSent(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// outcomeUnknown is the error of a once request that may or may not have
// taken effect. It does not match ErrUnavailable, which invites a retry:
// retrying blindly is what it warns against.
func outcomeUnknown(r call, cause, ctxErr error) error {
	if ctxErr != nil {
		return fmt.Errorf("%s: %w: the context ended (%w) after the request may have reached a node (%v); %s",
			r.what, ErrOutcomeUnknown, ctxErr, cause, r.check)
	}
	return fmt.Errorf("%s: %w: %v; not resent, since the cluster would act on it again; %s", r.what, ErrOutcomeUnknown, cause, r.check)
}

func giveUp(r call, ctxErr, lastErr error) error {
	if lastErr == nil {
		return fmt.Errorf("%s: %w", r.what, ctxErr)
	}
	return fmt.Errorf("%s: %w (last error: %w)", r.what, ctxErr, lastErr)
}

// retryable says whether an HTTP status means "this node cannot answer
// now" rather than an answer about the request.
func retryable(status int) bool {
	switch status {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

func decodeError(status int, data []byte) *APIError {
	e := &APIError{HTTPStatus: status}
	var er errorResponse
	if json.Unmarshal(data, &er) == nil && er.Error != nil {
		e.Code, e.Message, e.Holder, e.Limit = er.Error.Code, er.Error.Message, er.Holder, er.Limit
		e.FencingToken, e.RetryAfter = er.FencingToken, time.Duration(er.Error.RetryAfterMs)*time.Millisecond
		return e
	}
	msg := strings.TrimSpace(string(data))
	if len(msg) > 200 {
		msg = msg[:200] + "…"
	}
	e.Message = msg
	return e
}

// retryAfter reads Retry-After in seconds or as an HTTP date.
func retryAfter(h http.Header) time.Duration {
	v := h.Get("Retry-After")
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return time.Until(t)
	}
	return 0
}

// jitter spreads retries of many clients: a random duration in [d/2, d).
func jitter(d time.Duration) time.Duration {
	return d/2 + rand.N(d/2+1)
}

// sleep waits d or until ctx ends; it reports whether it slept all of d.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// target picks the node for the next attempt: the leader if known, else the
// next endpoint in turn, skipping nodes that asked to be left alone. If all
// did, it returns how long until the first of them may be asked again.
func (c *Client) target() (string, time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if c.leader != "" && !now.Before(c.notBefore[c.leader]) {
		return c.leader, 0
	}
	var soonest time.Time
	for range c.endpoints {
		base := c.endpoints[c.next%len(c.endpoints)]
		c.next++
		nb := c.notBefore[base]
		if !now.Before(nb) {
			return base, 0
		}
		if soonest.IsZero() || nb.Before(soonest) {
			soonest = nb
		}
	}
	return c.endpoints[c.next%len(c.endpoints)], soonest.Sub(now)
}

// failed records that a node could not answer: it is no longer assumed to
// be the leader, and with a Retry-After it is not asked again before then.
// A leader address that cannot even be dialled is not taken from discovery
// for a while: it may be an address the nodes see but this client cannot
// reach, and every request would pay for the failed dial.
func (c *Client) failed(base string, after time.Duration, undialable bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.leader == base {
		c.leader = ""
		if undialable {
			c.distrust[base] = time.Now().Add(distrustFor)
		}
	}
	if after > 0 {
		c.notBefore[base] = time.Now().Add(after)
	} else {
		delete(c.notBefore, base)
	}
}

// discover asks a node for the leader's address, at most once a second while
// the leader is unknown. Any node would do (followers forward writes), so a
// failure here only costs the leader shortcut.
func (c *Client) discover(ctx context.Context) {
	c.mu.Lock()
	if c.leader != "" || time.Since(c.lastAsked) < discoverEvery {
		c.mu.Unlock()
		return
	}
	c.lastAsked = time.Now()
	base := c.endpoints[c.next%len(c.endpoints)]
	c.mu.Unlock()

	ctx, cancel := context.WithTimeout(ctx, min(time.Second, c.reqTimeout))
	defer cancel()
	status, _, data, err := c.attempt(ctx, base, call{method: http.MethodGet, path: "/cluster", timeout: time.Second}, nil)
	if err != nil || status != http.StatusOK {
		return
	}
	var ci ClusterInfo
	if json.Unmarshal(data, &ci) != nil {
		return
	}
	leader := leaderBase(base, ci.LeaderAPIAddr)
	if leader == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Now().Before(c.distrust[leader]) {
		return
	}
	delete(c.distrust, leader)
	c.leader = leader
}

// leaderBase turns the leader's advertised host:port into a base URL with
// the scheme of the node that named it. An address this client cannot mean
// is ignored: no host, 0.0.0.0, or loopback named by a node this client
// reaches over the network (it is the node's own loopback, not ours).
func leaderBase(from, addr string) string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return ""
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return ""
	}
	scheme, fromHost, _ := strings.Cut(from, "://")
	if isLoopback(host) && !isLoopback(hostOnly(fromHost)) {
		return ""
	}
	return scheme + "://" + addr
}

func hostOnly(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return hostport
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// track registers a lease or session so Close can stop it; it fails once
// the client is closed.
func (c *Client) track(k *keeper) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	c.live[k] = struct{}{}
	return nil
}

func (c *Client) untrack(k *keeper) {
	c.mu.Lock()
	delete(c.live, k)
	c.mu.Unlock()
}
