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
	"github.com/dlock/dlock/internal/raftnode"
	"github.com/dlock/dlock/internal/service"
)

// Calls for a shard this node does not run (its replicas are on other
// nodes: --shard-replicas, or a replica moved away) go to a node that runs
// it, over the raft port with the peers' TLS, as a follower forwards a
// write to its leader. The receiving node runs the call on its own service
// of that shard and never forwards it again, so calls cannot loop; its
// service forwards writes to the shard's leader as for any local call. A
// replica that does not start reading a call in time (paused, cut off)
// never gets it, and the call goes to the next replica (remoteCall).

// Remote sends a routed call to another node (the server's, over the
// raft port): the answer's bytes, or an error when the node could not be
// reached or does not serve routed calls.
type Remote interface {
	// Call sends body to node. accept, when above zero, bounds how long
	// the node may take to start reading the call; past it the call is
	// abandoned unsent. An error wrapping raftnode.ErrNotSent (with
	// raftnode.ErrNotAccepted when accept passed) or ErrRefused means the
	// node did not run the call; any other error may come after it ran.
	Call(ctx context.Context, node string, body []byte, accept time.Duration) ([]byte, error)
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
	var in routed
	if !readRouted(w, req, maxRoutedRequest, "routed call", &in) {
		return
	}
	op := ops[in.Op]
	if op == nil {
		http.Error(w, "unknown routed call "+strconv.Quote(in.Op), http.StatusBadRequest)
		return
	}
	// A queued acquire may wait up to command.MaxWaitMs.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(time.Duration(command.MaxWaitMs)*time.Millisecond + routeWriteSlack))
	var out routedAnswer
	if svc := r.local(in.Group); svc == nil {
		out.Err = notHere(in.Group)
	} else {
		resp, stale, err := op(asCaller(req.Context(), in.Bearer, in.CertCN), svc, &in)
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

// readRouted reads what another node routed here (a call or a stream's
// request): a JSON body of at most limit bytes, into in. A bad one is
// answered 400 here, and readRouted reports false. Reading the body is
// what accepts the call: the sender withholds it until then (Remote).
func readRouted(w http.ResponseWriter, req *http.Request, limit int, what string, in any) bool {
	body, err := io.ReadAll(io.LimitReader(req.Body, int64(limit)+1))
	if err != nil || len(body) > limit {
		http.Error(w, "bad "+what, http.StatusBadRequest)
		return false
	}
	if err := json.Unmarshal(body, in); err != nil {
		http.Error(w, "bad "+what+": "+err.Error(), http.StatusBadRequest)
		return false
	}
	return true
}

// local is this node's service of Raft group g, nil when it does not run
// the group (any more).
func (r *Router) local(g uint64) *service.Service {
	v, _ := r.view()
	if k := v.m.IndexOfGroup(g); k >= 0 {
		return v.shards[k]
	}
	return nil
}

// notHere answers a routed call or stream for a group this node does not
// run: the sender tries another replica.
func notHere(g uint64) *routedError {
	return &routedError{Code: errNotHere, Message: fmt.Sprintf("group %d is not running on this node", g)}
}

// asCaller is ctx with the credentials a routed call carries: the call
// runs here as the caller, ACL checks included.
func asCaller(ctx context.Context, bearer, certCN string) context.Context {
	return service.WithBearer(service.WithCertIdentity(ctx, certCN), bearer)
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
// replicas in turn (pick.order: the one that answered last first, one that
// lately did not accept a call last), and decodes the answer into a new T.
//
// Each replica but the last tried gets pick's accept bound to start reading
// the call; one that does not (paused, cut off, overloaded) never got it,
// so the call goes on to the next. A call a replica received but whose
// answer was lost goes on only if running it twice is harmless (resendable);
// otherwise its outcome is unknown and the caller is told so. It answers
// 503 when no replica could be reached.
func remoteCall[T any](ctx context.Context, r *Router, v *view, k int, in routed) (*T, *service.StaleRead, error) {
	rem := r.Remote()
	hosts := v.m.Hosts(k, rem.All())
	in.Group = v.m.Groups[k]
	in.Bearer, in.CertCN = service.Credentials(ctx)
	body, err := json.Marshal(&in)
	if err != nil {
		return nil, nil, apierror.Wrap(apierror.Internal, err, "encode a routed call")
	}
	var last error
	order := r.pick.order(in.Group, hosts, rem.Self(), time.Now())
	for i, node := range order {
		accept := r.pick.acceptBound()
		if i == len(order)-1 {
			// The last replica is waited for as long as the call may take:
			// a slow one still answers.
			accept = 0
		}
		b, err := rem.Call(ctx, node, body, accept)
		if err != nil {
			last = err
			if ctx.Err() != nil {
				if !errors.Is(err, raftnode.ErrNotSent) && !errors.Is(err, ErrRefused) && !resendable(&in) {
					return nil, nil, outcomeUnknown(node, v.m.IDs[k], err)
				}
				break
			}
			switch {
			case errors.Is(err, raftnode.ErrNotSent):
				r.pick.bench(in.Group, node, time.Now())
				continue
			case errors.Is(err, ErrRefused):
				continue
			case resendable(&in):
				continue
			}
			return nil, nil, outcomeUnknown(node, v.m.IDs[k], err)
		}
		var out routedAnswer
		if err := json.Unmarshal(b, &out); err != nil {
			last = fmt.Errorf("node %s answered a routed call badly: %w", node, err)
			if resendable(&in) {
				continue
			}
			return nil, nil, outcomeUnknown(node, v.m.IDs[k], last)
		}
		if out.Err != nil && out.Err.Code == errNotHere {
			last = errors.New(out.Err.Message)
			continue
		}
		r.pick.answered(in.Group, node)
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

// ErrRefused wraps a Remote.Call error for an answer other than the
// router's (a node not serving routed calls yet, a bad request): the node
// did not run the call.
var ErrRefused = errors.New("the node refused the routed call")

// idempotentOps change nothing, or nothing a second time: a routed call of
// one whose answer was lost is sent to another replica.
var idempotentOps = map[string]bool{
	"get_lock": true, "get_election": true, "list_locks": true, "list_elections": true, "history": true,
	"split_children": true, "cluster": true, "watch_splits": true, "token_keys": true,
	// A keepalive only renews (command.KeepAlive is idempotent).
	"keepalive": true,
}

// resendable reports whether a call that may have run can be sent again:
// it changes nothing, or it is a write with a request_id, which the
// shard's dedup table answers with the first outcome instead of acting
// twice (the router gives waiting acquires and campaigns one of its own).
func resendable(in *routed) bool {
	if idempotentOps[in.Op] {
		return true
	}
	var q struct {
		RequestID string `json:"request_id"`
	}
	return json.Unmarshal(in.Req, &q) == nil && q.RequestID != ""
}

// outcomeUnknown answers a write without a request_id that reached a
// replica whose answer then was lost.
func outcomeUnknown(node string, shardID int, cause error) error {
	return &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Err: cause, Message: fmt.Sprintf(
		"the request reached node %s (a replica of shard %d) but its answer was lost, so its outcome is unknown and it was not sent again (it would act twice); read the state before you retry, and send writes with a request_id to make retries safe", node, shardID)}
}

func fnvString(s string) uint64 {
	var h uint64 = 14695981039346656037
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}
