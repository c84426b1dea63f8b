package state

import "github.com/dlock/dlock/internal/command"

// EventType classifies what a command did. Public types are what watchers see;
// internal ones feed the leader's timers and the server's waiting requests.
type EventType uint8

// Event types.
const (
	EventAcquired EventType = iota + 1
	EventReleased
	EventExpired
	EventQueued
	EventDequeued
	EventSessionCreated
	EventSessionExpired
	EventSessionDeleted

	// Internal: a lease's TTL (re)started; RemainingMs counts from the command.
	EventLeaseTimer
	// Internal: a lease is gone.
	EventLeaseGone
	// Internal: a wait was queued; RemainingMs is its time left.
	EventWaitTimer
	// Internal: a wait left its queue (granted, timed out, cancelled, ended).
	EventWaitGone

	// Public: an election leader changed its value.
	EventProclaimed

	// Internal: an ACL token was revoked or replaced (Accessor says which),
	// so what it authorized may have to end on every node.
	EventACLChanged

	// Public: a grant was ended by force (Revoke); Reason says why.
	EventRevoked
	// Public: a lock holder replaced its value (a renew with a value).
	EventValueChanged
	// Internal: a lock-delay began (Name, Token: the grant whose end began
	// it); RemainingMs is its length.
	EventDelayTimer
	// Internal: the oldest history record is due to age out in RemainingMs
	// (lease clock); the leader then commits a TrimHistory.
	EventHistoryTimer
	// Public: a lock-delay ended (Token: the grant whose end began it); the
	// hand-off it lets in, if anyone waits, follows at the same revision.
	EventDelayEnded
	// Internal: a split carved the names at and above Name into a new
	// state for Raft group Token; Carved is its snapshot, at this entry.
	EventSplit
)

// Causes carried by events.
const (
	CauseAcquire        = "acquire"
	CauseHandoff        = "handoff"
	CauseTakeover       = "takeover"
	CauseReleased       = "release"
	CauseExpired        = "expired"
	CauseTimeout        = "timeout"
	CauseCancelled      = "cancelled"
	CauseSessionDeleted = "session_deleted"
	CauseRevoked        = "revoked"
)

var eventNames = map[EventType]string{
	EventAcquired:       "acquired",
	EventReleased:       "released",
	EventExpired:        "expired",
	EventQueued:         "queued",
	EventDequeued:       "dequeued",
	EventSessionCreated: "session_created",
	EventSessionExpired: "session_expired",
	EventSessionDeleted: "session_deleted",
	EventLeaseTimer:     "lease_timer",
	EventLeaseGone:      "lease_gone",
	EventWaitTimer:      "wait_timer",
	EventWaitGone:       "wait_gone",
	EventProclaimed:     "proclaimed",
	EventACLChanged:     "acl_changed",
	EventRevoked:        "revoked",
	EventValueChanged:   "value_changed",
	EventDelayTimer:     "delay_timer",
	EventHistoryTimer:   "history_timer",
	EventDelayEnded:     "delay_ended",
	EventSplit:          "split",
}

func (t EventType) String() string { return eventNames[t] }

// Public reports whether watchers may see this event type.
func (t EventType) Public() bool {
	return t >= EventAcquired && t <= EventSessionDeleted || t == EventProclaimed ||
		t == EventRevoked || t == EventValueChanged || t == EventDelayEnded
}

// Event is one effect of a command. LeaseID is internal: the lease id is a
// secret capability and must never reach watchers or logs. Name is the
// lock-table key (command.SplitKey tells a lock from an election).
type Event struct {
	Revision uint64
	Type     EventType
	Name     string
	// At is the leader timestamp of the command (display only).
	At int64
	// Value is an election leader's value (acquired, proclaimed).
	Value    string
	ClientID string
	Token    uint64
	Cause    string
	// Reason is a revoke's reason (EventRevoked).
	Reason      string
	LeaseID     command.LeaseID
	Seq         uint64
	Gen         uint64
	RemainingMs int64
	// Accessor is the ACL token of an EventACLChanged.
	Accessor [16]byte
	// Shared and Subtree are the grant's or the wait's mode (acquired,
	// released, expired, queued, dequeued).
	Shared, Subtree bool
	// Carved is the split-off state's snapshot (EventSplit only).
	Carved []byte
}

func (s *State) emit(e Event) {
	e.Revision = s.revision + 1
	e.At = s.ts
	s.events = append(s.events, e)
}

// TakeEvents returns the events produced since the last call and forgets them.
func (s *State) TakeEvents() []Event {
	ev := s.events
	s.events = nil
	return ev
}
