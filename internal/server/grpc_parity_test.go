package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	dlockv1 "github.com/dlock/dlock/api/dlock/v1"
	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/testcluster"
)

// outcome is one call's answer in protocol-neutral form: the dlock error code
// ("" on success), the protocol's own status, the message, and the answer
// decoded into the service's types (for lock_held and wait_timeout, the
// holder or current leader that came with the error).
type outcome struct {
	code    string
	status  int
	message string
	body    any
}

// transport makes the same calls over one protocol.
type transport interface {
	acquire(service.AcquireRequest) outcome
	release(service.ReleaseRequest) outcome
	renew(service.RenewRequest) outcome
	getLock(name string) outcome
	listLocks(service.ListRequest) outcome
	createSession(service.CreateSessionRequest) outcome
	keepAlive(service.KeepAliveRequest) outcome
	deleteSession(service.DeleteSessionRequest) outcome
	campaign(service.CampaignRequest) outcome
	getElection(name string) outcome
	proclaim(service.ProclaimRequest) outcome
	resign(service.ResignRequest) outcome
	renewElection(service.RenewRequest) outcome
	// wantStatus is the protocol status a dlock code must map to.
	wantStatus(code string) int
}

// ---- HTTP ----

type httpTransport struct {
	c    *testcluster.Cluster
	base string
}

func (h *httpTransport) do(method, path string, body any, out any) outcome {
	var raw json.RawMessage
	code, err := h.c.Do(context.Background(), method, h.base+path, body, &raw)
	if err != nil {
		return outcome{code: "transport: " + err.Error()}
	}
	if code/100 == 2 {
		if err := json.Unmarshal(raw, out); err != nil {
			return outcome{code: "decode: " + err.Error()}
		}
		return outcome{status: code, body: out}
	}
	var e struct {
		Error   struct{ Code, Message string } `json:"error"`
		Holder  *service.Holder                `json:"holder"`
		Current *service.ElectionLeader        `json:"current"`
		Limit   int                            `json:"limit"`
	}
	_ = json.Unmarshal(raw, &e)
	o := outcome{code: e.Error.Code, status: code, message: e.Error.Message}
	switch out.(type) {
	case *service.AcquireResponse:
		o.body = &service.AcquireResponse{Holder: e.Holder, Limit: e.Limit}
	case *service.CampaignResponse:
		o.body = &service.CampaignResponse{Current: e.Current}
	}
	return o
}

func (h *httpTransport) wantStatus(code string) int { return apierror.HTTPStatus(apierror.Code(code)) }

func (h *httpTransport) acquire(r service.AcquireRequest) outcome {
	return h.do("POST", "/locks/"+r.Name+"/acquire", r, &service.AcquireResponse{})
}
func (h *httpTransport) release(r service.ReleaseRequest) outcome {
	return h.do("POST", "/locks/"+r.Name+"/release", r, &service.ReleaseResponse{})
}
func (h *httpTransport) renew(r service.RenewRequest) outcome {
	return h.do("POST", "/locks/"+r.Name+"/renew", r, &service.RenewResponse{})
}
func (h *httpTransport) getLock(name string) outcome {
	return h.do("GET", "/locks/"+name, nil, &service.LockView{})
}
func (h *httpTransport) listLocks(r service.ListRequest) outcome {
	return h.do("GET", fmt.Sprintf("/locks?prefix=%s&limit=%d", url.QueryEscape(r.Prefix), r.Limit), nil, &service.ListResponse{})
}
func (h *httpTransport) createSession(r service.CreateSessionRequest) outcome {
	return h.do("POST", "/sessions", r, &service.SessionResponse{})
}
func (h *httpTransport) keepAlive(r service.KeepAliveRequest) outcome {
	return h.do("POST", "/sessions/"+r.SessionID+"/keepalive", r, &service.SessionResponse{})
}
func (h *httpTransport) deleteSession(r service.DeleteSessionRequest) outcome {
	return h.do("DELETE", "/sessions/"+r.SessionID, r, &service.DeleteSessionResponse{})
}
func (h *httpTransport) campaign(r service.CampaignRequest) outcome {
	return h.do("POST", "/elections/"+r.Name+"/campaign", r, &service.CampaignResponse{})
}
func (h *httpTransport) getElection(name string) outcome {
	return h.do("GET", "/elections/"+name, nil, &service.ElectionView{})
}
func (h *httpTransport) proclaim(r service.ProclaimRequest) outcome {
	return h.do("POST", "/elections/"+r.Name+"/proclaim", r, &service.ProclaimResponse{})
}
func (h *httpTransport) resign(r service.ResignRequest) outcome {
	return h.do("POST", "/elections/"+r.Name+"/resign", r, &service.ResignResponse{})
}
func (h *httpTransport) renewElection(r service.RenewRequest) outcome {
	body := map[string]any{"candidate_id": r.ClientID, "fencing_token": r.FencingToken, "lease_id": r.LeaseID}
	if r.TTLms != 0 {
		body["ttl_ms"] = r.TTLms
	}
	return h.do("POST", "/elections/"+r.Name+"/renew", body, &service.RenewResponse{})
}

// ---- gRPC ----

func dialGRPC(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

type grpcTransport struct {
	locks     dlockv1.LockServiceClient
	sessions  dlockv1.SessionServiceClient
	elections dlockv1.ElectionServiceClient
}

func newGRPCTransport(cc *grpc.ClientConn) *grpcTransport {
	return &grpcTransport{dlockv1.NewLockServiceClient(cc), dlockv1.NewSessionServiceClient(cc), dlockv1.NewElectionServiceClient(cc)}
}

func (g *grpcTransport) wantStatus(code string) int {
	return int(apierror.GRPCCode(apierror.Code(code)))
}

func tm(ts *timestamppb.Timestamp) time.Time {
	if ts == nil {
		return time.Time{}
	}
	return ts.AsTime()
}

func holderOf(h *dlockv1.Holder) *service.Holder {
	if h == nil {
		return nil
	}
	return &service.Holder{ClientID: h.ClientId, FencingToken: h.FencingToken, GrantedAt: tm(h.GrantedAt), ExpiresAt: tm(h.ExpiresAt),
		Mode: h.Mode, Subtree: h.Subtree, Lock: h.Lock}
}

func leaderOf(l *dlockv1.ElectionLeader) *service.ElectionLeader {
	if l == nil {
		return nil
	}
	return &service.ElectionLeader{CandidateID: l.CandidateId, Value: l.Value, FencingToken: l.FencingToken, Since: tm(l.Since), ExpiresAt: tm(l.ExpiresAt)}
}

func lockOf(l *dlockv1.Lock) service.LockView {
	v := service.LockView{Name: l.Name, Held: l.Held, Holder: holderOf(l.Holder), Waiters: int(l.Waiters), Revision: l.Revision,
		Limit: int(l.Limit), Mode: l.Mode, Subtree: l.Subtree, Holders: []service.Holder{}}
	for _, h := range l.Holders {
		v.Holders = append(v.Holders, *holderOf(h))
	}
	return v
}

func electionOf(e *dlockv1.Election) *service.ElectionView {
	return &service.ElectionView{Name: e.Name, Leader: leaderOf(e.Leader), Campaigners: int(e.Campaigners), Revision: e.Revision}
}

// grpcOutcome turns a call's result into an outcome; on error the
// ErrorDetail gives the dlock code and, for conflicts, conflict builds the
// body from it.
func grpcOutcome[P any](resp P, err error, ok func(P) any, conflict func(*dlockv1.ErrorDetail) any) outcome {
	if err == nil {
		return outcome{status: int(codes.OK), body: ok(resp)}
	}
	st := status.Convert(err)
	o := outcome{status: int(st.Code()), message: st.Message(), code: "no ErrorDetail"}
	for _, d := range st.Details() {
		if ed, isED := d.(*dlockv1.ErrorDetail); isED {
			o.code = ed.Code
			if conflict != nil {
				o.body = conflict(ed)
			}
		}
	}
	return o
}

var bg = context.Background()

func (g *grpcTransport) acquire(r service.AcquireRequest) outcome {
	resp, err := g.locks.Acquire(bg, &dlockv1.AcquireRequest{Name: r.Name, ClientId: r.ClientID, TtlMs: r.TTLms, SessionId: r.SessionID,
		WaitTimeoutMs: r.WaitTimeoutMs, RequestId: r.RequestID, Takeover: r.Takeover, Limit: r.Limit, Mode: r.Mode, Subtree: r.Subtree})
	return grpcOutcome(resp, err, func(p *dlockv1.AcquireResponse) any {
		return &service.AcquireResponse{Acquired: p.Acquired, FencingToken: p.FencingToken, TokenProof: p.TokenProof, LeaseRef: p.LeaseRef, ExpiresAt: tm(p.ExpiresAt), LeaseID: p.LeaseId, Revision: p.Revision}
	}, func(d *dlockv1.ErrorDetail) any {
		return &service.AcquireResponse{Holder: holderOf(d.Holder), Limit: int(d.Limit)}
	})
}

func (g *grpcTransport) release(r service.ReleaseRequest) outcome {
	resp, err := g.locks.Release(bg, &dlockv1.ReleaseRequest{Name: r.Name, ClientId: r.ClientID, FencingToken: r.FencingToken, LeaseId: r.LeaseID})
	return grpcOutcome(resp, err, func(p *dlockv1.ReleaseResponse) any {
		return &service.ReleaseResponse{Released: p.Released, Revision: p.Revision}
	}, nil)
}

func (g *grpcTransport) renew(r service.RenewRequest) outcome {
	resp, err := g.locks.Renew(bg, &dlockv1.RenewRequest{Name: r.Name, ClientId: r.ClientID, FencingToken: r.FencingToken, LeaseId: r.LeaseID, TtlMs: r.TTLms})
	return grpcOutcome(resp, err, func(p *dlockv1.RenewResponse) any {
		return &service.RenewResponse{Renewed: p.Renewed, ExpiresAt: tm(p.ExpiresAt), TTLms: p.TtlMs, Revision: p.Revision}
	}, nil)
}

func (g *grpcTransport) getLock(name string) outcome {
	resp, err := g.locks.GetLock(bg, &dlockv1.GetLockRequest{Name: name})
	return grpcOutcome(resp, err, func(p *dlockv1.GetLockResponse) any { v := lockOf(p.Lock); return &v }, nil)
}

func (g *grpcTransport) listLocks(r service.ListRequest) outcome {
	resp, err := g.locks.ListLocks(bg, &dlockv1.ListLocksRequest{Prefix: r.Prefix, Limit: int32(r.Limit)})
	return grpcOutcome(resp, err, func(p *dlockv1.ListLocksResponse) any {
		out := &service.ListResponse{Locks: []service.LockView{}, More: p.More, Revision: p.Revision}
		for _, l := range p.Locks {
			out.Locks = append(out.Locks, lockOf(l))
		}
		return out
	}, nil)
}

func (g *grpcTransport) createSession(r service.CreateSessionRequest) outcome {
	resp, err := g.sessions.CreateSession(bg, &dlockv1.CreateSessionRequest{ClientId: r.ClientID, TtlMs: r.TTLms})
	return grpcOutcome(resp, err, func(p *dlockv1.CreateSessionResponse) any {
		return &service.SessionResponse{SessionID: p.SessionId, TTLms: p.TtlMs, ExpiresAt: tm(p.ExpiresAt), Revision: p.Revision}
	}, nil)
}

func (g *grpcTransport) keepAlive(r service.KeepAliveRequest) outcome {
	resp, err := g.sessions.KeepAlive(bg, &dlockv1.KeepAliveRequest{SessionId: r.SessionID, ClientId: r.ClientID})
	return grpcOutcome(resp, err, func(p *dlockv1.KeepAliveResponse) any {
		return &service.SessionResponse{SessionID: p.SessionId, TTLms: p.TtlMs, ExpiresAt: tm(p.ExpiresAt), Revision: p.Revision}
	}, nil)
}

func (g *grpcTransport) deleteSession(r service.DeleteSessionRequest) outcome {
	resp, err := g.sessions.DeleteSession(bg, &dlockv1.DeleteSessionRequest{SessionId: r.SessionID, ClientId: r.ClientID})
	return grpcOutcome(resp, err, func(p *dlockv1.DeleteSessionResponse) any {
		return &service.DeleteSessionResponse{Deleted: p.Deleted, Revision: p.Revision}
	}, nil)
}

func (g *grpcTransport) campaign(r service.CampaignRequest) outcome {
	resp, err := g.elections.Campaign(bg, &dlockv1.CampaignRequest{Name: r.Name, CandidateId: r.CandidateID, Value: r.Value, TtlMs: r.TTLms,
		SessionId: r.SessionID, WaitTimeoutMs: r.WaitTimeoutMs, Takeover: r.Takeover})
	return grpcOutcome(resp, err, func(p *dlockv1.CampaignResponse) any {
		return &service.CampaignResponse{Leader: p.Leader, FencingToken: p.FencingToken, TokenProof: p.TokenProof, LeaseRef: p.LeaseRef, ExpiresAt: tm(p.ExpiresAt), LeaseID: p.LeaseId, Revision: p.Revision}
	}, func(d *dlockv1.ErrorDetail) any { return &service.CampaignResponse{Current: leaderOf(d.Current)} })
}

func (g *grpcTransport) getElection(name string) outcome {
	resp, err := g.elections.GetElection(bg, &dlockv1.GetElectionRequest{Name: name})
	return grpcOutcome(resp, err, func(p *dlockv1.GetElectionResponse) any { return electionOf(p.Election) }, nil)
}

func (g *grpcTransport) proclaim(r service.ProclaimRequest) outcome {
	resp, err := g.elections.Proclaim(bg, &dlockv1.ProclaimRequest{Name: r.Name, CandidateId: r.CandidateID, FencingToken: r.FencingToken,
		LeaseId: r.LeaseID, Value: r.Value})
	return grpcOutcome(resp, err, func(p *dlockv1.ProclaimResponse) any {
		return &service.ProclaimResponse{Proclaimed: p.Proclaimed, Revision: p.Revision}
	}, nil)
}

func (g *grpcTransport) resign(r service.ResignRequest) outcome {
	resp, err := g.elections.Resign(bg, &dlockv1.ResignRequest{Name: r.Name, CandidateId: r.CandidateID, FencingToken: r.FencingToken, LeaseId: r.LeaseID})
	return grpcOutcome(resp, err, func(p *dlockv1.ResignResponse) any {
		return &service.ResignResponse{Resigned: p.Resigned, Revision: p.Revision}
	}, nil)
}

func (g *grpcTransport) renewElection(r service.RenewRequest) outcome {
	resp, err := g.elections.RenewElection(bg, &dlockv1.RenewElectionRequest{Name: r.Name, CandidateId: r.ClientID, FencingToken: r.FencingToken,
		LeaseId: r.LeaseID, TtlMs: r.TTLms})
	return grpcOutcome(resp, err, func(p *dlockv1.RenewElectionResponse) any {
		return &service.RenewResponse{Renewed: p.Renewed, ExpiresAt: tm(p.ExpiresAt), TTLms: p.TtlMs, Revision: p.Revision}
	}, nil)
}

// ---- the shared table ----

// fixture is what earlier steps learned (ids and tokens) for later ones; each
// protocol has its own, and its own name prefix ns.
type fixture struct {
	ns            string
	token         uint64
	lease         string
	session       string
	electionToken uint64
	electionLease string
	// oldToken and oldLease are a grant taken over since.
	oldToken uint64
	oldLease string
}

type parityStep struct {
	name string
	call func(tr transport, f *fixture) outcome
	// code is the dlock error code the call must end with ("" for success).
	code string
	// check looks at a successful or conflict answer and may record ids.
	check func(t *testing.T, f *fixture, body any)
}

var unknownID = strings.Repeat("ab", 16)

func parityTable() []parityStep {
	lock := func(f *fixture) string { return f.ns + "/a" }
	return []parityStep{
		{"acquire free lock", func(tr transport, f *fixture) outcome {
			return tr.acquire(service.AcquireRequest{Name: lock(f), ClientID: "owner", TTLms: 60000, RequestID: "r-" + f.ns})
		}, "", func(t *testing.T, f *fixture, b any) {
			a := b.(*service.AcquireResponse)
			if !a.Acquired || a.FencingToken == 0 || len(a.LeaseID) != 32 || a.ExpiresAt.IsZero() {
				t.Fatalf("grant %+v", a)
			}
			f.token, f.lease = a.FencingToken, a.LeaseID
		}},
		{"retried acquire returns the first answer", func(tr transport, f *fixture) outcome {
			return tr.acquire(service.AcquireRequest{Name: lock(f), ClientID: "owner", TTLms: 60000, RequestID: "r-" + f.ns})
		}, "", func(t *testing.T, f *fixture, b any) {
			if a := b.(*service.AcquireResponse); a.FencingToken != f.token || a.LeaseID != f.lease {
				t.Fatalf("retry answered %+v, first was token %d", a, f.token)
			}
		}},
		// Knowing the holder's client_id takes nothing: a new lease of the
		// same client_id is refused like anyone else's...
		{"same client with a new lease, without takeover: lock_held", func(tr transport, f *fixture) outcome {
			return tr.acquire(service.AcquireRequest{Name: lock(f), ClientID: "owner", TTLms: 60000})
		}, "lock_held", func(t *testing.T, f *fixture, b any) {
			if h := b.(*service.AcquireResponse).Holder; h == nil || h.ClientID != "owner" || h.FencingToken != f.token {
				t.Fatalf("holder %+v", h)
			}
		}},
		{"same client with a new lease, without takeover: wait_timeout", func(tr transport, f *fixture) outcome {
			return tr.acquire(service.AcquireRequest{Name: lock(f), ClientID: "owner", TTLms: 60000, WaitTimeoutMs: 200})
		}, "wait_timeout", nil},
		{"the holder still renews", func(tr transport, f *fixture) outcome {
			return tr.renew(service.RenewRequest{Name: lock(f), ClientID: "owner", FencingToken: f.token, LeaseID: f.lease})
		}, "", nil},
		// ...and takes over only when it asks to.
		{"same client with a new lease and takeover takes over", func(tr transport, f *fixture) outcome {
			return tr.acquire(service.AcquireRequest{Name: lock(f), ClientID: "owner", TTLms: 60000, Takeover: true})
		}, "", func(t *testing.T, f *fixture, b any) {
			a := b.(*service.AcquireResponse)
			if a.FencingToken <= f.token || a.LeaseID == f.lease {
				t.Fatalf("takeover %+v after token %d", a, f.token)
			}
			f.oldToken, f.oldLease = f.token, f.lease
			f.token, f.lease = a.FencingToken, a.LeaseID
		}},
		{"the lease taken over no longer renews", func(tr transport, f *fixture) outcome {
			return tr.renew(service.RenewRequest{Name: lock(f), ClientID: "owner", FencingToken: f.oldToken, LeaseID: f.oldLease})
		}, "not_holder", nil},
		{"takeover by another client is an ordinary acquire", func(tr transport, f *fixture) outcome {
			return tr.acquire(service.AcquireRequest{Name: lock(f), ClientID: "other", TTLms: 5000, Takeover: true})
		}, "lock_held", nil},
		{"a counting lock", func(tr transport, f *fixture) outcome {
			return tr.acquire(service.AcquireRequest{Name: "lm/" + f.ns + "/sem", ClientID: "other", TTLms: 5000, Limit: 3})
		}, "", nil},
		{"limit_mismatch carries the lock's limit", func(tr transport, f *fixture) outcome {
			return tr.acquire(service.AcquireRequest{Name: "lm/" + f.ns + "/sem", ClientID: "other", TTLms: 5000, Limit: 2})
		}, "limit_mismatch", func(t *testing.T, f *fixture, b any) {
			if l := b.(*service.AcquireResponse).Limit; l != 3 {
				t.Fatalf("limit %d, want 3", l)
			}
		}},
		{"shared with a limit is refused", func(tr transport, f *fixture) outcome {
			return tr.acquire(service.AcquireRequest{Name: f.ns + "/x", ClientID: "other", TTLms: 5000, Limit: 2, Mode: "shared"})
		}, "invalid_argument", nil},
		{"a subtree over a held lock names it", func(tr transport, f *fixture) outcome {
			return tr.acquire(service.AcquireRequest{Name: f.ns, ClientID: "other", TTLms: 5000, Subtree: true, Mode: "shared"})
		}, "lock_held", func(t *testing.T, f *fixture, b any) {
			if h := b.(*service.AcquireResponse).Holder; h == nil || h.ClientID != "owner" || h.Lock != lock(f) || h.Mode != "exclusive" {
				t.Fatalf("holder %+v", h)
			}
		}},
		{"held: lock_held with the holder", func(tr transport, f *fixture) outcome {
			return tr.acquire(service.AcquireRequest{Name: lock(f), ClientID: "other", TTLms: 5000})
		}, "lock_held", func(t *testing.T, f *fixture, b any) {
			if h := b.(*service.AcquireResponse).Holder; h == nil || h.ClientID != "owner" || h.FencingToken != f.token {
				t.Fatalf("holder %+v", h)
			}
		}},
		{"held: wait_timeout with the holder", func(tr transport, f *fixture) outcome {
			return tr.acquire(service.AcquireRequest{Name: lock(f), ClientID: "other", TTLms: 5000, WaitTimeoutMs: 200})
		}, "wait_timeout", func(t *testing.T, f *fixture, b any) {
			if h := b.(*service.AcquireResponse).Holder; h == nil || h.ClientID != "owner" {
				t.Fatalf("holder %+v", h)
			}
		}},
		{"get held lock", func(tr transport, f *fixture) outcome { return tr.getLock(lock(f)) }, "", func(t *testing.T, f *fixture, b any) {
			if v := b.(*service.LockView); !v.Held || v.Holder.ClientID != "owner" || v.Holder.FencingToken != f.token || v.Waiters != 0 {
				t.Fatalf("view %+v", v)
			}
		}},
		{"get free lock", func(tr transport, f *fixture) outcome { return tr.getLock(f.ns + "/free") }, "", func(t *testing.T, f *fixture, b any) {
			if v := b.(*service.LockView); v.Held || v.Holder != nil || v.Name != f.ns+"/free" {
				t.Fatalf("view %+v", v)
			}
		}},
		{"list by prefix", func(tr transport, f *fixture) outcome {
			return tr.listLocks(service.ListRequest{Prefix: f.ns + "/"})
		}, "", func(t *testing.T, f *fixture, b any) {
			if l := b.(*service.ListResponse); len(l.Locks) != 1 || l.Locks[0].Name != lock(f) || l.More {
				t.Fatalf("list %+v", l)
			}
		}},
		{"list limit too large", func(tr transport, f *fixture) outcome {
			return tr.listLocks(service.ListRequest{Prefix: f.ns + "/", Limit: 100000})
		}, "invalid_argument", nil},
		{"renew", func(tr transport, f *fixture) outcome {
			return tr.renew(service.RenewRequest{Name: lock(f), ClientID: "owner", FencingToken: f.token, LeaseID: f.lease, TTLms: 30000})
		}, "", func(t *testing.T, f *fixture, b any) {
			if r := b.(*service.RenewResponse); !r.Renewed || r.TTLms != 30000 {
				t.Fatalf("renew %+v", r)
			}
		}},
		{"renew with a bad ttl", func(tr transport, f *fixture) outcome {
			return tr.renew(service.RenewRequest{Name: lock(f), ClientID: "owner", FencingToken: f.token, LeaseID: f.lease, TTLms: 10})
		}, "invalid_argument", nil},
		{"renew a free lock", func(tr transport, f *fixture) outcome {
			return tr.renew(service.RenewRequest{Name: f.ns + "/free", ClientID: "owner", FencingToken: f.token, LeaseID: f.lease})
		}, "not_holder", nil},
		{"release with a wrong token", func(tr transport, f *fixture) outcome {
			return tr.release(service.ReleaseRequest{Name: lock(f), ClientID: "owner", FencingToken: f.token + 1000, LeaseID: f.lease})
		}, "not_holder", nil},
		{"release by another client", func(tr transport, f *fixture) outcome {
			return tr.release(service.ReleaseRequest{Name: lock(f), ClientID: "thief", FencingToken: f.token, LeaseID: f.lease})
		}, "not_holder", nil},
		{"release without a token", func(tr transport, f *fixture) outcome {
			return tr.release(service.ReleaseRequest{Name: lock(f), ClientID: "owner", LeaseID: f.lease})
		}, "invalid_argument", nil},
		{"release with a malformed lease id", func(tr transport, f *fixture) outcome {
			return tr.release(service.ReleaseRequest{Name: lock(f), ClientID: "owner", FencingToken: f.token, LeaseID: "zz"})
		}, "invalid_argument", nil},
		{"acquire with a ttl too small", func(tr transport, f *fixture) outcome {
			return tr.acquire(service.AcquireRequest{Name: f.ns + "/b", ClientID: "c", TTLms: 999})
		}, "invalid_argument", nil},
		{"acquire without ttl or session", func(tr transport, f *fixture) outcome {
			return tr.acquire(service.AcquireRequest{Name: f.ns + "/b", ClientID: "c"})
		}, "invalid_argument", nil},
		{"acquire without client id", func(tr transport, f *fixture) outcome {
			return tr.acquire(service.AcquireRequest{Name: f.ns + "/b", TTLms: 5000})
		}, "invalid_argument", nil},
		{"acquire a bad name", func(tr transport, f *fixture) outcome {
			return tr.acquire(service.AcquireRequest{Name: f.ns + "/./b", ClientID: "c", TTLms: 5000})
		}, "invalid_argument", nil},
		{"acquire with an unknown session", func(tr transport, f *fixture) outcome {
			return tr.acquire(service.AcquireRequest{Name: f.ns + "/b", ClientID: "c", SessionID: unknownID})
		}, "session_not_found", nil},
		{"release", func(tr transport, f *fixture) outcome {
			return tr.release(service.ReleaseRequest{Name: lock(f), ClientID: "owner", FencingToken: f.token, LeaseID: f.lease})
		}, "", func(t *testing.T, f *fixture, b any) {
			if r := b.(*service.ReleaseResponse); !r.Released || r.Revision == 0 {
				t.Fatalf("release %+v", r)
			}
		}},
		{"release again", func(tr transport, f *fixture) outcome {
			return tr.release(service.ReleaseRequest{Name: lock(f), ClientID: "owner", FencingToken: f.token, LeaseID: f.lease})
		}, "not_holder", nil},

		{"create session", func(tr transport, f *fixture) outcome {
			return tr.createSession(service.CreateSessionRequest{ClientID: "worker", TTLms: 30000})
		}, "", func(t *testing.T, f *fixture, b any) {
			s := b.(*service.SessionResponse)
			if len(s.SessionID) != 32 || s.TTLms != 30000 {
				t.Fatalf("session %+v", s)
			}
			f.session = s.SessionID
		}},
		{"create session with a bad ttl", func(tr transport, f *fixture) outcome {
			return tr.createSession(service.CreateSessionRequest{ClientID: "worker", TTLms: 700000})
		}, "invalid_argument", nil},
		{"keepalive", func(tr transport, f *fixture) outcome {
			return tr.keepAlive(service.KeepAliveRequest{SessionID: f.session})
		}, "", func(t *testing.T, f *fixture, b any) {
			if s := b.(*service.SessionResponse); s.SessionID != f.session || s.TTLms != 30000 {
				t.Fatalf("keepalive %+v", s)
			}
		}},
		{"keepalive an unknown session", func(tr transport, f *fixture) outcome {
			return tr.keepAlive(service.KeepAliveRequest{SessionID: unknownID})
		}, "session_not_found", nil},
		{"keepalive a malformed session id", func(tr transport, f *fixture) outcome {
			return tr.keepAlive(service.KeepAliveRequest{SessionID: "nope"})
		}, "invalid_argument", nil},
		{"acquire under the session", func(tr transport, f *fixture) outcome {
			return tr.acquire(service.AcquireRequest{Name: f.ns + "/s", ClientID: "worker", SessionID: f.session})
		}, "", func(t *testing.T, f *fixture, b any) {
			if a := b.(*service.AcquireResponse); !a.Acquired || a.LeaseID != f.session {
				t.Fatalf("session acquire %+v", a)
			}
		}},
		{"acquire under another client's session", func(tr transport, f *fixture) outcome {
			return tr.acquire(service.AcquireRequest{Name: f.ns + "/s2", ClientID: "intruder", SessionID: f.session})
		}, "session_not_found", nil},
		{"delete session", func(tr transport, f *fixture) outcome {
			return tr.deleteSession(service.DeleteSessionRequest{SessionID: f.session})
		}, "", func(t *testing.T, f *fixture, b any) {
			if d := b.(*service.DeleteSessionResponse); !d.Deleted {
				t.Fatalf("delete %+v", d)
			}
		}},
		{"deleting the session released its lock", func(tr transport, f *fixture) outcome { return tr.getLock(f.ns + "/s") }, "",
			func(t *testing.T, f *fixture, b any) {
				if v := b.(*service.LockView); v.Held {
					t.Fatalf("still held: %+v", v)
				}
			}},
		{"delete the session again", func(tr transport, f *fixture) outcome {
			return tr.deleteSession(service.DeleteSessionRequest{SessionID: f.session})
		}, "session_not_found", nil},

		{"campaign", func(tr transport, f *fixture) outcome {
			return tr.campaign(service.CampaignRequest{Name: f.ns + "/e", CandidateID: "A", Value: "a:1", TTLms: 30000})
		}, "", func(t *testing.T, f *fixture, b any) {
			c := b.(*service.CampaignResponse)
			if !c.Leader || c.FencingToken == 0 || len(c.LeaseID) != 32 {
				t.Fatalf("campaign %+v", c)
			}
			f.electionToken, f.electionLease = c.FencingToken, c.LeaseID
		}},
		{"campaign while led: lock_held with the leader", func(tr transport, f *fixture) outcome {
			return tr.campaign(service.CampaignRequest{Name: f.ns + "/e", CandidateID: "B", Value: "b:1", TTLms: 30000})
		}, "lock_held", func(t *testing.T, f *fixture, b any) {
			if c := b.(*service.CampaignResponse).Current; c == nil || c.CandidateID != "A" || c.Value != "a:1" || c.FencingToken != f.electionToken {
				t.Fatalf("current %+v", c)
			}
		}},
		{"campaign by the leader's candidate id, without takeover: lock_held", func(tr transport, f *fixture) outcome {
			return tr.campaign(service.CampaignRequest{Name: f.ns + "/e", CandidateID: "A", Value: "a:9", TTLms: 30000})
		}, "lock_held", func(t *testing.T, f *fixture, b any) {
			if c := b.(*service.CampaignResponse).Current; c == nil || c.CandidateID != "A" || c.Value != "a:1" || c.FencingToken != f.electionToken {
				t.Fatalf("current %+v", c)
			}
		}},
		{"campaign by the leader's candidate id with takeover", func(tr transport, f *fixture) outcome {
			return tr.campaign(service.CampaignRequest{Name: f.ns + "/e", CandidateID: "A", Value: "a:1", TTLms: 30000, Takeover: true})
		}, "", func(t *testing.T, f *fixture, b any) {
			c := b.(*service.CampaignResponse)
			if !c.Leader || c.FencingToken <= f.electionToken || c.LeaseID == f.electionLease {
				t.Fatalf("takeover %+v after token %d", c, f.electionToken)
			}
			f.electionToken, f.electionLease = c.FencingToken, c.LeaseID
		}},
		{"campaign without candidate id", func(tr transport, f *fixture) outcome {
			return tr.campaign(service.CampaignRequest{Name: f.ns + "/e", Value: "x", TTLms: 30000})
		}, "invalid_argument", nil},
		{"get election", func(tr transport, f *fixture) outcome { return tr.getElection(f.ns + "/e") }, "", func(t *testing.T, f *fixture, b any) {
			if v := b.(*service.ElectionView); v.Leader == nil || v.Leader.CandidateID != "A" || v.Leader.Value != "a:1" {
				t.Fatalf("election %+v", v)
			}
		}},
		{"proclaim", func(tr transport, f *fixture) outcome {
			return tr.proclaim(service.ProclaimRequest{Name: f.ns + "/e", CandidateID: "A", FencingToken: f.electionToken, LeaseID: f.electionLease, Value: "a:2"})
		}, "", nil},
		{"proclaim with a wrong token", func(tr transport, f *fixture) outcome {
			return tr.proclaim(service.ProclaimRequest{Name: f.ns + "/e", CandidateID: "A", FencingToken: f.electionToken + 1000, LeaseID: f.electionLease, Value: "x"})
		}, "not_holder", nil},
		{"proclaim a value over 4 KiB", func(tr transport, f *fixture) outcome {
			return tr.proclaim(service.ProclaimRequest{Name: f.ns + "/e", CandidateID: "A", FencingToken: f.electionToken, LeaseID: f.electionLease,
				Value: strings.Repeat("v", 5000)})
		}, "invalid_argument", nil},
		{"renew election", func(tr transport, f *fixture) outcome {
			return tr.renewElection(service.RenewRequest{Name: f.ns + "/e", ClientID: "A", FencingToken: f.electionToken, LeaseID: f.electionLease, TTLms: 20000})
		}, "", func(t *testing.T, f *fixture, b any) {
			if r := b.(*service.RenewResponse); !r.Renewed || r.TTLms != 20000 {
				t.Fatalf("renew election %+v", r)
			}
		}},
		{"resign with a wrong lease", func(tr transport, f *fixture) outcome {
			return tr.resign(service.ResignRequest{Name: f.ns + "/e", CandidateID: "A", FencingToken: f.electionToken, LeaseID: unknownID})
		}, "not_holder", nil},
		{"resign", func(tr transport, f *fixture) outcome {
			return tr.resign(service.ResignRequest{Name: f.ns + "/e", CandidateID: "A", FencingToken: f.electionToken, LeaseID: f.electionLease})
		}, "", nil},
		{"election after resign has no leader", func(tr transport, f *fixture) outcome { return tr.getElection(f.ns + "/e") }, "",
			func(t *testing.T, f *fixture, b any) {
				if v := b.(*service.ElectionView); v.Leader != nil {
					t.Fatalf("election %+v", v)
				}
			}},
	}
}

// normalized is an answer with what must differ between two runs (tokens,
// ids, times, revisions, the protocol's name prefix) reduced to whether it is
// set, so the rest can be compared exactly.
func normalized(o outcome, ns string) string {
	b, _ := json.Marshal(o.body)
	var v any
	_ = json.Unmarshal(b, &v)
	var walk func(any) any
	walk = func(x any) any {
		switch x := x.(type) {
		case map[string]any:
			for k, val := range x {
				switch k {
				case "fencing_token", "lease_id", "session_id", "revision", "expires_at", "granted_at", "since", "token_proof", "lease_ref":
					x[k] = "<set>"
				default:
					x[k] = walk(val)
				}
			}
		case []any:
			for i := range x {
				x[i] = walk(x[i])
			}
		case string:
			return strings.ReplaceAll(x, ns, "NS")
		}
		return x
	}
	out, _ := json.Marshal(walk(v))
	return fmt.Sprintf("code=%s message=%q body=%s", o.code, strings.ReplaceAll(o.message, ns, "NS"), out)
}

// TestHTTPAndGRPCGiveTheSameAnswers runs one table of calls over HTTP and over
// gRPC against the same node (each protocol under its own name prefix) and
// requires the same codes, messages and answers, with each protocol's status
// taken from apierror's one table.
func TestHTTPAndGRPCGiveTheSameAnswers(t *testing.T) {
	c := testcluster.New(t, 3)
	// Both on the leader, so a difference can only come from the protocol
	// layers (follower forwarding is covered by the cluster and stream tests).
	leader := c.WaitLeader(10 * time.Second)
	transports := []struct {
		name string
		tr   transport
	}{
		{"http", &httpTransport{c: c, base: c.URL(leader) + "/api/v1"}},
		{"grpc", newGRPCTransport(dialGRPC(t, c.GRPCAddr(leader)))},
	}
	steps := parityTable()
	results := map[string][]outcome{}
	for _, p := range transports {
		t.Run(p.name, func(t *testing.T) { results[p.name] = runParity(t, p.name, p.tr, steps) })
	}
	if t.Failed() {
		return
	}
	for i, s := range steps {
		h, g := normalized(results["http"][i], "http"), normalized(results["grpc"][i], "grpc")
		if h != g {
			t.Errorf("%s:\n http %s\n grpc %s", s.name, h, g)
		}
	}
}

// runParity runs the steps in order over one protocol, checking each answer's
// code and protocol status, and returns the outcomes.
func runParity(t *testing.T, ns string, tr transport, steps []parityStep) []outcome {
	f := &fixture{ns: ns}
	var out []outcome
	for _, s := range steps {
		o := s.call(tr, f)
		if o.code != s.code {
			t.Fatalf("%s: code %q (%s), want %q", s.name, o.code, o.message, s.code)
		}
		wantStatus := tr.wantStatus(s.code)
		if s.code == "" {
			wantStatus = o.status // success: 200/201 or OK, checked below
			if (ns == "http" && o.status/100 != 2) || (ns == "grpc" && o.status != int(codes.OK)) {
				t.Fatalf("%s: success with status %d", s.name, o.status)
			}
		}
		if o.status != wantStatus {
			t.Fatalf("%s: status %d for code %q, want %d", s.name, o.status, s.code, wantStatus)
		}
		if s.code != "" && o.message == "" {
			t.Fatalf("%s: error without a message", s.name)
		}
		if s.check != nil {
			s.check(t, f, o.body)
		}
		out = append(out, o)
	}
	return out
}
