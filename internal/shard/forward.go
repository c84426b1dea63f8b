package shard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/service"
)

// Calls for a shard this node does not run (its replicas are on other
// nodes: --shard-replicas, or a replica moved away) go to a node that runs
// it, over the raft port with the peers' TLS, as a follower forwards a
// write to its leader. The receiving node runs the call on its own service
// of that shard and never forwards it again, so calls cannot loop; its
// service forwards writes to the shard's leader as for any local call.

// Remote sends a routed call to another node (the server's, over the
// raft port): the answer's bytes, or an error when the node could not be
// reached or does not serve routed calls.
type Remote interface {
	Call(ctx context.Context, node string, body []byte) ([]byte, error)
	// Self is this node's id, All the initial cluster's node ids (the
	// replicas of a range without a replica set).
	Self() string
	All() []string
}

// routed is one routed call: op on the service of group Group, with the
// request's JSON and the fields its JSON form leaves out.
type routed struct {
	Group     uint64          `json:"group"`
	Op        string          `json:"op"`
	Name      string          `json:"name,omitempty"`
	Election  bool            `json:"election,omitempty"` // a revoke's: its JSON form leaves it out
	Stale     bool            `json:"stale,omitempty"`
	SessionID string          `json:"session_id,omitempty"`
	LeaseID   command.LeaseID `json:"lease_id"`
	Req       json.RawMessage `json:"req,omitempty"`
	// Bearer and CertCN are the caller's credentials (ACLs): the node that
	// runs the call authorizes it as the one that got it would. The raft
	// port is trusted with them as with forwarded writes (docs/security.md).
	Bearer string `json:"bearer,omitempty"`
	CertCN string `json:"cert_cn,omitempty"`
}

// routedAnswer is its answer: the response, the error, or both (a refused
// acquire answers who holds the lock and why).
type routedAnswer struct {
	Resp  json.RawMessage    `json:"resp,omitempty"`
	Err   *routedError       `json:"err,omitempty"`
	Stale *service.StaleRead `json:"stale,omitempty"`
}

type routedError struct {
	Code         apierror.Code `json:"code"`
	Message      string        `json:"message"`
	RetryAfterMs int64         `json:"retry_after_ms,omitempty"`
	FencingToken uint64        `json:"fencing_token,omitempty"`
}

// errNotHere is a node's answer to a call for a group it does not run
// (any more): the sender tries another replica.
const errNotHere = "not_here"

// ops are the calls a node serves for others: each decodes its request,
// calls the local service, and returns the answer and its staleness.
var ops = map[string]func(ctx context.Context, s *service.Service, in *routed) (any, *service.StaleRead, error){
	"acquire": func(ctx context.Context, s *service.Service, in *routed) (any, *service.StaleRead, error) {
		var q service.AcquireRequest
		return decodeCall(in, &q, func() (any, error) { q.Name = in.Name; return s.Acquire(ctx, q) })
	},
	"release": func(ctx context.Context, s *service.Service, in *routed) (any, *service.StaleRead, error) {
		var q service.ReleaseRequest
		return decodeCall(in, &q, func() (any, error) { q.Name = in.Name; return s.Release(ctx, q) })
	},
	"renew": func(ctx context.Context, s *service.Service, in *routed) (any, *service.StaleRead, error) {
		var q service.RenewRequest
		return decodeCall(in, &q, func() (any, error) { q.Name = in.Name; return s.Renew(ctx, q) })
	},
	"revoke": func(ctx context.Context, s *service.Service, in *routed) (any, *service.StaleRead, error) {
		var q service.RevokeRequest
		return decodeCall(in, &q, func() (any, error) { q.Name, q.Election = in.Name, in.Election; return s.Revoke(ctx, q) })
	},
	"history": func(ctx context.Context, s *service.Service, in *routed) (any, *service.StaleRead, error) {
		var q service.HistoryRequest
		return decodeCall(in, &q, func() (any, error) { return s.History(ctx, q) })
	},
	"campaign": func(ctx context.Context, s *service.Service, in *routed) (any, *service.StaleRead, error) {
		var q service.CampaignRequest
		return decodeCall(in, &q, func() (any, error) { q.Name = in.Name; return s.Campaign(ctx, q) })
	},
	"proclaim": func(ctx context.Context, s *service.Service, in *routed) (any, *service.StaleRead, error) {
		var q service.ProclaimRequest
		return decodeCall(in, &q, func() (any, error) { q.Name = in.Name; return s.Proclaim(ctx, q) })
	},
	"resign": func(ctx context.Context, s *service.Service, in *routed) (any, *service.StaleRead, error) {
		var q service.ResignRequest
		return decodeCall(in, &q, func() (any, error) { q.Name = in.Name; return s.Resign(ctx, q) })
	},
	"renew_election": func(ctx context.Context, s *service.Service, in *routed) (any, *service.StaleRead, error) {
		var q service.RenewRequest
		return decodeCall(in, &q, func() (any, error) { q.Name = in.Name; return s.RenewElection(ctx, q) })
	},
	"get_lock": func(ctx context.Context, s *service.Service, in *routed) (any, *service.StaleRead, error) {
		v, err := s.GetLock(ctx, in.Name, in.Stale)
		if v == nil {
			return nil, nil, err
		}
		return v, v.Stale, err
	},
	"get_election": func(ctx context.Context, s *service.Service, in *routed) (any, *service.StaleRead, error) {
		v, err := s.GetElection(ctx, in.Name, in.Stale)
		if v == nil {
			return nil, nil, err
		}
		return v, v.Stale, err
	},
	"list_locks": func(ctx context.Context, s *service.Service, in *routed) (any, *service.StaleRead, error) {
		var q service.ListRequest
		if err := json.Unmarshal(in.Req, &q); err != nil {
			return nil, nil, badRouted(err)
		}
		v, err := s.ListLocks(ctx, q)
		if v == nil {
			return nil, nil, err
		}
		return v, v.Stale, err
	},
	"list_elections": func(ctx context.Context, s *service.Service, in *routed) (any, *service.StaleRead, error) {
		var q service.ListRequest
		if err := json.Unmarshal(in.Req, &q); err != nil {
			return nil, nil, badRouted(err)
		}
		v, err := s.ListElections(ctx, q)
		if v == nil {
			return nil, nil, err
		}
		return v, v.Stale, err
	},
	"create_session": func(ctx context.Context, s *service.Service, in *routed) (any, *service.StaleRead, error) {
		var q service.CreateSessionRequest
		return decodeCall(in, &q, func() (any, error) { q.LeaseID = in.LeaseID; return s.CreateSession(ctx, q) })
	},
	"keepalive": func(ctx context.Context, s *service.Service, in *routed) (any, *service.StaleRead, error) {
		var q service.KeepAliveRequest
		return decodeCall(in, &q, func() (any, error) { q.SessionID = in.SessionID; return s.KeepAlive(ctx, q) })
	},
	"delete_session": func(ctx context.Context, s *service.Service, in *routed) (any, *service.StaleRead, error) {
		var q service.DeleteSessionRequest
		return decodeCall(in, &q, func() (any, error) { q.SessionID = in.SessionID; return s.DeleteSession(ctx, q) })
	},
	"split_children": func(ctx context.Context, s *service.Service, in *routed) (any, *service.StaleRead, error) {
		v, err := s.SplitChildren(ctx)
		return v, nil, err
	},
	"cluster": func(ctx context.Context, s *service.Service, in *routed) (any, *service.StaleRead, error) {
		v, err := s.Cluster(ctx)
		return v, nil, err
	},
	// watch_splits answers which groups were split off the shard and where,
	// for a merged watch resumed from a revision vector (router.go); like
	// split_children, it tells group ids and revisions, no names.
	"watch_splits": func(ctx context.Context, s *service.Service, in *routed) (any, *service.StaleRead, error) {
		var q struct {
			From uint64 `json:"from"`
		}
		if err := json.Unmarshal(in.Req, &q); err != nil {
			return nil, nil, badRouted(err)
		}
		out := splitsOf(s, q.From)
		return &out, nil, nil
	},
	"token_keys": func(ctx context.Context, s *service.Service, in *routed) (any, *service.StaleRead, error) {
		v, err := s.TokenKeys(ctx)
		return v, nil, err
	},
}

func decodeCall(in *routed, q any, call func() (any, error)) (any, *service.StaleRead, error) {
	if err := json.Unmarshal(in.Req, q); err != nil {
		return nil, nil, badRouted(err)
	}
	v, err := call()
	return v, nil, err
}

func badRouted(err error) error {
	return apierror.Wrap(apierror.InvalidArgument, err, "a routed call from another node could not be read: %v", err)
}

// routeWriteSlack is how long a routed call's answer may take beyond its
// wait: the forwarding server's own write timeout is shorter than the
// longest waits.
const routeWriteSlack = time.Minute

// ServeHTTP serves the calls other nodes route here (under
// raftnode.RoutePrefix), on this node's own services only.
func (r *Router) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if strings.HasSuffix(req.URL.Path, "/watch") {
		r.serveStream(w, req)
		return
	}
	body, err := io.ReadAll(io.LimitReader(req.Body, maxRoutedRequest+1))
	if err != nil || len(body) > maxRoutedRequest {
		http.Error(w, "bad routed call", http.StatusBadRequest)
		return
	}
	var in routed
	if err := json.Unmarshal(body, &in); err != nil {
		http.Error(w, "bad routed call: "+err.Error(), http.StatusBadRequest)
		return
	}
	op := ops[in.Op]
	if op == nil {
		http.Error(w, "unknown routed call "+strconv.Quote(in.Op), http.StatusBadRequest)
		return
	}
	// A queued acquire may wait up to command.MaxWaitMs.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(time.Duration(command.MaxWaitMs)*time.Millisecond + routeWriteSlack))
	v, _ := r.view()
	var svc *service.Service
	if k := v.m.IndexOfGroup(in.Group); k >= 0 {
		svc = v.shards[k]
	}
	var out routedAnswer
	if svc == nil {
		out.Err = &routedError{Code: errNotHere, Message: fmt.Sprintf("group %d is not running on this node", in.Group)}
	} else {
		ctx := service.WithBearer(service.WithCertIdentity(req.Context(), in.CertCN), in.Bearer)
		resp, stale, err := op(ctx, svc, &in)
		out.Stale = stale
		if rv := reflect.ValueOf(resp); resp != nil && !(rv.Kind() == reflect.Pointer && rv.IsNil()) {
			b, merr := json.Marshal(resp)
			if merr != nil {
				err = merr
			} else {
				out.Resp = b
			}
		}
		if err != nil {
			out.Err = wireErr(err)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(&out)
}

// maxRoutedRequest bounds a routed call (an acquire's value is the largest
// part, at most command.MaxValueLen).
const maxRoutedRequest = 1 << 20

func wireErr(err error) *routedError {
	ae := apierror.From(err)
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		ae = &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Message: "the call ended before the node that runs its shard answered; retry"}
	}
	return &routedError{Code: ae.Code, Message: ae.Message, RetryAfterMs: ae.RetryAfter.Milliseconds(), FencingToken: ae.FencingToken}
}

// remoteCall runs op for range k of v on a node that runs it, trying its
// replicas in turn (this node's preference first, so calls spread), and
// decodes the answer into a new T. It answers 503 when none could be
// reached.
func remoteCall[T any](ctx context.Context, r *Router, v *view, k int, in routed) (*T, *service.StaleRead, error) {
	rem := r.remote
	hosts := v.m.Hosts(k, rem.All())
	in.Group = v.m.Groups[k]
	in.Bearer, in.CertCN = service.Credentials(ctx)
	body, err := json.Marshal(&in)
	if err != nil {
		return nil, nil, apierror.Wrap(apierror.Internal, err, "encode a routed call")
	}
	var last error
	start := int(fnvString(rem.Self()) % uint64(max(len(hosts), 1)))
	for i := range hosts {
		node := hosts[(start+i)%len(hosts)]
		if node == rem.Self() {
			continue
		}
		b, err := rem.Call(ctx, node, body)
		if err != nil {
			last = err
			if ctx.Err() != nil {
				break
			}
			continue
		}
		var out routedAnswer
		if err := json.Unmarshal(b, &out); err != nil {
			last = fmt.Errorf("node %s answered a routed call badly: %w", node, err)
			continue
		}
		if out.Err != nil && out.Err.Code == errNotHere {
			last = errors.New(out.Err.Message)
			continue
		}
		var resp *T
		if len(out.Resp) > 0 {
			resp = new(T)
			if err := json.Unmarshal(out.Resp, resp); err != nil {
				return nil, nil, apierror.Wrap(apierror.Internal, err, "node %s answered a routed call badly", node)
			}
		}
		if out.Err != nil {
			return resp, out.Stale, &apierror.Error{Code: out.Err.Code, Message: out.Err.Message,
				RetryAfter: time.Duration(out.Err.RetryAfterMs) * time.Millisecond, FencingToken: out.Err.FencingToken}
		}
		if resp == nil {
			resp = new(T)
		}
		return resp, out.Stale, nil
	}
	return nil, nil, &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Err: last, Message: fmt.Sprintf(
		"shard %d runs on nodes %v, not this one, and none of them could be reached; retry", v.m.IDs[k], hosts)}
}

func fnvString(s string) uint64 {
	var h uint64 = 14695981039346656037
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}
