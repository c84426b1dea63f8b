package grpcapi

import (
	"context"
	"errors"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	dlockv1 "github.com/dlock/dlock/api/dlock/v1"
	"github.com/dlock/dlock/fence"
	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/watch"
)

// Every handler passes its call's ctx to the service: gRPC cancels it when the
// client cancels or its connection dies, which is how a waiting Acquire or
// Campaign withdraws its wait (as HTTP does through the request context).

type lockServer struct{ *api }

func (s *lockServer) Acquire(ctx context.Context, req *dlockv1.AcquireRequest) (*dlockv1.AcquireResponse, error) {
	resp, err := s.svc.Acquire(ctx, service.AcquireRequest{Name: req.Name, ClientID: req.ClientId, TTLms: req.TtlMs,
		SessionID: req.SessionId, WaitTimeoutMs: req.WaitTimeoutMs, RequestID: req.RequestId, Takeover: req.Takeover,
		Limit: req.Limit, Mode: req.Mode, Subtree: req.Subtree, Value: req.Value, LockDelayMs: req.LockDelayMs})
	if err != nil {
		// lock_held and wait_timeout come with who holds the lock, lock_lost
		// with the token of the grant that was lost, limit_mismatch with the
		// lock's limit.
		var d dlockv1.ErrorDetail
		if resp != nil {
			d.Holder = holderPB(resp.Holder)
			d.FencingToken = resp.FencingToken
			d.Limit = int64(resp.Limit)
		}
		return nil, s.status(ctx, err, &d)
	}
	return reply(s.api, ctx, resp, nil, func(r *service.AcquireResponse) *dlockv1.AcquireResponse {
		return &dlockv1.AcquireResponse{Acquired: r.Acquired, FencingToken: r.FencingToken, ExpiresAt: ts(r.ExpiresAt), LeaseId: r.LeaseID, Revision: r.Revision, TokenProof: r.TokenProof, LeaseRef: r.LeaseRef}
	})
}

func (s *lockServer) Release(ctx context.Context, req *dlockv1.ReleaseRequest) (*dlockv1.ReleaseResponse, error) {
	resp, err := s.svc.Release(ctx, service.ReleaseRequest{Name: req.Name, ClientID: req.ClientId, FencingToken: req.FencingToken,
		LeaseID: req.LeaseId, RequestID: req.RequestId})
	return reply(s.api, ctx, resp, err, func(r *service.ReleaseResponse) *dlockv1.ReleaseResponse {
		return &dlockv1.ReleaseResponse{Released: r.Released, Revision: r.Revision}
	})
}

func (s *lockServer) Renew(ctx context.Context, req *dlockv1.RenewRequest) (*dlockv1.RenewResponse, error) {
	resp, err := s.svc.Renew(ctx, service.RenewRequest{Name: req.Name, ClientID: req.ClientId, FencingToken: req.FencingToken,
		LeaseID: req.LeaseId, TTLms: req.TtlMs, RequestID: req.RequestId, Value: req.Value})
	return reply(s.api, ctx, resp, err, renewPB)
}

func (s *lockServer) GetHistory(ctx context.Context, req *dlockv1.GetHistoryRequest) (*dlockv1.GetHistoryResponse, error) {
	resp, err := s.svc.History(ctx, service.HistoryRequest{Name: req.Name, Election: req.Election, Limit: int(req.Limit), Stale: req.Stale})
	if err == nil {
		staleHeaders(ctx, resp.Stale)
	}
	return reply(s.api, ctx, resp, err, func(r *service.HistoryResponse) *dlockv1.GetHistoryResponse {
		out := &dlockv1.GetHistoryResponse{Name: r.Name, Revision: r.Revision}
		for _, g := range r.Grants {
			out.Grants = append(out.Grants, &dlockv1.Grant{FencingToken: g.FencingToken, ClientId: g.ClientID, Value: g.Value,
				GrantedAt: ts(g.GrantedAt), EndedAt: ts(g.EndedAt), EndCause: g.EndCause, Reason: g.Reason, TtlMs: g.TTLms, LockDelayMs: g.LockDelayMs})
		}
		return out
	})
}

func (s *lockServer) Revoke(ctx context.Context, req *dlockv1.RevokeRequest) (*dlockv1.RevokeResponse, error) {
	resp, err := s.svc.Revoke(ctx, service.RevokeRequest{Name: req.Name, Election: req.Election, FencingToken: req.FencingToken,
		Reason: req.Reason, ClientID: req.ClientId, RequestID: req.RequestId})
	return reply(s.api, ctx, resp, err, func(r *service.RevokeResponse) *dlockv1.RevokeResponse {
		return &dlockv1.RevokeResponse{Revoked: r.Revoked, FencingToken: r.FencingToken, FencingTokens: r.FencingTokens, Revision: r.Revision}
	})
}

func (s *lockServer) GetLock(ctx context.Context, req *dlockv1.GetLockRequest) (*dlockv1.GetLockResponse, error) {
	resp, err := s.svc.GetLock(ctx, req.Name, req.Stale)
	if err == nil {
		staleHeaders(ctx, resp.Stale)
	}
	return reply(s.api, ctx, resp, err, func(v *service.LockView) *dlockv1.GetLockResponse {
		return &dlockv1.GetLockResponse{Lock: lockPB(v)}
	})
}

func (s *lockServer) ListLocks(ctx context.Context, req *dlockv1.ListLocksRequest) (*dlockv1.ListLocksResponse, error) {
	resp, err := s.svc.ListLocks(ctx, service.ListRequest{Prefix: req.Prefix, After: req.After, Limit: int(req.Limit), Stale: req.Stale})
	if err == nil {
		staleHeaders(ctx, resp.Stale)
	}
	return reply(s.api, ctx, resp, err, func(r *service.ListResponse) *dlockv1.ListLocksResponse {
		out := &dlockv1.ListLocksResponse{More: r.More, Revision: r.Revision}
		for i := range r.Locks {
			out.Locks = append(out.Locks, lockPB(&r.Locks[i]))
		}
		return out
	})
}

type sessionServer struct{ *api }

func (s *sessionServer) CreateSession(ctx context.Context, req *dlockv1.CreateSessionRequest) (*dlockv1.CreateSessionResponse, error) {
	resp, err := s.svc.CreateSession(ctx, service.CreateSessionRequest{ClientID: req.ClientId, TTLms: req.TtlMs, RequestID: req.RequestId})
	return reply(s.api, ctx, resp, err, func(r *service.SessionResponse) *dlockv1.CreateSessionResponse {
		return &dlockv1.CreateSessionResponse{SessionId: r.SessionID, TtlMs: r.TTLms, ExpiresAt: ts(r.ExpiresAt), Revision: r.Revision}
	})
}

func (s *sessionServer) KeepAlive(ctx context.Context, req *dlockv1.KeepAliveRequest) (*dlockv1.KeepAliveResponse, error) {
	resp, err := s.svc.KeepAlive(ctx, service.KeepAliveRequest{SessionID: req.SessionId, ClientID: req.ClientId, RequestID: req.RequestId, LostAfter: req.LostAfter})
	return reply(s.api, ctx, resp, err, func(r *service.KeepAliveResponse) *dlockv1.KeepAliveResponse {
		return &dlockv1.KeepAliveResponse{SessionId: r.SessionID, TtlMs: r.TTLms, ExpiresAt: ts(r.ExpiresAt), Revision: r.Revision, Lost: lostPB(r.Lost)}
	})
}

func lostPB(lost []service.LostGrant) []*dlockv1.LostGrant {
	out := make([]*dlockv1.LostGrant, 0, len(lost))
	for _, g := range lost {
		out = append(out, &dlockv1.LostGrant{Kind: g.Kind, Name: g.Name, FencingToken: g.FencingToken, Cause: g.Cause, Reason: g.Reason, Revision: g.Revision})
	}
	return out
}

// KeepAliveStream renews a session every TTL/3 while the call is open. A
// renewal that fails for a passing reason (no leader during an election) is
// retried soon, for as long as the session may still be alive by the last
// successful renewal; after that the caller must learn that its locks may be
// gone.
func (s *sessionServer) KeepAliveStream(req *dlockv1.KeepAliveStreamRequest, stream grpc.ServerStreamingServer[dlockv1.KeepAliveStreamResponse]) error {
	ctx := stream.Context()
	var lastOK time.Time
	var ttl time.Duration
	// Each lost grant is sent once: every renewal lists those after the
	// previous one's revision (Service.KeepAlive).
	lostAfter := req.LostAfter
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return s.status(ctx, ctx.Err(), nil)
		case <-s.closing:
			return s.status(ctx, apierror.New(apierror.Unavailable, "this node is shutting down; open the keepalive stream on another node"), nil)
		case <-timer.C:
		}
		resp, err := s.svc.KeepAlive(ctx, service.KeepAliveRequest{SessionID: req.SessionId, ClientID: req.ClientId, LostAfter: lostAfter})
		switch {
		case err == nil:
			lastOK, ttl = time.Now(), time.Duration(resp.TTLms)*time.Millisecond
			// The list is in revision order and complete up to its last.
			lostAfter = max(lostAfter, resp.Revision)
			if n := len(resp.Lost); n > 0 {
				lostAfter = max(lostAfter, resp.Lost[n-1].Revision)
			}
			if err := stream.Send(&dlockv1.KeepAliveStreamResponse{TtlMs: resp.TTLms, ExpiresAt: ts(resp.ExpiresAt), Revision: resp.Revision, Lost: lostPB(resp.Lost)}); err != nil {
				return err
			}
			timer.Reset(ttl / 3)
		case transient(err) && ctx.Err() == nil && !lastOK.IsZero() && time.Since(lastOK) < ttl:
			timer.Reset(min(time.Second, ttl/10))
		default:
			return s.status(ctx, err, nil)
		}
	}
}

// transient errors are retried by KeepAliveStream. rate_limited is one: a
// client over its rate limit should not lose its session for it.
func transient(err error) bool {
	c := apierror.CodeOf(err)
	return c == apierror.Unavailable || c == apierror.NoLeader || c == apierror.RateLimited
}

func (s *sessionServer) DeleteSession(ctx context.Context, req *dlockv1.DeleteSessionRequest) (*dlockv1.DeleteSessionResponse, error) {
	resp, err := s.svc.DeleteSession(ctx, service.DeleteSessionRequest{SessionID: req.SessionId, ClientID: req.ClientId, RequestID: req.RequestId})
	return reply(s.api, ctx, resp, err, func(r *service.DeleteSessionResponse) *dlockv1.DeleteSessionResponse {
		return &dlockv1.DeleteSessionResponse{Deleted: r.Deleted, Revision: r.Revision}
	})
}

type electionServer struct{ *api }

func (s *electionServer) Campaign(ctx context.Context, req *dlockv1.CampaignRequest) (*dlockv1.CampaignResponse, error) {
	resp, err := s.svc.Campaign(ctx, service.CampaignRequest{Name: req.Name, CandidateID: req.CandidateId, Value: req.Value,
		TTLms: req.TtlMs, SessionID: req.SessionId, WaitTimeoutMs: req.WaitTimeoutMs, RequestID: req.RequestId, Takeover: req.Takeover})
	if err != nil {
		var d dlockv1.ErrorDetail
		if resp != nil {
			d.Current = leaderPB(resp.Current)
			d.FencingToken = resp.FencingToken
		}
		return nil, s.status(ctx, err, &d)
	}
	return reply(s.api, ctx, resp, nil, func(r *service.CampaignResponse) *dlockv1.CampaignResponse {
		return &dlockv1.CampaignResponse{Leader: r.Leader, FencingToken: r.FencingToken, ExpiresAt: ts(r.ExpiresAt), LeaseId: r.LeaseID, Revision: r.Revision, TokenProof: r.TokenProof, LeaseRef: r.LeaseRef}
	})
}

func (s *electionServer) GetElection(ctx context.Context, req *dlockv1.GetElectionRequest) (*dlockv1.GetElectionResponse, error) {
	resp, err := s.svc.GetElection(ctx, req.Name, req.Stale)
	if err == nil {
		staleHeaders(ctx, resp.Stale)
	}
	return reply(s.api, ctx, resp, err, func(v *service.ElectionView) *dlockv1.GetElectionResponse {
		return &dlockv1.GetElectionResponse{Election: electionPB(v)}
	})
}

func (s *electionServer) Proclaim(ctx context.Context, req *dlockv1.ProclaimRequest) (*dlockv1.ProclaimResponse, error) {
	resp, err := s.svc.Proclaim(ctx, service.ProclaimRequest{Name: req.Name, CandidateID: req.CandidateId, FencingToken: req.FencingToken,
		LeaseID: req.LeaseId, Value: req.Value, RequestID: req.RequestId})
	return reply(s.api, ctx, resp, err, func(r *service.ProclaimResponse) *dlockv1.ProclaimResponse {
		return &dlockv1.ProclaimResponse{Proclaimed: r.Proclaimed, Revision: r.Revision}
	})
}

func (s *electionServer) Resign(ctx context.Context, req *dlockv1.ResignRequest) (*dlockv1.ResignResponse, error) {
	resp, err := s.svc.Resign(ctx, service.ResignRequest{Name: req.Name, CandidateID: req.CandidateId, FencingToken: req.FencingToken,
		LeaseID: req.LeaseId, RequestID: req.RequestId})
	return reply(s.api, ctx, resp, err, func(r *service.ResignResponse) *dlockv1.ResignResponse {
		return &dlockv1.ResignResponse{Resigned: r.Resigned, Revision: r.Revision}
	})
}

func (s *electionServer) RenewElection(ctx context.Context, req *dlockv1.RenewElectionRequest) (*dlockv1.RenewElectionResponse, error) {
	resp, err := s.svc.RenewElection(ctx, service.RenewRequest{Name: req.Name, ClientID: req.CandidateId, FencingToken: req.FencingToken,
		LeaseID: req.LeaseId, TTLms: req.TtlMs, RequestID: req.RequestId})
	return reply(s.api, ctx, resp, err, func(r *service.RenewResponse) *dlockv1.RenewElectionResponse {
		return &dlockv1.RenewElectionResponse{Renewed: r.Renewed, ExpiresAt: ts(r.ExpiresAt), TtlMs: r.TTLms, Revision: r.Revision}
	})
}

// Observe sends the current view, then the view after each event, as the
// HTTP observe stream does.
func (s *electionServer) Observe(req *dlockv1.ObserveRequest, stream grpc.ServerStreamingServer[dlockv1.ObserveResponse]) error {
	ctx := stream.Context()
	view, w, err := s.svc.Observe(ctx, req.Name, req.Stale)
	if err != nil {
		return s.status(ctx, err, nil)
	}
	defer w.Close()
	v := *view
	if err := stream.SendHeader(revisionHeader(v.Revision)); err != nil {
		return err
	}
	if err := stream.Send(&dlockv1.ObserveResponse{Election: electionPB(&v)}); err != nil {
		return err
	}
	return s.pump(ctx, w, func(e watch.Event) error {
		v = service.NextView(v, e)
		return stream.Send(&dlockv1.ObserveResponse{Election: electionPB(&v)})
	})
}

type watchServer struct{ *api }

func (s *watchServer) Watch(req *dlockv1.WatchRequest, stream grpc.ServerStreamingServer[dlockv1.WatchResponse]) error {
	ctx := stream.Context()
	w, err := s.svc.Watch(ctx, service.WatchRequest{Prefix: req.Prefix, FromRevision: req.FromRevision})
	if err != nil {
		return s.status(ctx, err, nil)
	}
	defer w.Close()
	if err := stream.SendHeader(revisionHeader(w.Revision)); err != nil {
		return err
	}
	return s.pump(ctx, w, func(e watch.Event) error {
		return stream.Send(&dlockv1.WatchResponse{Event: eventPB(service.Event(e))})
	})
}

func revisionHeader(rev uint64) metadata.MD {
	return metadata.Pairs(RevisionKey, strconv.FormatUint(rev, 10))
}

// pump forwards a watcher's events until the caller leaves or the watcher
// ends; a watcher cut off (too slow, snapshot restored, node shutting down)
// ends the call with its reason. A slow client only backs up its own
// watcher's bounded buffer, never Raft's apply; a client that stops reading
// altogether ends the call when its watcher falls behind or one send has
// waited sendTimeout, whichever comes first (streamSender).
func (a *api) pump(ctx context.Context, w *service.Watcher, send func(watch.Event) error) error {
	sender := newStreamSender()
	defer sender.close()
	events := w.Events()
	ended := func() error {
		if err := w.Err(); err != nil {
			return a.status(ctx, err, nil)
		}
		return nil
	}
	for {
		select {
		case <-ctx.Done():
			return a.status(ctx, ctx.Err(), nil)
		case e, ok := <-events:
			if !ok {
				return ended()
			}
			// A watcher cut off as too slow abandons its send at once: its
			// client reads nothing. Any other end (shutdown, no leader,
			// restore) still delivers what was queued, as over HTTP.
			slow := func() bool { return errors.Is(w.Err(), watch.ErrSlow) }
			err := sender.send(ctx, func() error { return send(e) }, a.sendTimeout, w.Done(), slow)
			switch {
			case errors.Is(err, errSendStopped):
				return ended()
			case errors.Is(err, errSendTimeout):
				return a.status(ctx, apierror.Wrap(apierror.Unavailable, err,
					"this stream was cut off: the client took no message for %s; reconnect with from_revision set to the last revision you received (and skip its events you already have)", a.sendTimeout), nil)
			case err != nil && ctx.Err() != nil:
				return a.status(ctx, ctx.Err(), nil)
			case err != nil:
				return err
			}
		}
	}
}

type clusterServer struct{ *api }

func (s *clusterServer) GetCluster(ctx context.Context, _ *dlockv1.GetClusterRequest) (*dlockv1.GetClusterResponse, error) {
	resp, err := s.svc.Cluster(ctx)
	return reply(s.api, ctx, resp, err, func(c *service.ClusterInfo) *dlockv1.GetClusterResponse {
		return &dlockv1.GetClusterResponse{Cluster: clusterPB(c)}
	})
}

func (s *clusterServer) AddMember(ctx context.Context, req *dlockv1.AddMemberRequest) (*dlockv1.AddMemberResponse, error) {
	resp, err := s.svc.AddMember(ctx, service.MemberRequest{ID: req.Id, RaftAddr: req.RaftAddr})
	return reply(s.api, ctx, resp, err, func(c *service.ClusterInfo) *dlockv1.AddMemberResponse {
		return &dlockv1.AddMemberResponse{Cluster: clusterPB(c)}
	})
}

func (s *clusterServer) RemoveMember(ctx context.Context, req *dlockv1.RemoveMemberRequest) (*dlockv1.RemoveMemberResponse, error) {
	resp, err := s.svc.RemoveMember(ctx, req.Id)
	return reply(s.api, ctx, resp, err, func(c *service.ClusterInfo) *dlockv1.RemoveMemberResponse {
		return &dlockv1.RemoveMemberResponse{Cluster: clusterPB(c)}
	})
}

func (s *clusterServer) TransferLeadership(ctx context.Context, req *dlockv1.TransferLeadershipRequest) (*dlockv1.TransferLeadershipResponse, error) {
	resp, err := s.svc.TransferLeadership(ctx, service.TransferRequest{ID: req.Id})
	return reply(s.api, ctx, resp, err, func(c *service.ClusterInfo) *dlockv1.TransferLeadershipResponse {
		return &dlockv1.TransferLeadershipResponse{Cluster: clusterPB(c)}
	})
}

func (s *clusterServer) GetTokenKeys(ctx context.Context, _ *dlockv1.GetTokenKeysRequest) (*dlockv1.GetTokenKeysResponse, error) {
	resp, err := s.svc.TokenKeys(ctx)
	return reply(s.api, ctx, resp, err, func(d *fence.KeySetDocument) *dlockv1.GetTokenKeysResponse {
		return &dlockv1.GetTokenKeysResponse{Keys: tokenKeysPB(d)}
	})
}

func (s *clusterServer) RotateTokenKey(ctx context.Context, req *dlockv1.RotateTokenKeyRequest) (*dlockv1.RotateTokenKeyResponse, error) {
	resp, err := s.svc.RotateTokenKey(ctx, service.RotateTokenKeyRequest{RevokeRetired: req.RevokeRetired})
	return reply(s.api, ctx, resp, err, func(d *fence.KeySetDocument) *dlockv1.RotateTokenKeyResponse {
		return &dlockv1.RotateTokenKeyResponse{Keys: tokenKeysPB(d)}
	})
}

// tokenKeysPB maps the key-set document field for field, as HTTP serves it:
// max_token is present exactly on the retired keys.
func tokenKeysPB(d *fence.KeySetDocument) []*dlockv1.TokenKey {
	out := make([]*dlockv1.TokenKey, 0, len(d.Keys))
	for _, k := range d.Keys {
		out = append(out, &dlockv1.TokenKey{Id: k.ID, Algorithm: k.Algorithm, PublicKey: k.PublicKey, Current: k.Current, MaxToken: copyUint64(k.MaxToken)})
	}
	return out
}

func copyUint64(p *uint64) *uint64 {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// Header metadata of a stale answer, as the HTTP API's X-Dlock-Known-Leader
// and X-Dlock-Last-Contact (milliseconds; absent if the node never heard from
// a leader).
const (
	mdKnownLeader = "x-dlock-known-leader"
	mdLastContact = "x-dlock-last-contact"
)

// staleHeaders describes a stale answer's freshness; nil sets nothing.
func staleHeaders(ctx context.Context, sr *service.StaleRead) {
	if sr == nil {
		return
	}
	md := metadata.Pairs(mdKnownLeader, strconv.FormatBool(sr.KnownLeader))
	if ms, ok := sr.LastContactMs(); ok {
		md.Append(mdLastContact, strconv.FormatInt(ms, 10))
	}
	// SetHeader fails only outside a unary call's handler, which this is not.
	_ = grpc.SetHeader(ctx, md)
}
