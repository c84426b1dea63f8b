package httpapi

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/service"
)

// errorBody is the one error shape of design.md §5.
type errorBody struct {
	Code    apierror.Code `json:"code"`
	Message string        `json:"message"`
	// RetryAfterMs is, with lock_delayed, the lock-delay's time left.
	RetryAfterMs int64 `json:"retry_after_ms,omitempty"`
}

type errorEnvelope struct {
	Error errorBody `json:"error"`
	// FencingToken is, with lock_lost, the token of the grant that ended.
	FencingToken uint64 `json:"fencing_token,omitempty"`
}

func bodyOf(e *apierror.Error) errorBody {
	b := errorBody{Code: e.Code, Message: message(e)}
	if e.Code == apierror.LockDelayed {
		b.RetryAfterMs = max(e.RetryAfter.Milliseconds(), 1)
	}
	return b
}

// acquireConflict is the 409 answer of an acquire that did not get the lock:
// the error plus who holds it, so the caller can decide whether to wait. A
// lock_lost answer carries the token of the grant that was lost instead, a
// limit_mismatch answer the lock's limit.
type acquireConflict struct {
	Acquired     bool            `json:"acquired"`
	Error        errorBody       `json:"error"`
	Holder       *service.Holder `json:"holder,omitempty"`
	FencingToken uint64          `json:"fencing_token,omitempty"`
	Limit        int             `json:"limit,omitempty"`
}

// The fixed headers of every JSON answer, shared (see writeJSON).
var (
	jsonContentType = []string{"application/json"}
	noStore         = []string{"no-store"}
	noSniff         = []string{"nosniff"}
)

// writeJSON marshals before touching the response, so that a value that
// cannot be encoded (a time.Time past year 9999, say) can still be answered
// with a clean 500 instead of a half-written 200.
func writeJSON(w http.ResponseWriter, status int, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	h := w.Header()
	// Shared value slices under canonical keys instead of Header.Set, which
	// allocates a slice per header on every answer (net/http copies them
	// when the header is written and never changes them).
	h["Content-Type"] = jsonContentType
	// Answers carry live lock state and secrets (lease and session ids):
	// nothing in between may cache them.
	h["Cache-Control"] = noStore
	h["X-Content-Type-Options"] = noSniff
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
	return nil
}

// reply answers a service call: the error if there is one, else resp.
func reply[T any](a *api, w http.ResponseWriter, r *http.Request, status int, resp *T, err error) {
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	if resp == nil {
		a.writeError(w, r, apierror.Wrap(apierror.Internal, errors.New("service returned neither an answer nor an error"), ""))
		return
	}
	if err := writeJSON(w, status, resp); err != nil {
		a.writeError(w, r, apierror.Wrap(apierror.Internal, err, "encoding the answer"))
	}
}

// publicError is what a client may see of err, and its HTTP status.
func (a *api) publicError(r *http.Request, err error) (*apierror.Error, int) {
	e, internal := apierror.Public(r.Context(), err)
	status := apierror.HTTPStatus(e.Code)
	if !internal {
		return e, status
	}
	// Internal errors, and codes the table does not know, are logged with
	// their cause and shown only as a pointer to the log: the cause may hold
	// internals a client has no business seeing. Only the error text is
	// logged, never a request, so lease ids stay out of the log as long as the
	// service keeps them out of its errors.
	id := RequestID(r.Context())
	requestLogger(r.Context(), a.log).LogAttrs(r.Context(), slog.LevelError, "internal error",
		slog.String("code", string(e.Code)), slog.String("error", err.Error()))
	return &apierror.Error{
		Code:    apierror.Internal,
		Message: "internal error; see the server log for request id " + id,
	}, status
}

// writeError answers err in the design.md §5 error shape.
func (a *api) writeError(w http.ResponseWriter, r *http.Request, err error) {
	e, status := a.publicError(r, err)
	setRetryAfter(w, e)
	writeJSON(w, status, errorEnvelope{Error: bodyOf(e), FencingToken: e.FencingToken})
}

func (a *api) writeAcquireConflict(w http.ResponseWriter, r *http.Request, resp *service.AcquireResponse, e *apierror.Error) {
	writeJSON(w, apierror.HTTPStatus(e.Code), acquireConflict{
		Acquired:     false,
		Error:        errorBody{Code: e.Code, Message: message(e)},
		Holder:       resp.Holder,
		FencingToken: resp.FencingToken,
		Limit:        resp.Limit,
	})
}

// message never leaves an error without words: a bare code does not say
// what to do.
func message(e *apierror.Error) string {
	if e.Message != "" {
		return e.Message
	}
	return strings.ReplaceAll(string(e.Code), "_", " ")
}

// setRetryAfter tells clients when to come back from a 503 (no leader,
// unavailable) or a 429 (apierror.RetryAfterSeconds).
func setRetryAfter(w http.ResponseWriter, e *apierror.Error) {
	if secs, ok := apierror.RetryAfterSeconds(e); ok {
		w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	}
}
