package client

import (
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Errors callers branch on with errors.Is. Errors that come from a server
// answer are *APIError values, which match the sentinel of their code.
var (
	// ErrLockHeld: someone else holds the lock and the call did not wait.
	ErrLockHeld = errors.New("dlock: lock is held by another client")
	// ErrLimitMismatch: the lock is in use with another limit than the one
	// asked for (a Semaphore's, or 1 for a Mutex or RWMutex); APIError.Limit
	// is the lock's.
	ErrLimitMismatch = errors.New("dlock: lock is in use with another limit")
	// ErrWaitTimeout: the wait in line ended (the context's deadline or the
	// server's wait limit) before the lock was granted.
	ErrWaitTimeout = errors.New("dlock: timed out waiting for the lock")
	// ErrLockLost: the acquire was granted (its fencing token was used) but
	// the grant ended before its answer reached this client — a reply lost
	// in a failover, retried after the unclaimed lease had lapsed. Mutex.Lock
	// and Election.Campaign handle it by trying again; the low-level calls
	// return it.
	//
	// A renewal answered with it means an operator revoked the grant
	// (Client.Revoke): the Lease ends with it.
	ErrLockLost = errors.New("dlock: the lock was granted but lost before the answer arrived")
	// ErrLockDelayed: the lock is in a lock-delay after its last holder's
	// grant ended by expiry or revoke; nobody gets it until
	// APIError.RetryAfter has passed. Lock (which waits in line) never
	// returns it; TryLock and a low-level Acquire without a wait do.
	ErrLockDelayed = errors.New("dlock: the lock is in a lock-delay")
	// ErrNotHolder: a release or renew named a token and lease that do not
	// hold the lock (it expired, was released, or was never yours).
	ErrNotHolder = errors.New("dlock: not the holder of the lock")
	// ErrLeaseLost: the client can no longer be sure it holds the lock.
	// Lease.Err and Session.Err wrap it together with the cause.
	ErrLeaseLost = errors.New("dlock: lease lost")
	// ErrSessionExpired: the server no longer knows the session (it
	// expired, was deleted, or belongs to another client id).
	ErrSessionExpired = errors.New("dlock: session expired or not found")
	// ErrNoLeader: the cluster has no leader (an election is under way or a
	// quorum is down). Errors that match it also match ErrUnavailable.
	ErrNoLeader = errors.New("dlock: cluster has no leader")
	// ErrUnavailable: no node could complete the request before the
	// context ended.
	ErrUnavailable = errors.New("dlock: cluster unavailable")
	// ErrInvalidArgument: the request was refused as malformed (bad name,
	// TTL out of range, ...); retrying it cannot help.
	ErrInvalidArgument = errors.New("dlock: invalid argument")
	// ErrReleased is Lease.Err after Unlock and Session.Err after Close.
	ErrReleased = errors.New("dlock: released")
	// ErrClosed: the Client was closed; leases it kept alive end with
	// ErrLeaseLost wrapping it.
	ErrClosed = errors.New("dlock: client closed")
	// ErrUnauthenticated: the cluster runs with ACLs and the request had no
	// valid token (Config.Token), or it was revoked.
	ErrUnauthenticated = errors.New("dlock: no valid ACL token")
	// ErrPermissionDenied: the token does not allow this on this name or
	// client_id.
	ErrPermissionDenied = errors.New("dlock: permission denied")
	// ErrOutcomeUnknown: a request the cluster acts on every time it gets
	// one (ACLBootstrap, CreateACLToken, TransferLeadership to any voter)
	// may have reached a node, but no answer came back. The client does not
	// resend it, since that could act twice; the error's message says what
	// to read to find out whether it took effect. It does not match
	// ErrUnavailable: do not retry it blindly either.
	ErrOutcomeUnknown = errors.New("dlock: the request may or may not have taken effect")
)

// Server error codes (docs/api.md).
const (
	CodeInvalidArgument = "invalid_argument"
	CodeLockHeld        = "lock_held"
	CodeLimitMismatch   = "limit_mismatch"
	CodeWaitTimeout     = "wait_timeout"
	CodeLockLost        = "lock_lost"
	CodeNotHolder       = "not_holder"
	CodeSessionNotFound = "session_not_found"
	CodeNoLeader        = "no_leader"
	CodeUnavailable     = "unavailable"
	CodeTooLarge        = "too_large"
	CodeCompacted       = "compacted"
	CodeUnauthenticated = "unauthenticated"
	CodePermission      = "permission_denied"
	// CodeDiskFull: the leader's disk is below its free-space reserve; new
	// writes are refused until space returns (it matches ErrUnavailable).
	CodeDiskFull = "disk_full"
	// CodeLockDelayed: see ErrLockDelayed.
	CodeLockDelayed = "lock_delayed"
	// CodeWrongShard: on a sharded cluster, the name's range was just split
	// and the node had not learned the new map in time; the client retries
	// it with the same request_id (it matches ErrUnavailable).
	CodeWrongShard = "wrong_shard"
	// CodeConflict: a cluster change clashes with the cluster as it is (a
	// shard replica move onto a node that has one, or while another move
	// of that shard is in flight).
	CodeConflict = "conflict"
)

// codeNotFound answers a request for a thing the cluster does not have.
const codeNotFound = "not_found"

// APIError is an error answer from a dlock node.
type APIError struct {
	// Code is the server's snake_case code, e.g. "lock_held"; empty if the
	// answer was not a dlock error (a proxy's error page, say).
	Code       string
	Message    string
	HTTPStatus int
	// Holder is who holds the lock, on lock_held and wait_timeout answers.
	Holder *Holder
	// FencingToken is, on lock_lost, the token of the grant that ended.
	FencingToken uint64
	// RetryAfter is, on lock_delayed, how long the lock-delay has left.
	RetryAfter time.Duration
	// Limit is the lock's limit, on limit_mismatch answers.
	Limit int
}

func (e *APIError) Error() string {
	if e.Code == "" {
		return fmt.Sprintf("dlock: HTTP %d %s: %s", e.HTTPStatus, http.StatusText(e.HTTPStatus), e.Message)
	}
	return fmt.Sprintf("dlock: %s: %s", e.Code, e.Message)
}

// Is makes errors.Is(err, ErrLockHeld) and friends true for the matching code.
func (e *APIError) Is(target error) bool {
	switch e.Code {
	case CodeLockHeld:
		return target == ErrLockHeld
	case CodeLimitMismatch:
		return target == ErrLimitMismatch
	case CodeWaitTimeout:
		return target == ErrWaitTimeout
	case CodeLockLost:
		return target == ErrLockLost
	case CodeLockDelayed:
		return target == ErrLockDelayed
	case CodeNotHolder:
		return target == ErrNotHolder
	case CodeSessionNotFound:
		return target == ErrSessionExpired
	case CodeNoLeader:
		return target == ErrNoLeader || target == ErrUnavailable
	case CodeUnavailable, CodeDiskFull, CodeWrongShard:
		return target == ErrUnavailable
	case CodeInvalidArgument, CodeTooLarge:
		return target == ErrInvalidArgument
	case CodeCompacted:
		return target == ErrCompacted
	case CodeUnauthenticated:
		return target == ErrUnauthenticated
	case CodePermission:
		return target == ErrPermissionDenied
	}
	return false
}

// lost is the error of a lease or session the client gave up on.
func lost(cause error) error {
	if errors.Is(cause, ErrLeaseLost) {
		return cause
	}
	return fmt.Errorf("%w: %w", ErrLeaseLost, cause)
}

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidArgument}, args...)...)
}
