package shard

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/dlock/dlock/fence"
	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/service"
)

// Router serves the API of a sharded cluster over this node's shard
// services: a call on one name goes to that name's shard (whose service
// forwards to its leader as a one-group node does), a listing or watch
// over a prefix to every shard it overlaps, a session to every shard.
type Router struct {
	m      Map
	shards []*service.Service
}

// NewRouter routes over shards; shards[k] serves range k of m.
func NewRouter(m Map, shards []*service.Service) *Router {
	return &Router{m: m, shards: shards}
}

// Map is the shard map the router routes by.
func (r *Router) Map() Map { return r.m }

func (r *Router) of(name string) *service.Service { return r.shards[r.m.Lookup(name)] }

func notBuilt(what string) error {
	return apierror.New(apierror.InvalidArgument, "%s is not available on a sharded cluster yet (docs/operations.md, Shards); nothing was changed", what)
}

// ---- one name ----

func (r *Router) Acquire(ctx context.Context, req service.AcquireRequest) (*service.AcquireResponse, error) {
	return r.of(req.Name).Acquire(ctx, req)
}
func (r *Router) Release(ctx context.Context, req service.ReleaseRequest) (*service.ReleaseResponse, error) {
	return r.of(req.Name).Release(ctx, req)
}
func (r *Router) Renew(ctx context.Context, req service.RenewRequest) (*service.RenewResponse, error) {
	return r.of(req.Name).Renew(ctx, req)
}
func (r *Router) GetLock(ctx context.Context, name string, stale bool) (*service.LockView, error) {
	return r.of(name).GetLock(ctx, name, stale)
}
func (r *Router) History(ctx context.Context, req service.HistoryRequest) (*service.HistoryResponse, error) {
	return r.of(req.Name).History(ctx, req)
}
func (r *Router) Revoke(ctx context.Context, req service.RevokeRequest) (*service.RevokeResponse, error) {
	return r.of(req.Name).Revoke(ctx, req)
}
func (r *Router) Campaign(ctx context.Context, req service.CampaignRequest) (*service.CampaignResponse, error) {
	return r.of(req.Name).Campaign(ctx, req)
}
func (r *Router) GetElection(ctx context.Context, name string, stale bool) (*service.ElectionView, error) {
	return r.of(name).GetElection(ctx, name, stale)
}
func (r *Router) Proclaim(ctx context.Context, req service.ProclaimRequest) (*service.ProclaimResponse, error) {
	return r.of(req.Name).Proclaim(ctx, req)
}
func (r *Router) Resign(ctx context.Context, req service.ResignRequest) (*service.ResignResponse, error) {
	return r.of(req.Name).Resign(ctx, req)
}
func (r *Router) RenewElection(ctx context.Context, req service.RenewRequest) (*service.RenewResponse, error) {
	return r.of(req.Name).RenewElection(ctx, req)
}
func (r *Router) Observe(ctx context.Context, name string, stale bool) (*service.ElectionView, *service.Watcher, error) {
	return r.of(name).Observe(ctx, name, stale)
}

// ---- prefixes: merged ----

// overlap checks a prefix the way the services do and lists its shards.
func (r *Router) overlap(prefix string) ([]int, error) {
	p, err := command.ValidatePrefix(prefix)
	if err != nil {
		return nil, apierror.New(apierror.InvalidArgument, "bad prefix: %v", err)
	}
	return r.m.Overlap(p), nil
}

// page is one shard's page of a list, or the merge of several.
type page[V any] struct {
	items     []V
	more      bool
	revision  uint64
	revisions map[string]uint64
	stale     *service.StaleRead
}

// mergePages lists every shard the prefix overlaps and merges the pages by
// name: each shard lists up to the limit after the cursor, so the first limit
// names of the merge are the first limit names overall. One shard's page is
// returned as it is, with its own revision.
func mergePages[V any](ctx context.Context, r *Router, req service.ListRequest, list func(context.Context, *service.Service) (page[V], error), name func(*V) string) (page[V], error) {
	ks, err := r.overlap(req.Prefix)
	if err != nil {
		return page[V]{}, err
	}
	if len(ks) == 1 {
		return list(ctx, r.shards[ks[0]])
	}
	pages := make([]page[V], len(ks))
	if err := r.each(ctx, ks, func(ctx context.Context, i, k int) (err error) {
		pages[i], err = list(ctx, r.shards[k])
		return err
	}); err != nil {
		return page[V]{}, err
	}
	out := page[V]{items: []V{}, revisions: map[string]uint64{}, stale: pages[0].stale}
	for i, p := range pages {
		out.items = append(out.items, p.items...)
		out.more = out.more || p.more
		out.revisions[strconv.Itoa(ks[i])] = p.revision
	}
	sort.Slice(out.items, func(a, b int) bool { return name(&out.items[a]) < name(&out.items[b]) })
	if limit := listLimit(req.Limit); len(out.items) > limit {
		out.items, out.more = out.items[:limit], true
	}
	return out, nil
}

// ListLocks merges the lock lists of every shard the prefix overlaps.
func (r *Router) ListLocks(ctx context.Context, req service.ListRequest) (*service.ListResponse, error) {
	p, err := mergePages(ctx, r, req, func(ctx context.Context, s *service.Service) (page[service.LockView], error) {
		l, err := s.ListLocks(ctx, req)
		if err != nil {
			return page[service.LockView]{}, err
		}
		return page[service.LockView]{items: l.Locks, more: l.More, revision: l.Revision, stale: l.Stale}, nil
	}, func(v *service.LockView) string { return v.Name })
	if err != nil {
		return nil, err
	}
	return &service.ListResponse{Locks: p.items, More: p.more, Revision: p.revision, Revisions: p.revisions, Stale: p.stale}, nil
}

// ListElections merges the election lists of every shard the prefix overlaps.
func (r *Router) ListElections(ctx context.Context, req service.ListRequest) (*service.ElectionListResponse, error) {
	p, err := mergePages(ctx, r, req, func(ctx context.Context, s *service.Service) (page[service.ElectionView], error) {
		l, err := s.ListElections(ctx, req)
		if err != nil {
			return page[service.ElectionView]{}, err
		}
		return page[service.ElectionView]{items: l.Elections, more: l.More, revision: l.Revision, stale: l.Stale}, nil
	}, func(v *service.ElectionView) string { return v.Name })
	if err != nil {
		return nil, err
	}
	return &service.ElectionListResponse{Elections: p.items, More: p.more, Revision: p.revision, Revisions: p.revisions, Stale: p.stale}, nil
}

func listLimit(l int) int {
	if l <= 0 {
		return service.DefaultListLimit
	}
	return l
}

// each runs fn for every listed shard at once and returns the first error.
func (r *Router) each(ctx context.Context, ks []int, fn func(ctx context.Context, i, k int) error) error {
	errs := make([]error, len(ks))
	var wg sync.WaitGroup
	for i, k := range ks {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = fn(ctx, i, k) }()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Watch merges the streams of every shard the prefix overlaps. Each shard's
// stream starts at its entry of FromRevisions (else FromRevision with one
// shard, else now), and the merged events carry the resume vector.
func (r *Router) Watch(ctx context.Context, req service.WatchRequest) (*service.Watcher, error) {
	ks, err := r.overlap(req.Prefix)
	if err != nil {
		return nil, err
	}
	if req.FromRevision != 0 && len(ks) > 1 {
		return nil, apierror.New(apierror.InvalidArgument, "this prefix spans %d shards, each with its own revisions: resume with from_revisions=shard:revision,... (the id of the last event you received, each revision + 1), not from_revision", len(ks))
	}
	for k := range req.FromRevisions {
		if k < 0 || k >= r.m.N() {
			return nil, apierror.New(apierror.InvalidArgument, "from_revisions names shard %d; this cluster has shards 0 to %d", k, r.m.N()-1)
		}
	}
	parts := make([]*service.Watcher, 0, len(ks))
	last := make([]uint64, 0, len(ks))
	for _, k := range ks {
		from := req.FromRevision
		if v, ok := req.FromRevisions[k]; ok {
			from = v
		}
		w, err := r.shards[k].Watch(ctx, service.WatchRequest{Prefix: req.Prefix, FromRevision: from})
		if err != nil {
			for _, p := range parts {
				p.Close()
			}
			return nil, err
		}
		parts = append(parts, w)
		if from > 0 {
			last = append(last, from-1)
		} else {
			last = append(last, w.Revision)
		}
	}
	return service.MergeWatchers(parts, ks, last), nil
}

// ---- sessions: one lease per shard, one id ----

// CreateSession commits the session's lease on shard 0, which draws its id,
// then a lease with that id on every other shard. A retry with the same
// request_id is answered from each shard's dedup table, so it finds the
// same id everywhere.
func (r *Router) CreateSession(ctx context.Context, req service.CreateSessionRequest) (*service.SessionResponse, error) {
	if req.RequestID == "" {
		req.RequestID = "srv-" + randHex(12)
	}
	first, err := r.shards[0].CreateSession(ctx, req)
	if err != nil {
		return nil, err
	}
	id, err := command.ParseLeaseID(first.SessionID)
	if err != nil {
		return nil, apierror.Wrap(apierror.Internal, err, "shard 0 answered a bad session id")
	}
	rest := make([]int, 0, len(r.shards)-1)
	for k := 1; k < len(r.shards); k++ {
		rest = append(rest, k)
	}
	resps := make([]*service.SessionResponse, len(rest))
	err = r.each(ctx, rest, func(ctx context.Context, i, k int) (err error) {
		sreq := req
		sreq.LeaseID = id
		resps[i], err = r.shards[k].CreateSession(ctx, sreq)
		return err
	})
	if err != nil {
		return nil, err
	}
	out := *first
	for _, s := range resps {
		out.ExpiresAt = earliest(out.ExpiresAt, s.ExpiresAt)
	}
	return &out, nil
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// KeepAlive renews the session's lease on every shard at once; the answer's
// expires_at is the earliest. A lost grant's revision is its shard's, so no
// one lost_after cursor can serve every shard: each shard lists every lost
// grant it remembers for the session (at most state.MaxLostPerSession), the
// answer's revision is 0 so the client's cursor stays there, and a client
// hears of a lost grant again on each keepalive (ending a lease twice is
// harmless).
func (r *Router) KeepAlive(ctx context.Context, req service.KeepAliveRequest) (*service.KeepAliveResponse, error) {
	req.LostAfter = 0
	resps := make([]*service.KeepAliveResponse, len(r.shards))
	err := r.each(ctx, r.all(), func(ctx context.Context, i, k int) (err error) {
		resps[i], err = r.shards[k].KeepAlive(ctx, req)
		return err
	})
	if err != nil {
		return nil, err
	}
	out := *resps[0]
	out.Revision = 0
	out.Lost = append([]service.LostGrant{}, resps[0].Lost...)
	for _, s := range resps[1:] {
		out.ExpiresAt = earliest(out.ExpiresAt, s.ExpiresAt)
		out.Lost = append(out.Lost, s.Lost...)
	}
	return &out, nil
}

// DeleteSession ends the session's lease on every shard. A shard that no
// longer has it (expired, or deleted by an earlier try) is no error once
// another shard deleted it.
func (r *Router) DeleteSession(ctx context.Context, req service.DeleteSessionRequest) (*service.DeleteSessionResponse, error) {
	resps := make([]*service.DeleteSessionResponse, len(r.shards))
	errs := make([]error, len(r.shards))
	var wg sync.WaitGroup
	for k := range r.shards {
		wg.Add(1)
		go func() { defer wg.Done(); resps[k], errs[k] = r.shards[k].DeleteSession(ctx, req) }()
	}
	wg.Wait()
	var out *service.DeleteSessionResponse
	var notFound error
	for k, err := range errs {
		var ae *apierror.Error
		switch {
		case err == nil:
			if out == nil {
				out = resps[k]
			}
		case errors.As(err, &ae) && ae.Code == apierror.SessionNotFound:
			notFound = err
		default:
			return nil, err
		}
	}
	if out == nil {
		return nil, notFound
	}
	return out, nil
}

func (r *Router) all() []int {
	ks := make([]int, len(r.shards))
	for k := range ks {
		ks[k] = k
	}
	return ks
}

// ---- cluster ----

// Cluster is shard 0's view plus every shard's leader, term and indexes.
func (r *Router) Cluster(ctx context.Context) (*service.ClusterInfo, error) {
	return r.cluster(ctx, r.shards[0].Cluster)
}

// ClusterHealth is Cluster with shard 0's member probe.
func (r *Router) ClusterHealth(ctx context.Context) (*service.ClusterInfo, error) {
	return r.cluster(ctx, r.shards[0].ClusterHealth)
}

func (r *Router) cluster(ctx context.Context, first func(context.Context) (*service.ClusterInfo, error)) (*service.ClusterInfo, error) {
	ci, err := first(ctx)
	if err != nil {
		return nil, err
	}
	for k, s := range r.shards {
		c := ci
		if k > 0 {
			if c, err = s.Cluster(ctx); err != nil {
				return nil, err
			}
		}
		start, end := r.m.Range(k)
		ci.Shards = append(ci.Shards, service.ShardInfo{ID: k, Start: start, End: end, LeaderID: c.LeaderID, LeaderAPI: c.LeaderAPI,
			Term: c.Term, CommitIndex: c.CommitIndex, AppliedIndex: c.AppliedIndex, Revision: c.Revision, LastToken: c.LastToken})
	}
	return ci, nil
}

func (r *Router) AddMember(context.Context, service.MemberRequest) (*service.ClusterInfo, error) {
	return nil, notBuilt("adding a member")
}
func (r *Router) RemoveMember(context.Context, string) (*service.ClusterInfo, error) {
	return nil, notBuilt("removing a member")
}
func (r *Router) TransferLeadership(context.Context, service.TransferRequest) (*service.ClusterInfo, error) {
	return nil, notBuilt("transferring leadership by hand (the shards' leaders are balanced automatically)")
}
func (r *Router) Snapshot(context.Context) ([]byte, uint64, error) {
	return nil, 0, notBuilt("a snapshot download")
}

// TokenKeys lists every shard's token keys: each shard signs its grants
// with its own key, and one key set verifies any shard's proofs.
func (r *Router) TokenKeys(ctx context.Context) (*fence.KeySetDocument, error) {
	docs := make([]*fence.KeySetDocument, len(r.shards))
	if err := r.each(ctx, r.all(), func(ctx context.Context, i, k int) (err error) {
		docs[i], err = r.shards[k].TokenKeys(ctx)
		return err
	}); err != nil {
		return nil, err
	}
	out := &fence.KeySetDocument{}
	for _, d := range docs {
		out.Keys = append(out.Keys, d.Keys...)
	}
	return out, nil
}

func (r *Router) RotateTokenKey(context.Context, service.RotateTokenKeyRequest) (*fence.KeySetDocument, error) {
	return nil, notBuilt("rotating the token keys")
}
func (r *Router) ACLBootstrap(context.Context) (*service.ACLTokenView, error) {
	return nil, notBuilt("ACLs")
}
func (r *Router) CreateACLToken(context.Context, service.ACLTokenRequest) (*service.ACLTokenView, error) {
	return nil, notBuilt("ACLs")
}
func (r *Router) ListACLTokens(context.Context) (*service.ACLTokenList, error) {
	return nil, notBuilt("ACLs")
}
func (r *Router) DeleteACLToken(context.Context, string) error { return notBuilt("ACLs") }

// Healthy is every shard's liveness.
func (r *Router) Healthy() error {
	for _, s := range r.shards {
		if err := s.Healthy(); err != nil {
			return err
		}
	}
	return nil
}

// Ready is every shard's readiness.
func (r *Router) Ready() error {
	for _, s := range r.shards {
		if err := s.Ready(); err != nil {
			return err
		}
	}
	return nil
}
