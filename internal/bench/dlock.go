package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// apiError is a non-2xx dlock answer, or a failed gRPC call (grpcError).
type apiError struct {
	Status  int // the HTTP status (over gRPC: the HTTP status of Code)
	Code    string
	Message string
	GRPC    string // over gRPC: the status code's name, e.g. "Unavailable"
}

func (e *apiError) Error() string {
	if e.GRPC != "" {
		return fmt.Sprintf("gRPC %s %s: %s", e.GRPC, e.Code, e.Message)
	}
	return fmt.Sprintf("HTTP %d %s: %s", e.Status, e.Code, e.Message)
}

func asAPIError(err error, out **apiError) bool { return errors.As(err, out) }

// isCode reports whether err is a dlock API error with the given code.
func isCode(err error, code string) bool {
	var ae *apiError
	return errors.As(err, &ae) && ae.Code == code
}

// retryable reports whether an error means "try again shortly" (no leader,
// unavailable, transport trouble) rather than a refusal.
func retryable(err error) bool {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.Status == http.StatusServiceUnavailable || ae.Status == http.StatusTooManyRequests
	}
	return err != nil
}

// lockAPI is what the dlock workloads call on a client: *dlockClient speaks
// HTTP/JSON, *grpcClient gRPC (dlock.v1). Both send every call to the leader,
// turn refusals into *apiError (so retryable and the error counts work alike)
// and bound each call the same way (2 minutes, plus a contended acquire's wait
// on gRPC).
type lockAPI interface {
	acquire(ctx context.Context, name string, req acquireReq) (*acquireResp, error)
	release(ctx context.Context, name string, req holderReq) error
	renew(ctx context.Context, name string, req holderReq) error
	createSession(ctx context.Context, clientID string, ttl time.Duration) (string, error)
	keepAlive(ctx context.Context, id string) error
	deleteSession(ctx context.Context, id string) error
	// rediscover looks for the leader again after a failure, at most every
	// 200 ms.
	rediscover(ctx context.Context)
}

var (
	_ lockAPI = (*dlockClient)(nil)
	_ lockAPI = (*grpcClient)(nil)
)

// dlockClient talks to a dlock cluster over HTTP/JSON with keep-alive, sending
// every write to the leader's API address (found through GET /api/v1/cluster).
type dlockClient struct {
	// calls carries the API calls (httpconn.go); event streams and /metrics
	// scrapes, not on the measured path, use net/http clients of their own.
	calls     *httpCaller
	endpoints []string
	// viaFollower sends every call to a follower instead (Config.ViaFollower).
	viaFollower bool

	mu     sync.Mutex
	target string // base URL calls go to (the leader's, or a follower's), e.g. http://127.0.0.1:7070
	search leaderSearch
}

// leaderSearch is what both clients do around their discover: retry it
// until a leader is found, and rerun it after failures at most every 200 ms.
type leaderSearch struct {
	mu    sync.Mutex
	found time.Time // the last search
}

type discoverFunc func(ctx context.Context) (string, *clusterInfo, error)

func (s *leaderSearch) mark() {
	s.mu.Lock()
	s.found = time.Now()
	s.mu.Unlock()
}

// wait retries discover until it succeeds or within passes.
func (s *leaderSearch) wait(ctx context.Context, within time.Duration, discover discoverFunc) (string, *clusterInfo, error) {
	deadline := time.Now().Add(within)
	for {
		l, ci, err := discover(ctx)
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return l, ci, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// again reruns discover unless a search ran in the last 200 ms.
func (s *leaderSearch) again(ctx context.Context, discover discoverFunc) {
	s.mu.Lock()
	recent := time.Since(s.found) < 200*time.Millisecond
	if !recent {
		s.found = time.Now()
	}
	s.mu.Unlock()
	if !recent {
		_, _, _ = discover(ctx)
	}
}

// newHTTPClient returns a keep-alive client with enough idle connections per
// host for conns concurrent requests.
func newHTTPClient(conns int, timeout time.Duration) *http.Client {
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        conns * 4,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}
	return &http.Client{Transport: tr, Timeout: timeout}
}

func newDlockClient(endpoints []string, conns int) *dlockClient {
	eps := make([]string, 0, len(endpoints))
	for _, e := range endpoints {
		eps = append(eps, normalizeURL(e))
	}
	return &dlockClient{calls: newHTTPCaller(conns, 2*time.Minute), endpoints: eps}
}

func normalizeURL(s string) string {
	s = strings.TrimRight(strings.TrimSpace(s), "/")
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	return s
}

// clusterInfo is GET /api/v1/cluster (or gRPC GetCluster, clusterFromPB).
type clusterInfo struct {
	NodeID       string          `json:"node_id"`
	LeaderID     string          `json:"leader_id"`
	LeaderAPI    string          `json:"leader_api_addr"`
	Term         uint64          `json:"term"`
	Members      []clusterMember `json:"members"`
	CommitIndex  uint64          `json:"commit_index"`
	AppliedIndex uint64          `json:"applied_index"`
}

type clusterMember struct {
	ID      string `json:"id"`
	APIAddr string `json:"api_addr"`
}

// follower is the API address of the first member, by id, that is not the
// leader.
func (ci *clusterInfo) follower() (string, bool) {
	best := clusterMember{}
	for _, m := range ci.Members {
		if m.ID != ci.LeaderID && m.APIAddr != "" && (best.ID == "" || m.ID < best.ID) {
			best = m
		}
	}
	return best.APIAddr, best.ID != ""
}

func (c *dlockClient) cluster(ctx context.Context, base string) (*clusterInfo, error) {
	var ci clusterInfo
	if err := c.do(ctx, http.MethodGet, base+"/api/v1/cluster", nil, &ci); err != nil {
		return nil, err
	}
	return &ci, nil
}

// discover finds the leader through any endpoint and sets the URL calls go
// to: the leader's API address, or with viaFollower a follower's.
func (c *dlockClient) discover(ctx context.Context) (string, *clusterInfo, error) {
	var errs []error
	for _, ep := range c.endpoints {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		ci, err := c.cluster(cctx, ep)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", ep, err))
			continue
		}
		if ci.LeaderAPI == "" {
			errs = append(errs, fmt.Errorf("%s: no leader known yet", ep))
			continue
		}
		target := normalizeURL(ci.LeaderAPI)
		if c.viaFollower {
			f, ok := ci.follower()
			if !ok {
				errs = append(errs, fmt.Errorf("%s: no follower with an API address among %d members", ep, len(ci.Members)))
				continue
			}
			target = normalizeURL(f)
		}
		c.mu.Lock()
		c.target = target
		c.mu.Unlock()
		c.search.mark()
		return target, ci, nil
	}
	return "", nil, fmt.Errorf("find the dlock leader: %w", errors.Join(errs...))
}

// waitLeader retries discover until it succeeds or within passes.
func (c *dlockClient) waitLeader(ctx context.Context, within time.Duration) (string, *clusterInfo, error) {
	return c.search.wait(ctx, within, c.discover)
}

// base is the URL to send calls to: the leader's, or with viaFollower a
// follower's (the first endpoint until found).
func (c *dlockClient) base() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.target != "" {
		return c.target
	}
	return c.endpoints[0]
}

// rediscover looks for the leader again after a failure, at most every 200 ms.
func (c *dlockClient) rediscover(ctx context.Context) { c.search.again(ctx, c.discover) }

// do sends a JSON request and decodes a 2xx answer into out; any other answer
// is an *apiError.
func (c *dlockClient) do(ctx context.Context, method, u string, body, out any) error {
	var b []byte
	if body != nil {
		var err error
		if b, err = json.Marshal(body); err != nil {
			return err
		}
	}
	return c.calls.call(ctx, method, u, b, func(status int, data []byte) error {
		if status/100 != 2 {
			var e struct {
				Error struct {
					Code    string `json:"code"`
					Message string `json:"message"`
				} `json:"error"`
			}
			_ = json.Unmarshal(data, &e)
			if e.Error.Code == "" {
				e.Error.Code = "http_" + strconv.Itoa(status)
				e.Error.Message = strings.TrimSpace(string(data))
			}
			return &apiError{Status: status, Code: e.Error.Code, Message: e.Error.Message}
		}
		if out != nil {
			if err := json.Unmarshal(data, out); err != nil {
				return fmt.Errorf("decode %s %s answer %q: %w", method, u, data, err)
			}
		}
		return nil
	})
}

type acquireReq struct {
	ClientID      string `json:"client_id"`
	TTLms         int64  `json:"ttl_ms,omitempty"`
	SessionID     string `json:"session_id,omitempty"`
	WaitTimeoutMs int64  `json:"wait_timeout_ms,omitempty"`
	// Takeover is set by the workloads: each client id belongs to one
	// sequential worker, so a lock (or wait) it already has is a leftover of
	// its own attempt whose answer was lost (a failover, a timeout), which
	// it takes over at once instead of waiting out the TTL.
	Takeover bool `json:"takeover,omitempty"`
	// Limit and Mode: the semaphore and readers workloads.
	Limit int64  `json:"limit,omitempty"`
	Mode  string `json:"mode,omitempty"`
}

type acquireResp struct {
	Acquired     bool   `json:"acquired"`
	FencingToken uint64 `json:"fencing_token"`
	LeaseID      string `json:"lease_id"`
	Revision     uint64 `json:"revision"`
}

type holderReq struct {
	ClientID     string `json:"client_id"`
	FencingToken uint64 `json:"fencing_token"`
	LeaseID      string `json:"lease_id"`
}

func lockURL(base, name, action string) string {
	return base + "/api/v1/locks/" + name + "/" + action
}

func (c *dlockClient) acquire(ctx context.Context, name string, req acquireReq) (*acquireResp, error) {
	var out acquireResp
	if err := c.do(ctx, http.MethodPost, lockURL(c.base(), name, "acquire"), req, &out); err != nil {
		return nil, err
	}
	if !out.Acquired {
		return nil, fmt.Errorf("acquire %s: answer 2xx without acquired:true", name)
	}
	return &out, nil
}

func (c *dlockClient) release(ctx context.Context, name string, req holderReq) error {
	return c.do(ctx, http.MethodPost, lockURL(c.base(), name, "release"), req, nil)
}

func (c *dlockClient) renew(ctx context.Context, name string, req holderReq) error {
	return c.do(ctx, http.MethodPost, lockURL(c.base(), name, "renew"), req, nil)
}

func (c *dlockClient) createSession(ctx context.Context, clientID string, ttl time.Duration) (string, error) {
	var out struct {
		SessionID string `json:"session_id"`
	}
	body := map[string]any{"client_id": clientID, "ttl_ms": ttl.Milliseconds()}
	if err := c.do(ctx, http.MethodPost, c.base()+"/api/v1/sessions", body, &out); err != nil {
		return "", err
	}
	return out.SessionID, nil
}

func (c *dlockClient) keepAlive(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodPost, c.base()+"/api/v1/sessions/"+id+"/keepalive", nil, nil)
}

func (c *dlockClient) deleteSession(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, c.base()+"/api/v1/sessions/"+id, nil, nil)
}

// memberURLs lists every member's API URL.
func (ci *clusterInfo) memberURLs() map[string]string {
	out := map[string]string{}
	for _, m := range ci.Members {
		if m.APIAddr != "" {
			out[m.ID] = normalizeURL(m.APIAddr)
		}
	}
	return out
}

// scrapeMetrics reads those of the named unlabelled series that a Prometheus
// /metrics page has.
func scrapeMetrics(ctx context.Context, hc *http.Client, metricsURL string, names ...string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, metricsURL, nil)
	if err != nil {
		return nil, err
	}
	res, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: HTTP %d", metricsURL, res.StatusCode)
	}
	out := make(map[string]float64, len(names))
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || !slices.Contains(names, name) {
			continue
		}
		if v, perr := strconv.ParseFloat(strings.TrimSpace(value), 64); perr == nil {
			out[name] = v
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// requireSeries fails unless a scrape of metricsURL found every name.
func requireSeries(found map[string]float64, metricsURL string, names ...string) error {
	for _, n := range names {
		if _, ok := found[n]; !ok {
			return fmt.Errorf("%s lacks %s", metricsURL, n)
		}
	}
	return nil
}

// scrapeMemory reads process_resident_memory_bytes and
// go_memstats_heap_inuse_bytes from a Prometheus /metrics page.
func scrapeMemory(ctx context.Context, hc *http.Client, metricsURL string) (rss, heap float64, err error) {
	names := []string{"process_resident_memory_bytes", "go_memstats_heap_inuse_bytes"}
	v, err := scrapeMetrics(ctx, hc, metricsURL, names...)
	if err == nil {
		err = requireSeries(v, metricsURL, names...)
	}
	if err != nil {
		return 0, 0, err
	}
	return v["process_resident_memory_bytes"], v["go_memstats_heap_inuse_bytes"], nil
}

// memoryOf scrapes every node's memory, named by node id.
func memoryOf(ctx context.Context, hc *http.Client, phase string, metricsURLs map[string]string) []NodeMemory {
	var out []NodeMemory
	for _, id := range sortedKeys(metricsURLs) {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		rss, heap, err := scrapeMemory(cctx, hc, metricsURLs[id])
		cancel()
		m := NodeMemory{Node: id, Phase: phase, RSSMiB: round3(rss / (1 << 20)), HeapInUse: round3(heap / (1 << 20))}
		if err != nil {
			m = NodeMemory{Node: id, Phase: phase, Error: err.Error()}
		}
		out = append(out, m)
	}
	return out
}

// sseEvent is one watch event's data.
type sseEvent struct {
	Revision     uint64 `json:"revision"`
	Type         string `json:"type"`
	Kind         string `json:"kind"`
	Name         string `json:"name"`
	FencingToken uint64 `json:"fencing_token"`
}

// watchSSE streams GET /api/v1/watch?prefix=P from base, calling fn with each
// event and its arrival time, reconnecting from the last revision + 1 when the
// stream ends, until ctx ends. ready is called once the first stream is open.
// watchConnectTimeout bounds how long watchSSE tries to open its first
// stream.
const watchConnectTimeout = 5 * time.Second

func watchSSE(ctx context.Context, hc *http.Client, base, prefix string, ready func(), fn func(at time.Time, ev *sseEvent)) error {
	var from uint64
	first := true
	start := time.Now()
	for ctx.Err() == nil {
		u := base + "/api/v1/watch?prefix=" + url.QueryEscape(prefix)
		if from > 0 {
			u += "&from_revision=" + strconv.FormatUint(from, 10)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return err
		}
		res, err := hc.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				if first {
					return fmt.Errorf("watch %s: stopped before the stream opened: %w", base, ctx.Err())
				}
				return nil
			}
			if first && time.Since(start) > watchConnectTimeout {
				// A member that is down, or whose advertised API address
				// this host cannot reach: the run cannot measure it.
				return fmt.Errorf("watch %s: cannot open a stream for %v: %w (is the member up and its API address reachable from here?)", base, watchConnectTimeout, err)
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if res.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
			res.Body.Close()
			return fmt.Errorf("watch %s: HTTP %d %s", base, res.StatusCode, b)
		}
		if first {
			first = false
			ready()
		}
		br := bufio.NewReaderSize(res.Body, 64<<10)
		var event string
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				break
			}
			line = strings.TrimRight(line, "\r\n")
			switch {
			case strings.HasPrefix(line, "event: "):
				event = line[len("event: "):]
			case strings.HasPrefix(line, "data: "):
				at := time.Now()
				if event == "error" {
					continue
				}
				var ev sseEvent
				if json.Unmarshal([]byte(line[len("data: "):]), &ev) == nil {
					if ev.Revision >= from {
						from = ev.Revision + 1
					}
					fn(at, &ev)
				}
			case line == "":
				event = ""
			}
		}
		res.Body.Close()
	}
	if first {
		return fmt.Errorf("watch %s: stopped before the stream opened: %w", base, ctx.Err())
	}
	return nil
}
