package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"
)

// The HTTP client side: every operation is sent with a request_id (writes)
// and retried on 503, 5xx, connection errors and timeouts with the SAME body
// against another node, until a definitive answer or its deadline.

type apiError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

type holderJSON struct {
	ClientID     string `json:"client_id"`
	FencingToken uint64 `json:"fencing_token"`
	// Lock: a refusal by a grant on another lock (through a subtree).
	Lock string `json:"lock,omitempty"`
}

type leaderJSON struct {
	CandidateID  string `json:"candidate_id"`
	Value        string `json:"value"`
	FencingToken uint64 `json:"fencing_token"`
}

// answer is the union of the answers the suite reads.
type answer struct {
	// elections: a bool in campaign answers, an object (or null) in reads
	Leader     json.RawMessage `json:"leader"`
	Current    *leaderJSON     `json:"current"`
	Resigned   bool            `json:"resigned"`
	Proclaimed bool            `json:"proclaimed"`

	Acquired     bool        `json:"acquired"`
	FencingToken uint64      `json:"fencing_token"`
	TokenProof   string      `json:"token_proof"`
	LeaseRef     string      `json:"lease_ref"`
	LeaseID      string      `json:"lease_id"`
	Holder       *holderJSON `json:"holder"`
	Held         bool        `json:"held"`
	Name         string      `json:"name"`
	Waiters      int         `json:"waiters"`
	SessionID    string      `json:"session_id"`
	Released     bool        `json:"released"`
	Renewed      bool        `json:"renewed"`
	Deleted      bool        `json:"deleted"`
	Error        *apiError   `json:"error"`
}

type apiClient struct {
	c    *cluster
	h    *history
	http *http.Client
	grpc *grpcConns // lock calls of protocolOf "grpc" clients; nil: HTTP

	// counters of what the retries met
	retries5xx, retries503, retriesNet, internal500 atomic.Int64
	unexpected                                      atomic.Int64
}

func newAPIClient(c *cluster, h *history) *apiClient {
	tr := &http.Transport{
		Proxy:               nil,
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     5 * time.Second,
	}
	return &apiClient{c: c, h: h, http: &http.Client{Transport: tr}}
}

func lockPath(name, action string) string {
	p := "/api/v1/locks/" + name
	if isElection(name) {
		p = "/api/v1/elections/" + realName(name)
	}
	if action != "" {
		p += "/" + action
	}
	return p
}

// send makes one HTTP attempt.
func (a *apiClient) send(ctx context.Context, node int, method, path string, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.c.nodes[node].url()+path, rd)
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := a.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return 0, nil, fmt.Errorf("read answer: %w", err)
	}
	return resp.StatusCode, b, nil
}

// callOpts bound one operation.
type callOpts struct {
	attempt  time.Duration // per attempt
	overall  time.Duration // from the first send; then the op is unknown
	stop     <-chan struct{}
	definite func(status int) bool
}

// call runs op's HTTP request with retries and records it in the history.
// It returns the status and decoded answer of the definitive reply; ok is
// false when there was none (the op is then recorded as unknown).
func (a *apiClient) call(op *Op, rng *rand.Rand, method, path string, body any, o callOpts) (int, *answer, bool) {
	a.h.begin(op)
	deadline := time.Now().Add(o.overall)
	node := rng.IntN(len(a.c.nodes))
	backoff := 20 * time.Millisecond
	for {
		op.Attempts++
		op.Via = append(op.Via, a.c.nodes[node].id)
		ctx, cancel := context.WithTimeout(context.Background(), o.attempt)
		var status int
		var b []byte
		var err error
		handled := false
		switch proto := protocolOf(op.Client); {
		case proto == "grpc" && a.grpc != nil:
			status, b, handled, err = a.grpc.send(ctx, node, method, path, body)
		case proto == "ws":
			status, b, handled, err = wsSend(ctx, a.c.nodes[node].url(), method, path, body)
		}
		if handled {
			op.Via[len(op.Via)-1] += "/" + protocolOf(op.Client)
		}
		if !handled {
			status, b, err = a.send(ctx, node, method, path, body)
		}
		cancel()
		if err == nil {
			var ans answer
			_ = json.Unmarshal(b, &ans)
			switch {
			case o.definite(status):
				return status, &ans, true
			case status == http.StatusServiceUnavailable || status == http.StatusTooManyRequests:
				a.retries503.Add(1)
				op.Err = fmt.Sprintf("%d %s", status, strings.TrimSpace(string(b)))
			case status >= 500:
				a.retries5xx.Add(1)
				if status == http.StatusInternalServerError {
					a.internal500.Add(1)
				}
				op.Err = fmt.Sprintf("%d %s", status, strings.TrimSpace(string(b)))
			default:
				// A definitive answer the suite did not expect (400, 404 route…).
				a.unexpected.Add(1)
				op.Err = fmt.Sprintf("unexpected %d %s", status, strings.TrimSpace(string(b)))
				a.h.end(op, oError)
				return status, &ans, false
			}
		} else {
			a.retriesNet.Add(1)
			op.Err = err.Error()
			if errors.Is(err, context.DeadlineExceeded) {
				op.Err = "attempt timed out after " + o.attempt.String()
			}
		}
		if time.Now().After(deadline) {
			a.h.end(op, oUnknown)
			return 0, nil, false
		}
		select {
		case <-o.stop:
			a.h.end(op, oUnknown)
			return 0, nil, false
		case <-time.After(backoff/2 + time.Duration(rng.Int64N(int64(backoff)))):
		}
		backoff = min(backoff*2, 400*time.Millisecond)
		node = (node + 1 + rng.IntN(len(a.c.nodes)-1)) % len(a.c.nodes)
	}
}

// Request bodies.

type acquireBody struct {
	ClientID      string `json:"client_id"`
	TTLms         int64  `json:"ttl_ms,omitempty"`
	SessionID     string `json:"session_id,omitempty"`
	WaitTimeoutMs int64  `json:"wait_timeout_ms,omitempty"`
	RequestID     string `json:"request_id"`
	Takeover      bool   `json:"takeover,omitempty"`
	Limit         int    `json:"limit,omitempty"`
	Mode          string `json:"mode,omitempty"`
	Subtree       bool   `json:"subtree,omitempty"`
}

type tokenBody struct {
	ClientID     string `json:"client_id"`
	FencingToken uint64 `json:"fencing_token"`
	LeaseID      string `json:"lease_id"`
	RequestID    string `json:"request_id"`
}

type sessionBody struct {
	ClientID  string `json:"client_id"`
	TTLms     int64  `json:"ttl_ms,omitempty"`
	RequestID string `json:"request_id"`
}

func definiteLock(status int) bool {
	return status == http.StatusOK || status == http.StatusConflict || status == http.StatusNotFound
}

func definiteSession(status int) bool {
	return status == http.StatusOK || status == http.StatusCreated || status == http.StatusNotFound
}

type campaignBody struct {
	CandidateID   string `json:"candidate_id"`
	Value         string `json:"value"`
	TTLms         int64  `json:"ttl_ms,omitempty"`
	WaitTimeoutMs int64  `json:"wait_timeout_ms,omitempty"`
	RequestID     string `json:"request_id"`
	Takeover      bool   `json:"takeover,omitempty"`
}

type electionTokenBody struct {
	CandidateID  string `json:"candidate_id"`
	FencingToken uint64 `json:"fencing_token"`
	LeaseID      string `json:"lease_id"`
	Value        string `json:"value,omitempty"`
	RequestID    string `json:"request_id"`
}

// acquire sends an acquire (wait > 0: a blocking one) and fills op's outcome;
// for an election, a campaign.
func (a *apiClient) acquire(op *Op, rng *rand.Rand, o callOpts) {
	ab := acquireBody{ClientID: op.Client, RequestID: op.ReqID, WaitTimeoutMs: op.Wait / 1e6, Takeover: op.Takeover, Limit: op.Limit, Subtree: op.Subtree}
	if op.Shared {
		ab.Mode = "shared"
	}
	var body any = ab
	action := "acquire"
	if isElection(op.Lock) {
		body = campaignBody{CandidateID: op.Client, Value: op.Value, TTLms: op.TTL / 1e6, WaitTimeoutMs: op.Wait / 1e6, RequestID: op.ReqID, Takeover: op.Takeover}
		action = "campaign"
	} else if op.Session != "" {
		b := body.(acquireBody)
		b.SessionID = op.Session
		body = b
	} else {
		b := body.(acquireBody)
		b.TTLms = op.TTL / 1e6
		body = b
	}
	if op.Wait > 0 {
		// The request blocks up to the wait; the attempt gets the wait plus a margin.
		o.attempt += time.Duration(op.Wait)
	}
	o.definite = definiteLock
	status, ans, ok := a.call(op, rng, http.MethodPost, lockPath(op.Lock, action), body, o)
	if !ok {
		return
	}
	if isElection(op.Lock) {
		ans.Acquired = status == 200 && string(ans.Leader) == "true"
		if ans.Current != nil {
			ans.Holder = &holderJSON{ClientID: ans.Current.CandidateID, FencingToken: ans.Current.FencingToken}
		}
	}
	switch {
	case status == 200 && ans.Acquired && ans.FencingToken != 0:
		op.OutToken, op.OutLease = ans.FencingToken, ans.LeaseID
		op.OutProof, op.OutLeaseRef = ans.TokenProof, ans.LeaseRef
		a.h.end(op, oOK)
	case status == 409 && ans.Error != nil && (ans.Error.Code == "lock_held" || ans.Error.Code == "wait_timeout"):
		// A holder on another lock (through a subtree) is not this lock's.
		if ans.Holder != nil && ans.Holder.Lock == "" {
			op.HolderClient, op.HolderToken = ans.Holder.ClientID, ans.Holder.FencingToken
		}
		out := oHeld
		if ans.Error.Code == "wait_timeout" {
			out = oWaitTimeout
		}
		a.h.end(op, out)
	case status == 409 && ans.Error != nil && ans.Error.Code == "lock_lost" && ans.FencingToken != 0:
		op.OutToken = ans.FencingToken
		a.h.end(op, oLost)
	case status == 404 && ans.Error != nil && ans.Error.Code == "session_not_found":
		a.h.end(op, oNoSession)
	default:
		a.unexpected.Add(1)
		op.Err = fmt.Sprintf("unexpected answer %d %+v", status, ans)
		if ans.Error != nil {
			op.Err += fmt.Sprintf(" error %+v", *ans.Error)
		}
		a.h.end(op, oError)
	}
}

// releaseOrRenew sends a release or renew with op.Token and op.Lease; for an
// election a resign, renew or proclaim (op.Value).
func (a *apiClient) releaseOrRenew(op *Op, rng *rand.Rand, o callOpts) {
	var body any = tokenBody{ClientID: op.Client, FencingToken: op.Token, LeaseID: op.Lease, RequestID: op.ReqID}
	action := op.Kind
	if isElection(op.Lock) {
		body = electionTokenBody{CandidateID: op.Client, FencingToken: op.Token, LeaseID: op.Lease, Value: op.Value, RequestID: op.ReqID}
		if op.Kind == kRelease {
			action = "resign"
		}
	}
	o.definite = definiteLock
	status, ans, ok := a.call(op, rng, http.MethodPost, lockPath(op.Lock, action), body, o)
	if !ok {
		return
	}
	switch {
	case status == 200 && (ans.Released || ans.Renewed || ans.Resigned || ans.Proclaimed):
		a.h.end(op, oOK)
	case status == 409 && ans.Error != nil && ans.Error.Code == "not_holder":
		a.h.end(op, oNotHolder)
	default:
		a.unexpected.Add(1)
		op.Err = fmt.Sprintf("unexpected answer %d %+v", status, ans)
		a.h.end(op, oError)
	}
}

// get reads a lock (linearizable).
func (a *apiClient) get(op *Op, rng *rand.Rand, o callOpts) {
	o.definite = func(s int) bool { return s == http.StatusOK }
	_, ans, ok := a.call(op, rng, http.MethodGet, lockPath(op.Lock, ""), nil, o)
	if !ok {
		return
	}
	if isElection(op.Lock) {
		var l *leaderJSON
		if err := json.Unmarshal(ans.Leader, &l); err != nil {
			a.unexpected.Add(1)
			op.Err = fmt.Sprintf("election view: %v", err)
			a.h.end(op, oError)
			return
		}
		if l != nil {
			op.Held, op.HolderClient, op.HolderToken, op.OutValue = true, l.CandidateID, l.FencingToken, l.Value
		}
		a.h.end(op, oOK)
		return
	}
	op.Held = ans.Held
	if ans.Held && ans.Holder != nil {
		op.HolderClient, op.HolderToken = ans.Holder.ClientID, ans.Holder.FencingToken
	}
	a.h.end(op, oOK)
}

// createSession creates a session; op.Session is filled on success.
func (a *apiClient) createSession(op *Op, rng *rand.Rand, o callOpts) {
	o.definite = definiteSession
	status, ans, ok := a.call(op, rng, http.MethodPost, "/api/v1/sessions",
		sessionBody{ClientID: op.Client, TTLms: op.TTL / 1e6, RequestID: op.ReqID}, o)
	if !ok {
		return
	}
	if status == 201 && ans.SessionID != "" {
		op.Session, op.OutLease = ans.SessionID, ans.SessionID
		a.h.end(op, oOK)
		return
	}
	a.unexpected.Add(1)
	op.Err = fmt.Sprintf("unexpected answer %d %+v", status, ans)
	a.h.end(op, oError)
}

// keepAliveOrDelete sends a keepalive or a session delete for op.Session.
func (a *apiClient) keepAliveOrDelete(op *Op, rng *rand.Rand, o callOpts) {
	o.definite = definiteSession
	method, path := http.MethodPost, "/api/v1/sessions/"+url.PathEscape(op.Session)+"/keepalive"
	if op.Kind == kSessDelete {
		method, path = http.MethodDelete, "/api/v1/sessions/"+url.PathEscape(op.Session)
	}
	status, ans, ok := a.call(op, rng, method, path, sessionBody{ClientID: op.Client, RequestID: op.ReqID}, o)
	if !ok {
		return
	}
	switch {
	case status == 200:
		a.h.end(op, oOK)
	case status == 404 && ans.Error != nil && ans.Error.Code == "session_not_found":
		a.h.end(op, oNoSession)
	default:
		a.unexpected.Add(1)
		op.Err = fmt.Sprintf("unexpected answer %d %+v", status, ans)
		a.h.end(op, oError)
	}
}
