package service

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/state"
	"github.com/dlock/dlock/internal/watch"
)

// Watcher is an open event stream. Read Events until it is closed, then Err
// says why; Close ends it early.
type Watcher struct {
	sub *watch.Subscription
	// Revision is the newest revision this node had applied when the watch
	// started.
	Revision uint64
	// release gives back the stream's watcher slot (--max-watchers) and
	// stops following its ACL token.
	release func()
	// revoked is set when the stream's ACL token was revoked (bindToken).
	revoked atomic.Bool
	// m, when set, is a stream merged over several shards (MergeWatchers);
	// sub is then nil.
	m *merged
	// Start is a merged stream's place when it opened: per shard, the
	// first revision it streams (shards split off later join it).
	Start []watch.ShardRevision
	// src, when set, is a stream served elsewhere (SourceWatcher); sub
	// and m are then nil.
	src Source
}

// Source is an event stream this node does not serve from its own history:
// a shard's events relayed from a replica on another node (the shard
// router's forwarded watch). It has Watcher's contract: Events is closed
// after Done, Err says why it ended, Close ends it and may be called more
// than once.
type Source interface {
	Events() <-chan watch.Event
	Done() <-chan struct{}
	Close()
	Err() error
}

// SourceWatcher wraps src as a Watcher; rev is the revision its stream
// started after (Watcher.Revision).
func SourceWatcher(src Source, rev uint64) *Watcher {
	return &Watcher{src: src, Revision: rev}
}

// Events delivers events in revision order; it is closed when the stream ends.
func (w *Watcher) Events() <-chan watch.Event {
	if w.src != nil {
		return w.src.Events()
	}
	if w.m != nil {
		return w.m.out
	}
	return w.sub.Events()
}

// Done is closed as soon as the stream ends (Err says why), even while events
// are still queued on Events.
func (w *Watcher) Done() <-chan struct{} {
	if w.src != nil {
		return w.src.Done()
	}
	if w.m != nil {
		return w.m.done
	}
	return w.sub.Done()
}

// Close ends the stream. Every watcher must be closed, even one that ended by
// itself: that frees its slot under the watcher limits.
func (w *Watcher) Close() {
	if w.src != nil {
		w.src.Close()
		return
	}
	if w.m != nil {
		w.m.close()
		return
	}
	w.sub.Close()
	if w.release != nil {
		w.release()
	}
}

// Err says why the stream ended, as a client-facing error (nil if closed by Close).
func (w *Watcher) Err() error {
	if w.src != nil {
		return w.src.Err()
	}
	if w.m != nil {
		return w.m.error()
	}
	if w.revoked.Load() {
		return revokedErr("this stream was opened with")
	}
	return watchErr(w.sub.Err())
}

// bindToken ends the stream, with a permission_denied Err, once the token
// that opened it (tok; nil with ACLs off) is revoked, replaced or expires.
func (s *Service) bindToken(w *Watcher, tok *state.ACLToken) {
	if tok == nil {
		return
	}
	ctx, untrack := s.trackToken(context.Background(), tok)
	stop := context.AfterFunc(ctx, func() {
		w.revoked.Store(true)
		w.sub.Close()
	})
	release := w.release
	w.release = func() {
		stop()
		untrack()
		release()
	}
}

func watchErr(err error) error {
	var ce *watch.CompactedError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ce):
		return &apierror.Error{Code: apierror.Compacted, Err: err, Message: ce.Error()}
	case errors.Is(err, watch.ErrSlow):
		return apierror.Wrap(apierror.Unavailable, err, "this watcher fell behind and was cut off so it never misses events silently: its next event left this node's kept history; reconnect with from_revision set to the last revision you received (and skip its events you already have), and if that is answered compacted, list again")
	case errors.Is(err, watch.ErrReset):
		return apierror.Wrap(apierror.Compacted, err, "this node restored a snapshot and its event history restarted; list again and watch from the listed revision + 1")
	case errors.Is(err, errNoLeaderHere):
		return apierror.Wrap(apierror.NoLeader, err, noLeaderHere+", so it hears of no changes; reconnect to another node with from_revision set to the last revision you received (and skip its events you already have)")
	case errors.Is(err, watch.ErrClosed):
		return apierror.Wrap(apierror.Unavailable, err, "this node is shutting down; reconnect to another node with from_revision set to the last revision you received (and skip its events you already have)")
	}
	return apierror.Wrap(apierror.Internal, err, "watch failed")
}

// Event converts a hub event to its public form.
func Event(e watch.Event) WatchEvent {
	v := WatchEvent{Revision: e.Revision, Type: e.Type, Kind: e.Kind, Name: e.Name, ClientID: e.ClientID,
		FencingToken: e.Token, Cause: e.Cause, Reason: e.Reason, Value: e.Value, At: ms(e.At), Subtree: e.Subtree}
	if e.Vector != nil {
		shard := e.Shard
		v.Shard = &shard
		v.Revisions = make(map[string]uint64, len(e.Vector))
		for _, p := range e.Vector {
			v.Revisions[strconv.Itoa(p.Shard)] = p.Revision
		}
	}
	if e.Kind == "lock" {
		switch e.Type {
		case "acquired", "released", "expired", "revoked", "queued", "dequeued":
			v.Mode = modeName(e.Shared)
		}
	}
	return v
}

// Watch streams every state change under a name prefix from a revision on.
// Served from this node's own applied log: followers see the same events in the
// same order as the leader. A revision older than the kept history is answered
// with `compacted`.
func (s *Service) Watch(ctx context.Context, req WatchRequest) (*Watcher, error) {
	if err := s.admit(ctx, ""); err != nil {
		return nil, err
	}
	prefix, err := command.ValidatePrefix(req.Prefix)
	if err != nil {
		return nil, invalid("bad prefix: %v", err)
	}
	if req.FromRevisions != nil {
		return nil, invalid("from_revisions is for clusters with several shards; this one has one: use from_revision")
	}
	tok, err := s.authToken(ctx, command.PermWatch, prefix, "")
	if err != nil {
		return nil, err
	}
	if s.leaderless() {
		return nil, watchErr(errNoLeaderHere)
	}
	if err := s.checkFromRevision(ctx, req.FromRevision); err != nil {
		return nil, err
	}
	release, err := s.watchSlot(ctx)
	if err != nil {
		return nil, err
	}
	sub, cur, err := s.hub.Subscribe(watch.Filter{Prefix: prefix, Splits: req.FollowSplits}, req.FromRevision)
	if err != nil {
		release()
		return nil, watchErr(err)
	}
	w := &Watcher{sub: sub, Revision: cur, release: release}
	s.bindToken(w, tok)
	return w, nil
}

// checkFromRevision refuses a watch from a revision the cluster has not
// reached: it would wait silently until the cluster got there, which for
// a mistyped or hostile from_revision is for ever. The rule is
// from_revision <= committed revision + 1. This node's own revision is
// checked first; only a from_revision beyond it costs a linearizable read,
// after which this node has applied every revision any client can have
// seen on any node (each was committed before the read began), so a client
// that moved here from a node ahead of this one is still served.
func (s *Service) checkFromRevision(ctx context.Context, from uint64) error {
	if from == 0 {
		return nil
	}
	cur := s.revision()
	if from <= cur+1 {
		return nil
	}
	if err := s.node.LinearizableRead(ctx); err != nil {
		return err
	}
	if cur = s.revision(); from <= cur+1 {
		return nil
	}
	return invalid("from_revision %d is ahead of the cluster, whose current revision is %d: watch from at most %d (the next change), or omit from_revision to watch from now", from, cur, cur+1)
}

func (s *Service) revision() uint64 {
	var rev uint64
	s.fsm.Read(func(st *state.State) { rev = st.Revision() })
	return rev
}

// Observe follows one election: it returns the current view and a stream of
// the election's events; apply each with NextView to get the next view. The
// view is read and the stream opened at the same revision, so nothing is
// missed in between.
func (s *Service) Observe(ctx context.Context, name string, stale bool) (*ElectionView, *Watcher, error) {
	if err := s.admit(ctx, ""); err != nil {
		return nil, nil, err
	}
	n, err := normalize(name)
	if err != nil {
		return nil, nil, err
	}
	tok, err := s.authToken(ctx, command.PermWatch, n, "")
	if err != nil {
		return nil, nil, err
	}
	if s.leaderless() {
		return nil, nil, watchErr(errNoLeaderHere)
	}
	if err := s.read(ctx, stale); err != nil {
		return nil, nil, err
	}
	release, err := s.watchSlot(ctx)
	if err != nil {
		return nil, nil, err
	}
	var view ElectionView
	var sub *watch.Subscription
	// Read the view under the FSM lock so no event applies between the read
	// and the subscription (the hub is fed from Apply under the same lock).
	moved := false
	s.fsm.Read(func(st *state.State) {
		if moved = !st.Owns(n); moved {
			return
		}
		view = electionView(st.GetElection(n), st.Revision())
		sub, _, err = s.hub.Subscribe(watch.Filter{Kind: "election", Name: n}, 0)
	})
	if moved {
		release()
		return nil, nil, wrongShardErr("observe")
	}
	if err != nil {
		release()
		return nil, nil, watchErr(err)
	}
	w := &Watcher{sub: sub, Revision: view.Revision, release: release}
	s.bindToken(w, tok)
	return &view, w, nil
}

// NextView applies one election event to a view.
func NextView(v ElectionView, e watch.Event) ElectionView {
	v.Revision = e.Revision
	switch e.Type {
	case "elected":
		v.Leader = &ElectionLeader{CandidateID: e.ClientID, Value: e.Value, FencingToken: e.Token, Since: ms(e.At)}
		if v.Campaigners > 0 && e.Cause == state.CauseHandoff {
			v.Campaigners--
		}
	case "resigned", "expired":
		v.Leader = nil
	case "proclaimed":
		if v.Leader != nil {
			l := *v.Leader
			l.Value = e.Value
			v.Leader = &l
		}
	case "queued":
		v.Campaigners++
	case "dequeued":
		if v.Campaigners > 0 {
			v.Campaigners--
		}
	}
	return v
}
