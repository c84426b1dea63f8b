// Package command defines the replicated commands of dlock's state machine and
// their versioned binary encoding: one type byte and one version byte per entry,
// then the envelope (leader timestamp, client_id, request_id) and the body.
// Type numbers are append-only: a number is never reused or renumbered, so a newer
// node can always read an older log.
package command

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/dlock/dlock/internal/wire"
)

// Type identifies a command in the Raft log. Append-only: never renumber.
type Type uint8

// Command types. New types go at the end.
const (
	TypeRegisterMember Type = 1
	TypeCreateSession  Type = 2
	TypeKeepAlive      Type = 3
	TypeDeleteSession  Type = 4
	TypeAcquire        Type = 5
	TypeRelease        Type = 6
	TypeRenew          Type = 7
	TypeExpireLeases   Type = 8
	TypeExpireWaits    Type = 9
	TypeCancelWait     Type = 10
	TypeProclaim       Type = 11
	TypeSetTokenKey    Type = 12
	TypeSetACLToken    Type = 13
	TypeDeleteACLToken Type = 14
	TypeTick           Type = 15
	// 16 is TypePacked (packed.go).
	TypeRevoke              Type = 17
	TypeSetHistoryRetention Type = 18
	TypeTrimHistory         Type = 19
	TypeEndLockDelay        Type = 20
	// Version 9: ranges that change online (shards).
	TypeSplit       Type = 21
	TypeSetShardMap Type = 22
)

// Version is the encoding version written for new entries. Decoders accept every
// version up to this one. Version 2 added Acquire.Value (elections), version 3
// SetTokenKey.RevokeRetired and Envelope.Clock, and is the first whose
// SetACLToken always carries TTLms and CertCNs (version 2 entries come with
// and without them); version 4 Envelope.ClockTerm; version 5 Acquire.MaxWaiters,
// Acquire.Takeover and RegisterMember.Version (earlier acquires decode with Takeover true: they
// always took over); version 6 Acquire.Limit, Acquire.Shared and Acquire.Subtree (earlier
// acquires are exclusive, limit 1, one name); version 7 Acquire.LockDelayMs,
// Renew.Value and Renew.SetValue, and values on plain locks (Envelope.Version);
// version 8 changes no encoding: from it on a session remembers the grants it
// loses to a revoke or a takeover (Envelope.RemembersLostGrants); version 9
// adds Split and SetShardMap (a shard's range and the meta group's map);
// version 10 ShardRange.Replicas (each range's replica set); version 11
// SetShardMap.Removing (the nodes whose removal from the cluster began).
const Version = 11

// Limits shared by validation and the state machine.
const (
	// MaxMemberVersionLen bounds a member's version string.
	MaxMemberVersionLen = 128
	MinTTLms            = 1_000
	MaxTTLms            = 600_000
	MaxWaitMs           = 3_600_000
	// MaxClientID bounds client_id and request_id.
	MaxClientID = 128
	// MaxValueLen bounds a holder's value (a lock's or an election's).
	MaxValueLen = 4096
	// MaxLockDelayMs bounds Acquire.LockDelayMs.
	MaxLockDelayMs = 60_000
	// MaxReasonLen bounds a revoke's reason.
	MaxReasonLen = 256
	// MaxLimit bounds a counting lock's limit (Acquire.Limit).
	MaxLimit = 10_000
)

// LeaseID is a 128-bit random lease or session id. It is the holder's secret
// capability: never shown to anyone but the holder.
type LeaseID [16]byte

// NewLeaseID draws a random id. Only the leader calls it, before proposing.
func NewLeaseID() LeaseID {
	var id LeaseID
	if _, err := rand.Read(id[:]); err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err))
	}
	return id
}

// IsZero reports whether the id is unset.
func (id LeaseID) IsZero() bool { return id == LeaseID{} }

// String is the 32-hex-digit form used on the API.
func (id LeaseID) String() string { return hex.EncodeToString(id[:]) }

// ParseLeaseID parses the 32-hex-digit form.
func ParseLeaseID(s string) (LeaseID, error) {
	var id LeaseID
	if len(s) != 32 {
		return id, errors.New("lease id must be 32 hex digits")
	}
	if _, err := hex.Decode(id[:], []byte(s)); err != nil {
		return id, errors.New("lease id must be 32 hex digits")
	}
	return id, nil
}

// Envelope is one log entry: who asked, when (the proposing leader's wall clock,
// for display only), and what.
type Envelope struct {
	// TS is the leader's wall clock in Unix milliseconds, stamped by the leader
	// just before proposing and never decreasing along the log.
	TS int64
	// Clock is the lease clock in milliseconds (version 3 on; 0 before): the
	// time elapsed since the cluster began, as the leaders measured it on
	// their monotonic clocks, each counting on from where the log stood when
	// it took over. Unlike TS it never mixes two machines' wall clocks, so
	// the time left on a lease (TTL minus lease-clock time since its renewal)
	// is never shortened by clock skew between leaders; the time between one
	// leader's last entry and its successor's takeover is not counted (a
	// lease may gain that much, never lose it). The state machine keeps the
	// largest Clock it has seen.
	Clock int64
	// ClockTerm is the Raft term of the leadership whose lease clock Clock was
	// read from (version 4 on; 0 before). The FSM ignores a Clock whose term
	// is not the entry's own: a proposal stamped in an earlier term and
	// appended only after this node was elected again would count the time
	// between its terms, which no leader measured.
	ClockTerm uint64
	ClientID  string
	RequestID string
	Body      Body
	// Version is the encoding version the entry was decoded from; 0 for an
	// envelope built in this process (the current version). Encode ignores
	// it. A rule that changed with a version asks it (ValueOnLocks).
	Version byte
}

// ValueOnLocks reports whether the entry may give a plain lock a value:
// from version 7 on. An earlier acquire with a value on a lock was refused,
// and a replay must refuse it again.
func (e *Envelope) ValueOnLocks() bool { return e.Version == 0 || e.Version >= 7 }

// RemembersLostGrants reports whether a session that loses a grant by this
// entry remembers it for its keepalive: from version 8 on. An older node
// applying an earlier entry did not, and a replay (or a node that restored a
// snapshot taken before) must agree with it.
func (e *Envelope) RemembersLostGrants() bool { return e.Version == 0 || e.Version >= 8 }

// Body is the typed payload of a command.
type Body interface {
	Type() Type
	encode(w *wire.Writer)
	decode(r *wire.Reader, version byte)
}

// RegisterMember records a node's client API address so any node can tell
// clients where the leader's API is.
type RegisterMember struct {
	ID       string
	RaftAddr string
	APIAddr  string
	// Version (command version 5) is the build the node runs, for
	// GET /cluster; a node registers again when it changes.
	Version string
}

// CreateSession creates an explicit lease. LeaseID is drawn by the leader.
type CreateSession struct {
	LeaseID LeaseID
	TTLms   int64
}

// KeepAlive renews a session.
type KeepAlive struct {
	LeaseID LeaseID
}

// DeleteSession ends a session, releasing its locks and dropping its waits.
type DeleteSession struct {
	LeaseID LeaseID
}

// Acquire takes a lock, or queues for it when WaitMs > 0. With Session false the
// leader draws LeaseID for a new implicit one-lock lease of TTLms. An election
// campaign is an Acquire of the election's key (ElectionKey) with a Value.
type Acquire struct {
	Name    string
	LeaseID LeaseID
	Session bool
	TTLms   int64
	WaitMs  int64
	Value   string
	// MaxWaiters (version 5), when positive, caps the lock's queue: an
	// acquire that would be the queue's MaxWaiters+1-th waiter is refused
	// with StatusQueueFull. The node that took the request sets it from its
	// --max-waiters-per-lock; in the command, every replica decides alike
	// however many such acquires race.
	MaxWaiters int64
	// Takeover lets the acquire take the lock, or its place in the queue,
	// from another lease of the same client_id. Without it that lease is
	// like any other holder or waiter, so knowing a client_id takes
	// nothing. Entries before version 5 decode with Takeover true: they
	// always took over, and a replay must do what they did.
	Takeover bool
	// Limit (version 6) is how many exclusive holders the lock admits at
	// once (a counting lock, or semaphore); 0 and 1 are a plain mutex. The
	// acquire that finds the lock unused sets it; any other must match.
	Limit int64
	// Shared (version 6) asks for a shared grant: shared holders coexist,
	// a shared and an exclusive holder never do.
	Shared bool
	// Subtree (version 6) makes the grant cover the name and every name
	// below it ("a" covers "a/b" and "a/b/c", not "ab").
	Subtree bool
	// LockDelayMs (version 7; 0..MaxLockDelayMs) keeps the lock from
	// anyone for that long after this grant ends by expiry or revoke (not
	// by a release), for resources that cannot check fencing tokens.
	LockDelayMs int64
}

// Release gives a lock back; holder proof is token plus lease id.
type Release struct {
	Name    string
	LeaseID LeaseID
	Token   uint64
}

// Renew extends the lease that holds a lock; TTLms 0 keeps the lease's TTL.
// With SetValue (version 7) it also replaces the holder's value with Value.
type Renew struct {
	Name     string
	LeaseID  LeaseID
	Token    uint64
	TTLms    int64
	Value    string
	SetValue bool
}

// Revoke ends a grant by force (an operator's act, allowed by the service):
// the grant whose fencing token is Token, or with Token 0 every grant of the
// lock. The lock is handed to the next waiter in the same step, after the
// grant's lock-delay if it set one. Reason is kept in the history.
type Revoke struct {
	Name   string
	Token  uint64
	Reason string
}

// SetHistoryRetention sets the bounds of the grant history (state keeps
// them, so every replica trims alike): the ended grants kept per name, in
// all, and in bytes, and for how long (MaxAgeMs on the lease clock, judged
// when the leader commits a TrimHistory). The leader proposes it when its
// flags differ from the state's.
type SetHistoryRetention struct {
	PerName    int64
	MaxEntries int64
	MaxBytes   int64
	MaxAgeMs   int64
}

// TrimHistory drops the ended grants older than the retention's MaxAgeMs,
// counted back from this entry's lease clock (Envelope.Clock): the leader
// commits one when the oldest record is due, as it commits expiries.
type TrimHistory struct{}

// EndLockDelay ends the lock-delay that the end of grant Token started on
// lock Name, and hands the lock to its first waiter. The leader commits it
// when the delay has passed on its lease clock; a delay started by another
// grant since is left alone.
type EndLockDelay struct {
	Name  string
	Token uint64
}

// Split (version 9) ends a shard's ownership of the names whose top-level
// segment (TopSegment) is At or above: they, with everything that belongs
// to them, are carved into a new state for the new shard's Raft group
// (Group, drawn from the source group and At so every proposer agrees).
// At must lie strictly inside the shard's range; a split already done
// (same Group) is a no-op.
type Split struct {
	At    string
	Group uint64
	// From and To are the shard's range in the map ("" To: open), which a
	// shard that was never split does not know itself.
	From, To string
}

// ShardRange is one range of the shard map: the names whose top-level
// segment is Start or above, up to the next range's Start, live in Raft
// group Group, shown as shard ID.
type ShardRange struct {
	Start string
	ID    uint64
	Group uint64
	// Replicas (version 10) are the ids of the nodes that run the range's
	// group, sorted; none means every node of the initial cluster (maps
	// written before replica sets existed).
	Replicas []string
	// Leaving (version 10) is the replica a move is taking off the range
	// (one of Replicas; "" when no move is in flight).
	Leaving string
}

// MaxReplicas bounds a range's replica set, MaxReplicaIDLen each node id
// in it.
const (
	MaxReplicas     = 16
	MaxReplicaIDLen = 128
)

// SetShardMap (version 9) is the meta group's: it installs Generation of
// the shard map, Ranges in Start order (the first Start ""). Only the next
// generation applies (a stale or repeated one is a no-op), so every node
// that proposes the same change commits it once.
//
// Removing (version 11) are the nodes whose removal from the cluster
// began, in the order it began; no range may list one as a replica. An
// entry of an earlier version carries no Removing: it keeps the map's
// (the state machine applies it so), so a node that proposes maps without
// knowing of removals cannot undo one.
type SetShardMap struct {
	Generation uint64
	Ranges     []ShardRange
	Removing   []string
}

// MaxRemoving bounds SetShardMap.Removing.
const MaxRemoving = 64

// Proclaim replaces the value of an election's current leader.
type Proclaim struct {
	Name    string
	LeaseID LeaseID
	Token   uint64
	Value   string
}

// SetTokenKey installs the cluster's token-signing key: an Ed25519 seed drawn
// by the leader (the public key and key id are derived from it, so every
// replica agrees). Without Rotate it only takes effect when the cluster has
// no key yet (the first leader bootstraps it; a racing second proposal is a
// no-op); with Rotate it becomes the current key and the old one is kept for
// verification only, of tokens up to the last one granted. RevokeRetired
// (with Rotate; since Version 3) drops every retired key as well, so only
// the new key verifies anything.
type SetTokenKey struct {
	Seed          [32]byte
	Rotate        bool
	RevokeRetired bool
}

// Permission bits of an ACL rule.
const (
	PermRead   uint8 = 1 << iota // read locks and elections, cluster info
	PermLock                     // acquire, renew, release locks
	PermElect                    // campaign, proclaim, resign
	PermWatch                    // watch changes, observe elections
	PermAdmin                    // membership, snapshots, keys, ACLs
	PermRevoke                   // end anyone's grant by force (revoke)
	PermAll    = PermRead | PermLock | PermElect | PermWatch | PermAdmin | PermRevoke
)

// ACLRule grants permissions on every name that starts with Prefix ("" is
// every name).
type ACLRule struct {
	Prefix string
	Perms  uint8
}

// SetACLToken creates or replaces an ACL token. The secret never enters the
// log: only its SHA-256. With Bootstrap it only applies while the cluster has
// no token at all (the first management token).
type SetACLToken struct {
	AccessorID  [16]byte
	SecretHash  [32]byte
	Description string
	Rules       []ACLRule
	// ClientIDs are the client_ids (a trailing "*" matches any suffix) the
	// token may act as; empty means any.
	ClientIDs []string
	Bootstrap bool
	// TTLms > 0 makes the token expire that long after this entry's
	// timestamp; 0 never.
	TTLms int64
	// CertCNs are client-certificate common names that authenticate as this
	// token (over mutual TLS, without the secret).
	CertCNs []string
}

// DeleteACLToken revokes a token.
type DeleteACLToken struct {
	AccessorID [16]byte
}

// Tick changes nothing but the lease clock (Envelope.Clock): the leader
// commits one when the log has been quiet for a while and leases are
// running, so a successor that takes over counts each lease's time left from
// a recent point, not from the last real command (which could be a whole TTL
// ago: the lease would gain that much on every failover).
type Tick struct{}

// LeaseGen names one lease at one renewal generation.
type LeaseGen struct {
	LeaseID LeaseID
	Gen     uint64
}

// ExpireLeases is proposed by the leader's reaper. A lease expires only if it
// still exists at the same generation, so a racing renewal wins.
type ExpireLeases struct {
	Leases []LeaseGen
}

// WaitRef names one queued wait: the lease, the lock and the wait's sequence
// number (the log index of the acquire that queued it).
type WaitRef struct {
	LeaseID LeaseID
	Name    string
	Seq     uint64
}

// ExpireWaits is proposed by the leader's reaper when waits time out.
type ExpireWaits struct {
	Waits []WaitRef
}

// CancelWait withdraws a wait whose requester gave up. With ReleaseIfGranted, a
// grant that this very wait already received is released too, so a cancelled
// acquire leaves nothing behind.
type CancelWait struct {
	Wait             WaitRef
	ReleaseIfGranted bool
}

// Type implementations.
func (*RegisterMember) Type() Type { return TypeRegisterMember }
func (*CreateSession) Type() Type  { return TypeCreateSession }
func (*KeepAlive) Type() Type      { return TypeKeepAlive }
func (*DeleteSession) Type() Type  { return TypeDeleteSession }
func (*Acquire) Type() Type        { return TypeAcquire }
func (*Release) Type() Type        { return TypeRelease }
func (*Renew) Type() Type          { return TypeRenew }
func (*ExpireLeases) Type() Type   { return TypeExpireLeases }
func (*ExpireWaits) Type() Type    { return TypeExpireWaits }
func (*CancelWait) Type() Type     { return TypeCancelWait }
func (*Proclaim) Type() Type       { return TypeProclaim }
func (*SetTokenKey) Type() Type    { return TypeSetTokenKey }
func (*SetACLToken) Type() Type    { return TypeSetACLToken }
func (*DeleteACLToken) Type() Type { return TypeDeleteACLToken }
func (*Tick) Type() Type           { return TypeTick }
func (*Revoke) Type() Type         { return TypeRevoke }
func (*SetHistoryRetention) Type() Type {
	return TypeSetHistoryRetention
}
func (*TrimHistory) Type() Type  { return TypeTrimHistory }
func (*EndLockDelay) Type() Type { return TypeEndLockDelay }
func (*Split) Type() Type        { return TypeSplit }
func (*SetShardMap) Type() Type  { return TypeSetShardMap }

// Encode serialises the envelope: type, version, envelope fields, body.
func Encode(e *Envelope) []byte {
	w := &wire.Writer{Buf: make([]byte, 0, 96)}
	w.Byte(byte(e.Body.Type()))
	w.Byte(Version)
	w.Varint(e.TS)
	w.Varint(e.Clock)
	w.Uvarint(e.ClockTerm)
	w.String(e.ClientID)
	w.String(e.RequestID)
	e.Body.encode(w)
	return w.Buf
}

// MaxEntryBytes bounds one encoded entry. It is below wire.MaxString, so any
// entry that passes the check also decodes: an entry the leader could propose
// but replicas could not apply would stop every replica at that index.
const MaxEntryBytes = 512 << 10

// ErrTooLarge is returned by EncodeChecked for an entry over MaxEntryBytes.
var ErrTooLarge = errors.New("command too large")

// EncodeChecked is Encode with the size bound every proposal must respect.
func EncodeChecked(e *Envelope) ([]byte, error) {
	b := Encode(e)
	if len(b) > MaxEntryBytes {
		return nil, fmt.Errorf("%w: %d bytes, the limit is %d", ErrTooLarge, len(b), MaxEntryBytes)
	}
	return b, nil
}

// ErrUnknownType is returned for a type byte this build does not know.
var ErrUnknownType = errors.New("unknown command type")

func newBody(t Type) Body {
	switch t {
	case TypeRegisterMember:
		return &RegisterMember{}
	case TypeCreateSession:
		return &CreateSession{}
	case TypeKeepAlive:
		return &KeepAlive{}
	case TypeDeleteSession:
		return &DeleteSession{}
	case TypeAcquire:
		return &Acquire{}
	case TypeRelease:
		return &Release{}
	case TypeRenew:
		return &Renew{}
	case TypeExpireLeases:
		return &ExpireLeases{}
	case TypeExpireWaits:
		return &ExpireWaits{}
	case TypeCancelWait:
		return &CancelWait{}
	case TypeProclaim:
		return &Proclaim{}
	case TypeSetTokenKey:
		return &SetTokenKey{}
	case TypeSetACLToken:
		return &SetACLToken{}
	case TypeDeleteACLToken:
		return &DeleteACLToken{}
	case TypeTick:
		return &Tick{}
	case TypeRevoke:
		return &Revoke{}
	case TypeSetHistoryRetention:
		return &SetHistoryRetention{}
	case TypeTrimHistory:
		return &TrimHistory{}
	case TypeEndLockDelay:
		return &EndLockDelay{}
	case TypeSplit:
		return &Split{}
	case TypeSetShardMap:
		return &SetShardMap{}
	}
	return nil
}

// Decode parses an entry written by Encode (any version up to Version). It never
// panics on bad input; trailing bytes are an error.
func Decode(b []byte) (*Envelope, error) {
	r := wire.NewReader(b)
	t := Type(r.Byte())
	v := r.Byte()
	if err := r.Err(); err != nil {
		return nil, fmt.Errorf("decode command header: %w", err)
	}
	body := newBody(t)
	if body == nil {
		return nil, fmt.Errorf("decode command: type %d: %w (is this node older than the leader? upgrade it)", t, ErrUnknownType)
	}
	if v == 0 || v > Version {
		return nil, fmt.Errorf("decode command: type %d version %d not supported by this build (upgrade this node)", t, v)
	}
	if (t >= TypeRevoke && v < 7) || (t >= TypeSplit && v < 9) {
		return nil, fmt.Errorf("decode command: type %d did not exist in version %d", t, v)
	}
	e := &Envelope{Body: body, Version: v}
	e.TS = r.Varint()
	if v >= 3 {
		e.Clock = r.Varint()
	}
	if v >= 4 {
		e.ClockTerm = r.Uvarint()
	}
	e.ClientID = r.String()
	e.RequestID = r.String()
	body.decode(r, v)
	if err := r.Err(); err != nil {
		return nil, fmt.Errorf("decode command type %d: %w", t, err)
	}
	if r.Len() != 0 {
		return nil, fmt.Errorf("decode command type %d: %d trailing bytes", t, r.Len())
	}
	return e, nil
}

func putLease(w *wire.Writer, id LeaseID) { w.Fixed(id[:]) }
func getLease(r *wire.Reader) (id LeaseID) {
	r.Fixed(id[:])
	return id
}

func (b *RegisterMember) encode(w *wire.Writer) {
	w.String(b.ID)
	w.String(b.RaftAddr)
	w.String(b.APIAddr)
	w.String(b.Version) // version 5
}
func (b *RegisterMember) decode(r *wire.Reader, v byte) {
	b.ID, b.RaftAddr, b.APIAddr = r.String(), r.String(), r.String()
	if v >= 5 {
		b.Version = r.String()
	}
}

func (b *CreateSession) encode(w *wire.Writer) { putLease(w, b.LeaseID); w.Varint(b.TTLms) }
func (b *CreateSession) decode(r *wire.Reader, _ byte) {
	b.LeaseID = getLease(r)
	b.TTLms = r.Varint()
}

func (b *KeepAlive) encode(w *wire.Writer)             { putLease(w, b.LeaseID) }
func (b *KeepAlive) decode(r *wire.Reader, _ byte)     { b.LeaseID = getLease(r) }
func (b *DeleteSession) encode(w *wire.Writer)         { putLease(w, b.LeaseID) }
func (b *DeleteSession) decode(r *wire.Reader, _ byte) { b.LeaseID = getLease(r) }

func (b *Acquire) encode(w *wire.Writer) {
	w.String(b.Name)
	putLease(w, b.LeaseID)
	w.Bool(b.Session)
	w.Varint(b.TTLms)
	w.Varint(b.WaitMs)
	w.String(b.Value)
	w.Varint(b.MaxWaiters)  // version 5
	w.Bool(b.Takeover)      // version 5
	w.Varint(b.Limit)       // version 6
	w.Bool(b.Shared)        // version 6
	w.Bool(b.Subtree)       // version 6
	w.Varint(b.LockDelayMs) // version 7
}
func (b *Acquire) decode(r *wire.Reader, v byte) {
	b.Name = r.String()
	b.LeaseID = getLease(r)
	b.Session = r.Bool()
	b.TTLms = r.Varint()
	b.WaitMs = r.Varint()
	if v >= 2 {
		b.Value = r.String()
	}
	if v >= 5 {
		b.MaxWaiters = r.Varint()
		b.Takeover = r.Bool()
	} else {
		b.Takeover = true
	}
	if v >= 6 {
		b.Limit = r.Varint()
		b.Shared = r.Bool()
		b.Subtree = r.Bool()
	}
	if v >= 7 {
		b.LockDelayMs = r.Varint()
	}
}

func (b *Proclaim) encode(w *wire.Writer) {
	w.String(b.Name)
	putLease(w, b.LeaseID)
	w.Uvarint(b.Token)
	w.String(b.Value)
}
func (b *Proclaim) decode(r *wire.Reader, _ byte) {
	b.Name = r.String()
	b.LeaseID = getLease(r)
	b.Token = r.Uvarint()
	b.Value = r.String()
}

func (b *Release) encode(w *wire.Writer) {
	w.String(b.Name)
	putLease(w, b.LeaseID)
	w.Uvarint(b.Token)
}
func (b *Release) decode(r *wire.Reader, _ byte) {
	b.Name = r.String()
	b.LeaseID = getLease(r)
	b.Token = r.Uvarint()
}

func (b *Renew) encode(w *wire.Writer) {
	w.String(b.Name)
	putLease(w, b.LeaseID)
	w.Uvarint(b.Token)
	w.Varint(b.TTLms)
	w.String(b.Value)  // version 7
	w.Bool(b.SetValue) // version 7
}
func (b *Renew) decode(r *wire.Reader, v byte) {
	b.Name = r.String()
	b.LeaseID = getLease(r)
	b.Token = r.Uvarint()
	b.TTLms = r.Varint()
	if v >= 7 {
		b.Value = r.String()
		b.SetValue = r.Bool()
	}
}

func (b *Revoke) encode(w *wire.Writer) {
	w.String(b.Name)
	w.Uvarint(b.Token)
	w.String(b.Reason)
}
func (b *Revoke) decode(r *wire.Reader, _ byte) {
	b.Name = r.String()
	b.Token = r.Uvarint()
	b.Reason = r.String()
}

func (b *SetHistoryRetention) encode(w *wire.Writer) {
	w.Varint(b.PerName)
	w.Varint(b.MaxEntries)
	w.Varint(b.MaxBytes)
	w.Varint(b.MaxAgeMs)
}
func (b *SetHistoryRetention) decode(r *wire.Reader, _ byte) {
	b.PerName, b.MaxEntries, b.MaxBytes, b.MaxAgeMs = r.Varint(), r.Varint(), r.Varint(), r.Varint()
}

func (b *Split) encode(w *wire.Writer) {
	w.String(b.At)
	w.Uvarint(b.Group)
	w.String(b.From)
	w.String(b.To)
}
func (b *Split) decode(r *wire.Reader, _ byte) {
	b.At, b.Group, b.From, b.To = r.String(), r.Uvarint(), r.String(), r.String()
}

func (b *SetShardMap) encode(w *wire.Writer) {
	w.Uvarint(b.Generation)
	w.Uvarint(uint64(len(b.Ranges)))
	for _, x := range b.Ranges {
		w.String(x.Start)
		w.Uvarint(x.ID)
		w.Uvarint(x.Group)
		w.Uvarint(uint64(len(x.Replicas))) // version 10
		for _, id := range x.Replicas {
			w.String(id)
		}
		w.String(x.Leaving)
	}
	w.Uvarint(uint64(len(b.Removing))) // version 11
	for _, id := range b.Removing {
		w.String(id)
	}
}
func (b *SetShardMap) decode(r *wire.Reader, v byte) {
	b.Generation = r.Uvarint()
	n := r.Count(3)
	b.Ranges = make([]ShardRange, n)
	for i := range b.Ranges {
		b.Ranges[i] = ShardRange{Start: r.String(), ID: r.Uvarint(), Group: r.Uvarint()}
		if v >= 10 {
			m := r.Count(1)
			for ; m > 0 && r.Err() == nil; m-- {
				b.Ranges[i].Replicas = append(b.Ranges[i].Replicas, r.String())
			}
			b.Ranges[i].Leaving = r.String()
		}
	}
	if v >= 11 {
		n := r.Count(1)
		for ; n > 0 && r.Err() == nil; n-- {
			b.Removing = append(b.Removing, r.String())
		}
	}
}

func (*TrimHistory) encode(*wire.Writer)       {}
func (*TrimHistory) decode(*wire.Reader, byte) {}

func (b *EndLockDelay) encode(w *wire.Writer) { w.String(b.Name); w.Uvarint(b.Token) }
func (b *EndLockDelay) decode(r *wire.Reader, _ byte) {
	b.Name = r.String()
	b.Token = r.Uvarint()
}

func (b *ExpireLeases) encode(w *wire.Writer) {
	w.Uvarint(uint64(len(b.Leases)))
	for _, l := range b.Leases {
		putLease(w, l.LeaseID)
		w.Uvarint(l.Gen)
	}
}
func (b *ExpireLeases) decode(r *wire.Reader, _ byte) {
	n := r.Count(17)
	b.Leases = make([]LeaseGen, n)
	for i := range b.Leases {
		b.Leases[i].LeaseID = getLease(r)
		b.Leases[i].Gen = r.Uvarint()
	}
}

func putWait(w *wire.Writer, x WaitRef) {
	putLease(w, x.LeaseID)
	w.String(x.Name)
	w.Uvarint(x.Seq)
}
func getWait(r *wire.Reader) WaitRef {
	return WaitRef{LeaseID: getLease(r), Name: r.String(), Seq: r.Uvarint()}
}

func (b *ExpireWaits) encode(w *wire.Writer) {
	w.Uvarint(uint64(len(b.Waits)))
	for _, x := range b.Waits {
		putWait(w, x)
	}
}
func (b *ExpireWaits) decode(r *wire.Reader, _ byte) {
	n := r.Count(18)
	b.Waits = make([]WaitRef, n)
	for i := range b.Waits {
		b.Waits[i] = getWait(r)
	}
}

func (b *CancelWait) encode(w *wire.Writer) { putWait(w, b.Wait); w.Bool(b.ReleaseIfGranted) }
func (b *CancelWait) decode(r *wire.Reader, _ byte) {
	b.Wait = getWait(r)
	b.ReleaseIfGranted = r.Bool()
}

// Stamped returns a copy of the envelope with the leader's timestamp and any
// new lease id filled in. The original stays unstamped, so a retry after an
// unknown outcome proposes afresh and relies on request_id dedup.
func (e *Envelope) Stamped(ts int64) *Envelope {
	c := *e
	c.TS = ts
	switch b := e.Body.(type) {
	case *CreateSession:
		if b.LeaseID.IsZero() {
			nb := *b
			nb.LeaseID = NewLeaseID()
			c.Body = &nb
		}
	case *Acquire:
		if !b.Session && b.LeaseID.IsZero() {
			nb := *b
			nb.LeaseID = NewLeaseID()
			c.Body = &nb
		}
	}
	return &c
}

// Idempotent reports whether applying the command twice has the same effect as
// once, so it may be retried after an unknown outcome even without request_id.
func (e *Envelope) Idempotent() bool {
	switch e.Body.(type) {
	case *RegisterMember, *ExpireLeases, *ExpireWaits, *CancelWait, *KeepAlive, *Tick,
		*SetHistoryRetention, *TrimHistory, *EndLockDelay, *Split, *SetShardMap:
		return true
	}
	return false
}

func (b *SetTokenKey) encode(w *wire.Writer) {
	w.Fixed(b.Seed[:])
	w.Bool(b.Rotate)
	w.Bool(b.RevokeRetired)
}
func (b *SetTokenKey) decode(r *wire.Reader, v byte) {
	r.Fixed(b.Seed[:])
	b.Rotate = r.Bool()
	if v >= 3 {
		b.RevokeRetired = r.Bool()
	}
}

func (b *SetACLToken) encode(w *wire.Writer) {
	w.Fixed(b.AccessorID[:])
	w.Fixed(b.SecretHash[:])
	w.String(b.Description)
	w.Uvarint(uint64(len(b.Rules)))
	for _, r := range b.Rules {
		w.String(r.Prefix)
		w.Byte(r.Perms)
	}
	w.Uvarint(uint64(len(b.ClientIDs)))
	for _, c := range b.ClientIDs {
		w.String(c)
	}
	w.Bool(b.Bootstrap)
	w.Varint(b.TTLms)
	w.Uvarint(uint64(len(b.CertCNs)))
	for _, c := range b.CertCNs {
		w.String(c)
	}
}
func (b *SetACLToken) decode(r *wire.Reader, v byte) {
	r.Fixed(b.AccessorID[:])
	r.Fixed(b.SecretHash[:])
	b.Description = r.String()
	if n := r.Count(2); n > 0 {
		b.Rules = make([]ACLRule, n)
		for i := range b.Rules {
			b.Rules[i] = ACLRule{Prefix: r.String(), Perms: r.Byte()}
		}
	}
	if n := r.Count(1); n > 0 {
		b.ClientIDs = make([]string, n)
		for i := range b.ClientIDs {
			b.ClientIDs[i] = r.String()
		}
	}
	b.Bootstrap = r.Bool()
	if v < 3 && r.Len() == 0 {
		// Version 2 has two layouts: the first builds with ACLs ended here;
		// later ones appended TTLms and CertCNs (always at least two more
		// bytes) without raising the version, so both must still decode.
		return
	}
	b.TTLms = r.Varint()
	if n := r.Count(1); n > 0 {
		b.CertCNs = make([]string, n)
		for i := range b.CertCNs {
			b.CertCNs[i] = r.String()
		}
	}
}

func (b *DeleteACLToken) encode(w *wire.Writer)         { w.Fixed(b.AccessorID[:]) }
func (b *DeleteACLToken) decode(r *wire.Reader, _ byte) { r.Fixed(b.AccessorID[:]) }

func (*Tick) encode(*wire.Writer)       {}
func (*Tick) decode(*wire.Reader, byte) {}
