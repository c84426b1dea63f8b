package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// requestTimeout bounds every request that is not a blocking acquire.
const requestTimeout = 10 * time.Second

// httpClient talks to dlock as curl would: one connection per request (so a
// killed node leaves no pooled connection behind), no proxy.
var httpClient = &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}

// apiError is the error part of every dlock error answer.
type apiError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

type holder struct {
	ClientID     string    `json:"client_id"`
	FencingToken uint64    `json:"fencing_token"`
	GrantedAt    time.Time `json:"granted_at"`
	ExpiresAt    time.Time `json:"expires_at"`
}

type acquireAnswer struct {
	Acquired     bool      `json:"acquired"`
	FencingToken uint64    `json:"fencing_token"`
	ExpiresAt    time.Time `json:"expires_at"`
	LeaseID      string    `json:"lease_id"`
	Revision     uint64    `json:"revision"`
	Holder       *holder   `json:"holder"`
	Error        *apiError `json:"error"`
}

type lockView struct {
	Name     string  `json:"name"`
	Held     bool    `json:"held"`
	Holder   *holder `json:"holder"`
	Waiters  int     `json:"waiters"`
	Revision uint64  `json:"revision"`
}

type sessionAnswer struct {
	SessionID string    `json:"session_id"`
	TTLms     int64     `json:"ttl_ms"`
	ExpiresAt time.Time `json:"expires_at"`
	Error     *apiError `json:"error"`
}

type clusterInfo struct {
	NodeID   string `json:"node_id"`
	LeaderID string `json:"leader_id"`
	Term     uint64 `json:"term"`
	Members  []struct {
		ID       string `json:"id"`
		RaftAddr string `json:"raft_addr"`
		APIAddr  string `json:"api_addr"`
		Suffrage string `json:"suffrage"`
		State    string `json:"state"`
	} `json:"members"`
	CommitIndex  uint64 `json:"commit_index"`
	AppliedIndex uint64 `json:"applied_index"`
}

// response is a status and body, kept whole for failure messages.
type response struct {
	Status int
	Body   []byte
}

func (r *response) String() string {
	return fmt.Sprintf("%d %s", r.Status, strings.TrimSpace(string(r.Body)))
}

func (r *response) decode(v any) error {
	if err := json.Unmarshal(r.Body, v); err != nil {
		return fmt.Errorf("answer %s is not the JSON expected: %v", r, err)
	}
	return nil
}

// call sends one request with the default timeout. A non-nil body is sent as
// JSON with Content-Type application/json.
func call(method, url string, body any) (*response, error) {
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	return callCtx(ctx, method, url, body)
}

func callCtx(ctx context.Context, method, url string, body any) (*response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("%s %s: read answer: %w", method, url, err)
	}
	return &response{Status: resp.StatusCode, Body: b}, nil
}

// mustCall sends one request and fails the test unless it answers want; the
// answer is decoded into out when out is not nil. A 503 (no leader yet, or a
// leader still settling after an election) is retried for a few seconds with
// the same body — the same request_id, if it has one — as a client would.
func mustCall(t testing.TB, method, url string, body any, want int, out any) *response {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		r, err := call(method, url, body)
		if err != nil {
			t.Fatalf("%s %s: %v", method, url, err)
		}
		if r.Status == http.StatusServiceUnavailable && want != r.Status && time.Now().Before(deadline) {
			t.Logf("%s %s: %s; retrying", method, url, r)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if r.Status != want {
			t.Fatalf("%s %s with %v: got %s, want status %d", method, url, body, r, want)
		}
		if out != nil {
			if err := r.decode(out); err != nil {
				t.Fatalf("%s %s: %v", method, url, err)
			}
		}
		return r
	}
}

func getLock(t testing.TB, baseURL, name string) lockView {
	t.Helper()
	var v lockView
	mustCall(t, http.MethodGet, baseURL+"/api/v1/locks/"+name, nil, http.StatusOK, &v)
	return v
}

// pending is a request running in the background, e.g. a blocking acquire.
type pending struct {
	sent time.Time
	ch   chan pendingResult
}

type pendingResult struct {
	r    *response
	err  error
	took time.Duration // from sending to the answer
}

// startCall sends a request in the background, bounded by within.
func startCall(method, url string, body any, within time.Duration) *pending {
	p := &pending{sent: time.Now(), ch: make(chan pendingResult, 1)}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		r, err := callCtx(ctx, method, url, body)
		p.ch <- pendingResult{r: r, err: err, took: time.Since(p.sent)}
	}()
	return p
}

// notYet fails the test if the request has answered, after waiting d for it
// not to.
func (p *pending) notYet(t testing.TB, what string, d time.Duration) {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case res := <-p.ch:
		if res.err != nil {
			t.Fatalf("%s: returned early after %s: %v", what, res.took, res.err)
		}
		t.Fatalf("%s: returned early after %s: %s", what, res.took, res.r)
	case <-timer.C:
	}
}

// result waits up to d for the answer.
func (p *pending) result(t testing.TB, what string, d time.Duration) pendingResult {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case res := <-p.ch:
		if res.err != nil {
			t.Fatalf("%s: failed after %s: %v", what, res.took, res.err)
		}
		return res
	case <-timer.C:
		t.Fatalf("%s: no answer within %s", what, d)
	}
	return pendingResult{}
}

func itoa(i int) string { return strconv.Itoa(i) }
