package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock/fence"
	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/service"
)

// ---- fake service ----------------------------------------------------------

type fakeCall struct {
	method    string
	req       any
	requestID string // RequestID(ctx) as the service saw it
}

// getLockCall records GetLock's two arguments as one comparable value.
type getLockCall struct {
	Name  string
	Stale bool
}

// fakeService records every call and answers from canned values: resp (if
// its type fits the method) and err; with neither, a default success.
type fakeService struct {
	mu        sync.Mutex
	calls     []fakeCall
	resp      any
	err       error
	nilAnswer bool // answer (nil, nil), a service bug
	panicMsg  string
	healthErr error
	readyErr  error
	// block makes Acquire wait for its context to end; started is closed
	// when it begins waiting.
	block   bool
	started chan struct{}
	ended   chan error
}

var (
	t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	t1 = t0.Add(30 * time.Second)
)

func answer[T any](ctx context.Context, f *fakeService, method string, req any, def *T) (*T, error) {
	f.mu.Lock()
	f.calls = append(f.calls, fakeCall{method: method, req: req, requestID: RequestID(ctx)})
	resp, err, nilAnswer, panicMsg := f.resp, f.err, f.nilAnswer, f.panicMsg
	f.mu.Unlock()
	if panicMsg != "" {
		panic(panicMsg)
	}
	if nilAnswer {
		return nil, nil
	}
	if r, ok := resp.(*T); ok {
		return r, err
	}
	if err != nil {
		return nil, err
	}
	return def, nil
}

func (f *fakeService) Acquire(ctx context.Context, req service.AcquireRequest) (*service.AcquireResponse, error) {
	if f.block {
		f.mu.Lock()
		f.calls = append(f.calls, fakeCall{method: "Acquire", req: req})
		f.mu.Unlock()
		close(f.started)
		<-ctx.Done()
		f.ended <- ctx.Err()
		return nil, ctx.Err()
	}
	return answer(ctx, f, "Acquire", req, &service.AcquireResponse{
		Acquired: true, FencingToken: 7, ExpiresAt: t1, LeaseID: "L-secret", Revision: 9,
	})
}

func (f *fakeService) Release(ctx context.Context, req service.ReleaseRequest) (*service.ReleaseResponse, error) {
	return answer(ctx, f, "Release", req, &service.ReleaseResponse{Released: true, Revision: 10})
}

func (f *fakeService) Renew(ctx context.Context, req service.RenewRequest) (*service.RenewResponse, error) {
	return answer(ctx, f, "Renew", req, &service.RenewResponse{Renewed: true, ExpiresAt: t1, TTLms: 30000, Revision: 11})
}

func (f *fakeService) GetLock(ctx context.Context, name string, stale bool) (*service.LockView, error) {
	h := service.Holder{ClientID: "c1", FencingToken: 7, GrantedAt: t0, ExpiresAt: t1, Mode: service.ModeExclusive}
	return answer(ctx, f, "GetLock", getLockCall{name, stale}, &service.LockView{
		Name: name, Held: true, Waiters: 2, Revision: 12, Holder: &h, Limit: 1, Mode: service.ModeExclusive, Holders: []service.Holder{h},
	})
}

func (f *fakeService) History(ctx context.Context, req service.HistoryRequest) (*service.HistoryResponse, error) {
	return answer(ctx, f, "History", req, &service.HistoryResponse{Name: req.Name, Grants: []service.GrantView{
		{FencingToken: 9, ClientID: "worker-1", EndCause: "revoked", Reason: "stuck", TTLms: 30_000}}, Revision: 20})
}

func (f *fakeService) Revoke(ctx context.Context, req service.RevokeRequest) (*service.RevokeResponse, error) {
	return answer(ctx, f, "Revoke", req, &service.RevokeResponse{Revoked: true, FencingToken: req.FencingToken, Revision: 21})
}

func (f *fakeService) ListLocks(ctx context.Context, req service.ListRequest) (*service.ListResponse, error) {
	return answer(ctx, f, "ListLocks", req, &service.ListResponse{
		Locks:    []service.LockView{{Name: "billing/job", Held: false, Revision: 13, Limit: 1, Holders: []service.Holder{}}},
		More:     true,
		Revision: 13,
	})
}

func (f *fakeService) ListElections(ctx context.Context, req service.ListRequest) (*service.ElectionListResponse, error) {
	return answer(ctx, f, "ListElections", req, &service.ElectionListResponse{
		Elections: []service.ElectionView{{Name: "db/primary", Campaigners: 1, Revision: 13}},
		Revision:  13,
	})
}

func (f *fakeService) CreateSession(ctx context.Context, req service.CreateSessionRequest) (*service.SessionResponse, error) {
	return answer(ctx, f, "CreateSession", req, &service.SessionResponse{SessionID: "S-secret", TTLms: 10000, ExpiresAt: t1, Revision: 14})
}

func (f *fakeService) KeepAlive(ctx context.Context, req service.KeepAliveRequest) (*service.KeepAliveResponse, error) {
	return answer(ctx, f, "KeepAlive", req, &service.KeepAliveResponse{TTLms: 10000, ExpiresAt: t1, Revision: 15,
		Lost: []service.LostGrant{{Kind: "lock", Name: "jobs/a", FencingToken: 7, Cause: "revoked", Reason: "stuck", Revision: 12}}})
}

func (f *fakeService) DeleteSession(ctx context.Context, req service.DeleteSessionRequest) (*service.DeleteSessionResponse, error) {
	return answer(ctx, f, "DeleteSession", req, &service.DeleteSessionResponse{Deleted: true, Revision: 16})
}

func (f *fakeService) Cluster(ctx context.Context) (*service.ClusterInfo, error) {
	return answer[service.ClusterInfo](ctx, f, "Cluster", nil, &service.ClusterInfo{
		NodeID: "n1", LeaderID: "n1", Term: 3, CommitIndex: 40, AppliedIndex: 40, Revision: 17, LastToken: 7,
		Members: []service.Member{{ID: "n1", RaftAddr: "127.0.0.1:7071", APIAddr: "127.0.0.1:7070", Suffrage: "voter", State: "leader"}},
	})
}

func (f *fakeService) Campaign(ctx context.Context, req service.CampaignRequest) (*service.CampaignResponse, error) {
	return answer(ctx, f, "Campaign", req, &service.CampaignResponse{Leader: true, FencingToken: 8, ExpiresAt: t1, LeaseID: "L-secret", Revision: 18})
}

func (f *fakeService) GetElection(ctx context.Context, name string, stale bool) (*service.ElectionView, error) {
	return answer(ctx, f, "GetElection", getLockCall{name, stale}, &service.ElectionView{Name: name, Revision: 19})
}

func (f *fakeService) Proclaim(ctx context.Context, req service.ProclaimRequest) (*service.ProclaimResponse, error) {
	return answer(ctx, f, "Proclaim", req, &service.ProclaimResponse{Proclaimed: true, Revision: 20})
}

func (f *fakeService) Resign(ctx context.Context, req service.ResignRequest) (*service.ResignResponse, error) {
	return answer(ctx, f, "Resign", req, &service.ResignResponse{Resigned: true, Revision: 21})
}

func (f *fakeService) RenewElection(ctx context.Context, req service.RenewRequest) (*service.RenewResponse, error) {
	return answer(ctx, f, "RenewElection", req, &service.RenewResponse{Renewed: true, ExpiresAt: t1, TTLms: 30000, Revision: 22})
}

func (f *fakeService) AddMember(ctx context.Context, req service.MemberRequest) (*service.ClusterInfo, error) {
	return answer(ctx, f, "AddMember", req, &service.ClusterInfo{NodeID: "n1"})
}

func (f *fakeService) RemoveMember(ctx context.Context, id string) (*service.ClusterInfo, error) {
	return answer(ctx, f, "RemoveMember", id, &service.ClusterInfo{NodeID: "n1"})
}

func (f *fakeService) SplitShard(ctx context.Context, req service.SplitRequest) (*service.ClusterInfo, error) {
	return answer(ctx, f, "SplitShard", req, &service.ClusterInfo{NodeID: "n1"})
}
func (f *fakeService) MoveShard(ctx context.Context, req service.MoveRequest) (*service.ClusterInfo, error) {
	return answer(ctx, f, "MoveShard", req, &service.ClusterInfo{NodeID: "n1"})
}
func (f *fakeService) TransferLeadership(ctx context.Context, req service.TransferRequest) (*service.ClusterInfo, error) {
	return answer(ctx, f, "TransferLeadership", req, &service.ClusterInfo{NodeID: "n1"})
}

func (f *fakeService) TokenKeys(ctx context.Context) (*fence.KeySetDocument, error) {
	return answer(ctx, f, "TokenKeys", nil, &fence.KeySetDocument{Keys: []fence.KeyInfo{}})
}

func (f *fakeService) RotateTokenKey(ctx context.Context, req service.RotateTokenKeyRequest) (*fence.KeySetDocument, error) {
	return answer(ctx, f, "RotateTokenKey", req, &fence.KeySetDocument{Keys: []fence.KeyInfo{}})
}

func (f *fakeService) ACLBootstrap(ctx context.Context) (*service.ACLTokenView, error) {
	return answer(ctx, f, "ACLBootstrap", nil, &service.ACLTokenView{})
}

func (f *fakeService) CreateACLToken(ctx context.Context, req service.ACLTokenRequest) (*service.ACLTokenView, error) {
	return answer(ctx, f, "CreateACLToken", req, &service.ACLTokenView{})
}

func (f *fakeService) ListACLTokens(ctx context.Context) (*service.ACLTokenList, error) {
	return answer(ctx, f, "ListACLTokens", nil, &service.ACLTokenList{})
}

func (f *fakeService) DeleteACLToken(ctx context.Context, id string) error {
	_, err := answer(ctx, f, "DeleteACLToken", id, &service.ACLTokenList{})
	return err
}

func (f *fakeService) Snapshot(ctx context.Context) ([]byte, uint64, error) {
	_, err := answer[service.ClusterInfo](ctx, f, "Snapshot", nil, nil)
	return []byte("DLSNAP"), 23, err
}

// Streams need a real hub; the fake refuses them (the cluster tests cover them).
func (f *fakeService) Watch(ctx context.Context, req service.WatchRequest) (*service.Watcher, error) {
	_, err := answer[service.Watcher](ctx, f, "Watch", req, nil)
	if err == nil {
		err = apierror.New(apierror.Unavailable, "fake service has no watch hub")
	}
	return nil, err
}

func (f *fakeService) Observe(ctx context.Context, name string, stale bool) (*service.ElectionView, *service.Watcher, error) {
	_, err := answer[service.Watcher](ctx, f, "Observe", getLockCall{name, stale}, nil)
	if err == nil {
		err = apierror.New(apierror.Unavailable, "fake service has no watch hub")
	}
	return nil, nil, err
}

func (f *fakeService) ClusterHealth(ctx context.Context) (*service.ClusterInfo, error) {
	return f.Cluster(ctx)
}

func (f *fakeService) Healthy() error { return f.healthErr }
func (f *fakeService) Ready() error   { return f.readyErr }

func (f *fakeService) recorded() []fakeCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]fakeCall(nil), f.calls...)
}

var _ Service = (*fakeService)(nil)

// ---- helpers ---------------------------------------------------------------

// syncBuffer lets a test read log output written by handler goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newHandler(f *fakeService, opts Options) (http.Handler, *syncBuffer) {
	logs := &syncBuffer{}
	logger := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	return New(f, logger, opts), logs
}

type request struct {
	method, target, body string
	header               map[string]string
	chunked              bool // no Content-Length, so only the read limit can catch size
}

func do(h http.Handler, q request) *httptest.ResponseRecorder {
	var body io.Reader
	if q.body != "" {
		body = strings.NewReader(q.body)
	}
	r := httptest.NewRequest(q.method, q.target, body)
	if q.body != "" {
		// Every body is JSON unless the test says otherwise: a
		// "Content-Type" of "" in header sends none.
		r.Header.Set("Content-Type", "application/json")
	}
	for k, v := range q.header {
		if v == "" {
			r.Header.Del(k)
			continue
		}
		r.Header.Set(k, v)
	}
	if q.chunked {
		r.ContentLength = -1
		r.Body = io.NopCloser(strings.NewReader(q.body))
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec
}

// jsonEqual compares two JSON texts as values.
func jsonEqual(t *testing.T, got, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal([]byte(got), &g); err != nil {
		t.Fatalf("answer is not JSON: %v: %q", err, got)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("bad want JSON: %v: %q", err, want)
	}
	if !reflect.DeepEqual(g, w) {
		t.Errorf("body\n got %s\nwant %s", strings.TrimSpace(got), want)
	}
}

// checkError asserts the design.md §5 error shape and that status and code agree
// through the one apierror table. It returns the message.
func checkError(t *testing.T, rec *httptest.ResponseRecorder, wantStatus int, wantCode apierror.Code) string {
	t.Helper()
	if rec.Code != wantStatus {
		t.Errorf("status %d, want %d; body %s", rec.Code, wantStatus, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	if rec.Header().Get(RequestIDHeader) == "" {
		t.Error("no X-Request-Id on the answer")
	}
	// The one error shape; lock_delayed adds its wait, lock_lost the token.
	var env struct {
		Error struct {
			Code         apierror.Code `json:"code"`
			Message      string        `json:"message"`
			RetryAfterMs int64         `json:"retry_after_ms"`
		} `json:"error"`
		FencingToken uint64 `json:"fencing_token"`
	}
	dec := json.NewDecoder(bytes.NewReader(rec.Body.Bytes()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&env); err != nil {
		t.Fatalf("error body %q is not {\"error\":{code,message}}: %v", rec.Body, err)
	}
	if env.Error.Code != wantCode {
		t.Errorf("code %q, want %q (message %q)", env.Error.Code, wantCode, env.Error.Message)
	}
	if env.Error.Message == "" {
		t.Error("empty error message")
	}
	if s := apierror.HTTPStatus(env.Error.Code); s != rec.Code {
		t.Errorf("code %q maps to %d but status is %d", env.Error.Code, s, rec.Code)
	}
	return env.Error.Message
}

// ---- happy paths -----------------------------------------------------------

func TestRoutes(t *testing.T) {
	const acquireOK = `{"acquired":true,"fencing_token":7,"expires_at":"2030-01-02T03:04:35Z","lease_id":"L-secret","revision":9}`
	const lockView = `{"name":%q,"held":true,"holder":{"client_id":"c1","fencing_token":7,"granted_at":"2030-01-02T03:04:05Z","expires_at":"2030-01-02T03:04:35Z","mode":"exclusive"},"waiters":2,"limit":1,"mode":"exclusive","holders":[{"client_id":"c1","fencing_token":7,"granted_at":"2030-01-02T03:04:05Z","expires_at":"2030-01-02T03:04:35Z","mode":"exclusive"}],"revision":12}`
	const listOK = `{"locks":[{"name":"billing/job","held":false,"waiters":0,"limit":1,"holders":[],"revision":13}],"more":true,"revision":13}`
	const keepAliveOK = `{"ttl_ms":10000,"expires_at":"2030-01-02T03:04:35Z","revision":15,"lost":[{"kind":"lock","name":"jobs/a","fencing_token":7,"cause":"revoked","reason":"stuck","revision":12}]}`
	const deleteOK = `{"deleted":true,"revision":16}`
	jsonCT := map[string]string{"Content-Type": "application/json"}

	tests := []struct {
		name       string
		req        request
		wantStatus int
		wantMethod string
		wantReq    any
		wantBody   string
	}{
		{
			name:       "acquire with ttl and wait",
			req:        request{method: "POST", target: "/api/v1/locks/billing/job/acquire", header: jsonCT, body: `{"client_id":"c1","ttl_ms":30000,"wait_timeout_ms":5000,"request_id":"r1"}`},
			wantStatus: 200, wantMethod: "Acquire",
			wantReq:  service.AcquireRequest{Name: "billing/job", ClientID: "c1", TTLms: 30000, WaitTimeoutMs: 5000, RequestID: "r1"},
			wantBody: acquireOK,
		},
		{
			name:       "acquire with limit, mode and subtree",
			req:        request{method: "POST", target: "/api/v1/locks/billing/acquire", header: jsonCT, body: `{"client_id":"c1","ttl_ms":30000,"limit":3,"mode":"exclusive","subtree":true}`},
			wantStatus: 200, wantMethod: "Acquire",
			wantReq:  service.AcquireRequest{Name: "billing", ClientID: "c1", TTLms: 30000, Limit: 3, Mode: "exclusive", Subtree: true},
			wantBody: acquireOK,
		},
		{
			name:       "acquire with %2F-escaped name and session",
			req:        request{method: "POST", target: "/api/v1/locks/billing%2Fjob/acquire", body: `{"client_id":"c1","session_id":"S1"}`},
			wantStatus: 200, wantMethod: "Acquire",
			wantReq:  service.AcquireRequest{Name: "billing/job", ClientID: "c1", SessionID: "S1"},
			wantBody: acquireOK,
		},
		{
			name:       "acquire with mixed raw and escaped slashes",
			req:        request{method: "POST", target: "/api/v1/locks/a%2Fb/c:d_e-f.g/acquire", body: `{"client_id":"c1","ttl_ms":1000}`},
			wantStatus: 200, wantMethod: "Acquire",
			wantReq:  service.AcquireRequest{Name: "a/b/c:d_e-f.g", ClientID: "c1", TTLms: 1000},
			wantBody: acquireOK,
		},
		{
			name:       "acquire with a leading slash in the name",
			req:        request{method: "POST", target: "/api/v1/locks/%2Fjobs/acquire", body: `{"client_id":"c1","ttl_ms":1000}`},
			wantStatus: 200, wantMethod: "Acquire",
			wantReq:  service.AcquireRequest{Name: "jobs", ClientID: "c1", TTLms: 1000},
			wantBody: acquireOK,
		},
		{
			name:       "acquire with JSON charset and whitespace around the body",
			req:        request{method: "POST", target: "/api/v1/locks/j/acquire", header: map[string]string{"Content-Type": "application/json; charset=UTF-8"}, body: " \n{\"client_id\":\"c1\",\"ttl_ms\":1000}\r\n "},
			wantStatus: 200, wantMethod: "Acquire",
			wantReq:  service.AcquireRequest{Name: "j", ClientID: "c1", TTLms: 1000},
			wantBody: acquireOK,
		},
		{
			name:       "acquire with a +json media type and null field",
			req:        request{method: "POST", target: "/api/v1/locks/j/acquire", header: map[string]string{"Content-Type": "application/vnd.dlock+json"}, body: `{"client_id":"c1","ttl_ms":1000,"request_id":null}`},
			wantStatus: 200, wantMethod: "Acquire",
			wantReq:  service.AcquireRequest{Name: "j", ClientID: "c1", TTLms: 1000},
			wantBody: acquireOK,
		},
		{
			name:       "acquire with a value and a lock-delay",
			req:        request{method: "POST", target: "/api/v1/locks/j/acquire", body: `{"client_id":"c1","ttl_ms":1000,"value":"pid 42","lock_delay_ms":5000}`},
			wantStatus: 200, wantMethod: "Acquire",
			wantReq:  service.AcquireRequest{Name: "j", ClientID: "c1", TTLms: 1000, Value: "pid 42", LockDelayMs: 5000},
			wantBody: acquireOK,
		},
		{
			name:       "history of a lock named like an action",
			req:        request{method: "GET", target: "/api/v1/history/billing/batch-job/revoke?limit=5"},
			wantStatus: 200, wantMethod: "History",
			wantReq:  service.HistoryRequest{Name: "billing/batch-job/revoke", Limit: 5},
			wantBody: `{"name":"billing/batch-job/revoke","grants":[{"fencing_token":9,"client_id":"worker-1","granted_at":"0001-01-01T00:00:00Z","end_cause":"revoked","reason":"stuck","ttl_ms":30000}],"revision":20}`,
		},
		{
			name:       "history of an election, stale",
			req:        request{method: "GET", target: "/api/v1/history/db%2Fprimary?kind=election&stale=true"},
			wantStatus: 200, wantMethod: "History",
			wantReq:  service.HistoryRequest{Name: "db/primary", Election: true, Stale: true},
			wantBody: `{"name":"db/primary","grants":[{"fencing_token":9,"client_id":"worker-1","granted_at":"0001-01-01T00:00:00Z","end_cause":"revoked","reason":"stuck","ttl_ms":30000}],"revision":20}`,
		},
		{
			name:       "revoke one grant",
			req:        request{method: "POST", target: "/api/v1/locks/billing/batch-job/revoke", body: `{"fencing_token":9,"reason":"stuck"}`},
			wantStatus: 200, wantMethod: "Revoke",
			wantReq:  service.RevokeRequest{Name: "billing/batch-job", FencingToken: 9, Reason: "stuck"},
			wantBody: `{"revoked":true,"fencing_token":9,"revision":21}`,
		},
		{
			name:       "revoke an election's leader",
			req:        request{method: "POST", target: "/api/v1/elections/db/revoke", body: `{"reason":"stuck","client_id":"ops","request_id":"r9"}`},
			wantStatus: 200, wantMethod: "Revoke",
			wantReq:  service.RevokeRequest{Name: "db", Election: true, Reason: "stuck", ClientID: "ops", RequestID: "r9"},
			wantBody: `{"revoked":true,"revision":21}`,
		},
		{
			name:       "release",
			req:        request{method: "POST", target: "/api/v1/locks/billing/job/release", header: jsonCT, body: `{"client_id":"c1","fencing_token":7,"lease_id":"L1","request_id":"r2"}`},
			wantStatus: 200, wantMethod: "Release",
			wantReq:  service.ReleaseRequest{Name: "billing/job", ClientID: "c1", FencingToken: 7, LeaseID: "L1", RequestID: "r2"},
			wantBody: `{"released":true,"revision":10}`,
		},
		{
			name:       "renew with escaped name",
			req:        request{method: "POST", target: "/api/v1/locks/billing%2fjob/renew", body: `{"client_id":"c1","fencing_token":18446744073709551615,"lease_id":"L1","ttl_ms":60000}`},
			wantStatus: 200, wantMethod: "Renew",
			wantReq:  service.RenewRequest{Name: "billing/job", ClientID: "c1", FencingToken: 18446744073709551615, LeaseID: "L1", TTLms: 60000},
			wantBody: `{"renewed":true,"expires_at":"2030-01-02T03:04:35Z","ttl_ms":30000,"revision":11}`,
		},
		{
			name:       "get lock",
			req:        request{method: "GET", target: "/api/v1/locks/billing/job"},
			wantStatus: 200, wantMethod: "GetLock",
			wantReq:  getLockCall{Name: "billing/job"},
			wantBody: strings.Replace(lockView, "%q", `"billing/job"`, 1),
		},
		{
			name:       "get lock whose last segment looks like an action",
			req:        request{method: "GET", target: "/api/v1/locks/jobs/acquire"},
			wantStatus: 200, wantMethod: "GetLock",
			wantReq:  getLockCall{Name: "jobs/acquire"},
			wantBody: strings.Replace(lockView, "%q", `"jobs/acquire"`, 1),
		},
		{
			name:       "get lock escaped, stale=true",
			req:        request{method: "GET", target: "/api/v1/locks/billing%2Fjob?stale=true"},
			wantStatus: 200, wantMethod: "GetLock",
			wantReq:  getLockCall{Name: "billing/job", Stale: true},
			wantBody: strings.Replace(lockView, "%q", `"billing/job"`, 1),
		},
		{
			name:       "get lock bare ?stale",
			req:        request{method: "GET", target: "/api/v1/locks/x?stale"},
			wantStatus: 200, wantMethod: "GetLock",
			wantReq:  getLockCall{Name: "x", Stale: true},
			wantBody: strings.Replace(lockView, "%q", `"x"`, 1),
		},
		{
			name:       "get lock stale=false",
			req:        request{method: "GET", target: "/api/v1/locks/x?stale=false"},
			wantStatus: 200, wantMethod: "GetLock",
			wantReq:  getLockCall{Name: "x"},
			wantBody: strings.Replace(lockView, "%q", `"x"`, 1),
		},
		{
			name:       "list with every parameter",
			req:        request{method: "GET", target: "/api/v1/locks?prefix=billing/&after=billing%2Fa&limit=50&stale=true"},
			wantStatus: 200, wantMethod: "ListLocks",
			wantReq:  service.ListRequest{Prefix: "billing/", After: "billing/a", Limit: 50, Stale: true},
			wantBody: listOK,
		},
		{
			name:       "list without parameters",
			req:        request{method: "GET", target: "/api/v1/locks"},
			wantStatus: 200, wantMethod: "ListLocks",
			wantReq:  service.ListRequest{},
			wantBody: listOK,
		},
		{
			name:       "list with trailing slash and limit 0",
			req:        request{method: "GET", target: "/api/v1/locks/?limit=0"},
			wantStatus: 200, wantMethod: "ListLocks",
			wantReq:  service.ListRequest{},
			wantBody: listOK,
		},
		{
			name:       "list elections with every parameter",
			req:        request{method: "GET", target: "/api/v1/elections?prefix=db/&after=db%2Fa&limit=5&stale=true"},
			wantStatus: 200, wantMethod: "ListElections",
			wantReq:  service.ListRequest{Prefix: "db/", After: "db/a", Limit: 5, Stale: true},
			wantBody: `{"elections":[{"name":"db/primary","leader":null,"campaigners":1,"revision":13}],"more":false,"revision":13}`,
		},
		{
			name:       "list elections with trailing slash",
			req:        request{method: "GET", target: "/api/v1/elections/"},
			wantStatus: 200, wantMethod: "ListElections",
			wantReq:  service.ListRequest{},
			wantBody: `{"elections":[{"name":"db/primary","leader":null,"campaigners":1,"revision":13}],"more":false,"revision":13}`,
		},
		{
			name:       "create session",
			req:        request{method: "POST", target: "/api/v1/sessions", header: jsonCT, body: `{"client_id":"c1","ttl_ms":10000,"request_id":"r3"}`},
			wantStatus: 201, wantMethod: "CreateSession",
			wantReq:  service.CreateSessionRequest{ClientID: "c1", TTLms: 10000, RequestID: "r3"},
			wantBody: `{"session_id":"S-secret","ttl_ms":10000,"expires_at":"2030-01-02T03:04:35Z","revision":14}`,
		},
		{
			name:       "keepalive without body",
			req:        request{method: "POST", target: "/api/v1/sessions/S1/keepalive"},
			wantStatus: 200, wantMethod: "KeepAlive",
			wantReq:  service.KeepAliveRequest{SessionID: "S1"},
			wantBody: keepAliveOK,
		},
		{
			name:       "keepalive with an empty body and a form Content-Type (curl -X POST -d '')",
			req:        request{method: "POST", target: "/api/v1/sessions/S1/keepalive", header: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}},
			wantStatus: 200, wantMethod: "KeepAlive",
			wantReq:  service.KeepAliveRequest{SessionID: "S1"},
			wantBody: keepAliveOK,
		},
		{
			name:       "keepalive with body",
			req:        request{method: "POST", target: "/api/v1/sessions/S%2B1/keepalive", header: jsonCT, body: `{"client_id":"c1","request_id":"r4","lost_after":11}`},
			wantStatus: 200, wantMethod: "KeepAlive",
			wantReq:  service.KeepAliveRequest{SessionID: "S+1", ClientID: "c1", RequestID: "r4", LostAfter: 11},
			wantBody: keepAliveOK,
		},
		{
			name:       "delete session without body",
			req:        request{method: "DELETE", target: "/api/v1/sessions/S1"},
			wantStatus: 200, wantMethod: "DeleteSession",
			wantReq:  service.DeleteSessionRequest{SessionID: "S1"},
			wantBody: deleteOK,
		},
		{
			name:       "delete session with body",
			req:        request{method: "DELETE", target: "/api/v1/sessions/S1", body: `{"client_id":"c1","request_id":"r5"}`},
			wantStatus: 200, wantMethod: "DeleteSession",
			wantReq:  service.DeleteSessionRequest{SessionID: "S1", ClientID: "c1", RequestID: "r5"},
			wantBody: deleteOK,
		},
		{
			name:       "cluster",
			req:        request{method: "GET", target: "/api/v1/cluster"},
			wantStatus: 200, wantMethod: "Cluster",
			wantBody: `{"node_id":"n1","leader_id":"n1","term":3,"members":[{"id":"n1","raft_addr":"127.0.0.1:7071","api_addr":"127.0.0.1:7070","suffrage":"voter","state":"leader"}],"commit_index":40,"applied_index":40,"revision":17,"last_fencing_token":7}`,
		},
		{
			name:       "healthz",
			req:        request{method: "GET", target: "/healthz"},
			wantStatus: 200,
			wantBody:   `{"status":"ok"}`,
		},
		{
			name:       "readyz ignores query",
			req:        request{method: "GET", target: "/readyz?verbose"},
			wantStatus: 200,
			wantBody:   `{"status":"ok"}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeService{}
			h, _ := newHandler(f, Options{})
			rec := do(h, tt.req)
			if rec.Code != tt.wantStatus {
				t.Fatalf("status %d, want %d; body %s", rec.Code, tt.wantStatus, rec.Body)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			if cc := rec.Header().Get("Cache-Control"); cc != "no-store" {
				t.Errorf("Cache-Control %q", cc)
			}
			if xc := rec.Header().Get("X-Content-Type-Options"); xc != "nosniff" {
				t.Errorf("X-Content-Type-Options %q", xc)
			}
			jsonEqual(t, rec.Body.String(), tt.wantBody)
			calls := f.recorded()
			if tt.wantMethod == "" {
				if len(calls) != 0 {
					t.Errorf("service called: %+v", calls)
				}
				return
			}
			if len(calls) != 1 {
				t.Fatalf("service calls %+v, want one %s", calls, tt.wantMethod)
			}
			if calls[0].method != tt.wantMethod {
				t.Errorf("called %s, want %s", calls[0].method, tt.wantMethod)
			}
			if !reflect.DeepEqual(calls[0].req, tt.wantReq) {
				t.Errorf("service got\n %#v\nwant\n %#v", calls[0].req, tt.wantReq)
			}
			if calls[0].requestID == "" || calls[0].requestID != rec.Header().Get(RequestIDHeader) {
				t.Errorf("service saw request id %q, answer has %q", calls[0].requestID, rec.Header().Get(RequestIDHeader))
			}
		})
	}
}

func TestHead(t *testing.T) {
	f := &fakeService{}
	h, _ := newHandler(f, Options{})
	for _, target := range []string{"/api/v1/cluster", "/api/v1/locks/x", "/api/v1/locks", "/healthz", "/api/v1/elections/e"} {
		if rec := do(h, request{method: "HEAD", target: target}); rec.Code != 200 {
			t.Errorf("HEAD %s: status %d", target, rec.Code)
		}
	}
}

// ---- malformed requests ----------------------------------------------------

func TestMalformedRequests(t *testing.T) {
	acquire := "/api/v1/locks/billing/job/acquire"
	okAcquire := `{"client_id":"c1","ttl_ms":1000}`
	big := `{"client_id":"` + strings.Repeat("x", DefaultMaxBodyBytes) + `","ttl_ms":1000}`
	ct := func(v string) map[string]string { return map[string]string{"Content-Type": v} }

	tests := []struct {
		name        string
		req         request
		wantStatus  int
		wantCode    apierror.Code
		wantAllow   string
		wantMessage string // a substring the message must contain
	}{
		// bodies
		{name: "unknown field", req: request{method: "POST", target: acquire, body: `{"client_id":"c1","ttl_ms":1000,"bogus":1}`}, wantStatus: 400, wantCode: "invalid_argument", wantMessage: `"bogus"`},
		{name: "field in another case", req: request{method: "POST", target: acquire, body: `{"CLIENT_ID":"c1","ttl_ms":1000}`}, wantStatus: 400, wantCode: "invalid_argument", wantMessage: "CLIENT_ID"},
		{name: "field given twice", req: request{method: "POST", target: acquire, body: `{"client_id":"a","ttl_ms":1000,"client_id":"b"}`}, wantStatus: 400, wantCode: "invalid_argument", wantMessage: "more than once"},
		{name: "name in body is not a field", req: request{method: "POST", target: acquire, body: `{"name":"other","client_id":"c1","ttl_ms":1000}`}, wantStatus: 400, wantCode: "invalid_argument", wantMessage: `"name"`},
		{name: "truncated JSON", req: request{method: "POST", target: acquire, body: `{"client_id":`}, wantStatus: 400, wantCode: "invalid_argument"},
		{name: "not JSON", req: request{method: "POST", target: acquire, body: `client_id=c1`}, wantStatus: 400, wantCode: "invalid_argument"},
		{name: "array body", req: request{method: "POST", target: acquire, body: `[{"client_id":"c1"}]`}, wantStatus: 400, wantCode: "invalid_argument", wantMessage: "object"},
		{name: "null body", req: request{method: "POST", target: acquire, body: `null`}, wantStatus: 400, wantCode: "invalid_argument", wantMessage: "object"},
		{name: "string body", req: request{method: "POST", target: acquire, body: `"c1"`}, wantStatus: 400, wantCode: "invalid_argument"},
		{name: "trailing garbage", req: request{method: "POST", target: acquire, body: okAcquire + ` x`}, wantStatus: 400, wantCode: "invalid_argument"},
		{name: "two objects", req: request{method: "POST", target: acquire, body: okAcquire + okAcquire}, wantStatus: 400, wantCode: "invalid_argument", wantMessage: "after the JSON object"},
		{name: "ttl_ms as string", req: request{method: "POST", target: acquire, body: `{"client_id":"c1","ttl_ms":"30s"}`}, wantStatus: 400, wantCode: "invalid_argument", wantMessage: `"ttl_ms"`},
		{name: "ttl_ms fractional", req: request{method: "POST", target: acquire, body: `{"client_id":"c1","ttl_ms":1.5}`}, wantStatus: 400, wantCode: "invalid_argument", wantMessage: `"ttl_ms"`},
		{name: "client_id as number", req: request{method: "POST", target: acquire, body: `{"client_id":5,"ttl_ms":1000}`}, wantStatus: 400, wantCode: "invalid_argument", wantMessage: `"client_id"`},
		{name: "negative fencing token", req: request{method: "POST", target: "/api/v1/locks/a/release", body: `{"client_id":"c1","fencing_token":-1,"lease_id":"L"}`}, wantStatus: 400, wantCode: "invalid_argument", wantMessage: `"fencing_token"`},
		{name: "fencing token overflows", req: request{method: "POST", target: "/api/v1/locks/a/renew", body: `{"client_id":"c1","fencing_token":18446744073709551616,"lease_id":"L"}`}, wantStatus: 400, wantCode: "invalid_argument", wantMessage: `"fencing_token"`},
		{name: "empty body on acquire", req: request{method: "POST", target: acquire}, wantStatus: 400, wantCode: "invalid_argument", wantMessage: "empty"},
		{name: "blank body on create session", req: request{method: "POST", target: "/api/v1/sessions", body: "  \n"}, wantStatus: 400, wantCode: "invalid_argument", wantMessage: "empty"},
		{name: "invalid UTF-8", req: request{method: "POST", target: acquire, body: "{\"client_id\":\"c\xff\",\"ttl_ms\":1000}"}, wantStatus: 400, wantCode: "invalid_argument", wantMessage: "UTF-8"},
		{name: "body over 64 KiB with Content-Length", req: request{method: "POST", target: acquire, body: big}, wantStatus: 413, wantCode: "too_large"},
		{name: "body over 64 KiB chunked", req: request{method: "POST", target: acquire, body: big, chunked: true}, wantStatus: 413, wantCode: "too_large"},
		{name: "optional body over 64 KiB", req: request{method: "DELETE", target: "/api/v1/sessions/S1", body: big, chunked: true}, wantStatus: 413, wantCode: "too_large"},
		{name: "keepalive bad JSON", req: request{method: "POST", target: "/api/v1/sessions/S1/keepalive", body: `{`}, wantStatus: 400, wantCode: "invalid_argument"},
		{name: "keepalive session_id in body", req: request{method: "POST", target: "/api/v1/sessions/S1/keepalive", body: `{"session_id":"S2"}`}, wantStatus: 400, wantCode: "invalid_argument", wantMessage: "session_id"},
		{name: "delete session trailing data", req: request{method: "DELETE", target: "/api/v1/sessions/S1", body: `{} {}`}, wantStatus: 400, wantCode: "invalid_argument"},

		// content types
		{name: "text/plain", req: request{method: "POST", target: acquire, header: ct("text/plain"), body: okAcquire}, wantStatus: 415, wantCode: "unsupported_media_type", wantMessage: "Content-Type"},
		{name: "form content type (curl -d default)", req: request{method: "POST", target: acquire, header: ct("application/x-www-form-urlencoded"), body: okAcquire}, wantStatus: 415, wantCode: "unsupported_media_type", wantMessage: "--json"},
		{name: "JSON in latin1", req: request{method: "POST", target: acquire, header: ct("application/json; charset=latin1"), body: okAcquire}, wantStatus: 415, wantCode: "unsupported_media_type"},
		{name: "malformed content type", req: request{method: "POST", target: "/api/v1/sessions", header: ct("application/json; ="), body: `{"client_id":"c1","ttl_ms":1000}`}, wantStatus: 415, wantCode: "unsupported_media_type"},
		{name: "no content type", req: request{method: "POST", target: acquire, header: ct(""), body: okAcquire}, wantStatus: 415, wantCode: "unsupported_media_type", wantMessage: "application/json"},
		{name: "blank body with a form content type", req: request{method: "POST", target: "/api/v1/sessions/S1/keepalive", header: ct("application/x-www-form-urlencoded"), body: "\n"}, wantStatus: 415, wantCode: "unsupported_media_type"},
		{name: "a body on an endpoint that reads none", req: request{method: "POST", target: "/api/v1/cluster/token-key/rotate", header: ct("text/plain"), body: "x"}, wantStatus: 415, wantCode: "unsupported_media_type"},
		{name: "a chunked body without content type", req: request{method: "DELETE", target: "/api/v1/sessions/S1", header: ct(""), body: "{}", chunked: true}, wantStatus: 415, wantCode: "unsupported_media_type"},

		// names
		{name: "name with empty segment", req: request{method: "POST", target: "/api/v1/locks/a//b/acquire", body: okAcquire}, wantStatus: 400, wantCode: "invalid_argument", wantMessage: "empty segment"},
		{name: "name with dot segment", req: request{method: "POST", target: "/api/v1/locks/a/./b/acquire", body: okAcquire}, wantStatus: 400, wantCode: "invalid_argument", wantMessage: `"."`},
		{name: "name with dot-dot segment", req: request{method: "POST", target: "/api/v1/locks/../x/acquire", body: okAcquire}, wantStatus: 400, wantCode: "invalid_argument", wantMessage: `".."`},
		{name: "escaped dot-dot", req: request{method: "POST", target: "/api/v1/locks/a/%2E%2E/release", body: okAcquire}, wantStatus: 400, wantCode: "invalid_argument"},
		{name: "name with space", req: request{method: "POST", target: "/api/v1/locks/a%20b/acquire", body: okAcquire}, wantStatus: 400, wantCode: "invalid_argument", wantMessage: "character"},
		{name: "empty name", req: request{method: "POST", target: "/api/v1/locks/acquire", body: okAcquire}, wantStatus: 400, wantCode: "invalid_argument", wantMessage: "empty"},
		{name: "empty name with slash", req: request{method: "POST", target: "/api/v1/locks//acquire", body: okAcquire}, wantStatus: 400, wantCode: "invalid_argument"},
		{name: "escaped double slash", req: request{method: "POST", target: "/api/v1/locks/a%2F%2Fb/renew", body: okAcquire}, wantStatus: 400, wantCode: "invalid_argument"},
		{name: "escaped trailing slash", req: request{method: "POST", target: "/api/v1/locks/a%2F/acquire", body: okAcquire}, wantStatus: 400, wantCode: "invalid_argument"},
		{name: "name too long", req: request{method: "POST", target: "/api/v1/locks/" + strings.Repeat("n", command.MaxNameLen+1) + "/acquire", body: okAcquire}, wantStatus: 400, wantCode: "invalid_argument", wantMessage: "limit"},
		{name: "get name with empty segment", req: request{method: "GET", target: "/api/v1/locks/a//b"}, wantStatus: 400, wantCode: "invalid_argument"},
		{name: "get name with trailing slash", req: request{method: "GET", target: "/api/v1/locks/a/"}, wantStatus: 400, wantCode: "invalid_argument"},
		{name: "get name ending in dot-dot", req: request{method: "GET", target: "/api/v1/locks/a/.."}, wantStatus: 400, wantCode: "invalid_argument"},
		{name: "get name with escaped NUL", req: request{method: "GET", target: "/api/v1/locks/a%00"}, wantStatus: 400, wantCode: "invalid_argument"},

		// query parameters
		{name: "stale=yes", req: request{method: "GET", target: "/api/v1/locks/x?stale=yes"}, wantStatus: 400, wantCode: "invalid_argument", wantMessage: "stale"},
		{name: "stale=1", req: request{method: "GET", target: "/api/v1/locks?stale=1"}, wantStatus: 400, wantCode: "invalid_argument", wantMessage: "stale"},
		{name: "non-numeric limit", req: request{method: "GET", target: "/api/v1/locks?limit=ten"}, wantStatus: 400, wantCode: "invalid_argument", wantMessage: "limit"},
		{name: "negative limit", req: request{method: "GET", target: "/api/v1/locks?limit=-1"}, wantStatus: 400, wantCode: "invalid_argument", wantMessage: "limit"},
		{name: "fractional limit", req: request{method: "GET", target: "/api/v1/locks?limit=1.5"}, wantStatus: 400, wantCode: "invalid_argument"},
		{name: "huge limit", req: request{method: "GET", target: "/api/v1/locks?limit=99999999999999999999"}, wantStatus: 400, wantCode: "invalid_argument"},
		{name: "bad prefix", req: request{method: "GET", target: "/api/v1/locks?prefix=a%20b"}, wantStatus: 400, wantCode: "invalid_argument", wantMessage: "prefix"},
		{name: "bad after", req: request{method: "GET", target: "/api/v1/locks?after=%3Cx%3E"}, wantStatus: 400, wantCode: "invalid_argument", wantMessage: "after"},
		{name: "misspelt parameter", req: request{method: "GET", target: "/api/v1/locks?prefx=a"}, wantStatus: 400, wantCode: "invalid_argument", wantMessage: "prefx"},
		{name: "repeated parameter", req: request{method: "GET", target: "/api/v1/locks?limit=1&limit=2"}, wantStatus: 400, wantCode: "invalid_argument", wantMessage: "more than once"},
		{name: "malformed query", req: request{method: "GET", target: "/api/v1/locks?prefix=%zz"}, wantStatus: 400, wantCode: "invalid_argument"},
		{name: "semicolon query", req: request{method: "GET", target: "/api/v1/locks?prefix=a;limit=1"}, wantStatus: 400, wantCode: "invalid_argument"},
		{name: "query on acquire", req: request{method: "POST", target: acquire + "?wait=1", body: okAcquire}, wantStatus: 400, wantCode: "invalid_argument", wantMessage: "wait"},
		{name: "query on cluster", req: request{method: "GET", target: "/api/v1/cluster?stale=true"}, wantStatus: 400, wantCode: "invalid_argument"},
		{name: "empty session id", req: request{method: "POST", target: "/api/v1/sessions//keepalive"}, wantStatus: 400, wantCode: "invalid_argument", wantMessage: "session id"},

		// unknown paths and actions
		{name: "unknown action", req: request{method: "POST", target: "/api/v1/locks/billing/job/grab", body: okAcquire}, wantStatus: 404, wantCode: "not_found", wantMessage: "acquire"},
		{name: "action escaped into the name", req: request{method: "POST", target: "/api/v1/locks/billing%2Facquire", body: okAcquire}, wantStatus: 404, wantCode: "not_found", wantMessage: "release"},
		{name: "trailing slash after action", req: request{method: "POST", target: acquire + "/", body: okAcquire}, wantStatus: 404, wantCode: "not_found"},
		{name: "action in another case", req: request{method: "POST", target: "/api/v1/locks/a/ACQUIRE", body: okAcquire}, wantStatus: 404, wantCode: "not_found"},
		{name: "unknown API path", req: request{method: "GET", target: "/api/v1/nope"}, wantStatus: 404, wantCode: "not_found"},
		{name: "API root", req: request{method: "GET", target: "/api/v1"}, wantStatus: 404, wantCode: "not_found"},
		{name: "prefix look-alike", req: request{method: "GET", target: "/api/v1/lockstep"}, wantStatus: 404, wantCode: "not_found"},
		{name: "unknown session action", req: request{method: "POST", target: "/api/v1/sessions/S1/renew"}, wantStatus: 404, wantCode: "not_found"},
		{name: "too deep session path", req: request{method: "POST", target: "/api/v1/sessions/S1/x/keepalive"}, wantStatus: 404, wantCode: "not_found"},
		{name: "cluster subpath", req: request{method: "GET", target: "/api/v1/cluster/"}, wantStatus: 404, wantCode: "not_found"},
		{name: "root", req: request{method: "GET", target: "/"}, wantStatus: 404, wantCode: "not_found"},
		{name: "list elections refuses POST", req: request{method: "POST", target: "/api/v1/elections"}, wantStatus: 405, wantCode: "method_not_allowed", wantAllow: "GET, HEAD"},
		{name: "list elections refuses an unknown parameter", req: request{method: "GET", target: "/api/v1/elections?observe=true"}, wantStatus: 400, wantCode: "invalid_argument"},
		{name: "list elections refuses a bad limit", req: request{method: "GET", target: "/api/v1/elections?limit=-1"}, wantStatus: 400, wantCode: "invalid_argument"},
		{name: "metrics unset", req: request{method: "GET", target: "/metrics"}, wantStatus: 404, wantCode: "not_found"},
		{name: "old API version", req: request{method: "GET", target: "/api/v2/locks"}, wantStatus: 404, wantCode: "not_found"},

		// methods
		{name: "DELETE a lock", req: request{method: "DELETE", target: "/api/v1/locks/a"}, wantStatus: 405, wantCode: "method_not_allowed", wantAllow: "GET, HEAD, POST"},
		{name: "PUT acquire", req: request{method: "PUT", target: acquire, body: okAcquire}, wantStatus: 405, wantCode: "method_not_allowed", wantAllow: "GET, HEAD, POST"},
		{name: "POST the lock list", req: request{method: "POST", target: "/api/v1/locks", body: okAcquire}, wantStatus: 405, wantCode: "method_not_allowed", wantAllow: "GET, HEAD"},
		{name: "GET sessions", req: request{method: "GET", target: "/api/v1/sessions"}, wantStatus: 405, wantCode: "method_not_allowed", wantAllow: "POST"},
		{name: "GET a session", req: request{method: "GET", target: "/api/v1/sessions/S1"}, wantStatus: 405, wantCode: "method_not_allowed", wantAllow: "DELETE"},
		{name: "GET keepalive", req: request{method: "GET", target: "/api/v1/sessions/S1/keepalive"}, wantStatus: 405, wantCode: "method_not_allowed", wantAllow: "POST"},
		{name: "POST cluster", req: request{method: "POST", target: "/api/v1/cluster"}, wantStatus: 405, wantCode: "method_not_allowed", wantAllow: "GET, HEAD"},
		{name: "POST healthz", req: request{method: "POST", target: "/healthz"}, wantStatus: 405, wantCode: "method_not_allowed", wantAllow: "GET, HEAD"},
		{name: "OPTIONS readyz", req: request{method: "OPTIONS", target: "/readyz"}, wantStatus: 405, wantCode: "method_not_allowed", wantAllow: "GET, HEAD"},
		// A HEAD of an event stream would never end (nothing ends the stream
		// but the client), so streams allow GET only.
		{name: "HEAD watch", req: request{method: "HEAD", target: "/api/v1/watch"}, wantStatus: 405, wantCode: "method_not_allowed", wantAllow: "GET"},
		{name: "POST watch", req: request{method: "POST", target: "/api/v1/watch"}, wantStatus: 405, wantCode: "method_not_allowed", wantAllow: "GET"},
		{name: "HEAD observe", req: request{method: "HEAD", target: "/api/v1/elections/e?observe=true"}, wantStatus: 405, wantCode: "method_not_allowed", wantAllow: "GET"},
	}
	if len(tests) < 25 {
		t.Fatalf("only %d malformed cases", len(tests))
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeService{}
			h, _ := newHandler(f, Options{})
			rec := do(h, tt.req)
			msg := checkError(t, rec, tt.wantStatus, tt.wantCode)
			if tt.wantMessage != "" && !strings.Contains(msg, tt.wantMessage) {
				t.Errorf("message %q does not mention %q", msg, tt.wantMessage)
			}
			if got := rec.Header().Get("Allow"); got != tt.wantAllow {
				t.Errorf("Allow %q, want %q", got, tt.wantAllow)
			}
			if loc := rec.Header().Get("Location"); loc != "" {
				t.Errorf("redirect to %q", loc)
			}
			if calls := f.recorded(); len(calls) != 0 {
				t.Errorf("service was called: %+v", calls)
			}
		})
	}
}

// TestBodyLimitBoundary checks the limit is on the bytes, not one off: a body
// of exactly MaxBodyBytes is fine, one more byte is not.
func TestBodyLimitBoundary(t *testing.T) {
	pad := func(n int) string {
		s := `{"client_id":"c1","ttl_ms":1000}`
		return s + strings.Repeat(" ", n-len(s))
	}
	for _, tc := range []struct {
		limit int64
		size  int
		want  int
	}{
		{0, DefaultMaxBodyBytes, 200},
		{0, DefaultMaxBodyBytes + 1, 413},
		{100, 100, 200},
		{100, 101, 413},
	} {
		for _, chunked := range []bool{false, true} {
			f := &fakeService{}
			h, _ := newHandler(f, Options{MaxBodyBytes: tc.limit})
			rec := do(h, request{method: "POST", target: "/api/v1/locks/a/acquire", body: pad(tc.size), chunked: chunked})
			if rec.Code != tc.want {
				t.Errorf("limit %d, size %d, chunked %v: status %d, want %d", tc.limit, tc.size, chunked, rec.Code, tc.want)
			}
		}
	}
}

// ---- service errors --------------------------------------------------------

func TestAcquireConflict(t *testing.T) {
	holder := &service.Holder{ClientID: "other", FencingToken: 41, GrantedAt: t0, ExpiresAt: t1}
	tests := []struct {
		name     string
		resp     *service.AcquireResponse
		err      error
		wantBody string
	}{
		{
			name:     "lock_held with holder",
			resp:     &service.AcquireResponse{Acquired: false, Holder: holder},
			err:      apierror.New(apierror.LockHeld, "billing/job is held by another client"),
			wantBody: `{"acquired":false,"error":{"code":"lock_held","message":"billing/job is held by another client"},"holder":{"client_id":"other","fencing_token":41,"granted_at":"2030-01-02T03:04:05Z","expires_at":"2030-01-02T03:04:35Z"}}`,
		},
		{
			name:     "wait_timeout with holder",
			resp:     &service.AcquireResponse{Acquired: false, Holder: holder},
			err:      apierror.New(apierror.WaitTimeout, "still held after 5s"),
			wantBody: `{"acquired":false,"error":{"code":"wait_timeout","message":"still held after 5s"},"holder":{"client_id":"other","fencing_token":41,"granted_at":"2030-01-02T03:04:05Z","expires_at":"2030-01-02T03:04:35Z"}}`,
		},
		{
			name:     "wait_timeout without holder omits it",
			resp:     &service.AcquireResponse{Acquired: false},
			err:      apierror.New(apierror.WaitTimeout, "timed out"),
			wantBody: `{"acquired":false,"error":{"code":"wait_timeout","message":"timed out"}}`,
		},
		{
			name:     "lock_held through a subtree names the lock and the mode",
			resp:     &service.AcquireResponse{Acquired: false, Holder: &service.Holder{ClientID: "other", FencingToken: 41, GrantedAt: t0, ExpiresAt: t1, Mode: "shared", Subtree: true, Lock: "billing"}},
			err:      apierror.New(apierror.LockHeld, "held through billing"),
			wantBody: `{"acquired":false,"error":{"code":"lock_held","message":"held through billing"},"holder":{"client_id":"other","fencing_token":41,"granted_at":"2030-01-02T03:04:05Z","expires_at":"2030-01-02T03:04:35Z","mode":"shared","subtree":true,"lock":"billing"}}`,
		},
		{
			name:     "limit_mismatch carries the lock's limit",
			resp:     &service.AcquireResponse{Acquired: false, Limit: 3},
			err:      apierror.New(apierror.LimitMismatch, "in use with limit 3"),
			wantBody: `{"acquired":false,"error":{"code":"limit_mismatch","message":"in use with limit 3"},"limit":3}`,
		},
		{
			name:     "lock_held wrapped and without a response is a plain error",
			err:      errors.Join(apierror.New(apierror.LockHeld, "held")),
			wantBody: `{"error":{"code":"lock_held","message":"held"}}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeService{resp: tt.resp, err: tt.err}
			h, _ := newHandler(f, Options{})
			rec := do(h, request{method: "POST", target: "/api/v1/locks/billing/job/acquire", body: `{"client_id":"c1","ttl_ms":1000,"wait_timeout_ms":5000}`})
			if rec.Code != http.StatusConflict {
				t.Fatalf("status %d, want 409", rec.Code)
			}
			jsonEqual(t, rec.Body.String(), tt.wantBody)
			if strings.Contains(rec.Body.String(), "lease_id") {
				t.Error("a refused acquire shows a lease id")
			}
		})
	}
}

func TestServiceErrors(t *testing.T) {
	tests := []struct {
		name           string
		req            request
		err            error
		wantStatus     int
		wantCode       apierror.Code
		wantRetryAfter string
	}{
		{"not_holder on release", request{method: "POST", target: "/api/v1/locks/a/release", body: `{"client_id":"c","fencing_token":1,"lease_id":"L"}`}, apierror.New(apierror.NotHolder, "not the holder"), 409, "not_holder", ""},
		{"not_holder on renew", request{method: "POST", target: "/api/v1/locks/a/renew", body: `{"client_id":"c","fencing_token":1,"lease_id":"L"}`}, apierror.New(apierror.NotHolder, "not the holder"), 409, "not_holder", ""},
		{"service rejects ttl", request{method: "POST", target: "/api/v1/locks/a/acquire", body: `{"client_id":"c","ttl_ms":5}`}, apierror.New(apierror.InvalidArgument, "ttl_ms must be 1000..600000"), 400, "invalid_argument", ""},
		{"session_not_found on keepalive", request{method: "POST", target: "/api/v1/sessions/S1/keepalive"}, apierror.New(apierror.SessionNotFound, "no such session"), 404, "session_not_found", ""},
		{"no_leader rounds Retry-After up", request{method: "GET", target: "/api/v1/locks/a"}, &apierror.Error{Code: apierror.NoLeader, Message: "no leader", RetryAfter: 2500 * time.Millisecond}, 503, "no_leader", "3"},
		{"unavailable without hint says 1", request{method: "GET", target: "/api/v1/cluster"}, apierror.New(apierror.Unavailable, "shutting down"), 503, "unavailable", "1"},
		{"sub-second hint says 1", request{method: "DELETE", target: "/api/v1/sessions/S1"}, &apierror.Error{Code: apierror.NoLeader, Message: "election", RetryAfter: 10 * time.Millisecond}, 503, "no_leader", "1"},
		{"rate limited", request{method: "POST", target: "/api/v1/sessions", body: `{"client_id":"c","ttl_ms":1000}`}, &apierror.Error{Code: apierror.RateLimited, Message: "slow down", RetryAfter: 4 * time.Second}, 429, "rate_limited", "4"},
		{"too large from service", request{method: "GET", target: "/api/v1/locks"}, apierror.New(apierror.TooLarge, "value over 4 KiB"), 413, "too_large", ""},
		{"lock_delayed says when", request{method: "POST", target: "/api/v1/locks/a/acquire", body: `{"client_id":"c","ttl_ms":1000}`}, &apierror.Error{Code: apierror.LockDelayed, Message: "delayed", RetryAfter: 4200 * time.Millisecond}, 409, "lock_delayed", "5"},
		{"lock_lost on renew", request{method: "POST", target: "/api/v1/locks/a/renew", body: `{"client_id":"c","fencing_token":1,"lease_id":"L"}`}, &apierror.Error{Code: apierror.LockLost, Message: "revoked", FencingToken: 1}, 409, "lock_lost", ""},
		{"history with a bad kind", request{method: "GET", target: "/api/v1/history/a?kind=x"}, nil, 400, "invalid_argument", ""},
		{"empty message gets words", request{method: "GET", target: "/api/v1/locks/a"}, &apierror.Error{Code: apierror.NotFound}, 404, "not_found", ""},
		{"plain error is internal", request{method: "GET", target: "/api/v1/locks/a"}, errors.New("boom"), 500, "internal", ""},
		{"unknown code is internal", request{method: "GET", target: "/api/v1/locks/a"}, &apierror.Error{Code: "weird_code", Message: "?"}, 500, "internal", ""},
		{"raw context error while the client is still there", request{method: "GET", target: "/api/v1/locks/a"}, context.DeadlineExceeded, 500, "internal", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeService{err: tt.err}
			h, _ := newHandler(f, Options{})
			rec := do(h, tt.req)
			checkError(t, rec, tt.wantStatus, tt.wantCode)
			if got := rec.Header().Get("Retry-After"); got != tt.wantRetryAfter {
				t.Errorf("Retry-After %q, want %q", got, tt.wantRetryAfter)
			}
			if calls := len(f.recorded()); calls != 1 && (tt.err != nil || calls != 0) {
				t.Errorf("service calls: %+v", f.recorded())
			}
			body := rec.Body.String()
			if tt.wantCode == apierror.LockDelayed && !strings.Contains(body, `"retry_after_ms":4200`) {
				t.Errorf("lock_delayed body without retry_after_ms: %s", body)
			}
			if tt.wantCode == apierror.LockLost && !strings.Contains(body, `"fencing_token":1`) {
				t.Errorf("lock_lost body without the token: %s", body)
			}
		})
	}
}

func TestInternalErrorIsLoggedNotShown(t *testing.T) {
	f := &fakeService{err: errors.New("disk on fire")}
	h, logs := newHandler(f, Options{})
	rec := do(h, request{
		method: "POST", target: "/api/v1/locks/a/release",
		header: map[string]string{RequestIDHeader: "req-42"},
		body:   `{"client_id":"c","fencing_token":1,"lease_id":"LEASE-SECRET-123"}`,
	})
	msg := checkError(t, rec, 500, apierror.Internal)
	if strings.Contains(msg, "disk") {
		t.Errorf("cause leaked to the client: %q", msg)
	}
	if !strings.Contains(msg, "req-42") {
		t.Errorf("message %q does not point at the request id", msg)
	}
	out := logs.String()
	if !strings.Contains(out, "disk on fire") || !strings.Contains(out, `"request_id":"req-42"`) {
		t.Errorf("cause or request id not logged:\n%s", out)
	}
	if strings.Contains(out, "LEASE-SECRET-123") {
		t.Errorf("lease id in the log:\n%s", out)
	}
}

func TestNilAnswerIsInternal(t *testing.T) {
	f := &fakeService{nilAnswer: true}
	h, _ := newHandler(f, Options{})
	checkError(t, do(h, request{method: "GET", target: "/api/v1/cluster"}), 500, apierror.Internal)
}

func TestPanicIsJSON500(t *testing.T) {
	f := &fakeService{panicMsg: "bug"}
	h, logs := newHandler(f, Options{})
	checkError(t, do(h, request{method: "GET", target: "/api/v1/locks/a"}), 500, apierror.Internal)
	if !strings.Contains(logs.String(), "panic serving request") {
		t.Errorf("panic not logged:\n%s", logs)
	}
}

func TestHealth(t *testing.T) {
	tests := []struct {
		name, target         string
		healthErr, readyErr  error
		wantStatus           int
		wantCode             apierror.Code
		wantMessageSubstring string
	}{
		{name: "healthz plain error", target: "/healthz", healthErr: errors.New("raft stopped"), wantStatus: 503, wantCode: "unavailable", wantMessageSubstring: "raft stopped"},
		{name: "readyz no leader", target: "/readyz", readyErr: apierror.New(apierror.NoLeader, "no leader yet"), wantStatus: 503, wantCode: "no_leader", wantMessageSubstring: "no leader yet"},
		{name: "readyz other code still 503", target: "/readyz", readyErr: apierror.New(apierror.Internal, "catching up"), wantStatus: 503, wantCode: "unavailable", wantMessageSubstring: "catching up"},
		{name: "healthz ignores ready", target: "/healthz", readyErr: errors.New("x"), wantStatus: 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeService{healthErr: tt.healthErr, readyErr: tt.readyErr}
			h, _ := newHandler(f, Options{})
			rec := do(h, request{method: "GET", target: tt.target})
			if tt.wantStatus == 200 {
				if rec.Code != 200 {
					t.Fatalf("status %d", rec.Code)
				}
				jsonEqual(t, rec.Body.String(), `{"status":"ok"}`)
				return
			}
			msg := checkError(t, rec, tt.wantStatus, tt.wantCode)
			if !strings.Contains(msg, tt.wantMessageSubstring) {
				t.Errorf("message %q", msg)
			}
			if rec.Header().Get("Retry-After") == "" {
				t.Error("503 without Retry-After")
			}
		})
	}
}

func TestMetricsOption(t *testing.T) {
	metrics := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "dlock_up 1\n")
	})
	h, _ := newHandler(&fakeService{}, Options{Metrics: metrics})
	rec := do(h, request{method: "GET", target: "/metrics"})
	if rec.Code != 200 || rec.Body.String() != "dlock_up 1\n" {
		t.Errorf("metrics: %d %q", rec.Code, rec.Body)
	}
}

// ---- request ids and logging -----------------------------------------------

func TestRequestID(t *testing.T) {
	f := &fakeService{}
	h, logs := newHandler(f, Options{})

	rec := do(h, request{method: "GET", target: "/api/v1/locks/a", header: map[string]string{RequestIDHeader: "abc-123"}})
	if got := rec.Header().Get(RequestIDHeader); got != "abc-123" {
		t.Errorf("request id %q not echoed", got)
	}

	seen := map[string]bool{}
	for _, bad := range []string{"", "has space", strings.Repeat("x", 200), "ctl\x01"} {
		rec := do(h, request{method: "GET", target: "/api/v1/locks/a", header: map[string]string{RequestIDHeader: bad}})
		got := rec.Header().Get(RequestIDHeader)
		if got == "" || got == bad || seen[got] || !validRequestID(got) {
			t.Errorf("for %q got id %q", bad, got)
		}
		seen[got] = true
	}

	// One debug line per request, with everything an operator needs.
	var found bool
	for line := range strings.SplitSeq(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if m["msg"] != "http request" || m["request_id"] != "abc-123" {
			continue
		}
		found = true
		if m["level"] != "DEBUG" || m["method"] != "GET" || m["path"] != "/api/v1/locks/a" || m["status"] != float64(200) || m["duration"] == nil {
			t.Errorf("request log line %v", m)
		}
	}
	if !found {
		t.Errorf("no request line for abc-123:\n%s", logs)
	}
}

func TestSessionIDsStayOutOfLogs(t *testing.T) {
	f := &fakeService{err: errors.New("boom")}
	h, logs := newHandler(f, Options{})
	do(h, request{method: "DELETE", target: "/api/v1/sessions/SESSION-SECRET"})
	do(h, request{method: "POST", target: "/api/v1/sessions/SESSION-SECRET/keepalive"})
	do(h, request{method: "POST", target: "/api/v1/sessions/SESSION-SECRET/bogus"})
	out := logs.String()
	if strings.Contains(out, "SESSION-SECRET") {
		t.Errorf("session id in the log:\n%s", out)
	}
	for _, p := range []string{`"path":"/api/v1/sessions/{id}"`, `"path":"/api/v1/sessions/{id}/keepalive"`} {
		if !strings.Contains(out, p) {
			t.Errorf("log lacks %s:\n%s", p, out)
		}
	}
}

// ---- through a real server -------------------------------------------------

// TestNoRedirects sends dot and double-slash paths through a real
// http.Server and client: the server must answer 400 itself, never clean
// the path and redirect.
func TestNoRedirects(t *testing.T) {
	f := &fakeService{}
	srv := httptest.NewServer(New(f, nil, Options{}))
	defer srv.Close()
	client := srv.Client()
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

	for _, tc := range []struct{ method, path string }{
		{"POST", "/api/v1/locks/a//b/acquire"},
		{"POST", "/api/v1/locks/a/./b/acquire"},
		{"POST", "/api/v1/locks/a/../b/acquire"},
		{"POST", "/api/v1/locks/../x/acquire"},
		{"POST", "/api/v1/locks/./x/release"},
		{"GET", "/api/v1/locks/a//b"},
		{"GET", "/api/v1/locks/a/../b"},
		{"GET", "/api/v1/locks/a/."},
	} {
		u := &url.URL{Scheme: "http", Host: strings.TrimPrefix(srv.URL, "http://"), Opaque: tc.path}
		const reqBody = `{"client_id":"c","ttl_ms":1000}`
		req := &http.Request{Method: tc.method, URL: u, Header: http.Header{"Content-Type": {"application/json"}}, Host: u.Host,
			Body: io.NopCloser(strings.NewReader(reqBody)), ContentLength: int64(len(reqBody))}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", tc.method, tc.path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || resp.Header.Get("Location") != "" || !strings.Contains(string(body), `"invalid_argument"`) {
			t.Errorf("%s %s: %d %s %s", tc.method, tc.path, resp.StatusCode, resp.Header.Get("Location"), body)
		}
	}
	if calls := f.recorded(); len(calls) != 0 {
		t.Errorf("service was called: %+v", calls)
	}
}

// TestHangUpWithdrawsWait checks the blocking acquire gets the request's
// context, so a client that hangs up cancels the service's wait.
func TestHangUpWithdrawsWait(t *testing.T) {
	f := &fakeService{block: true, started: make(chan struct{}), ended: make(chan error, 1)}
	srv := httptest.NewServer(New(f, nil, Options{}))
	defer srv.Close()

	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/api/v1/locks/a/acquire",
			strings.NewReader(`{"client_id":"c","ttl_ms":1000,"wait_timeout_ms":600000}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := srv.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	select {
	case <-f.started:
	case <-time.After(10 * time.Second):
		t.Fatal("acquire never reached the service")
	}
	cancel()
	select {
	case err := <-f.ended:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("service context ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("service context not cancelled after the client hung up")
	}
	if err := <-errc; err == nil {
		t.Error("client request succeeded after cancel")
	}
}

// ---- fuzz ------------------------------------------------------------------

// FuzzHTTPAPI feeds arbitrary methods, request targets and bodies through the
// handler. Whatever comes in, the answer is one JSON value with a documented
// status, nothing panics, and the service only ever sees canonical names.
// mode picks how the fake service answers, to reach the error encoders too.
func FuzzHTTPAPI(f *testing.F) {
	seeds := []struct {
		method, target, body string
		mode                 uint8
	}{
		{"POST", "/api/v1/locks/billing/job/acquire", `{"client_id":"c1","ttl_ms":30000}`, 0},
		{"POST", "/api/v1/locks/billing%2Fjob/acquire", `{"client_id":"c1","session_id":"s"}`, 1},
		{"POST", "/api/v1/locks/a/release", `{"client_id":"c1","fencing_token":1,"lease_id":"L"}`, 3},
		{"POST", "/api/v1/locks/a/renew", `{"client_id":"c1","fencing_token":1,"lease_id":"L","ttl_ms":5}`, 4},
		{"POST", "/api/v1/locks/a//b/acquire", `{}`, 0},
		{"POST", "/api/v1/locks/../x/acquire", `{"client_id":1}`, 0},
		{"GET", "/api/v1/locks/a/b?stale=true", "", 0},
		{"GET", "/api/v1/locks?prefix=a/&after=a/b&limit=10", "", 2},
		{"POST", "/api/v1/sessions", `{"client_id":"c1","ttl_ms":1000}`, 0},
		{"POST", "/api/v1/sessions/s1/keepalive", "", 5},
		{"DELETE", "/api/v1/sessions/s1", `{"client_id":"c1"}`, 6},
		{"GET", "/api/v1/cluster", "", 0},
		{"GET", "/healthz", "", 7},
		{"PATCH", "/api/v1/locks/a", `{"x":[1,{"y":null}]}`, 0},
		{"POST", "/api/v1/locks/a/acquire", `{"client_id":"c","ttl_ms":1000} trailing`, 0},
	}
	for _, s := range seeds {
		f.Add(s.method, s.target, []byte(s.body), s.mode)
	}
	documented := map[int]bool{200: true, 201: true, 400: true, 404: true, 405: true, 409: true, 413: true, 415: true, 429: true, 503: true}
	holder := &service.Holder{ClientID: "h", FencingToken: 1, GrantedAt: t0, ExpiresAt: t1}
	f.Fuzz(func(t *testing.T, method, target string, body []byte, mode uint8) {
		if !validMethod(method) {
			t.Skip()
		}
		// The server parses the request target the same way before any
		// handler runs; what it refuses never reaches us.
		u, err := url.ParseRequestURI(target)
		if err != nil {
			t.Skip()
		}
		fs := &fakeService{}
		internalAllowed := false
		switch mode % 8 {
		case 1:
			fs.resp, fs.err = &service.AcquireResponse{Holder: holder}, apierror.New(apierror.LockHeld, "held")
		case 2:
			fs.err = &apierror.Error{Code: apierror.NoLeader, Message: "election", RetryAfter: time.Second}
		case 3:
			fs.err = apierror.New(apierror.NotHolder, "no")
		case 4:
			fs.err, internalAllowed = errors.New("boom"), true
		case 5:
			fs.err = apierror.New(apierror.SessionNotFound, "gone")
		case 6:
			fs.nilAnswer, internalAllowed = true, true
		case 7:
			fs.healthErr, fs.readyErr = errors.New("sick"), errors.New("not ready")
		}
		h := New(fs, nil, Options{})
		r := &http.Request{
			Method: method, URL: u, RequestURI: target, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: http.Header{"Content-Type": {"application/json"}}, Host: "example.com", ContentLength: int64(len(body)),
			Body: io.NopCloser(bytes.NewReader(body)),
		}
		r = r.WithContext(context.Background())
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)

		if !documented[rec.Code] && !(internalAllowed && rec.Code == 500) {
			t.Fatalf("%s %q: undocumented status %d: %s", method, target, rec.Code, rec.Body)
		}
		if !json.Valid(rec.Body.Bytes()) {
			t.Fatalf("%s %q: answer is not JSON: %q", method, target, rec.Body)
		}
		if rec.Header().Get("Location") != "" {
			t.Fatalf("%s %q: redirect", method, target)
		}
		if rec.Code >= 400 {
			var env struct {
				Error *struct {
					Code    string `json:"code"`
					Message string `json:"message"`
				} `json:"error"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &env); err != nil || env.Error == nil || env.Error.Code == "" || env.Error.Message == "" {
				t.Fatalf("%s %q: error body %q", method, target, rec.Body)
			}
			if rec.Code == 405 && rec.Header().Get("Allow") == "" {
				t.Fatalf("405 without Allow")
			}
			if rec.Code == 503 && rec.Header().Get("Retry-After") == "" {
				t.Fatalf("503 without Retry-After")
			}
		}
		for _, c := range fs.recorded() {
			var name string
			switch req := c.req.(type) {
			case service.AcquireRequest:
				name = req.Name
			case service.ReleaseRequest:
				name = req.Name
			case service.RenewRequest:
				name = req.Name
			case getLockCall:
				name = req.Name
			case service.KeepAliveRequest:
				if req.SessionID == "" {
					t.Fatalf("empty session id reached the service")
				}
				continue
			case service.DeleteSessionRequest:
				if req.SessionID == "" {
					t.Fatalf("empty session id reached the service")
				}
				continue
			default:
				continue
			}
			if canon, err := command.NormalizeName(name); err != nil || canon != name {
				t.Fatalf("%s %q: service got name %q (%v)", method, target, name, err)
			}
		}
	})
}

// validMethod is net/http's rule for a method: a non-empty token.
func validMethod(m string) bool {
	if m == "" {
		return false
	}
	for i := 0; i < len(m); i++ {
		c := m[i]
		if c <= ' ' || c >= 0x7f || strings.ContainsRune(`()<>@,;:\"/[]?={}`, rune(c)) {
			return false
		}
	}
	return true
}
