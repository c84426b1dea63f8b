package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"strings"

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
// linearizable history. Sessions, elections and reads stay on HTTP.

// protocolOf says how a client sends its lock calls: c1 and c3 over gRPC,
// c5 over the WebSocket API, everyone else (and every other call) over HTTP.
func protocolOf(id string) string {
	switch id {
	case "c1", "c3":
		return "grpc"
	case "c5":
		return "ws"
	}
	return "http"
}

// grpcConns keeps one connection per node; they reconnect by themselves
// after a node restarts.
type grpcConns struct {
	locks []dlockv1.LockServiceClient
	conns []*grpc.ClientConn
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
	}
	return g, nil
}

func (g *grpcConns) close() {
	for _, cc := range g.conns {
		_ = cc.Close()
	}
}

// send makes one attempt of a lock call over gRPC. handled is false for a
// call it does not carry (the caller then uses HTTP).
func (g *grpcConns) send(ctx context.Context, node int, method, path string, body any) (code int, answer []byte, handled bool, err error) {
	name, action, ok := lockCall(method, path)
	if !ok {
		return 0, nil, false, nil
	}
	lc := g.locks[node]
	var out any
	var callErr error
	switch action {
	case "acquire":
		b, ok := body.(acquireBody)
		if !ok {
			return 0, nil, false, nil
		}
		var r *dlockv1.AcquireResponse
		r, callErr = lc.Acquire(ctx, &dlockv1.AcquireRequest{Name: name, ClientId: b.ClientID, TtlMs: b.TTLms,
			SessionId: b.SessionID, WaitTimeoutMs: b.WaitTimeoutMs, RequestId: b.RequestID, Takeover: b.Takeover,
			Limit: int64(b.Limit), Mode: b.Mode, Subtree: b.Subtree})
		if callErr == nil {
			out = map[string]any{"acquired": r.Acquired, "fencing_token": r.FencingToken, "lease_id": r.LeaseId,
				"token_proof": r.TokenProof, "lease_ref": r.LeaseRef}
		}
	case "release", "renew":
		b, ok := body.(tokenBody)
		if !ok {
			return 0, nil, false, nil
		}
		if action == "release" {
			var r *dlockv1.ReleaseResponse
			r, callErr = lc.Release(ctx, &dlockv1.ReleaseRequest{Name: name, ClientId: b.ClientID, FencingToken: b.FencingToken,
				LeaseId: b.LeaseID, RequestId: b.RequestID})
			if callErr == nil {
				out = map[string]any{"released": r.Released}
			}
		} else {
			var r *dlockv1.RenewResponse
			r, callErr = lc.Renew(ctx, &dlockv1.RenewRequest{Name: name, ClientId: b.ClientID, FencingToken: b.FencingToken,
				LeaseId: b.LeaseID, RequestId: b.RequestID})
			if callErr == nil {
				out = map[string]any{"renewed": r.Renewed}
			}
		}
	default:
		return 0, nil, false, nil
	}
	if callErr == nil {
		data, err := json.Marshal(out)
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
	rest, found := strings.CutPrefix(path, "/api/v1/locks/")
	i := strings.LastIndexByte(rest, '/')
	if !found || method != "POST" || i < 0 {
		return "", "", false
	}
	return rest[:i], rest[i+1:], true
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
