// Package watch keeps each node's recent history of public state-machine events
// and streams it to watchers. Every node applies the same log, so every node
// produces the same events in the same order and any node can serve a watch.
// Applying never waits for a watcher: the history is one shared ring, each
// watcher only a cursor into it, and one whose unread events leave the ring is
// cut off with a reason instead of being fed a gap.
package watch

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/state"
)

// Event is a public event as watchers see it (no lease ids: they are secrets).
type Event struct {
	Revision uint64
	Type     string
	// Kind is "lock", "election" or "session"; "split" (KindSplit) only on
	// a subscription that asked for splits (Filter.Splits).
	Kind     string
	Name     string
	ClientID string
	Token    uint64
	Cause    string
	Value    string
	At       int64
	// Shared and Subtree are a lock grant's or wait's mode (acquired,
	// released, expired, queued, dequeued).
	Shared, Subtree bool
	// Reason is a revoke's reason.
	Reason string
	// Shard and Vector are set only on a stream merged over several shards
	// (service.MergeWatchers): the event's shard, and every shard's revision
	// after this event, in shard order. A node's own history never has them.
	Shard  int
	Vector []ShardRevision
}

// KindSplit marks the event of a split this shard was the source of: the
// names at and above Name left for Raft group Token, whose own revisions
// continue after Revision. Only a merged stream asks for it (Filter.Splits),
// to add the new shard's stream at that point; it never reaches a client.
const KindSplit = "split"

// ShardRevision is one shard's place in a merged stream's resume vector.
type ShardRevision struct {
	Shard    int
	Revision uint64
}

// Errors a subscription can end with.
var (
	// ErrCompacted: the requested revision is older than the kept history.
	ErrCompacted = errors.New("requested revision is older than the kept history")
	// ErrSlow: the watcher did not keep up and was cut off.
	ErrSlow = errors.New("watcher fell behind and was cut off")
	// ErrReset: the node's state was replaced from a snapshot; re-list.
	ErrReset = errors.New("state was restored from a snapshot")
	// ErrClosed: the hub is shutting down.
	ErrClosed = errors.New("watch hub closed")
)

// CompactedError carries the current revision so the client can re-list.
type CompactedError struct {
	Requested, Oldest, Current uint64
}

func (e *CompactedError) Error() string {
	return fmt.Sprintf("revision %d is compacted (oldest kept %d, current %d); list again and watch from the listed revision + 1", e.Requested, e.Oldest, e.Current)
}

func (e *CompactedError) Unwrap() error { return ErrCompacted }

// Defaults.
const (
	// DefaultHistory is how many events a node keeps, for all its watchers
	// together: a watcher may fall this far behind.
	DefaultHistory = 10_000
	// DefaultBuffer is each watcher's hand-off channel, in events. Its
	// events are copies of the history's headers (EventHeaderBytes each);
	// names and values stay shared with the history.
	DefaultBuffer = 16
)

// EventHeaderBytes is the size of one Event outside its strings' bytes: what
// a watcher's hand-off channel holds per event.
const EventHeaderBytes = 120

// Hub is the event history and the set of watchers. It implements fsm.Observer.
//
// Every appended event gets the next sequence number; the ring keeps the
// newest len(ring) of them. A subscription is a cursor (a sequence number)
// and a goroutine that copies what its filter matches from the ring into a
// small channel as the reader takes it, so a watcher that starts from an old
// revision costs no more memory than one that starts now.
type Hub struct {
	mu sync.Mutex
	// ring[seq%len(ring)] holds event seq for seq in [next-count, next).
	ring  []Event
	next  uint64
	count int
	// floor is the lowest sequence number a new subscription may read:
	// events before a snapshot restore belong to the history that ended.
	floor uint64
	// first is the lowest revision the history covers completely; current is
	// the newest applied revision.
	first, current uint64
	// wake is closed (and replaced) whenever events are appended, so every
	// waiting subscription looks at the ring once, whatever their number.
	wake   chan struct{}
	subs   map[*Subscription]struct{}
	buffer int
	closed bool
}

// NewHub keeps up to history events; each watcher's hand-off channel holds up
// to buffer events.
func NewHub(history, buffer int) *Hub {
	if history <= 0 {
		history = DefaultHistory
	}
	if buffer <= 0 {
		buffer = DefaultBuffer
	}
	return &Hub{ring: make([]Event, history), first: 1, subs: map[*Subscription]struct{}{}, buffer: buffer, wake: make(chan struct{})}
}

// Subscription is one watcher's stream.
type Subscription struct {
	hub *Hub
	// from is the first revision wanted: a lagging node may still apply older
	// events after the subscription starts.
	from   uint64
	prefix string
	kind   string
	name   string
	splits bool
	ch     chan Event
	// done is closed when the subscription ends; stop when its pump must
	// give up at once (Close, or cut off as slow) rather than deliver what
	// the history still holds up to the end.
	done, stop chan struct{}

	// Guarded by hub.mu.
	ended  bool
	err    error
	endSeq uint64 // with ended: events before it are still delivered
	// cursor is the next sequence number the pump looks at; sent holds the
	// sequence numbers of the events it put in ch, oldest first (the
	// unread ones are the last len(ch)); holding is the one it took from
	// the ring but could not put in ch yet.
	cursor     uint64
	sent       []uint64
	holding    bool
	holdingSeq uint64
}

// Events delivers events in revision order. It is closed when the
// subscription ends; Err then says why.
func (s *Subscription) Events() <-chan Event { return s.ch }

// Done is closed as soon as the subscription ends, even while events it had
// queued are still unread.
func (s *Subscription) Done() <-chan struct{} { return s.done }

// Err is why the subscription ended (nil while open or after Close).
func (s *Subscription) Err() error {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	return s.err
}

// Close ends the subscription and stops its goroutine. Every subscription
// must be closed, also one that ended by itself.
func (s *Subscription) Close() {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	s.endLocked(nil)
	s.stopLocked()
}

func (s *Subscription) endLocked(err error) {
	if s.ended {
		return
	}
	s.ended = true
	s.err = err
	s.endSeq = s.hub.next
	delete(s.hub.subs, s)
	close(s.done)
}

func (s *Subscription) stopLocked() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
}

// Filter selects events: by name prefix, and optionally one kind or one exact name.
type Filter struct {
	Prefix string
	Kind   string
	Name   string
	// Splits adds the shard's split events (KindSplit), whatever the
	// prefix: a merged stream follows them to the new shards.
	Splits bool
}

func (s *Subscription) matches(e *Event) bool {
	if e.Revision < s.from {
		return false
	}
	if e.Kind == KindSplit {
		return s.splits
	}
	if s.kind != "" && e.Kind != s.kind {
		return false
	}
	if s.name != "" && e.Name != s.name {
		return false
	}
	return strings.HasPrefix(e.Name, s.prefix)
}

// Subscribe streams events with revision >= from (from 0 means "from now on").
// A from older than the kept history fails with a *CompactedError.
func (h *Hub) Subscribe(f Filter, from uint64) (*Subscription, uint64, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, 0, ErrClosed
	}
	if from == 0 {
		from = h.current + 1
	}
	if from < h.first {
		return nil, h.current, &CompactedError{Requested: from, Oldest: h.first, Current: h.current}
	}
	// Revisions only grow along the ring (since the last restore), so the
	// first event the subscription wants is found by bisection; every
	// event from there on is still kept, since from >= first.
	lo := max(h.floor, h.next-uint64(h.count))
	n := int(h.next - lo)
	start := lo + uint64(sort.Search(n, func(i int) bool { return h.at(lo+uint64(i)).Revision >= from }))
	s := &Subscription{hub: h, from: from, prefix: f.Prefix, kind: f.Kind, name: f.Name, splits: f.Splits,
		ch: make(chan Event, h.buffer), done: make(chan struct{}), stop: make(chan struct{}), cursor: start}
	h.subs[s] = struct{}{}
	go s.pump()
	return s, h.current, nil
}

// SplitRevision is the revision of the split event that made Raft group g,
// if the history (since the last restore) still holds it.
func (h *Hub) SplitRevision(g uint64) (uint64, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.splitRevisionLocked(g)
}

func (h *Hub) splitRevisionLocked(g uint64) (uint64, bool) {
	for seq := max(h.floor, h.oldest()); seq < h.next; seq++ {
		if e := h.at(seq); e.Kind == KindSplit && e.Token == g {
			return e.Revision, true
		}
	}
	return 0, false
}

// SplitBehind reports whether a subscription from revision from would
// start after the split that made group g (applied here), so it would
// never see that split event (from 0, "now", starts after every split
// applied here). A from older than the kept history is not behind: its
// subscription fails as compacted instead.
func (h *Hub) SplitBehind(g, from uint64) bool {
	if from == 0 {
		return true
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if rev, ok := h.splitRevisionLocked(g); ok {
		return rev < from
	}
	// Not kept: older than the history, which covers from on.
	return from >= h.first
}

func (h *Hub) at(seq uint64) *Event { return &h.ring[seq%uint64(len(h.ring))] }

// oldest is the lowest sequence number the ring still holds.
func (h *Hub) oldest() uint64 { return h.next - uint64(h.count) }

// pump moves the events the subscription wants from the ring into its
// channel as the reader takes them. It owns ch (the only sender, it closes
// it) and ends when the subscription is stopped, or has ended and delivered
// everything before its end.
func (s *Subscription) pump() {
	defer close(s.ch)
	h := s.hub
	var held Event
	for {
		h.mu.Lock()
		if s.behindLocked() {
			s.endLocked(ErrSlow)
			s.stopLocked()
			h.mu.Unlock()
			return
		}
		limit := h.next
		if s.ended {
			limit = min(limit, s.endSeq)
		}
		if !s.holding {
			held, s.holding = s.fillLocked(limit)
		}
		holding, ended, wake := s.holding, s.ended, h.wake
		h.mu.Unlock()
		if ended && !holding {
			return // everything up to the end is in the channel
		}
		done := s.done
		if ended {
			done = nil // closed already: no reason to look again
		}
		var send chan<- Event
		if holding {
			send = s.ch
		}
		// Besides the reader making room, every append is a reason to
		// look again: the reader may have fallen out of the history.
		select {
		case send <- held:
			h.mu.Lock()
			s.noteSentLocked(s.holdingSeq)
			s.holding = false
			h.mu.Unlock()
			held = Event{}
		case <-wake:
		case <-done:
		case <-s.stop:
			return
		}
	}
}

// fillLocked puts the events from the cursor up to limit that the filter
// wants into the channel without blocking. It returns the first one that
// did not fit, to be sent once the reader makes room.
func (s *Subscription) fillLocked(limit uint64) (Event, bool) {
	h := s.hub
	for ; s.cursor < limit; s.cursor++ {
		e := h.at(s.cursor)
		if !s.matches(e) {
			continue
		}
		select {
		case s.ch <- *e:
			s.noteSentLocked(s.cursor)
		default:
			s.holdingSeq = s.cursor
			s.cursor++
			return *e, true
		}
	}
	return Event{}, false
}

// noteSentLocked remembers the sequence number of an event put in ch,
// forgetting those the reader has taken.
func (s *Subscription) noteSentLocked(seq uint64) {
	if unread := len(s.ch) - 1; len(s.sent) > unread {
		n := copy(s.sent, s.sent[len(s.sent)-max(unread, 0):])
		s.sent = s.sent[:n]
	}
	s.sent = append(s.sent, seq)
}

// behindLocked reports whether the oldest event the reader has not taken
// left the history: the next one it would read is gone, so it is cut off
// rather than shown a gap. (len(ch) may be a moment old: a reader that
// took that very event as it left is cut off too.)
func (s *Subscription) behindLocked() bool {
	oldest := s.hub.oldest()
	if unread := len(s.ch); unread > 0 && unread <= len(s.sent) {
		return s.sent[len(s.sent)-unread] < oldest
	}
	if s.holding {
		return s.holdingSeq < oldest
	}
	return s.cursor < oldest
}

// Current is the newest revision the hub has seen.
func (h *Hub) Current() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.current
}

// Watchers is the number of open subscriptions.
func (h *Hub) Watchers() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs)
}

// Close ends every subscription, and every later one at once.
func (h *Hub) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	h.endAllLocked(ErrClosed)
}

// EndAll ends every open subscription with err (their Err); later ones are
// not affected.
func (h *Hub) EndAll(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.endAllLocked(err)
}

func (h *Hub) endAllLocked(err error) {
	for s := range h.subs {
		s.endLocked(err)
	}
}

func public(e *state.Event) (Event, bool) {
	if e.Type == state.EventSplit {
		return Event{Revision: e.Revision, Type: KindSplit, Kind: KindSplit, Name: e.Name, Token: e.Token, At: e.At}, true
	}
	if !e.Type.Public() {
		return Event{}, false
	}
	name, election := command.SplitKey(e.Name)
	out := Event{Revision: e.Revision, Name: name, ClientID: e.ClientID, Token: e.Token, Cause: e.Cause, Reason: e.Reason, At: e.At, Kind: "lock",
		Value: e.Value, Shared: e.Shared, Subtree: e.Subtree}
	out.Type = e.Type.String()
	switch {
	case e.Type == state.EventSessionCreated || e.Type == state.EventSessionExpired || e.Type == state.EventSessionDeleted:
		out.Kind = "session"
	case election:
		out.Kind = "election"
		switch e.Type {
		case state.EventAcquired:
			out.Type = "elected"
		case state.EventReleased:
			out.Type = "resigned"
		}
	}
	return out, true
}

// Applied records one entry's public events and wakes the watchers
// (fsm.Observer). It never blocks and does not visit the watchers: each
// reads the shared history on its own goroutine.
func (h *Hub) Applied(_ uint64, events []state.Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	appended := false
	for i := range events {
		e, ok := public(&events[i])
		if !ok {
			continue
		}
		if e.Revision > h.current {
			h.current = e.Revision
		}
		h.append(e)
		appended = true
	}
	if appended {
		close(h.wake)
		h.wake = make(chan struct{})
	}
}

func (h *Hub) append(e Event) {
	if h.count == len(h.ring) {
		old := h.at(h.oldest())
		// Events of one revision may be split by eviction: from now on only
		// revisions after the evicted one are complete.
		if old.Revision+1 > h.first {
			h.first = old.Revision + 1
		}
		h.count--
	}
	*h.at(h.next) = e
	h.next++
	h.count++
}

// Restored starts the history again and cuts every watcher off: the events
// between the old state and the snapshot are unknown here (fsm.Observer).
// The old events stay in the ring until overwritten, for the ended
// subscriptions to deliver what they had not yet, but no new subscription
// reads them.
func (h *Hub) Restored(s *state.State) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.floor = h.next
	h.current = s.Revision()
	h.first = h.current + 1
	h.endAllLocked(ErrReset)
}
