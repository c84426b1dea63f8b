// Package watch keeps each node's recent history of public state-machine events
// and streams it to watchers. Every node applies the same log, so every node
// produces the same events in the same order and any node can serve a watch.
// Applying never waits for a watcher: each watcher has a bounded buffer, and one
// that falls behind is cut off with a reason instead of being fed a gap.
package watch

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/state"
)

// Event is a public event as watchers see it (no lease ids: they are secrets).
type Event struct {
	Revision uint64
	Type     string
	// Kind is "lock", "election" or "session".
	Kind     string
	Name     string
	ClientID string
	Token    uint64
	Cause    string
	Value    string
	At       int64
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
	DefaultHistory = 10_000
	DefaultBuffer  = 1024
)

// Hub is the event history and the set of watchers. It implements fsm.Observer.
type Hub struct {
	mu sync.Mutex
	// ring holds the newest events, oldest at head.
	ring  []Event
	head  int
	count int
	// first is the lowest revision the history covers completely; current is
	// the newest applied revision.
	first, current uint64
	subs           map[*Subscription]struct{}
	buffer         int
	closed         bool
}

// NewHub keeps up to history events; each watcher buffers up to buffer events.
func NewHub(history, buffer int) *Hub {
	if history <= 0 {
		history = DefaultHistory
	}
	if buffer <= 0 {
		buffer = DefaultBuffer
	}
	return &Hub{ring: make([]Event, history), first: 1, subs: map[*Subscription]struct{}{}, buffer: buffer}
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
	ch     chan Event
	done   chan struct{}
	once   sync.Once
	err    error
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

// Close ends the subscription.
func (s *Subscription) Close() {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	s.endLocked(nil)
}

func (s *Subscription) endLocked(err error) {
	s.once.Do(func() {
		s.err = err
		delete(s.hub.subs, s)
		close(s.ch)
		close(s.done)
	})
}

// Filter selects events: by name prefix, and optionally one kind or one exact name.
type Filter struct {
	Prefix string
	Kind   string
	Name   string
}

func (s *Subscription) matches(e *Event) bool {
	if e.Revision < s.from {
		return false
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
	s := &Subscription{hub: h, from: from, prefix: f.Prefix, kind: f.Kind, name: f.Name, done: make(chan struct{})}
	var backlog []Event
	for i := 0; i < h.count; i++ {
		e := &h.ring[(h.head+i)%len(h.ring)]
		if s.matches(e) {
			backlog = append(backlog, *e)
		}
	}
	s.ch = make(chan Event, len(backlog)+h.buffer)
	for _, e := range backlog {
		s.ch <- e
	}
	h.subs[s] = struct{}{}
	return s, h.current, nil
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
	if !e.Type.Public() {
		return Event{}, false
	}
	name, election := command.SplitKey(e.Name)
	out := Event{Revision: e.Revision, Name: name, ClientID: e.ClientID, Token: e.Token, Cause: e.Cause, At: e.At, Kind: "lock"}
	out.Type = e.Type.String()
	switch {
	case e.Type == state.EventSessionCreated || e.Type == state.EventSessionExpired || e.Type == state.EventSessionDeleted:
		out.Kind = "session"
	case election:
		out.Kind = "election"
		out.Value = e.Value
		switch e.Type {
		case state.EventAcquired:
			out.Type = "elected"
		case state.EventReleased:
			out.Type = "resigned"
		}
	}
	return out, true
}

// Applied records and fans out one entry's public events (fsm.Observer). It
// never blocks: a watcher whose buffer is full is cut off.
func (h *Hub) Applied(_ uint64, events []state.Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := range events {
		e, ok := public(&events[i])
		if !ok {
			continue
		}
		if e.Revision > h.current {
			h.current = e.Revision
		}
		h.append(e)
		for s := range h.subs {
			if !s.matches(&e) {
				continue
			}
			select {
			case s.ch <- e:
			default:
				s.endLocked(ErrSlow)
			}
		}
	}
}

func (h *Hub) append(e Event) {
	if h.count == len(h.ring) {
		old := h.ring[h.head]
		h.ring[h.head] = e
		h.head = (h.head + 1) % len(h.ring)
		// Events of one revision may be split by eviction: from now on only
		// revisions after the evicted one are complete.
		if old.Revision+1 > h.first {
			h.first = old.Revision + 1
		}
		return
	}
	h.ring[(h.head+h.count)%len(h.ring)] = e
	h.count++
}

// Restored drops the history and cuts every watcher off: the events between
// the old state and the snapshot are unknown here (fsm.Observer).
func (h *Hub) Restored(s *state.State) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.head, h.count = 0, 0
	h.current = s.Revision()
	h.first = h.current + 1
	h.endAllLocked(ErrReset)
}
