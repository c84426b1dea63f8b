package shard

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
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
//
// The map it routes by changes when a range is split (the node calls
// Update as it follows the meta group). A shard that no longer owns a name
// refuses it with wrong_shard; the router then waits, bounded, for a newer
// map and sends the request again, with the same request_id, to the name's
// new shard — where the dedup table and the queue came along with the name.
type Router struct {
	mu      sync.Mutex
	v       *view
	changed chan struct{} // closed and replaced by every Update
	split   Splitter
	move    Mover
	remote  Remote // nil: every range runs here
	members *service.Service
	acl     *service.Service
	fw      *streams     // forwarded watches (watchfwd.go)
	pick    *fwdReplicas // replicas for forwarded calls (replicas.go)
	member  Membership
	gate    <-chan struct{} // closed once the map caught up since start; nil: open
}

// SetGate holds the calls that span shards until gate closes: the node's
// map may be older than the cluster's until its meta group has caught up
// once since start (nil: open).
func (r *Router) SetGate(gate <-chan struct{}) {
	r.mu.Lock()
	r.gate = gate
	r.mu.Unlock()
}

func (r *Router) gated() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.gate
}

// errCatchingUp is the answer of a call that spans shards while the gate
// is shut.
func errCatchingUp() *apierror.Error {
	return &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Message: "this node is still catching up with the cluster's shard map since its start (its meta group has not confirmed it has the cluster's newest map yet): it serves calls on one name, but no calls over several shards yet; retry, or send it to another node"}
}

// awaitGate waits, bounded by RouteWait and ctx, for the gate to open.
// Even with the per-shard split checks, a map from before a start could
// route a call that spans shards past a range it does not know of yet.
func (r *Router) awaitGate(ctx context.Context) error {
	g := r.gated()
	if g == nil {
		return nil
	}
	select {
	case <-g:
		return nil
	default:
	}
	t := time.NewTimer(RouteWait)
	defer t.Stop()
	select {
	case <-g:
		return nil
	case <-t.C:
		return errCatchingUp()
	case <-ctx.Done():
		e := errCatchingUp()
		e.Err = ctx.Err()
		return e
	}
}

// Membership adds and removes a sharded cluster's nodes (the server's; nil:
// not available).
type Membership interface {
	AddMember(ctx context.Context, req service.MemberRequest) error
	RemoveMember(ctx context.Context, id string) error
}

// SetMembership lets the router add and remove nodes
// (POST/DELETE /cluster/members).
func (r *Router) SetMembership(m Membership) {
	r.mu.Lock()
	r.member = m
	r.mu.Unlock()
}

// SetMembers gives the router the meta group's service: on a cluster whose
// shards run on some nodes only, GET /cluster lists its members (every
// node) rather than shard 0's replicas.
func (r *Router) SetMembers(s *service.Service) {
	r.mu.Lock()
	r.members = s
	r.mu.Unlock()
}

// view is one generation of the map with the services of its ranges
// (nil where this node does not run the group yet).
type view struct {
	m      Map
	shards []*service.Service
}

// Splitter splits a range online (the server's; nil: not available).
type Splitter interface {
	Split(ctx context.Context, at string) error
}

// RouteWait bounds how long a request refused by a shard that no longer
// owns its name waits for this node to learn the newer map (or to start
// the new shard's group) before it is answered 503.
const RouteWait = 10 * time.Second

// NewRouter routes over shards; shards[k] serves range k of m.
func NewRouter(m Map, shards []*service.Service) *Router {
	return &Router{v: &view{m: m, shards: shards}, changed: make(chan struct{}), fw: newStreams(), pick: newFwdReplicas()}
}

// SetRemote lets the router send calls for ranges this node does not run
// to nodes that do (forward.go). Without it every range runs here.
func (r *Router) SetRemote(rem Remote) {
	r.mu.Lock()
	r.remote = rem
	r.mu.Unlock()
}

// Remote is what the router sends calls for ranges this node does not run
// through (nil: every range runs here).
func (r *Router) Remote() Remote {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.remote
}

// away reports whether range k of v runs on other nodes only: its calls
// are sent there (forward.go).
func (r *Router) away(v *view, k int) bool {
	r.mu.Lock()
	rem := r.remote
	r.mu.Unlock()
	return v.shards[k] == nil && rem != nil && !v.m.Hosted(k, rem.Self(), rem.All())
}

// SetSplitter lets the router split ranges (POST /cluster/shards/split).
func (r *Router) SetSplitter(s Splitter) {
	r.mu.Lock()
	r.split = s
	r.mu.Unlock()
}

// SetACL lets the router serve the ACL calls on acl, the meta group's
// service (ACL tokens live in the meta group's state).
func (r *Router) SetACL(acl *service.Service) {
	r.mu.Lock()
	r.acl = acl
	r.mu.Unlock()
}

func (r *Router) aclService() (*service.Service, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.acl == nil {
		return nil, notBuilt("ACLs")
	}
	return r.acl, nil
}

// Update installs a newer map (or more of its groups' services); an older
// generation is ignored.
func (r *Router) Update(m Map, shards []*service.Service) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if m.Generation < r.v.m.Generation || (m.Generation == r.v.m.Generation && slices.Equal(shards, r.v.shards)) {
		return
	}
	r.v = &view{m: m, shards: shards}
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *Router) view() (*view, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.v, r.changed
}

// Map is the shard map the router routes by.
func (r *Router) Map() Map {
	v, _ := r.view()
	return v.m
}

// Services are the services of the map's ranges, in range order (nil where
// the group is not running here yet).
func (r *Router) Services() []*service.Service {
	v, _ := r.view()
	return v.shards
}

func notBuilt(what string) error {
	return apierror.New(apierror.InvalidArgument, "%s is not available on a sharded cluster yet (docs/operations.md, Shards); nothing was changed", what)
}

func isWrongShard(err error) bool {
	var ae *apierror.Error
	return errors.As(err, &ae) && ae.Code == apierror.WrongShard
}

// wrongShard is the answer when no newer map came within RouteWait.
func wrongShard(gen uint64, cause error) error {
	return &apierror.Error{Code: apierror.WrongShard, RetryAfter: time.Second, Err: cause, Message: fmt.Sprintf(
		"the name's shard changed (a range was split) and this node has not learned where it went yet (its shard map is at generation %d); retry with the same request_id", gen)}
}

// awaitChange waits, bounded by deadline and ctx, for the router's view to
// change; false when it did not.
func awaitChange(ctx context.Context, ch <-chan struct{}, deadline time.Time) bool {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// route runs fn on the service of name's shard, or sends the call (in)
// to a node that runs it when this node does not. A wrong_shard refusal
// (the name moved) is retried on the shard the newer map names, once this
// node knows it; so is a shard whose group this node has not started yet,
// and a wait handed off by a replica this node gave up (a move).
func route[T any](ctx context.Context, r *Router, name string, in routed, fn func(*service.Service) (*T, error)) (*T, error) {
	deadline := time.Now().Add(RouteWait)
	in.Name = name
	for {
		v, ch := r.view()
		k := v.m.Lookup(name)
		if v.shards[k] != nil || (in.Op != "" && r.away(v, k)) {
			out, err := onShard(ctx, r, v, k, in, fn)
			if !isWrongShard(err) {
				return out, err
			}
			if !awaitChange(ctx, ch, deadline) {
				return nil, wrongShard(v.m.Generation, err)
			}
			continue
		}
		if !awaitChange(ctx, ch, deadline) {
			return nil, &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Message: fmt.Sprintf(
				"the shard of %q was just split off or moved here and this node has not started its group yet; retry", name)}
		}
	}
}

// onShard runs fn on range k's service here, or sends in to a node that
// runs the range.
func onShard[T any](ctx context.Context, r *Router, v *view, k int, in routed, fn func(*service.Service) (*T, error)) (*T, error) {
	if s := v.shards[k]; s != nil {
		return fn(s)
	}
	if in.Op == "" || !r.away(v, k) {
		return nil, notRunning(v.m.IDs[k])
	}
	out, stale, err := remoteCall[T](ctx, r, v, k, in)
	if stale != nil && out != nil {
		switch x := any(out).(type) {
		case *service.LockView:
			x.Stale = stale
		case *service.ElectionView:
			x.Stale = stale
		case *service.ListResponse:
			x.Stale = stale
		case *service.ElectionListResponse:
			x.Stale = stale
		}
	}
	return out, err
}

// withRequestID gives a waiting request without a request_id one, so that
// a wait that moves with its name to a new shard is found again there by
// the retry (the router's own, with the same id).
func withRequestID(id string, waitMs int64) string {
	if id == "" && waitMs > 0 {
		return "srv-" + randHex(12)
	}
	return id
}

// ---- one name ----

func (r *Router) Acquire(ctx context.Context, req service.AcquireRequest) (*service.AcquireResponse, error) {
	req.RequestID = withRequestID(req.RequestID, req.WaitTimeoutMs)
	return route(ctx, r, req.Name, routed{Op: "acquire", Req: mustJSON(req)}, func(s *service.Service) (*service.AcquireResponse, error) { return s.Acquire(ctx, req) })
}
func (r *Router) Release(ctx context.Context, req service.ReleaseRequest) (*service.ReleaseResponse, error) {
	return route(ctx, r, req.Name, routed{Op: "release", Req: mustJSON(req)}, func(s *service.Service) (*service.ReleaseResponse, error) { return s.Release(ctx, req) })
}
func (r *Router) Renew(ctx context.Context, req service.RenewRequest) (*service.RenewResponse, error) {
	return route(ctx, r, req.Name, routed{Op: "renew", Req: mustJSON(req)}, func(s *service.Service) (*service.RenewResponse, error) { return s.Renew(ctx, req) })
}
func (r *Router) GetLock(ctx context.Context, name string, stale bool) (*service.LockView, error) {
	return route(ctx, r, name, routed{Op: "get_lock", Stale: stale}, func(s *service.Service) (*service.LockView, error) { return s.GetLock(ctx, name, stale) })
}
func (r *Router) History(ctx context.Context, req service.HistoryRequest) (*service.HistoryResponse, error) {
	return route(ctx, r, req.Name, routed{Op: "history", Req: mustJSON(req)}, func(s *service.Service) (*service.HistoryResponse, error) { return s.History(ctx, req) })
}
func (r *Router) Revoke(ctx context.Context, req service.RevokeRequest) (*service.RevokeResponse, error) {
	return route(ctx, r, req.Name, routed{Op: "revoke", Election: req.Election, Req: mustJSON(req)}, func(s *service.Service) (*service.RevokeResponse, error) { return s.Revoke(ctx, req) })
}
func (r *Router) Campaign(ctx context.Context, req service.CampaignRequest) (*service.CampaignResponse, error) {
	req.RequestID = withRequestID(req.RequestID, req.WaitTimeoutMs)
	return route(ctx, r, req.Name, routed{Op: "campaign", Req: mustJSON(req)}, func(s *service.Service) (*service.CampaignResponse, error) { return s.Campaign(ctx, req) })
}
func (r *Router) GetElection(ctx context.Context, name string, stale bool) (*service.ElectionView, error) {
	return route(ctx, r, name, routed{Op: "get_election", Stale: stale}, func(s *service.Service) (*service.ElectionView, error) { return s.GetElection(ctx, name, stale) })
}
func (r *Router) Proclaim(ctx context.Context, req service.ProclaimRequest) (*service.ProclaimResponse, error) {
	return route(ctx, r, req.Name, routed{Op: "proclaim", Req: mustJSON(req)}, func(s *service.Service) (*service.ProclaimResponse, error) { return s.Proclaim(ctx, req) })
}
func (r *Router) Resign(ctx context.Context, req service.ResignRequest) (*service.ResignResponse, error) {
	return route(ctx, r, req.Name, routed{Op: "resign", Req: mustJSON(req)}, func(s *service.Service) (*service.ResignResponse, error) { return s.Resign(ctx, req) })
}
func (r *Router) RenewElection(ctx context.Context, req service.RenewRequest) (*service.RenewResponse, error) {
	return route(ctx, r, req.Name, routed{Op: "renew_election", Req: mustJSON(req)}, func(s *service.Service) (*service.RenewResponse, error) { return s.RenewElection(ctx, req) })
}
func (r *Router) Observe(ctx context.Context, name string, stale bool) (*service.ElectionView, *service.Watcher, error) {
	type obs struct {
		v *service.ElectionView
		w *service.Watcher
	}
	// A shard that runs elsewhere: its replica streams the election here.
	if v, _ := r.view(); r.away(v, v.m.Lookup(name)) {
		return r.observeAway(ctx, name, stale)
	}
	o, err := route(ctx, r, name, routed{}, func(s *service.Service) (*obs, error) {
		v, w, err := s.Observe(ctx, name, stale)
		return &obs{v, w}, err
	})
	if err != nil {
		return nil, nil, err
	}
	return o.v, o.w, nil
}

// ---- prefixes: merged ----

// overlap checks a prefix the way the services do and lists its shards
// (as range indexes of v's map).
func (r *Router) overlap(v *view, prefix string) ([]int, error) {
	p, err := command.ValidatePrefix(prefix)
	if err != nil {
		return nil, apierror.New(apierror.InvalidArgument, "bad prefix: %v", err)
	}
	ks := v.m.Overlap(p)
	for _, k := range ks {
		if v.shards[k] == nil && !r.away(v, k) {
			return nil, notRunning(v.m.IDs[k])
		}
	}
	return ks, nil
}

// notStreamed refuses a watch of a range this node does not run when it
// cannot forward streams (its Remote is no Streamer).
func notStreamed(v *view, k int, all []string) error {
	return &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Message: fmt.Sprintf(
		"shard %d runs on nodes %v, not on this one, and this node cannot forward watches; watch through one of them (GET /api/v1/cluster lists every shard's replicas)", v.m.IDs[k], v.m.Hosts(k, all))}
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // the service's request types always encode
	}
	return b
}

// notRunningYet is notRunning after a bounded wait for the group to start.
func notRunningYet() error {
	return &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Message: fmt.Sprintf(
		"a shard was just split off and this node has not started its group within %s; retry, or send it to another node", RouteWait)}
}

// full waits, bounded by RouteWait and ctx, until this node runs the group
// of every range of its map (a range split off moments ago may not be
// started here yet), and returns that view.
func (r *Router) full(ctx context.Context) (*view, []int, error) {
	deadline := time.Now().Add(RouteWait)
	for {
		v, ch := r.view()
		ks, err := r.all(v)
		if err == nil {
			return v, ks, nil
		}
		if !awaitChange(ctx, ch, deadline) {
			return nil, nil, err
		}
	}
}

func notRunning(id int) error {
	return &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Message: fmt.Sprintf(
		"shard %d was just split off and this node has not started its group yet; retry", id)}
}

// all is every range of v, or an error if one that runs here has not
// started yet.
func (r *Router) all(v *view) ([]int, error) {
	ks := make([]int, len(v.shards))
	for k := range ks {
		if v.shards[k] == nil && !r.away(v, k) {
			return nil, notRunning(v.m.IDs[k])
		}
		ks[k] = k
	}
	return ks, nil
}

// page is one shard's page of a list, or the merge of several.
type page[V any] struct {
	items     []V
	more      bool
	revision  uint64
	revisions map[string]uint64
	stale     *service.StaleRead
	splits    []uint64 // groups split off the listed shards, as of their reads
}

// mergePages lists every shard the prefix overlaps and merges the pages by
// name: each shard lists up to the limit after the cursor, so the first limit
// names of the merge are the first limit names overall. One shard's page is
// returned as it is, with its own revision.
//
// This node's map may be older than the cluster's (a node replaying the
// meta group after a restart, or one cut off): names moved to a range split
// off since are in no page of it. Each shard's page therefore lists the
// groups split off it, read with the page; if one is not in the map, the
// list is made again once this node learns the newer map (bounded by
// RouteWait), else refused with a retryable 503. A split after the read
// left the page whole, so the groups listed are all that can miss it.
func mergePages[V any](ctx context.Context, r *Router, req service.ListRequest, list func(context.Context, *view, int) (page[V], error), name func(*V) string) (page[V], error) {
	if err := r.awaitGate(ctx); err != nil {
		return page[V]{}, err
	}
	deadline := time.Now().Add(RouteWait)
	for {
		v, ch := r.view()
		p, err := mergeOnce(ctx, r, v, req, list, name)
		if err != nil {
			return page[V]{}, err
		}
		unknown := 0
		for _, g := range p.splits {
			if v.m.IndexOfGroup(g) < 0 {
				unknown++
			}
		}
		if unknown == 0 {
			p.splits = nil
			return p, nil
		}
		if nv, _ := r.view(); nv != v {
			continue
		}
		if !awaitChange(ctx, ch, deadline) {
			return page[V]{}, staleMap(v.m.Generation, unknown, "a list over it would miss their names")
		}
	}
}

// mergeOnce is one try of mergePages over view v; its page's splits are
// every shard's.
func mergeOnce[V any](ctx context.Context, r *Router, v *view, req service.ListRequest, list func(context.Context, *view, int) (page[V], error), name func(*V) string) (page[V], error) {
	ks, err := r.overlap(v, req.Prefix)
	if err != nil {
		return page[V]{}, err
	}
	if len(ks) == 1 {
		return list(ctx, v, ks[0])
	}
	pages := make([]page[V], len(ks))
	if err := r.each(ctx, ks, func(ctx context.Context, i, k int) (err error) {
		pages[i], err = list(ctx, v, k)
		return err
	}); err != nil {
		return page[V]{}, err
	}
	out := page[V]{items: []V{}, revisions: map[string]uint64{}, stale: pages[0].stale}
	for i, p := range pages {
		out.items = append(out.items, p.items...)
		out.more = out.more || p.more
		out.revisions[strconv.Itoa(v.m.IDs[ks[i]])] = p.revision
		out.splits = append(out.splits, p.splits...)
	}
	sort.Slice(out.items, func(a, b int) bool { return name(&out.items[a]) < name(&out.items[b]) })
	if limit := listLimit(req.Limit); len(out.items) > limit {
		out.items, out.more = out.items[:limit], true
	}
	return out, nil
}

// ListLocks merges the lock lists of every shard the prefix overlaps.
func (r *Router) ListLocks(ctx context.Context, req service.ListRequest) (*service.ListResponse, error) {
	p, err := mergePages(ctx, r, req, func(ctx context.Context, v *view, k int) (page[service.LockView], error) {
		l, err := onShard(ctx, r, v, k, routed{Op: "list_locks", Req: mustJSON(req)}, func(s *service.Service) (*service.ListResponse, error) { return s.ListLocks(ctx, req) })
		if err != nil {
			return page[service.LockView]{}, err
		}
		return page[service.LockView]{items: l.Locks, more: l.More, revision: l.Revision, stale: l.Stale, splits: l.SplitGroups}, nil
	}, func(v *service.LockView) string { return v.Name })
	if err != nil {
		return nil, err
	}
	return &service.ListResponse{Locks: p.items, More: p.more, Revision: p.revision, Revisions: p.revisions, Stale: p.stale}, nil
}

// ListElections merges the election lists of every shard the prefix overlaps.
func (r *Router) ListElections(ctx context.Context, req service.ListRequest) (*service.ElectionListResponse, error) {
	p, err := mergePages(ctx, r, req, func(ctx context.Context, v *view, k int) (page[service.ElectionView], error) {
		l, err := onShard(ctx, r, v, k, routed{Op: "list_elections", Req: mustJSON(req)}, func(s *service.Service) (*service.ElectionListResponse, error) {
			return s.ListElections(ctx, req)
		})
		if err != nil {
			return page[service.ElectionView]{}, err
		}
		return page[service.ElectionView]{items: l.Elections, more: l.More, revision: l.Revision, stale: l.Stale, splits: l.SplitGroups}, nil
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
// shard, else now), and the merged events carry the resume vector. The
// stream follows splits: a shard split off one it streams joins it at the
// split, from the revision its group began with (watchmerge.go), so the
// moved names' events come from exactly one shard. A shard missing from
// FromRevisions that was split off one named there joins that way too.
func (r *Router) Watch(ctx context.Context, req service.WatchRequest) (*service.Watcher, error) {
	if err := r.awaitGate(ctx); err != nil {
		return nil, err
	}
	for try := 0; ; try++ {
		gen := r.Map().Generation
		w, raced, err := r.watch(ctx, req)
		if !raced {
			return w, err
		}
		if try == 3 {
			return nil, &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Message: "the shards kept splitting while the watch opened; retry"}
		}
		// A replica elsewhere may know of the split before this node's
		// map does: wait (bounded) for the map to move on.
		if v, ch := r.view(); v.m.Generation == gen {
			awaitChange(ctx, ch, time.Now().Add(RouteWait))
		}
	}
}

// watch is one try of Watch; raced when a shard split while its stream was
// opened, after the split's revision: the try is undone, and the next one
// routes by the map with the new shard.
func (r *Router) watch(ctx context.Context, req service.WatchRequest) (*service.Watcher, bool, error) {
	v, err := r.awaitSplitsMapped(ctx, req.FromRevisions)
	if err != nil {
		return nil, false, err
	}
	ks, err := r.overlap(v, req.Prefix)
	if err != nil {
		return nil, false, err
	}
	if req.FromRevision != 0 && len(ks) > 1 {
		return nil, false, apierror.New(apierror.InvalidArgument, "this prefix spans %d shards, each with its own revisions: resume with from_revisions=shard:revision,... (the id of the last event you received, each revision + 1), not from_revision", len(ks))
	}
	for id := range req.FromRevisions {
		if v.m.IndexOf(id) < 0 {
			return nil, false, apierror.New(apierror.InvalidArgument, "from_revisions names shard %d; this cluster's shards are %v", id, v.m.IDs)
		}
	}
	// parent[g] is the group group g was split off, as this node knows
	// (or, for a shard on other nodes, a replica of it); splits[k] are
	// range k's splits as a watch from its resume revision sees them.
	parent := map[uint64]uint64{}
	splits := make([][]splitInfo, len(v.shards))
	if len(req.FromRevisions) > 0 {
		var away []int
		for k, s := range v.shards {
			switch {
			case s != nil:
				splits[k] = splitsOf(s, req.FromRevisions[v.m.IDs[k]])
			case r.away(v, k):
				away = append(away, k)
			}
		}
		if err := r.each(ctx, away, func(ctx context.Context, _, k int) error {
			q := mustJSON(map[string]uint64{"from": req.FromRevisions[v.m.IDs[k]]})
			out, _, err := remoteCall[[]splitInfo](ctx, r, v, k, routed{Op: "watch_splits", Req: q})
			if out != nil {
				splits[k] = *out
			}
			return err
		}); err != nil {
			return nil, false, err
		}
		for k, ss := range splits {
			for _, c := range ss {
				parent[c.Group] = v.m.Groups[k]
			}
		}
	}
	resumed := func(k int) bool { _, ok := req.FromRevisions[v.m.IDs[k]]; return ok }
	var parts []*service.Watcher
	var ids []int
	var last []uint64
	var after [][]splitInfo       // each part's shard's splits once it opened
	streamed := map[uint64]bool{} // groups with a stream or joining by one
	fail := func(raced bool, err error) (*service.Watcher, bool, error) {
		for _, p := range parts {
			p.Close()
		}
		return nil, raced, err
	}
	for _, k := range ks {
		streamed[v.m.Groups[k]] = true
		if len(req.FromRevisions) > 0 && !resumed(k) {
			// Split off (at some remove) a shard the vector names: its
			// stream joins when that shard's reaches the split.
			if src, ok := resumedAncestor(v, parent, v.m.Groups[k], req.FromRevisions); ok {
				ki := v.m.IndexOfGroup(src)
				from := req.FromRevisions[v.m.IDs[ki]]
				child := v.m.Groups[k]
				for parent[child] != src {
					child = parent[child]
				}
				if err := splitStillAhead(splits[ki], child, from, v.m.IDs[ki], v.m.IDs[k]); err != nil {
					return fail(false, err)
				}
				continue
			}
		}
		from := req.FromRevision
		if x, ok := req.FromRevisions[v.m.IDs[k]]; ok {
			from = x
		}
		w, opened, err := r.watchShard(ctx, v, k, req.Prefix, from)
		if err != nil {
			return fail(false, err)
		}
		parts = append(parts, w)
		after = append(after, opened)
		ids = append(ids, v.m.IDs[k])
		if from > 0 {
			last = append(last, from-1)
		} else {
			last = append(last, w.Revision)
		}
	}
	// A split applied here after the view was taken and before a stream
	// opened, below the revision it opened at: its new shard would be
	// neither in the view nor reached through the stream.
	for i := range parts {
		for _, sp := range after[i] {
			if streamed[sp.Group] || v.m.IndexOfGroup(sp.Group) >= 0 {
				continue
			}
			if !sp.Kept || sp.Revision <= last[i] {
				return fail(true, nil)
			}
		}
	}
	prefix := req.Prefix
	// The streams added at splits open later, as the caller (its ACL
	// token) but not bounded by the opening request's deadline.
	caller := context.WithoutCancel(ctx)
	follow := func(fctx context.Context, g, rev uint64) (int, *service.Watcher, bool, error) {
		cctx, cancel := context.WithCancel(caller)
		defer cancel()
		defer context.AfterFunc(fctx, cancel)()
		return r.followSplit(cctx, prefix, g, rev)
	}
	return service.MergeWatchers(parts, ids, last, follow), false, nil
}

// resumedAncestor finds the shard named in from whose group g descends
// from by splits (ok false: none).
func resumedAncestor(v *view, parent map[uint64]uint64, g uint64, from map[int]uint64) (uint64, bool) {
	for range MaxRanges {
		p, ok := parent[g]
		if !ok {
			return 0, false
		}
		if k := v.m.IndexOfGroup(p); k >= 0 {
			if _, named := from[v.m.IDs[k]]; named {
				return p, true
			}
		}
		g = p
	}
	return 0, false
}

// splitStillAhead checks that the stream of a shard with splits src,
// resumed from revision from, will pass the split that made group child:
// otherwise that shard's events since the split would be missed.
func splitStillAhead(src []splitInfo, child, from uint64, srcID, childID int) error {
	behind := from == 0
	for _, sp := range src {
		if sp.Group == child {
			behind = sp.Behind
		}
	}
	if !behind {
		return nil
	}
	return apierror.New(apierror.InvalidArgument,
		"from_revisions lacks shard %d, which was split off shard %d before the revision you resume shard %d from: resume with the whole vector of the last event you received (it names shard %d), or list again and watch from the listed revisions", childID, srcID, srcID, childID)
}

// awaitSplitsMapped is the view once it has every group this node's shards
// have split off (a split applied here reaches the router a moment later,
// with the next map) and every shard id in from (a client that read a
// newer map elsewhere); bounded by RouteWait, after which an unknown id in
// from is left for the caller to refuse.
func (r *Router) awaitSplitsMapped(ctx context.Context, from map[int]uint64) (*view, error) {
	deadline := time.Now().Add(RouteWait)
	for {
		v, ch := r.view()
		unknown := false
		for id := range from {
			// Ids are dense (a split takes the next unused one), so one
			// at or above MaxRanges is never coming.
			if v.m.IndexOf(id) < 0 && id >= 0 && id < MaxRanges {
				unknown = true
			}
		}
		if r.allHere(v) && !unknown {
			var missing []uint64
			for _, s := range v.shards {
				if s == nil {
					continue
				}
				for _, g := range s.LocalSplits() {
					if v.m.IndexOfGroup(g) < 0 {
						missing = append(missing, g)
					}
				}
			}
			if len(missing) == 0 {
				return v, nil
			}
		}
		if !awaitChange(ctx, ch, deadline) {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			if r.allHere(v) && unknown {
				return v, nil
			}
			return nil, &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Message: "a shard was just split and this node has not learned the new map (or started the new shard's group) yet; retry"}
		}
	}
}

// allHere reports whether this node runs every range of v it hosts.
func (r *Router) allHere(v *view) bool {
	for k, s := range v.shards {
		if s == nil && !r.away(v, k) {
			return false
		}
	}
	return true
}

// followSplit opens, for a merged stream over prefix, the stream of the
// shard in group g, split off at revision rev: from rev+1, where its own
// revisions begin. It waits (bounded) for this node to route by a map
// with that group.
func (r *Router) followSplit(ctx context.Context, prefix string, g, rev uint64) (int, *service.Watcher, bool, error) {
	deadline := time.Now().Add(RouteWait)
	for {
		v, ch := r.view()
		if k := v.m.IndexOfGroup(g); k >= 0 && (v.shards[k] != nil || r.away(v, k)) {
			ks, err := r.overlap(v, prefix)
			if err != nil {
				return 0, nil, false, err
			}
			if !slices.Contains(ks, k) {
				return 0, nil, true, nil
			}
			w, _, err := r.watchShard(ctx, v, k, prefix, rev+1)
			if err != nil {
				return 0, nil, false, err
			}
			return v.m.IDs[k], w, false, nil
		}
		if !awaitChange(ctx, ch, deadline) {
			return 0, nil, false, &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Message: fmt.Sprintf(
				"a shard split off this stream's shards has not reached this node's map within %s; resume the watch with from_revisions (the last event's id)", RouteWait)}
		}
	}
}

// ---- sessions: one lease per shard, one id ----

// CreateSession commits the session's lease on the first shard, which
// draws its id, then a lease with that id on every other shard. A retry
// with the same request_id is answered from each shard's dedup table, so
// it finds the same id everywhere. A range split off meanwhile got a copy
// of the session if its source had it; if the map changed under the call,
// the shards it did not reach are reached too.
func (r *Router) CreateSession(ctx context.Context, req service.CreateSessionRequest) (*service.SessionResponse, error) {
	if err := r.awaitGate(ctx); err != nil {
		return nil, err
	}
	if req.RequestID == "" {
		req.RequestID = "srv-" + randHex(12)
	}
	v, ks, err := r.full(ctx)
	if err != nil {
		return nil, err
	}
	create := func(v *view, k int, req service.CreateSessionRequest) (*service.SessionResponse, error) {
		return onShard(ctx, r, v, k, routed{Op: "create_session", LeaseID: req.LeaseID, Req: mustJSON(req)}, func(s *service.Service) (*service.SessionResponse, error) {
			return s.CreateSession(ctx, req)
		})
	}
	first, err := create(v, 0, req)
	if err != nil {
		return nil, err
	}
	id, err := command.ParseLeaseID(first.SessionID)
	if err != nil {
		return nil, apierror.Wrap(apierror.Internal, err, "shard 0 answered a bad session id")
	}
	out := *first
	done := map[uint64]bool{v.m.Groups[0]: true}
	for range 4 {
		var rest []int
		for _, k := range ks {
			if !done[v.m.Groups[k]] {
				rest = append(rest, k)
			}
		}
		resps := make([]*service.SessionResponse, len(rest))
		err = r.each(ctx, rest, func(ctx context.Context, i, k int) (err error) {
			sreq := req
			sreq.LeaseID = id
			resps[i], err = create(v, k, sreq)
			return err
		})
		if err != nil {
			return nil, err
		}
		for i, s := range resps {
			out.ExpiresAt = earliest(out.ExpiresAt, s.ExpiresAt)
			done[v.m.Groups[rest[i]]] = true
		}
		// A shard that split after the view was taken (its split applied
		// before this session's lease there) gave the new shard no copy:
		// wait for the map with it, and create the lease there too.
		missing, err := r.splitOff(ctx, v)
		if err != nil {
			return nil, err
		}
		nv, ch := r.view()
		for len(missing) > 0 && !hasGroups(r, nv, missing) {
			if !awaitChange(ctx, ch, time.Now().Add(RouteWait)) {
				return nil, &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Message: "a shard was just split and this node has not learned the new map yet; retry the session create with the same request_id"}
			}
			nv, ch = r.view()
		}
		if nv == v {
			return &out, nil
		}
		v = nv
		if ks, err = r.all(v); err != nil {
			return nil, err
		}
	}
	return &out, nil
}

// splitOff lists the groups split off v's shards that v's map lacks.
func (r *Router) splitOff(ctx context.Context, v *view) ([]uint64, error) {
	ks, err := r.all(v)
	if err != nil {
		return nil, err
	}
	children := make([][]uint64, len(ks))
	if err := r.each(ctx, ks, func(ctx context.Context, i, k int) error {
		cs, err := onShard(ctx, r, v, k, routed{Op: "split_children"}, func(s *service.Service) (*[]uint64, error) {
			cs, err := s.SplitChildren(ctx)
			return &cs, err
		})
		if cs != nil {
			children[i] = *cs
		}
		return err
	}); err != nil {
		return nil, err
	}
	var out []uint64
	for _, cs := range children {
		for _, g := range cs {
			if v.m.IndexOfGroup(g) < 0 {
				out = append(out, g)
			}
		}
	}
	return out, nil
}

func hasGroups(r *Router, v *view, gs []uint64) bool {
	for _, g := range gs {
		if k := v.m.IndexOfGroup(g); k < 0 || (v.shards[k] == nil && !r.away(v, k)) {
			return false
		}
	}
	return true
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
//
// A shard just split off whose group this node has not started yet has the
// session too (the split carved it with its source's expiry): the shards
// running here are renewed at once, and the call waits, bounded by
// RouteWait, for the new group to start and renews it there as well.
//
// This node's map may also be older than the cluster's (a node that has
// just restarted replays the meta group's history while it serves; one cut
// off may lag): a range split off after that map was made would get no
// renewal and its copy of the lease would expire under the client. Each
// shard therefore answers which groups were split off it, as of after the
// renewal, and the call is not answered ok until every one of them was
// renewed as well: it waits, bounded by RouteWait, for this node to learn
// the map that has them, else answers 503. A split after the renewal
// copied the renewed lease, so the groups listed are all that can miss it.
func (r *Router) KeepAlive(ctx context.Context, req service.KeepAliveRequest) (*service.KeepAliveResponse, error) {
	if err := r.awaitGate(ctx); err != nil {
		return nil, err
	}
	req.LostAfter = 0
	deadline := time.Now().Add(RouteWait)
	done := map[uint64]bool{}
	split := map[uint64]bool{} // groups split off a renewed shard
	var resps []*service.KeepAliveResponse
	for {
		v, ch := r.view()
		var todo []int
		missing := false
		for k, s := range v.shards {
			switch {
			case s == nil && !r.away(v, k):
				missing = true
			case !done[v.m.Groups[k]]:
				done[v.m.Groups[k]] = true
				todo = append(todo, k)
			}
		}
		got := make([]*service.KeepAliveResponse, len(todo))
		if err := r.each(ctx, todo, func(ctx context.Context, i, k int) (err error) {
			got[i], err = onShard(ctx, r, v, k, routed{Op: "keepalive", SessionID: req.SessionID, Req: mustJSON(req)}, func(s *service.Service) (*service.KeepAliveResponse, error) {
				return s.KeepAlive(ctx, req)
			})
			return err
		}); err != nil {
			return nil, err
		}
		resps = append(resps, got...)
		for _, g := range got {
			for _, c := range g.SplitGroups {
				split[c] = true
			}
		}
		unknown := 0
		for c := range split {
			if !done[c] {
				unknown++
			}
		}
		if !missing && unknown == 0 {
			break
		}
		if nv, _ := r.view(); nv != v {
			continue
		}
		if !awaitChange(ctx, ch, deadline) {
			if unknown > 0 {
				return nil, staleMap(v.m.Generation, unknown, "the session could not be renewed everywhere")
			}
			return nil, notRunningYet()
		}
	}
	out := *resps[0]
	out.Revision = 0
	out.SplitGroups = nil
	out.Lost = append([]service.LostGrant{}, resps[0].Lost...)
	for _, s := range resps[1:] {
		out.ExpiresAt = earliest(out.ExpiresAt, s.ExpiresAt)
		out.Lost = append(out.Lost, s.Lost...)
	}
	return &out, nil
}

// staleMap answers a call over every shard that reached shards split since
// this node's map was made, when the newer map did not come within
// RouteWait; what says what the call could not do.
func staleMap(gen uint64, n int, what string) error {
	return &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Message: fmt.Sprintf(
		"this node's shard map (generation %d) is older than the cluster's: %d shard(s) split off since are not in it, so %s; retry, or send it to another node", gen, n, what)}
}

// DeleteSession ends the session's lease on every shard. A shard that no
// longer has it (expired, or deleted by an earlier try) is no error once
// another shard deleted it. As for a create, a range split off since this
// node's map was made (a map still replaying after a restart) is found by
// asking the shards for their splits after the delete, and the session is
// ended there too once this node learns the map that has it.
func (r *Router) DeleteSession(ctx context.Context, req service.DeleteSessionRequest) (*service.DeleteSessionResponse, error) {
	if err := r.awaitGate(ctx); err != nil {
		return nil, err
	}
	v, ks, err := r.full(ctx)
	if err != nil {
		return nil, err
	}
	var out *service.DeleteSessionResponse
	var notFound error
	done := map[uint64]bool{}
	for round := 0; ; round++ {
		var todo []int
		for _, k := range ks {
			if !done[v.m.Groups[k]] {
				done[v.m.Groups[k]] = true
				todo = append(todo, k)
			}
		}
		resps := make([]*service.DeleteSessionResponse, len(todo))
		errs := make([]error, len(todo))
		var wg sync.WaitGroup
		for i, k := range todo {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resps[i], errs[i] = onShard(ctx, r, v, k, routed{Op: "delete_session", SessionID: req.SessionID, Req: mustJSON(req)}, func(s *service.Service) (*service.DeleteSessionResponse, error) {
					return s.DeleteSession(ctx, req)
				})
			}()
		}
		wg.Wait()
		for i, err := range errs {
			var ae *apierror.Error
			switch {
			case err == nil:
				if out == nil {
					out = resps[i]
				}
			case errors.As(err, &ae) && ae.Code == apierror.SessionNotFound:
				notFound = err
			default:
				return nil, err
			}
		}
		missing, err := r.splitOff(ctx, v)
		if err != nil {
			return nil, err
		}
		if len(missing) == 0 {
			break
		}
		unmapped := &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Message: "a shard was split since this node's shard map was made and this node has not learned the new map yet; retry the session delete"}
		if round == 3 {
			return nil, unmapped
		}
		nv, ch := r.view()
		for !hasGroups(r, nv, missing) {
			if !awaitChange(ctx, ch, time.Now().Add(RouteWait)) {
				return nil, unmapped
			}
			nv, ch = r.view()
		}
		v = nv
		if ks, err = r.all(v); err != nil {
			return nil, err
		}
	}
	if out == nil {
		return nil, notFound
	}
	return out, nil
}

// ---- cluster ----

// Cluster is the first shard's view plus every shard's leader, term and
// indexes, and the map's generation.
func (r *Router) Cluster(ctx context.Context) (*service.ClusterInfo, error) {
	return r.cluster(ctx, false)
}

// ClusterHealth is Cluster with the first shard's member probe.
func (r *Router) ClusterHealth(ctx context.Context) (*service.ClusterInfo, error) {
	return r.cluster(ctx, true)
}

func (r *Router) cluster(ctx context.Context, health bool) (*service.ClusterInfo, error) {
	v, _ := r.view()
	// The top-level fields are shard 0's, asked of its replicas when it
	// does not run here.
	const first = 0
	ci, err := onShard(ctx, r, v, first, routed{Op: "cluster"}, func(s *service.Service) (*service.ClusterInfo, error) {
		if health {
			return s.ClusterHealth(ctx)
		}
		return s.Cluster(ctx)
	})
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	meta := r.members
	r.mu.Unlock()
	if placed(v.m) && meta != nil {
		// Shards on some nodes only: the members are every node (the
		// meta group's), and the answering node is this one.
		mi, err := meta.Cluster(ctx)
		if health {
			mi, err = meta.ClusterHealth(ctx)
		}
		if err != nil {
			return nil, err
		}
		ci.NodeID, ci.Members = mi.NodeID, mi.Members
	}
	if len(v.m.Removing) > 0 {
		// A removal commits the map listing the node first and takes it out
		// of the meta group after; in between, operators see it here.
		ci.Members = slices.Clone(ci.Members)
		for i := range ci.Members {
			ci.Members[i].Removing = slices.Contains(v.m.Removing, ci.Members[i].ID)
		}
	}
	ci.ShardGeneration = v.m.Generation
	var all []string
	if rem := r.Remote(); rem != nil {
		all = rem.All()
	}
	for k := range v.shards {
		start, end := v.m.Range(k)
		info := service.ShardInfo{ID: v.m.IDs[k], Start: start, End: end, Leaving: v.m.LeavingReplica(k)}
		if all != nil || (k < len(v.m.Replicas) && len(v.m.Replicas[k]) > 0) {
			info.Replicas = v.m.Hosts(k, all)
		}
		c := ci
		if k != first {
			c, err = onShard(ctx, r, v, k, routed{Op: "cluster"}, func(s *service.Service) (*service.ClusterInfo, error) { return s.Cluster(ctx) })
			if err != nil && !r.away(v, k) && v.shards[k] == nil {
				c, err = nil, nil // not started here yet: shown without its leader
			}
			if err != nil {
				return nil, err
			}
		}
		if c != nil {
			info.LeaderID, info.LeaderAPI, info.Term = c.LeaderID, c.LeaderAPI, c.Term
			info.CommitIndex, info.AppliedIndex, info.Revision, info.LastToken = c.CommitIndex, c.AppliedIndex, c.Revision, c.LastToken
		}
		ci.Shards = append(ci.Shards, info)
	}
	return ci, nil
}

// placed reports whether some range of m runs on a replica set rather
// than on every node.
func placed(m Map) bool {
	for _, r := range m.Replicas {
		if len(r) > 0 {
			return true
		}
	}
	return false
}

// SplitShard splits the range holding req.At at it, online: the names at
// and above it move, with their holders, queues, leases and counters, to a
// new shard. It answers once this node routes by the new map.
func (r *Router) SplitShard(ctx context.Context, req service.SplitRequest) (*service.ClusterInfo, error) {
	r.mu.Lock()
	sp := r.split
	r.mu.Unlock()
	if sp == nil {
		return nil, notBuilt("splitting a shard")
	}
	if err := sp.Split(ctx, req.At); err != nil {
		return nil, err
	}
	return r.Cluster(ctx)
}

// Mover moves a shard's replica between nodes online (the server's).
type Mover interface {
	Move(ctx context.Context, req service.MoveRequest) error
}

// SetMover lets the router move replicas (POST /cluster/shards/move).
func (r *Router) SetMover(m Mover) {
	r.mu.Lock()
	r.move = m
	r.mu.Unlock()
}

// MoveShard moves shard req.Shard's replica on node req.From to node
// req.To, online; it answers once the move is done.
func (r *Router) MoveShard(ctx context.Context, req service.MoveRequest) (*service.ClusterInfo, error) {
	r.mu.Lock()
	mv := r.move
	r.mu.Unlock()
	if mv == nil {
		return nil, notBuilt("moving a shard's replica")
	}
	if err := r.authorizeAdmin(ctx); err != nil {
		return nil, err
	}
	if err := mv.Move(ctx, req); err != nil {
		return nil, err
	}
	return r.Cluster(ctx)
}

// AddMember joins a node to the cluster: to the meta group, as every node
// is; it runs no shard until a move places a replica on it.
func (r *Router) AddMember(ctx context.Context, req service.MemberRequest) (*service.ClusterInfo, error) {
	r.mu.Lock()
	mb := r.member
	r.mu.Unlock()
	if mb == nil {
		return nil, notBuilt("adding a member")
	}
	if err := r.authorizeAdmin(ctx); err != nil {
		return nil, err
	}
	if err := mb.AddMember(ctx, req); err != nil {
		return nil, err
	}
	return r.Cluster(ctx)
}

// authorizeAdmin admits an admin call the router carries out itself, by
// the meta group's ACL state.
func (r *Router) authorizeAdmin(ctx context.Context) error {
	acl, err := r.aclService()
	if err != nil {
		return err
	}
	return acl.AuthorizeAdmin(ctx)
}

// RemoveMember removes a node that holds no shard's replica.
func (r *Router) RemoveMember(ctx context.Context, id string) (*service.ClusterInfo, error) {
	r.mu.Lock()
	mb := r.member
	r.mu.Unlock()
	if mb == nil {
		return nil, notBuilt("removing a member")
	}
	if err := r.authorizeAdmin(ctx); err != nil {
		return nil, err
	}
	if err := mb.RemoveMember(ctx, id); err != nil {
		return nil, err
	}
	return r.Cluster(ctx)
}
func (r *Router) TransferLeadership(context.Context, service.TransferRequest) (*service.ClusterInfo, error) {
	return nil, notBuilt("transferring leadership by hand (the shards' leaders are balanced automatically)")
}
func (r *Router) Snapshot(context.Context) ([]byte, uint64, error) {
	return nil, 0, notBuilt("a snapshot download")
}

// TokenKeys lists every shard's token keys: each shard signs its grants
// with its own key, and one key set verifies any shard's proofs. A shard
// split off another starts with its source's keys, listed once.
func (r *Router) TokenKeys(ctx context.Context) (*fence.KeySetDocument, error) {
	if err := r.awaitGate(ctx); err != nil {
		return nil, err
	}
	v, ks, err := r.full(ctx)
	if err != nil {
		return nil, err
	}
	docs := make([]*fence.KeySetDocument, len(ks))
	if err := r.each(ctx, ks, func(ctx context.Context, i, k int) (err error) {
		docs[i], err = onShard(ctx, r, v, k, routed{Op: "token_keys"}, func(s *service.Service) (*fence.KeySetDocument, error) { return s.TokenKeys(ctx) })
		return err
	}); err != nil {
		return nil, err
	}
	out := &fence.KeySetDocument{}
	seen := map[string]int{}
	for _, d := range docs {
		for _, k := range d.Keys {
			if i, dup := seen[k.ID]; dup {
				// The same key on two shards: a bound on one (retired
				// there) must not cap the other's, where it is current
				// or bounds higher.
				if o := out.Keys[i].MaxToken; o != nil && (k.MaxToken == nil || *k.MaxToken > *o) {
					out.Keys[i].MaxToken = k.MaxToken
				}
				continue
			}
			seen[k.ID] = len(out.Keys)
			out.Keys = append(out.Keys, k)
		}
	}
	return out, nil
}

func (r *Router) RotateTokenKey(context.Context, service.RotateTokenKeyRequest) (*fence.KeySetDocument, error) {
	return nil, notBuilt("rotating the token keys")
}

// The ACL calls go to the meta group, whose state holds the tokens; every
// shard's service authorizes from this node's copy of it.
func (r *Router) ACLBootstrap(ctx context.Context) (*service.ACLTokenView, error) {
	acl, err := r.aclService()
	if err != nil {
		return nil, err
	}
	return acl.ACLBootstrap(ctx)
}
func (r *Router) CreateACLToken(ctx context.Context, req service.ACLTokenRequest) (*service.ACLTokenView, error) {
	acl, err := r.aclService()
	if err != nil {
		return nil, err
	}
	return acl.CreateACLToken(ctx, req)
}
func (r *Router) ListACLTokens(ctx context.Context) (*service.ACLTokenList, error) {
	acl, err := r.aclService()
	if err != nil {
		return nil, err
	}
	return acl.ListACLTokens(ctx)
}
func (r *Router) DeleteACLToken(ctx context.Context, accessorID string) error {
	acl, err := r.aclService()
	if err != nil {
		return err
	}
	return acl.DeleteACLToken(ctx, accessorID)
}

// Healthy is every shard's liveness.
func (r *Router) Healthy() error {
	v, _ := r.view()
	for _, s := range v.shards {
		if s == nil {
			continue
		}
		if err := s.Healthy(); err != nil {
			return err
		}
	}
	return nil
}

// Ready is every shard's readiness, and not before the gate opened.
func (r *Router) Ready() error {
	if g := r.gated(); g != nil {
		select {
		case <-g:
		default:
			return errCatchingUp()
		}
	}
	v, _ := r.view()
	for k, s := range v.shards {
		if s == nil && r.away(v, k) {
			continue // its replicas' readiness is theirs
		}
		if s == nil {
			return notRunning(v.m.IDs[k])
		}
		if err := s.Ready(); err != nil {
			return err
		}
	}
	return nil
}

// watchShard opens range k's stream for a merged watch: on this node's
// service of it, or relayed from a replica elsewhere (watchfwd.go). It
// answers the stream and the shard's splits as they stood once it opened.
func (r *Router) watchShard(ctx context.Context, v *view, k int, prefix string, from uint64) (*service.Watcher, []splitInfo, error) {
	if s := v.shards[k]; s != nil {
		w, err := s.Watch(ctx, service.WatchRequest{Prefix: prefix, FromRevision: from, FollowSplits: true})
		if err != nil {
			return nil, nil, err
		}
		return w, splitsOf(s, from), nil
	}
	w, open, err := r.openStream(ctx, v, k, streamCall{Op: "watch", Prefix: prefix, From: from, Splits: true})
	if err != nil {
		return nil, nil, err
	}
	return w, open.Splits, nil
}

// observeAway observes an election whose shard runs on other nodes: a
// replica streams its view and events here. A move of the name's range
// (wrong_shard) is retried on the newer map, as route does.
func (r *Router) observeAway(ctx context.Context, name string, stale bool) (*service.ElectionView, *service.Watcher, error) {
	deadline := time.Now().Add(RouteWait)
	for {
		v, ch := r.view()
		k := v.m.Lookup(name)
		if !r.away(v, k) {
			return r.Observe(ctx, name, stale) // it moved here meanwhile
		}
		w, open, err := r.openStream(ctx, v, k, streamCall{Op: "observe", Name: name, Stale: stale})
		if err == nil {
			if open.View == nil {
				w.Close()
				return nil, nil, apierror.New(apierror.Internal, "the replica of %q's shard opened an observe without its view", name)
			}
			return open.View, w, nil
		}
		if !isWrongShard(err) {
			return nil, nil, err
		}
		if !awaitChange(ctx, ch, deadline) {
			return nil, nil, wrongShard(v.m.Generation, err)
		}
	}
}
