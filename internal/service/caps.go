package service

import (
	"context"
	"slices"
	"time"

	"github.com/dlock/dlock/internal/state"
)

// The caps (Limits): checked against this node's state before anything is
// proposed.

// checkCaps refuses an acquire or campaign that would add a waiter to a full
// queue or a lease to a client at its cap. A retry of a request the cluster
// already answered (same client_id and request_id) is let through: it
// creates nothing and must get its first answer. The waiter cap is checked
// here only to refuse early: requests that race (here or on other nodes) all
// pass this check, so the cap also travels in the command (maxWaiters) and
// the state machine enforces it. The lease cap is soft: racing requests may
// pass it by a few.
//
// counts says whether a lease the request creates counts against the lease
// cap (then call leaseCreated).
func (s *Service) checkCaps(a acquireArgs, newLease bool) (counts bool, _ error) {
	if s.lim == nil {
		return false, nil
	}
	c := s.lim.cfg
	wantWait := a.waitMs > 0 && c.MaxWaitersPerLock > 0
	wantLease := newLease && c.MaxLeasesPerClient > 0
	if !wantWait && !wantLease {
		return false, nil
	}
	if s.seen(a.clientID, a.requestID) {
		return false, nil
	}
	if wantWait {
		full, n := false, 0
		s.fsm.Read(func(st *state.State) {
			li := st.GetLock(a.key)
			n = li.Waiters
			// Only a lock in use queues. A takeover by a holder's own
			// client takes the lock instead, and one by a client that
			// waits already takes its place: neither adds a waiter.
			holds := slices.ContainsFunc(li.Holders, func(h state.Holder) bool { return h.ClientID == a.clientID })
			replaces := a.takeover && (holds || st.ClientQueued(a.key, a.clientID))
			full = (li.Held || n > 0) && n >= c.MaxWaitersPerLock && !replaces
		})
		if full {
			return false, s.queueFullErr(a, int64(n))
		}
	}
	if wantLease {
		return true, s.checkLeaseCap(a.clientID)
	}
	return false, nil
}

// maxWaiters is the waiter cap an acquire carries into the log (0: none).
func (s *Service) maxWaiters(a acquireArgs) int64 {
	if s.lim == nil || a.waitMs <= 0 || s.lim.cfg.MaxWaitersPerLock <= 0 {
		return 0
	}
	return int64(s.lim.cfg.MaxWaitersPerLock)
}

// queueFullErr refuses a wait in a queue that has n waiters, the cap.
func (s *Service) queueFullErr(a acquireArgs, n int64) error {
	s.limited(limitWaiters)
	return limitErr(time.Second, "%s %q already has %d waiters, the most one %s may have (dlock serve --max-waiters-per-lock); retry later, or ask without wait_timeout_ms",
		a.what, displayName(a.key), n, a.what)
}

// checkLeaseCap refuses a new session or implicit lease for a client that
// owns MaxLeasesPerClient already.
func (s *Service) checkLeaseCap(clientID string) error {
	if s.lim == nil || s.lim.cfg.MaxLeasesPerClient <= 0 {
		return nil
	}
	limit := s.lim.cfg.MaxLeasesPerClient
	if n := s.lim.leases.count(s.fsm.Read, clientID, limit); n >= limit {
		s.limited(limitLeases)
		return limitErr(time.Second, "client_id %q already owns %d leases (sessions, and locks held or awaited with ttl_ms), the most one client may own (dlock serve --max-leases-per-client); release locks and delete sessions it no longer needs, then retry",
			clientID, n)
	}
	return nil
}

// leaseCreated and leaseDeleted tell the lease counts about a lease this
// node created or deleted, so the client's next request here sees it.
func (s *Service) leaseCreated(clientID string) { s.lim.leases.changed(clientID, 1) }
func (s *Service) leaseDeleted(clientID string) { s.lim.leases.changed(clientID, -1) }

// seen reports whether the cluster already answered this request (the dedup
// table on this node).
func (s *Service) seen(clientID, requestID string) bool {
	if requestID == "" {
		return false
	}
	found := false
	s.fsm.Read(func(st *state.State) { _, found = st.Lookup(clientID, requestID) })
	return found
}

// WatchSlot reserves a slot under this node's watcher limits
// (--max-watchers, --max-watchers-per-conn) for a stream from ctx's
// connection that this service does not serve itself: the shard router's
// watch of a shard relayed from another node. release gives it back.
func (s *Service) WatchSlot(ctx context.Context) (release func(), err error) {
	return s.watchSlot(ctx)
}

// watchSlot reserves a watcher slot for a new stream from ctx's connection.
func (s *Service) watchSlot(ctx context.Context) (func(), error) {
	if s.lim == nil {
		return func() {}, nil
	}
	release, refused, n := s.lim.slots.take(remoteOf(ctx).conn)
	switch refused {
	case "":
		return release, nil
	case limitWatchers:
		s.limited(refused)
		return nil, limitErr(time.Second, "this node already serves %d watch streams, its limit (dlock serve --max-watchers); close watches you no longer need, watch a wider prefix, or use another node", n)
	default:
		s.limited(refused)
		return nil, limitErr(time.Second, "this connection already has %d open watch streams, the most one connection may have (dlock serve --max-watchers-per-conn); close one, watch a wider prefix, or open another connection", n)
	}
}

// checkSessionCap is checkLeaseCap for a session create, letting a retry of
// an answered request through; counts as for checkCaps.
func (s *Service) checkSessionCap(clientID, requestID string) (counts bool, _ error) {
	if !s.countsLeases(clientID, requestID) {
		return false, nil
	}
	return true, s.checkLeaseCap(clientID)
}

// countsLeases says whether a session create or delete by clientID changes
// its lease count: the cap is on, and this is not the retry of a request the
// cluster already answered (which acts again not at all).
func (s *Service) countsLeases(clientID, requestID string) bool {
	return s.lim != nil && s.lim.cfg.MaxLeasesPerClient > 0 && clientID != "" && !s.seen(clientID, requestID)
}
