package shard

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/watch"
)

// A watch (or observe) of a shard this node does not run is relayed from a
// replica over the raft port, as a unary call is (forward.go): this node
// posts a streamCall to RoutePrefix+"watch" on a replica, which opens the
// watch on its own service as the caller (the caller's ACL credentials
// travel with the call and the replica checks them) and answers with
// newline-delimited JSON streamLines: first the stream's opening (or the
// error that refused it), then its events and a heartbeat whenever it was
// quiet for a while, and last the error that ended it.
//
// The relayed stream is a service.Watcher like a local one, so the merged
// watch (router.go) and every protocol adapter use it unchanged. When the
// replica serving it dies, stops serving the shard, or goes quiet past the
// idle bound, the stream fails over: it asks another replica (or this node,
// if the shard moved here) for the rest, resuming after the last event it
// delivered, so the client sees every event once and in order. Only when
// no replica answers within RouteWait does it end, with `unavailable`,
// which the clients resume from as from any node's shutdown.

// Streamer opens forwarded watches (the server's, over the raft port). A
// Remote that is also a Streamer lets the router forward watches.
type Streamer interface {
	Stream(ctx context.Context, node string, body []byte) (io.ReadCloser, error)
}

// streamCall is a forwarded watch ("watch") or observe ("observe") of the
// shard in group Group.
type streamCall struct {
	Group  uint64 `json:"group"`
	Op     string `json:"op"`
	Prefix string `json:"prefix,omitempty"`
	Name   string `json:"name,omitempty"`
	From   uint64 `json:"from,omitempty"`
	Splits bool   `json:"splits,omitempty"`
	Stale  bool   `json:"stale,omitempty"`
	// The caller's credentials, as in a routed call.
	Bearer string `json:"bearer,omitempty"`
	CertCN string `json:"cert_cn,omitempty"`
}

// streamLine is one line of a forwarded stream: exactly one field is set.
type streamLine struct {
	Open  *streamOpen  `json:"open,omitempty"`
	Event *watch.Event `json:"event,omitempty"`
	HB    bool         `json:"hb,omitempty"`
	Err   *routedError `json:"err,omitempty"`
}

// streamOpen is a forwarded stream's first line: the revision it starts
// after, the splits of its shard as the replica knows them once the stream
// opened (a merged watch checks that none slipped in between), and an
// observe's view.
type streamOpen struct {
	Revision uint64                `json:"revision"`
	Splits   []splitInfo           `json:"splits,omitempty"`
	View     *service.ElectionView `json:"view,omitempty"`
}

// splitInfo is one group split off a shard: the revision of its split when
// the replica's watch history still holds it (Kept), and whether a watch of
// the shard from the asked revision starts after it (Behind).
type splitInfo struct {
	Group    uint64 `json:"group"`
	Revision uint64 `json:"revision,omitempty"`
	Kept     bool   `json:"kept,omitempty"`
	Behind   bool   `json:"behind,omitempty"`
}

// splitsOf lists the groups split off svc's shard as this node has applied
// them; Behind is for a watch from revision from.
func splitsOf(svc *service.Service, from uint64) []splitInfo {
	var out []splitInfo
	for _, g := range svc.LocalSplits() {
		rev, kept := svc.SplitRevision(g)
		out = append(out, splitInfo{Group: g, Revision: rev, Kept: kept, Behind: svc.SplitBehind(g, from)})
	}
	return out
}

// StreamLimits bound the watches a node forwards and serves for others.
type StreamLimits struct {
	// MaxOut is how many watches of shards it does not run this node
	// relays for its clients at once; MaxIn how many it serves for other
	// nodes. Beyond either a new one is refused with rate_limited.
	MaxOut, MaxIn int
	// Heartbeat is how often a served stream that had no event sends a
	// heartbeat line; a relayed stream that hears nothing for
	// IdleHeartbeats of them fails over to another replica.
	Heartbeat time.Duration
}

// Defaults of StreamLimits.
const (
	DefaultMaxForwardedWatches = 1024
	DefaultStreamHeartbeat     = 5 * time.Second
	// IdleHeartbeats is how many heartbeats a relayed stream may miss.
	IdleHeartbeats = 4
)

const (
	// maxStreamCall bounds a forwarded watch's request (a prefix, a name
	// and a token).
	maxStreamCall = 64 << 10
	// maxStreamLine bounds one line of a forwarded stream: an event's
	// strings are each at most a few KiB (command.MaxValueLen and the name
	// and id limits), escaped at most sixfold in JSON.
	maxStreamLine = 64 << 10
	// streamBuffer is how many events a relayed stream holds for its
	// reader: with maxStreamLine, its buffers stay under 1.1 MiB. A reader
	// slower than that stops the relay reading, the replica's writes block,
	// and the replica's watcher limits (a slow watcher is cut off) apply.
	streamBuffer = 16
	// streamWriteTimeout bounds one write of a served stream: a forwarding
	// node that stopped reading for that long is cut off.
	streamWriteTimeout = 30 * time.Second
)

// streams is a node's share of forwarded watches: its limits, the counts,
// and what ends them all when the node shuts down.
type streams struct {
	ctx    context.Context // cancelled by CloseStreams
	cancel context.CancelFunc

	mu        sync.Mutex
	limits    StreamLimits
	out, in   int
	failovers uint64
	closed    bool
	wg        sync.WaitGroup // every relay goroutine and served stream
}

func newStreams() *streams {
	ctx, cancel := context.WithCancel(context.Background())
	return &streams{ctx: ctx, cancel: cancel, limits: StreamLimits{
		MaxOut: DefaultMaxForwardedWatches, MaxIn: DefaultMaxForwardedWatches, Heartbeat: DefaultStreamHeartbeat}}
}

// SetStreamLimits replaces the limits of forwarded watches (zero fields
// keep their defaults); streams open already keep running.
func (r *Router) SetStreamLimits(l StreamLimits) {
	fw := r.fw
	fw.mu.Lock()
	defer fw.mu.Unlock()
	if l.MaxOut > 0 {
		fw.limits.MaxOut = l.MaxOut
	}
	if l.MaxIn > 0 {
		fw.limits.MaxIn = l.MaxIn
	}
	if l.Heartbeat > 0 {
		fw.limits.Heartbeat = l.Heartbeat
	}
}

// StreamCounts are the forwarded watches open now: relayed for this node's
// clients (out) and served for other nodes (in).
func (r *Router) StreamCounts() (out, in int) {
	r.fw.mu.Lock()
	defer r.fw.mu.Unlock()
	return r.fw.out, r.fw.in
}

// StreamFailovers counts the times a relayed stream of this node resumed
// on another replica (or this node) after its replica failed it.
func (r *Router) StreamFailovers() uint64 {
	r.fw.mu.Lock()
	defer r.fw.mu.Unlock()
	return r.fw.failovers
}

// CloseStreams ends every forwarded watch, relayed or served, and waits
// for their goroutines: the node is shutting down. A relayed stream ends
// with `unavailable`, which clients resume from on another node.
func (r *Router) CloseStreams() {
	fw := r.fw
	fw.mu.Lock()
	fw.closed = true
	fw.mu.Unlock()
	fw.cancel()
	fw.wg.Wait()
}

// take reserves a slot of the relayed (in false) or served streams and
// counts a goroutine in wg, so that CloseStreams waits for it: release
// gives the slot back (when the stream is closed), exit ends the
// goroutine's count (when it returns).
func (fw *streams) take(in bool) (release, exit func(), err error) {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	if fw.closed {
		return nil, nil, shuttingDown()
	}
	n, limit, what := &fw.out, fw.limits.MaxOut, "relays"
	if in {
		n, limit, what = &fw.in, fw.limits.MaxIn, "serves for other nodes"
	}
	if *n >= limit {
		return nil, nil, &apierror.Error{Code: apierror.RateLimited, RetryAfter: time.Second, Message: fmt.Sprintf(
			"this node already %s %d watches of shards it does not run, its limit; close watches you no longer need, watch a wider prefix, or watch through a node that runs the shard (GET /api/v1/cluster lists every shard's replicas)", what, *n)}
	}
	*n++
	fw.wg.Add(1)
	var rel, ex sync.Once
	return func() {
			rel.Do(func() {
				fw.mu.Lock()
				*n--
				fw.mu.Unlock()
			})
		}, func() {
			ex.Do(fw.wg.Done)
		}, nil
}

func (fw *streams) heartbeat() time.Duration {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	return fw.limits.Heartbeat
}

func shuttingDown() error {
	return &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Message: "this node is shutting down; reconnect to another node with from_revision (or from_revisions) set to the last event you received"}
}

// ---- the replica's side ----

// serveStream serves a watch another node forwards here, on this node's
// own service of the shard, until the stream ends, the forwarding node
// goes away, or this node shuts down.
func (r *Router) serveStream(w http.ResponseWriter, req *http.Request) {
	var in streamCall
	if !readRouted(w, req, maxStreamCall, "forwarded watch", &in) {
		return
	}
	if in.Op != "watch" && in.Op != "observe" {
		http.Error(w, fmt.Sprintf("unknown forwarded stream %q", in.Op), http.StatusBadRequest)
		return
	}
	rc := http.NewResponseController(w)
	// The request is read: from here only the forwarding node closing the
	// connection (or a write that cannot get through) ends the stream.
	_ = rc.SetReadDeadline(time.Time{})
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	send := func(l *streamLine) error {
		_ = rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
		return enc.Encode(l)
	}
	flush := func() error { return rc.Flush() }
	fail := func(err error) { _ = send(&streamLine{Err: wireErr(err)}); _ = flush() }

	release, exit, err := r.fw.take(true)
	if err != nil {
		fail(err)
		return
	}
	defer exit()
	defer release()
	svc := r.local(in.Group)
	if svc == nil {
		_ = send(&streamLine{Err: notHere(in.Group)})
		_ = flush()
		return
	}
	ctx := asCaller(req.Context(), in.Bearer, in.CertCN)
	var sw *service.Watcher
	var open streamOpen
	if in.Op == "watch" {
		sw, err = svc.Watch(ctx, service.WatchRequest{Prefix: in.Prefix, FromRevision: in.From, FollowSplits: in.Splits})
		if err == nil {
			open.Revision, open.Splits = sw.Revision, splitsOf(svc, in.From)
		}
	} else {
		open.View, sw, err = svc.Observe(ctx, in.Name, in.Stale)
		if err == nil {
			open.Revision = sw.Revision
		}
	}
	if err != nil {
		fail(err)
		return
	}
	defer sw.Close()
	if send(&streamLine{Open: &open}) != nil || flush() != nil {
		return
	}
	hb := time.NewTicker(r.fw.heartbeat())
	defer hb.Stop()
	events := sw.Events()
	for {
		select {
		case e, ok := <-events:
			for ok {
				if send(&streamLine{Event: &e}) != nil {
					return
				}
				// Send what is queued already before flushing.
				select {
				case e, ok = <-events:
					continue
				default:
				}
				break
			}
			if !ok {
				err := sw.Err()
				if err == nil {
					err = shuttingDown()
				}
				fail(err)
				return
			}
			if flush() != nil {
				return
			}
			hb.Reset(r.fw.heartbeat())
		case <-hb.C:
			if send(&streamLine{HB: true}) != nil || flush() != nil {
				return
			}
		case <-req.Context().Done():
			return
		case <-r.fw.ctx.Done():
			fail(shuttingDown())
			return
		}
	}
}

// ---- the forwarding node's side ----

// source is one connection of a relayed stream: a replica's stream, or
// this node's own service once the shard runs here.
type source interface {
	next() (streamLine, error)
	close()
}

// remoteSource reads a replica's stream line by line; a line that does
// not come within idle ends it.
type remoteSource struct {
	sc     *bufio.Scanner
	body   io.ReadCloser
	cancel context.CancelFunc
	idle   time.Duration
	node   string
}

var errIdle = errors.New("no event or heartbeat came within the idle bound")

func (s *remoteSource) next() (streamLine, error) {
	t := time.AfterFunc(s.idle, s.cancel)
	ok := s.sc.Scan()
	if !t.Stop() {
		return streamLine{}, fmt.Errorf("node %s: %w", s.node, errIdle)
	}
	if !ok {
		err := s.sc.Err()
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		return streamLine{}, fmt.Errorf("node %s: %w", s.node, err)
	}
	var l streamLine
	if err := json.Unmarshal(s.sc.Bytes(), &l); err != nil {
		return streamLine{}, fmt.Errorf("node %s sent a bad stream line: %w", s.node, err)
	}
	return l, nil
}

func (s *remoteSource) close() {
	s.cancel()
	_ = s.body.Close()
}

// localSource is this node's own watch of the shard; ctx (the relay's)
// ends a wait for its next event.
type localSource struct {
	ctx context.Context
	w   *service.Watcher
}

func (s localSource) next() (streamLine, error) {
	var e watch.Event
	var ok bool
	select {
	case e, ok = <-s.w.Events():
	case <-s.ctx.Done():
		return streamLine{}, s.ctx.Err()
	}
	if !ok {
		err := s.w.Err()
		if err == nil {
			err = shuttingDown()
		}
		return streamLine{Err: wireErr(err)}, nil
	}
	return streamLine{Event: &e}, nil
}

func (s localSource) close() { s.w.Close() }

// relay is a relayed stream: the service.Source of a forwarded watch.
type relay struct {
	r       *Router
	call    streamCall
	ctx     context.Context // ends the relay: Close or CloseStreams
	cancel  context.CancelFunc
	release func()
	out     chan watch.Event
	done    chan struct{}
	exited  chan struct{}

	// The relay goroutine's own: the last revision delivered, how many of
	// its events were delivered, and how many of those a resumed
	// connection still has to skip.
	last   uint64
	atLast int
	skip   int

	mu  sync.Mutex
	err error
}

func (s *relay) Events() <-chan watch.Event { return s.out }
func (s *relay) Done() <-chan struct{}      { return s.done }

func (s *relay) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

func (s *relay) Close() {
	s.cancel()
	<-s.exited
	s.release()
}

// openStream opens a relayed stream of range k of v (which runs on other
// nodes) from one of its replicas. ctx bounds the opening only; the
// stream lives until Close or CloseStreams.
func (r *Router) openStream(ctx context.Context, v *view, k int, call streamCall) (*service.Watcher, *streamOpen, error) {
	if _, ok := r.remote.(Streamer); !ok {
		return nil, nil, notStreamed(v, k, r.remote.All())
	}
	release, exit, err := r.fw.take(false)
	if err != nil {
		return nil, nil, err
	}
	// The relay is this node's client's stream: it counts against this
	// node's watcher limits (the meta group's service, on every node,
	// holds them) as a watch of a shard it runs does.
	r.mu.Lock()
	meta := r.members
	r.mu.Unlock()
	if meta != nil {
		slot, err := meta.WatchSlot(ctx)
		if err != nil {
			release()
			exit()
			return nil, nil, err
		}
		free := release
		release = func() { free(); slot() }
	}
	call.Group = v.m.Groups[k]
	call.Bearer, call.CertCN = service.Credentials(ctx)
	sctx, cancel := context.WithCancel(r.fw.ctx)
	s := &relay{r: r, call: call, ctx: sctx, cancel: cancel, release: release,
		out: make(chan watch.Event, streamBuffer), done: make(chan struct{}), exited: make(chan struct{})}
	src, open, err := s.dial(ctx, call, "")
	if err != nil {
		cancel()
		release()
		exit()
		return nil, nil, err
	}
	s.last = open.Revision
	if call.From > 0 {
		s.last = call.From - 1
	}
	go func() { defer exit(); s.run(src) }()
	return service.SourceWatcher(s, open.Revision), open, nil
}

// dial opens the stream on a replica of the call's group, as the current
// map places it: this node's preference first (so streams spread), avoid
// (the replica that just failed) last. A replica that does not run the
// group, has no leader or is shutting down is passed over; any other
// refusal (compacted, permission denied, a bad prefix) is the answer.
func (s *relay) dial(ctx context.Context, call streamCall, avoid string) (source, *streamOpen, error) {
	r := s.r
	v, _ := r.view()
	k := v.m.IndexOfGroup(call.Group)
	if k < 0 {
		return nil, nil, &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Message: fmt.Sprintf(
			"raft group %x of this stream is not in this node's shard map (generation %d); resume the watch", call.Group, v.m.Generation)}
	}
	if svc := v.shards[k]; svc != nil && call.Op == "watch" {
		// The shard runs here now (a replica moved here).
		w, err := svc.Watch(service.WithBearer(service.WithCertIdentity(ctx, call.CertCN), call.Bearer),
			service.WatchRequest{Prefix: call.Prefix, FromRevision: call.From, FollowSplits: call.Splits})
		if err != nil {
			return nil, nil, err
		}
		return localSource{s.ctx, w}, &streamOpen{Revision: w.Revision, Splits: splitsOf(svc, call.From)}, nil
	}
	st, _ := r.remote.(Streamer)
	hosts := v.m.Hosts(k, r.remote.All())
	body, err := json.Marshal(&call)
	if err != nil {
		return nil, nil, apierror.Wrap(apierror.Internal, err, "encode a forwarded watch")
	}
	order := make([]string, 0, len(hosts))
	start := int(fnvString(r.remote.Self()) % uint64(max(len(hosts), 1)))
	for i := range hosts {
		if n := hosts[(start+i)%len(hosts)]; n != r.remote.Self() && n != avoid {
			order = append(order, n)
		}
	}
	if avoid != "" && avoid != r.remote.Self() && v.m.Hosted(k, avoid, r.remote.All()) {
		order = append(order, avoid)
	}
	idle := IdleHeartbeats * r.fw.heartbeat()
	var last, limited error
	for _, node := range order {
		cctx, cancel := context.WithCancel(s.ctx)
		stop := context.AfterFunc(ctx, cancel) // the opening's bound
		src, open, err := s.dialOne(cctx, cancel, st, node, body, idle)
		stop()
		if err == nil && ctx.Err() == nil {
			return src, open, nil
		}
		if src != nil {
			src.close()
		}
		cancel()
		if ctx.Err() != nil || s.ctx.Err() != nil {
			return nil, nil, errors.Join(ctx.Err(), s.ctx.Err())
		}
		var ae *apierror.Error
		switch {
		case errors.As(err, &ae) && ae.Code == apierror.RateLimited:
			limited = err
		case errors.As(err, &ae) && !passOver(ae.Code):
			return nil, nil, err
		default:
			last = err
		}
	}
	if limited != nil {
		return nil, nil, limited
	}
	return nil, nil, &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Err: last, Message: fmt.Sprintf(
		"shard %d runs on nodes %v, not this one, and none of them could stream its events (%v); retry", v.m.IDs[k], hosts, last)}
}

// passOver reports whether a replica's refusal sends the stream to another
// replica.
func passOver(c apierror.Code) bool {
	return c == errNotHere || c == apierror.Unavailable || c == apierror.NoLeader
}

func (s *relay) dialOne(ctx context.Context, cancel context.CancelFunc, st Streamer, node string, body []byte, idle time.Duration) (source, *streamOpen, error) {
	rc, err := st.Stream(ctx, node, body)
	if err != nil {
		return nil, nil, err
	}
	sc := bufio.NewScanner(rc)
	sc.Buffer(make([]byte, 0, 4096), maxStreamLine)
	src := &remoteSource{sc: sc, body: rc, cancel: cancel, idle: idle, node: node}
	l, err := src.next()
	switch {
	case err != nil:
		return src, nil, err
	case l.Err != nil:
		return src, nil, remoteErr(l.Err)
	case l.Open == nil:
		return src, nil, fmt.Errorf("node %s did not open the stream", node)
	}
	return src, l.Open, nil
}

func remoteErr(e *routedError) error {
	return &apierror.Error{Code: e.Code, Message: e.Message, RetryAfter: time.Duration(e.RetryAfterMs) * time.Millisecond}
}

// run relays src, and the replicas it fails over to, into out until the
// stream ends.
func (s *relay) run(src source) {
	defer close(s.exited)
	defer close(s.out)
	defer close(s.done)
	node := ""
	if rs, ok := src.(*remoteSource); ok {
		node = rs.node
	}
	for {
		err := s.pump(src)
		src.close()
		if s.ctx.Err() != nil {
			if s.r.fw.ctx.Err() != nil {
				s.fail(shuttingDown())
			}
			return
		}
		var ae *apierror.Error
		if s.call.Op != "watch" || (errors.As(err, &ae) && !passOver(ae.Code)) {
			// An observe's view cannot be resumed: the client observes
			// again.
			s.fail(err)
			return
		}
		if src, node, err = s.failover(node, err); err != nil {
			s.fail(err)
			return
		}
		s.r.fw.mu.Lock()
		s.r.fw.failovers++
		s.r.fw.mu.Unlock()
	}
}

func (s *relay) fail(err error) {
	var ae *apierror.Error
	if !errors.As(err, &ae) {
		err = &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Err: err, Message: fmt.Sprintf(
			"the replica streaming this watch's shard stopped (%v); resume with from_revision (or from_revisions) set to the last event you received", err)}
	}
	s.mu.Lock()
	s.err = err
	s.mu.Unlock()
}

// pump delivers src's events until it ends; the error says why.
func (s *relay) pump(src source) error {
	for {
		l, err := src.next()
		if err != nil {
			return err
		}
		switch {
		case l.Err != nil:
			return remoteErr(l.Err)
		case l.Event == nil:
			continue // a heartbeat: the replica is alive
		}
		e := *l.Event
		if s.skip > 0 && e.Revision == s.last {
			s.skip--
			continue
		}
		s.skip = 0
		if e.Revision == s.last {
			s.atLast++
		} else {
			s.last, s.atLast = e.Revision, 1
		}
		select {
		case s.out <- e:
		case <-s.ctx.Done():
			return s.ctx.Err()
		}
	}
}

// failover resumes the stream on another replica after the last event
// delivered: from its revision, skipping the events of it delivered
// already (one entry may make several), or from the next one. It keeps
// trying, with a growing pause, for RouteWait.
func (s *relay) failover(failed string, cause error) (source, string, error) {
	deadline := time.Now().Add(RouteWait)
	pause := 100 * time.Millisecond
	for {
		call := s.call
		if s.atLast > 0 {
			call.From, s.skip = s.last, s.atLast
		} else {
			call.From, s.skip = s.last+1, 0
		}
		ctx, cancel := context.WithDeadline(s.ctx, deadline)
		src, _, err := s.dial(ctx, call, failed)
		cancel()
		if err == nil {
			node := ""
			if rs, ok := src.(*remoteSource); ok {
				node = rs.node
			}
			return src, node, nil
		}
		var ae *apierror.Error
		if errors.As(err, &ae) && !passOver(ae.Code) && ae.Code != apierror.RateLimited {
			return nil, "", err
		}
		cause = err
		if s.ctx.Err() != nil || time.Now().Add(pause).After(deadline) {
			return nil, "", &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Err: cause, Message: fmt.Sprintf(
				"no replica of this watch's shard could continue it within %s (%v); resume with from_revision (or from_revisions) set to the last event you received", RouteWait, cause)}
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-s.ctx.Done():
			t.Stop()
		}
		pause = min(2*pause, time.Second)
	}
}
