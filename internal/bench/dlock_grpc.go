package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	dlockv1 "github.com/dlock/dlock/api/dlock/v1"
	"github.com/dlock/dlock/internal/apierror"
)

// grpcCallTimeout bounds one gRPC call, as the HTTP path's client timeout
// does; an acquire that waits in line gets its wait_timeout_ms on top, so
// the deadline never cuts a wait short (which would withdraw it).
const grpcCallTimeout = 2 * time.Minute

// grpcClient talks to a dlock cluster over its gRPC API (dlock.v1), without
// TLS. Every call goes to the leader's endpoint: the one whose GetCluster
// answer names itself (node_id) as the leader (leader_id). It keeps conns
// ClientConns per endpoint and spreads the calls over the leader's in turn;
// each connection multiplexes its calls over HTTP/2.
type grpcClient struct {
	endpoints []string
	targets   map[string]*grpcTarget

	cur    atomic.Pointer[grpcTarget] // the leader (the first endpoint until found)
	next   atomic.Uint64              // round-robin over cur's connections
	search leaderSearch
}

// grpcTarget is one endpoint's connections and their stubs.
type grpcTarget struct {
	endpoint string
	conns    []*grpc.ClientConn
	locks    []dlockv1.LockServiceClient
	sessions []dlockv1.SessionServiceClient
	cluster  dlockv1.ClusterServiceClient
}

// newGRPCClient prepares conns connections per endpoint; they dial on first
// use, so only the leader's (and one per endpoint for GetCluster) connect.
func newGRPCClient(endpoints []string, conns int) (*grpcClient, error) {
	c := &grpcClient{targets: map[string]*grpcTarget{}}
	conns = max(conns, 1)
	for _, ep := range endpoints {
		ep = strings.TrimSpace(ep)
		if _, after, ok := strings.Cut(ep, "://"); ok {
			ep = after // tolerate grpc://host:port
		}
		if ep == "" || c.targets[ep] != nil {
			continue
		}
		t := &grpcTarget{endpoint: ep}
		for range conns {
			cc, err := grpc.NewClient(ep, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithNoProxy())
			if err != nil {
				c.close()
				return nil, fmt.Errorf("gRPC endpoint %q: %w", ep, err)
			}
			t.conns = append(t.conns, cc)
			t.locks = append(t.locks, dlockv1.NewLockServiceClient(cc))
			t.sessions = append(t.sessions, dlockv1.NewSessionServiceClient(cc))
		}
		t.cluster = dlockv1.NewClusterServiceClient(t.conns[0])
		c.targets[ep] = t
		c.endpoints = append(c.endpoints, ep)
	}
	if len(c.endpoints) == 0 {
		return nil, errors.New("no dlock gRPC endpoints")
	}
	c.cur.Store(c.targets[c.endpoints[0]])
	return c, nil
}

func (c *grpcClient) close() {
	for _, t := range c.targets {
		for _, cc := range t.conns {
			_ = cc.Close()
		}
	}
}

// pick is the connection index for the next call to the leader.
func (c *grpcClient) pick() (*grpcTarget, int) {
	t := c.cur.Load()
	return t, int(c.next.Add(1) % uint64(len(t.conns)))
}

func (c *grpcClient) lockStub() dlockv1.LockServiceClient {
	t, i := c.pick()
	return t.locks[i]
}

func (c *grpcClient) sessionStub() dlockv1.SessionServiceClient {
	t, i := c.pick()
	return t.sessions[i]
}

// discover asks every endpoint in turn for its view of the cluster and takes
// the first one that is itself the leader.
func (c *grpcClient) discover(ctx context.Context) (string, *clusterInfo, error) {
	var errs []error
	for _, ep := range c.endpoints {
		t := c.targets[ep]
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		r, err := t.cluster.GetCluster(cctx, &dlockv1.GetClusterRequest{})
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", ep, grpcError(err)))
			continue
		}
		cl := r.GetCluster()
		if cl.GetLeaderId() == "" {
			errs = append(errs, fmt.Errorf("%s: no leader known yet", ep))
			continue
		}
		if cl.GetNodeId() != cl.GetLeaderId() {
			errs = append(errs, fmt.Errorf("%s: node %s, not the leader %s", ep, cl.GetNodeId(), cl.GetLeaderId()))
			continue
		}
		c.cur.Store(t)
		c.search.mark()
		return ep, clusterFromPB(cl), nil
	}
	return "", nil, fmt.Errorf("find the dlock leader's gRPC endpoint (--grpc-endpoints must list every node's): %w", errors.Join(errs...))
}

// waitLeader retries discover until it succeeds or within passes.
func (c *grpcClient) waitLeader(ctx context.Context, within time.Duration) (string, *clusterInfo, error) {
	return c.search.wait(ctx, within, c.discover)
}

func (c *grpcClient) rediscover(ctx context.Context) { c.search.again(ctx, c.discover) }

// clusterFromPB is the gRPC Cluster in the HTTP answer's shape; its members'
// HTTP API addresses serve /metrics and watch streams.
func clusterFromPB(cl *dlockv1.Cluster) *clusterInfo {
	ci := &clusterInfo{NodeID: cl.GetNodeId(), LeaderID: cl.GetLeaderId(), LeaderAPI: cl.GetLeaderApiAddr(), Term: cl.GetTerm(),
		CommitIndex: cl.GetCommitIndex(), AppliedIndex: cl.GetAppliedIndex()}
	for _, m := range cl.GetMembers() {
		ci.Members = append(ci.Members, clusterMember{ID: m.GetId(), APIAddr: m.GetApiAddr()})
	}
	return ci
}

// grpcCall makes one unary call under the per-call timeout (plus extra) and
// maps its error.
func grpcCall[Req, Resp any](ctx context.Context, extra time.Duration, call func(context.Context, Req, ...grpc.CallOption) (Resp, error), req Req) (Resp, error) {
	ctx, cancel := context.WithTimeout(ctx, grpcCallTimeout+extra)
	defer cancel()
	resp, err := call(ctx, req)
	return resp, grpcError(err)
}

func (c *grpcClient) acquire(ctx context.Context, name string, req acquireReq) (*acquireResp, error) {
	r, err := grpcCall(ctx, time.Duration(req.WaitTimeoutMs)*time.Millisecond, c.lockStub().Acquire, &dlockv1.AcquireRequest{
		Name: name, ClientId: req.ClientID, TtlMs: req.TTLms, SessionId: req.SessionID, WaitTimeoutMs: req.WaitTimeoutMs, Takeover: req.Takeover,
		Limit: req.Limit, Mode: req.Mode})
	if err != nil {
		return nil, err
	}
	if !r.GetAcquired() {
		return nil, fmt.Errorf("acquire %s: answer OK without acquired:true", name)
	}
	return &acquireResp{Acquired: true, FencingToken: r.GetFencingToken(), LeaseID: r.GetLeaseId(), Revision: r.GetRevision()}, nil
}

func (c *grpcClient) release(ctx context.Context, name string, req holderReq) error {
	_, err := grpcCall(ctx, 0, c.lockStub().Release, &dlockv1.ReleaseRequest{Name: name, ClientId: req.ClientID, FencingToken: req.FencingToken, LeaseId: req.LeaseID})
	return err
}

func (c *grpcClient) renew(ctx context.Context, name string, req holderReq) error {
	_, err := grpcCall(ctx, 0, c.lockStub().Renew, &dlockv1.RenewRequest{Name: name, ClientId: req.ClientID, FencingToken: req.FencingToken, LeaseId: req.LeaseID})
	return err
}

func (c *grpcClient) createSession(ctx context.Context, clientID string, ttl time.Duration) (string, error) {
	r, err := grpcCall(ctx, 0, c.sessionStub().CreateSession, &dlockv1.CreateSessionRequest{ClientId: clientID, TtlMs: ttl.Milliseconds()})
	if err != nil {
		return "", err
	}
	return r.GetSessionId(), nil
}

func (c *grpcClient) keepAlive(ctx context.Context, id string) error {
	_, err := grpcCall(ctx, 0, c.sessionStub().KeepAlive, &dlockv1.KeepAliveRequest{SessionId: id})
	return err
}

func (c *grpcClient) deleteSession(ctx context.Context, id string) error {
	_, err := grpcCall(ctx, 0, c.sessionStub().DeleteSession, &dlockv1.DeleteSessionRequest{SessionId: id})
	return err
}

// grpcError turns a failed call's status into an *apiError, as the HTTP path
// reads an error body: Code is the dlock code from the status's ErrorDetail and
// Status that code's HTTP status (apierror's table), so a refusal counts and
// retries the same over either protocol (503 no_leader/unavailable and 429
// are retryable, 409 lock_held is not). A status without an ErrorDetail comes
// from gRPC itself, not from dlock: a deadline or cancellation of the call is
// returned as is (retryable, counted as a timeout, like an HTTP client
// timeout); anything else gets the code "grpc_<code>" and the HTTP status
// closest to its gRPC code (UNAVAILABLE, e.g. a refused connection, is 503).
func grpcError(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	ae := &apiError{Message: st.Message(), GRPC: st.Code().String()}
	for _, d := range st.Details() {
		if ed, ok := d.(*dlockv1.ErrorDetail); ok && ed.GetCode() != "" {
			ae.Code = ed.GetCode()
			break
		}
	}
	if ae.Code != "" {
		ae.Status = apierror.HTTPStatus(apierror.Code(ae.Code))
		if ae.Status == http.StatusInternalServerError && ae.Code != string(apierror.Internal) {
			// A code newer than this build: go by the gRPC code.
			ae.Status = grpcHTTPStatus(st.Code())
		}
		return ae
	}
	switch st.Code() {
	case codes.DeadlineExceeded, codes.Canceled:
		return err
	}
	ae.Code = "grpc_" + strings.ToLower(st.Code().String())
	ae.Status = grpcHTTPStatus(st.Code())
	return ae
}

// grpcHTTPStatus is the HTTP status closest to a gRPC code, for statuses
// without a dlock code.
func grpcHTTPStatus(c codes.Code) int {
	switch c {
	case codes.InvalidArgument, codes.OutOfRange:
		return http.StatusBadRequest
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.NotFound:
		return http.StatusNotFound
	case codes.AlreadyExists, codes.Aborted, codes.FailedPrecondition:
		return http.StatusConflict
	case codes.ResourceExhausted:
		return http.StatusTooManyRequests
	case codes.Unimplemented:
		return http.StatusNotImplemented
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}
