// Package apierror defines dlock's client-facing error codes and the one table
// that maps each code to an HTTP status and a gRPC status code, so every protocol
// answers the same failure the same way (design.md §5).
package apierror

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
)

// Code is a stable snake_case error code shown to clients.
type Code string

// Error codes.
const (
	InvalidArgument Code = "invalid_argument"
	NotFound        Code = "not_found"
	SessionNotFound Code = "session_not_found"
	LockHeld        Code = "lock_held"
	// LimitMismatch: an acquire whose limit (or shared mode) does not fit
	// the lock in use; the answer says the lock's limit.
	LimitMismatch    Code = "limit_mismatch"
	WaitTimeout      Code = "wait_timeout"
	LockLost         Code = "lock_lost"
	NotHolder        Code = "not_holder"
	TooLarge         Code = "too_large"
	RateLimited      Code = "rate_limited"
	NoLeader         Code = "no_leader"
	Unavailable      Code = "unavailable"
	Compacted        Code = "compacted"
	PermissionDenied Code = "permission_denied"
	Unauthenticated  Code = "unauthenticated"
	MethodNotAllowed Code = "method_not_allowed"
	Internal         Code = "internal"
	// UnsupportedMediaType: a request body not declared as JSON.
	UnsupportedMediaType Code = "unsupported_media_type"
	// DiskFull: the leader's disk is below its free-space reserve; writes
	// are refused until space returns, reads still work.
	DiskFull Code = "disk_full"
	// LockDelayed: the lock is in a lock-delay after its last grant ended by
	// expiry or revoke; nobody gets it until RetryAfter has passed.
	LockDelayed Code = "lock_delayed"
	// WrongShard: the shard that got the request no longer owns its name
	// (its range was split); the message gives the map generation the
	// node routed by. Retry with the same request_id: the cluster's router
	// does so itself, so clients see it only when the new map was slow to
	// arrive.
	WrongShard Code = "wrong_shard"
	// Conflict: the change asked for clashes with the cluster as it is
	// (a shard replica move onto a node that already has one, or while
	// another move of that shard is in flight); read GET /cluster first.
	Conflict Code = "conflict"
)

type mapping struct {
	http int
	grpc codes.Code
}

// table is the single mapping from error code to protocol status.
var table = map[Code]mapping{
	InvalidArgument:      {http.StatusBadRequest, codes.InvalidArgument},
	NotFound:             {http.StatusNotFound, codes.NotFound},
	SessionNotFound:      {http.StatusNotFound, codes.NotFound},
	LockHeld:             {http.StatusConflict, codes.FailedPrecondition},
	LimitMismatch:        {http.StatusConflict, codes.FailedPrecondition},
	WaitTimeout:          {http.StatusConflict, codes.DeadlineExceeded},
	LockLost:             {http.StatusConflict, codes.Aborted},
	NotHolder:            {http.StatusConflict, codes.FailedPrecondition},
	TooLarge:             {http.StatusRequestEntityTooLarge, codes.InvalidArgument},
	RateLimited:          {http.StatusTooManyRequests, codes.ResourceExhausted},
	NoLeader:             {http.StatusServiceUnavailable, codes.Unavailable},
	Unavailable:          {http.StatusServiceUnavailable, codes.Unavailable},
	Compacted:            {http.StatusGone, codes.OutOfRange},
	PermissionDenied:     {http.StatusForbidden, codes.PermissionDenied},
	Unauthenticated:      {http.StatusUnauthorized, codes.Unauthenticated},
	MethodNotAllowed:     {http.StatusMethodNotAllowed, codes.Unimplemented},
	Internal:             {http.StatusInternalServerError, codes.Internal},
	UnsupportedMediaType: {http.StatusUnsupportedMediaType, codes.InvalidArgument},
	DiskFull:             {http.StatusServiceUnavailable, codes.Unavailable},
	LockDelayed:          {http.StatusConflict, codes.FailedPrecondition},
	WrongShard:           {http.StatusServiceUnavailable, codes.Unavailable},
	Conflict:             {http.StatusConflict, codes.FailedPrecondition},
}

// HTTPStatus is the HTTP status for a code.
func HTTPStatus(c Code) int {
	if m, ok := table[c]; ok {
		return m.http
	}
	return http.StatusInternalServerError
}

// GRPCCode is the gRPC status code for a code.
func GRPCCode(c Code) codes.Code {
	if m, ok := table[c]; ok {
		return m.grpc
	}
	return codes.Internal
}

// Error is a client-facing error: a code, a message that says what to do, and
// for 503s, 429s and lock_delayed how long to wait before retrying.
type Error struct {
	Code       Code
	Message    string
	RetryAfter time.Duration
	// FencingToken is, with lock_lost, the token of the grant that ended.
	FencingToken uint64
	// Err is the underlying cause, for logs; never shown to clients.
	Err error
}

func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%s: %s: %v", e.Code, e.Message, e.Err)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}

func (e *Error) Unwrap() error { return e.Err }

// New makes an error with a formatted message.
func New(c Code, format string, args ...any) *Error {
	return &Error{Code: c, Message: fmt.Sprintf(format, args...)}
}

// Wrap makes an error that keeps its cause for logs.
func Wrap(c Code, err error, format string, args ...any) *Error {
	return &Error{Code: c, Message: fmt.Sprintf(format, args...), Err: err}
}

// RetryAfterSeconds is the Retry-After header value for an answer with e:
// whole seconds, at least 1 and at most an hour (an absurd hint from a bug
// upstream must not park clients for days); ok is false for answers that carry
// none (only 503 and 429 do).
func RetryAfterSeconds(e *Error) (secs int64, ok bool) {
	if s := HTTPStatus(e.Code); s != http.StatusServiceUnavailable && s != http.StatusTooManyRequests && e.Code != LockDelayed {
		return 0, false
	}
	secs = int64(math.Ceil(e.RetryAfter.Seconds()))
	return min(max(secs, 1), int64(time.Hour/time.Second)), true
}

// From returns err as an *Error; anything else becomes Internal.
func From(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Code: Internal, Message: "internal error; see the server log", Err: err}
}

// CodeOf returns the code of err, or "" for nil.
func CodeOf(err error) Code {
	if err == nil {
		return ""
	}
	return From(err).Code
}

// Public is what a client may see of err, the answer to a request whose
// context is ctx. A bare context error of a request that was cancelled (the
// client went away, or the server is stopping) becomes Unavailable; it is no
// server fault. internal reports a 500-class error: the caller logs err and
// shows the client only where to find it in the log, since the cause may hold
// internals a client has no business seeing.
func Public(ctx context.Context, err error) (e *Error, internal bool) {
	e, isAPI := errors.AsType[*Error](err)
	switch {
	case isAPI:
	case ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		e = &Error{Code: Unavailable, Message: "the request was cancelled before it finished; retry it", Err: err}
	default:
		e = From(err)
	}
	return e, HTTPStatus(e.Code) == http.StatusInternalServerError
}

// Codes lists every code of the table, sorted (for the OpenAPI document's
// test, which must list the same).
func Codes() []Code {
	out := make([]Code, 0, len(table))
	for c := range table {
		out = append(out, c)
	}
	slices.Sort(out)
	return out
}
