package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	dlockv1 "github.com/dlock/dlock/api/dlock/v1"
	"github.com/dlock/dlock/internal/apierror"
)

// The gRPC side of the workload. Some clients (protocolOf) send their lock
// acquires, releases and renewals over gRPC (dlock.v1 LockService) instead of
// HTTP, through the same retry loop: each call is made as the gRPC request
// and its answer turned back into the HTTP status and JSON the suite reads,
// with the status from the one error table (internal/apierror) and the
// holder or lost token from the ErrorDetail. So the gRPC path meets the same
// faults and the same checkers: a waiting Acquire cancelled by its attempt's
// deadline withdraws its wait like a hung-up HTTP request, a retry under the
// same request id lands in the dedup table, and the answers must be the same
// linearizable history. The gRPC clients' elections (ElectionService) and
// one session client's sessions (SessionService) go the same way; reads stay
// on HTTP.

// protocolOf says how a client sends its calls: c1 and c3 (locks and
// elections) and s1 (sessions and their locks) over gRPC, c5's lock calls
// over the WebSocket API (which has no election or session calls),
// everyone else (and every read) over HTTP.
func protocolOf(id string) string {
	switch id {
	case "c1", "c3", "s1":
		return "grpc"
	case "c5":
		return "ws"
	}
	return "http"
}

// grpcConns keeps one connection per node; they reconnect by themselves
// after a node restarts.
type grpcConns struct {
	locks     []dlockv1.LockServiceClient
	elections []dlockv1.ElectionServiceClient
	sessions  []dlockv1.SessionServiceClient
	conns     []*grpc.ClientConn
}

func newGRPCConns(c *cluster) (*grpcConns, error) {
	g := &grpcConns{}
	for _, n := range c.nodes {
		cc, err := grpc.NewClient(n.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithNoProxy())
		if err != nil {
			g.close()
			return nil, err
		}
		g.conns = append(g.conns, cc)
		g.locks = append(g.locks, dlockv1.NewLockServiceClient(cc))
		g.elections = append(g.elections, dlockv1.NewElectionServiceClient(cc))
		g.sessions = append(g.sessions, dlockv1.NewSessionServiceClient(cc))
	}
	return g, nil
}

func (g *grpcConns) close() {
	for _, cc := range g.conns {
		_ = cc.Close()
	}
}

// send makes one attempt of a lock, election or session call over gRPC.
// handled is false for a call it does not carry (the caller then uses HTTP).
func (g *grpcConns) send(ctx context.Context, node int, method, path string, body any) (code int, answer []byte, handled bool, err error) {
	var out any
	var callErr error
	switch {
	case strings.HasPrefix(path, "/api/v1/locks/"):
		out, handled, callErr = g.lockCall(ctx, node, method, path, body)
	case strings.HasPrefix(path, "/api/v1/elections/"):
		out, handled, callErr = g.electionCall(ctx, node, method, path, body)
	case strings.HasPrefix(path, "/api/v1/sessions"):
		out, handled, callErr = g.sessionCall(ctx, node, method, path, body)
	}
	if !handled {
		return 0, nil, false, nil
	}
	return grpcAnswer(ctx, out, callErr)
}

// lockCall carries an acquire, release or renew (LockService).
func (g *grpcConns) lockCall(ctx context.Context, node int, method, path string, body any) (out any, handled bool, callErr error) {
	name, action, ok := lockCall(method, path)
	if !ok {
		return nil, false, nil
	}
	lc := g.locks[node]
	switch action {
	case "acquire":
		b, ok := body.(acquireBody)
		if !ok {
			return nil, false, nil
		}
		r, err := lc.Acquire(ctx, &dlockv1.AcquireRequest{Name: name, ClientId: b.ClientID, TtlMs: b.TTLms,
			SessionId: b.SessionID, WaitTimeoutMs: b.WaitTimeoutMs, RequestId: b.RequestID, Takeover: b.Takeover,
			Limit: int64(b.Limit), Mode: b.Mode, Subtree: b.Subtree})
		if err != nil {
			return nil, true, err
		}
		return map[string]any{"acquired": r.Acquired, "fencing_token": r.FencingToken, "lease_id": r.LeaseId,
			"token_proof": r.TokenProof, "lease_ref": r.LeaseRef}, true, nil
	case "release", "renew":
		b, ok := body.(tokenBody)
		if !ok {
			return nil, false, nil
		}
		if action == "release" {
			r, err := lc.Release(ctx, &dlockv1.ReleaseRequest{Name: name, ClientId: b.ClientID, FencingToken: b.FencingToken,
				LeaseId: b.LeaseID, RequestId: b.RequestID})
			if err != nil {
				return nil, true, err
			}
			return map[string]any{"released": r.Released}, true, nil
		}
		r, err := lc.Renew(ctx, &dlockv1.RenewRequest{Name: name, ClientId: b.ClientID, FencingToken: b.FencingToken,
			LeaseId: b.LeaseID, RequestId: b.RequestID})
		if err != nil {
			return nil, true, err
		}
		return map[string]any{"renewed": r.Renewed}, true, nil
	}
	return nil, false, nil
}

// electionCall carries a campaign, resign, renew or proclaim
// (ElectionService).
func (g *grpcConns) electionCall(ctx context.Context, node int, method, path string, body any) (out any, handled bool, callErr error) {
	name, action, ok := postCall("/api/v1/elections/", method, path)
	if !ok {
		return nil, false, nil
	}
	ec := g.elections[node]
	if action == "campaign" {
		b, ok := body.(campaignBody)
		if !ok {
			return nil, false, nil
		}
		r, err := ec.Campaign(ctx, &dlockv1.CampaignRequest{Name: name, CandidateId: b.CandidateID, Value: b.Value, TtlMs: b.TTLms,
			WaitTimeoutMs: b.WaitTimeoutMs, RequestId: b.RequestID, Takeover: b.Takeover})
		if err != nil {
			return nil, true, err
		}
		return map[string]any{"leader": r.Leader, "fencing_token": r.FencingToken, "lease_id": r.LeaseId,
			"token_proof": r.TokenProof, "lease_ref": r.LeaseRef}, true, nil
	}
	b, ok := body.(electionTokenBody)
	if !ok {
		return nil, false, nil
	}
	switch action {
	case "resign":
		r, err := ec.Resign(ctx, &dlockv1.ResignRequest{Name: name, CandidateId: b.CandidateID, FencingToken: b.FencingToken,
			LeaseId: b.LeaseID, RequestId: b.RequestID})
		if err != nil {
			return nil, true, err
		}
		return map[string]any{"resigned": r.Resigned}, true, nil
	case "renew":
		r, err := ec.RenewElection(ctx, &dlockv1.RenewElectionRequest{Name: name, CandidateId: b.CandidateID, FencingToken: b.FencingToken,
			LeaseId: b.LeaseID, RequestId: b.RequestID})
		if err != nil {
			return nil, true, err
		}
		return map[string]any{"renewed": r.Renewed}, true, nil
	case "proclaim":
		r, err := ec.Proclaim(ctx, &dlockv1.ProclaimRequest{Name: name, CandidateId: b.CandidateID, FencingToken: b.FencingToken,
			LeaseId: b.LeaseID, Value: b.Value, RequestId: b.RequestID})
		if err != nil {
			return nil, true, err
		}
		return map[string]any{"proclaimed": r.Proclaimed}, true, nil
	}
	return nil, false, nil
}

// sessionCall carries a session's create, keepalive or delete
// (SessionService); a created session answers 201, as over HTTP.
func (g *grpcConns) sessionCall(ctx context.Context, node int, method, path string, body any) (out any, handled bool, callErr error) {
	b, ok := body.(sessionBody)
	if !ok {
		return nil, false, nil
	}
	sc := g.sessions[node]
	id, action, ok := sessionPath(method, path)
	if !ok {
		return nil, false, nil
	}
	switch action {
	case "create":
		r, err := sc.CreateSession(ctx, &dlockv1.CreateSessionRequest{ClientId: b.ClientID, TtlMs: b.TTLms, RequestId: b.RequestID})
		if err != nil {
			return nil, true, err
		}
		return createdSession{r.SessionId}, true, nil
	case "keepalive":
		if _, err := sc.KeepAlive(ctx, &dlockv1.KeepAliveRequest{SessionId: id, ClientId: b.ClientID, RequestId: b.RequestID}); err != nil {
			return nil, true, err
		}
		return map[string]any{"session_id": id}, true, nil
	case "delete":
		r, err := sc.DeleteSession(ctx, &dlockv1.DeleteSessionRequest{SessionId: id, ClientId: b.ClientID, RequestId: b.RequestID})
		if err != nil {
			return nil, true, err
		}
		return map[string]any{"deleted": r.Deleted}, true, nil
	}
	return nil, false, nil
}

// createdSession is a CreateSession's answer, which HTTP gives as 201.
type createdSession struct {
	SessionID string `json:"session_id"`
}

// grpcAnswer turns a call's result or error back into the HTTP status and
// JSON the suite reads.
func grpcAnswer(ctx context.Context, out any, callErr error) (code int, answer []byte, handled bool, err error) {
	if callErr == nil {
		data, err := json.Marshal(out)
		if _, created := out.(createdSession); created {
			return 201, data, true, err
		}
		return 200, data, true, err
	}
	st, isStatus := status.FromError(callErr)
	var d *dlockv1.ErrorDetail
	if isStatus {
		for _, x := range st.Details() {
			if ed, ok := x.(*dlockv1.ErrorDetail); ok {
				d = ed
			}
		}
	}
	if d == nil {
		// No dlock answer: the connection, a timeout, a node that is down.
		if ctx.Err() != nil {
			return 0, nil, true, context.DeadlineExceeded
		}
		if !isStatus || st.Code() == codes.Unavailable || st.Code() == codes.DeadlineExceeded || st.Code() == codes.Canceled {
			return 0, nil, true, errors.New("gRPC: " + callErr.Error())
		}
		return 500, []byte(`{"error":{"code":"internal","message":` + jsonString(st.Message()) + `}}`), true, nil
	}
	ans := map[string]any{"error": map[string]string{"code": d.Code, "message": st.Message()}}
	if d.Holder != nil {
		ans["holder"] = map[string]any{"client_id": d.Holder.ClientId, "fencing_token": d.Holder.FencingToken, "lock": d.Holder.Lock}
	}
	if d.Current != nil {
		ans["current"] = map[string]any{"candidate_id": d.Current.CandidateId, "fencing_token": d.Current.FencingToken}
	}
	if d.Limit != 0 {
		ans["limit"] = d.Limit
	}
	if d.FencingToken != 0 {
		ans["fencing_token"] = d.FencingToken
	}
	data, err := json.Marshal(ans)
	return apierror.HTTPStatus(apierror.Code(d.Code)), data, true, err
}

// lockCall splits a POST /api/v1/locks/{name}/{action} the gRPC and
// WebSocket clients carry; ok is false for any other call.
func lockCall(method, path string) (name, action string, ok bool) {
	return postCall("/api/v1/locks/", method, path)
}

// postCall splits a POST prefix{name}/{action}; ok is false for any other
// call.
func postCall(prefix, method, path string) (name, action string, ok bool) {
	rest, found := strings.CutPrefix(path, prefix)
	i := strings.LastIndexByte(rest, '/')
	if !found || method != "POST" || i <= 0 {
		return "", "", false
	}
	return rest[:i], rest[i+1:], true
}

// sessionPath names a session call: POST /api/v1/sessions ("create"),
// POST /api/v1/sessions/{id}/keepalive, DELETE /api/v1/sessions/{id}; ok
// is false for any other call.
func sessionPath(method, path string) (id, action string, ok bool) {
	rest, found := strings.CutPrefix(path, "/api/v1/sessions")
	switch {
	case !found:
		return "", "", false
	case rest == "" && method == "POST":
		return "", "create", true
	}
	rest, found = strings.CutPrefix(rest, "/")
	if !found || rest == "" {
		return "", "", false
	}
	if id, ka := strings.CutSuffix(rest, "/keepalive"); ka && method == "POST" && id != "" && !strings.Contains(id, "/") {
		return id, "keepalive", true
	}
	if method == "DELETE" && !strings.Contains(rest, "/") {
		return rest, "delete", true
	}
	return "", "", false
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func TestCallPaths(t *testing.T) {
	for _, c := range []struct {
		prefix, method, path string
		name, action         string
		ok                   bool
	}{
		{"/api/v1/locks/", "POST", "/api/v1/locks/hot/a/acquire", "hot/a", "acquire", true},
		{"/api/v1/locks/", "GET", "/api/v1/locks/hot/a", "", "", false},
		{"/api/v1/locks/", "POST", "/api/v1/locks//acquire", "", "", false},
		{"/api/v1/elections/", "POST", "/api/v1/elections/elect/a/campaign", "elect/a", "campaign", true},
		{"/api/v1/elections/", "POST", "/api/v1/locks/elect/a/campaign", "", "", false},
	} {
		name, action, ok := postCall(c.prefix, c.method, c.path)
		if name != c.name || action != c.action || ok != c.ok {
			t.Errorf("postCall(%s %s): %q %q %v, want %q %q %v", c.method, c.path, name, action, ok, c.name, c.action, c.ok)
		}
	}
	for _, c := range []struct {
		method, path string
		id, action   string
		ok           bool
	}{
		{"POST", "/api/v1/sessions", "", "create", true},
		{"POST", "/api/v1/sessions/ab12/keepalive", "ab12", "keepalive", true},
		{"DELETE", "/api/v1/sessions/ab12", "ab12", "delete", true},
		{"GET", "/api/v1/sessions", "", "", false},
		{"POST", "/api/v1/sessions/ab12", "", "", false},
		{"DELETE", "/api/v1/sessions/ab12/keepalive", "", "", false},
		{"POST", "/api/v1/sessions//keepalive", "", "", false},
		{"DELETE", "/api/v1/sessions/", "", "", false},
		{"POST", "/api/v1/sessionsx", "", "", false},
	} {
		id, action, ok := sessionPath(c.method, c.path)
		if id != c.id || action != c.action || ok != c.ok {
			t.Errorf("sessionPath(%s %s): %q %q %v, want %q %q %v", c.method, c.path, id, action, ok, c.id, c.action, c.ok)
		}
	}
}
