package command

import (
	"fmt"

	"github.com/dlock/dlock/internal/wire"
)

// Status is the outcome of applying one command.
type Status uint8

// Statuses. Append-only: results are kept in the replicated dedup table.
const (
	StatusOK              Status = 1
	StatusQueued          Status = 2
	StatusLockHeld        Status = 3
	StatusNotHolder       Status = 4
	StatusSessionNotFound Status = 5
	StatusInvalid         Status = 6
	StatusNotWaiting      Status = 7
	// StatusQueueFull refuses an acquire that would wait in a queue that
	// already has Acquire.MaxWaiters waiters.
	StatusQueueFull Status = 8
	// StatusLimitMismatch refuses an acquire whose limit (or shared mode)
	// does not fit the lock in use: Result.Limit is the lock's limit.
	StatusLimitMismatch Status = 9
	// StatusLockDelayed refuses an immediate acquire while the lock is in a
	// lock-delay (command.Acquire.LockDelayMs); Result.TTLms is then the
	// delay's time left on the lease clock.
	StatusLockDelayed Status = 10
	// StatusLockLost answers a renew of a grant that has ended (revoked) but
	// that the history still records: Result.Token is its token.
	StatusLockLost Status = 11
	// StatusWrongShard refuses a command on a name this shard no longer
	// owns (it was split off; command.Split): the router re-routes it.
	StatusWrongShard Status = 12
)

func (s Status) String() string {
	switch s {
	case StatusOK:
		return "ok"
	case StatusQueued:
		return "queued"
	case StatusLockHeld:
		return "lock_held"
	case StatusNotHolder:
		return "not_holder"
	case StatusSessionNotFound:
		return "session_not_found"
	case StatusInvalid:
		return "invalid"
	case StatusNotWaiting:
		return "not_waiting"
	case StatusQueueFull:
		return "queue_full"
	case StatusLimitMismatch:
		return "limit_mismatch"
	case StatusLockDelayed:
		return "lock_delayed"
	case StatusLockLost:
		return "lock_lost"
	case StatusWrongShard:
		return "wrong_shard"
	}
	return fmt.Sprintf("status(%d)", uint8(s))
}

// Holder describes the holder of a lock, as shown to other clients.
type Holder struct {
	ClientID  string
	Token     uint64
	GrantedAt int64
	ExpiresAt int64
}

// Result is what applying a command produced. One flat shape for every command
// keeps the dedup table and the forwarding path simple. The dedup table keeps
// 100,000 of them, so the small fields share the word before LeaseID.
type Result struct {
	Status Status
	// Replayed says this answer came from the dedup table: the request was
	// applied before, by an earlier entry. Never stored (EncodeResult leaves
	// it out): only the answer to a repeated request carries it.
	Replayed bool
	// HolderShared and HolderSubtree are the mode of Holder's grant in a
	// StatusLockHeld refusal.
	HolderShared, HolderSubtree bool
	// Limit is the lock's limit in a StatusLimitMismatch refusal.
	Limit   int32
	LeaseID LeaseID
	Token   uint64
	// ExpiresAt is the lease's expiry in the leader's wall clock (display only).
	ExpiresAt int64
	TTLms     int64
	Revision  uint64
	// Seq names the acquire (see the function Seq: its entry's index and
	// its place in the entry); a queued wait keeps it.
	Seq    uint64
	Holder Holder
	// Message explains StatusInvalid. In a StatusLockHeld refusal it is
	// the name of the lock Holder's grant is on when that is not the one
	// asked for: a subtree grant above it, or a grant inside the subtree
	// asked for. For a Revoke it lists the revoked fencing tokens
	// (decimal, space-separated).
	Message string
}

// EncodeResult serialises a result for the snapshot's dedup table.
func EncodeResult(w *wire.Writer, r *Result) {
	w.Byte(byte(r.Status))
	putLease(w, r.LeaseID)
	w.Uvarint(r.Token)
	w.Varint(r.ExpiresAt)
	w.Varint(r.TTLms)
	w.Uvarint(r.Revision)
	w.Uvarint(r.Seq)
	w.String(r.Holder.ClientID)
	w.Uvarint(r.Holder.Token)
	w.Varint(r.Holder.GrantedAt)
	w.Varint(r.Holder.ExpiresAt)
	w.String(r.Message)
}

// DecodeResult reads what EncodeResult wrote.
func DecodeResult(r *wire.Reader) Result {
	var x Result
	x.Status = Status(r.Byte())
	x.LeaseID = getLease(r)
	x.Token = r.Uvarint()
	x.ExpiresAt = r.Varint()
	x.TTLms = r.Varint()
	x.Revision = r.Uvarint()
	x.Seq = r.Uvarint()
	x.Holder.ClientID = r.String()
	x.Holder.Token = r.Uvarint()
	x.Holder.GrantedAt = r.Varint()
	x.Holder.ExpiresAt = r.Varint()
	x.Message = r.String()
	return x
}

// EncodeResultExt writes the fields EncodeResult leaves out for the layouts
// that came before them (snapshot version 8, the forwarding answer's tail):
// the refusal's limit and the holder's mode and subtree flag.
func EncodeResultExt(w *wire.Writer, r *Result) {
	w.Varint(int64(r.Limit))
	w.Bool(r.HolderShared)
	w.Bool(r.HolderSubtree)
}

// DecodeResultExt reads what EncodeResultExt wrote into x.
func DecodeResultExt(r *wire.Reader, x *Result) {
	x.Limit = int32(r.Varint())
	x.HolderShared = r.Bool()
	x.HolderSubtree = r.Bool()
}
