package httpapi

import (
	"net/http"
	"time"

	"github.com/dlock/dlock/internal/command"
)

// The http.Server's ReadTimeout and WriteTimeout are sized for plain
// requests, so that a slow or stalled client cannot hold a connection. Some
// requests rightly stay open longer — a blocking acquire (up to an hour), a
// watch or observe stream (for ever) — and get per-request deadlines here
// instead, through http.ResponseController (HTTP/1 and HTTP/2 alike).
//
// Two net/http facts shape this:
//   - ReadTimeout also bounds the server's background read that watches for
//     the client hanging up; when it fires, the request's context is
//     cancelled, which would withdraw a waiting acquire. So once a request's
//     body has been read (or it has none), its read deadline is lifted: there
//     is nothing left to read slowly.
//   - WriteTimeout counts from the end of the request headers, and over
//     HTTP/2 it resets the stream when it passes even if nothing is being
//     written, so long requests move it, never lift it: a client that stops
//     reading is still cut off.

// DefaultWriteTimeout is the write budget of a plain request, used when
// Options.WriteTimeout is not set.
const DefaultWriteTimeout = 30 * time.Second

// bodyDone lifts the read deadline of a request whose body has been read.
func bodyDone(w http.ResponseWriter) {
	// Not every ResponseWriter supports deadlines (tests' recorders); then
	// there is no server deadline to lift either.
	_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
}

// holdOpen gives a blocking acquire or campaign the time it may wait, plus a
// plain request's budget to commit and answer.
func (a *api) holdOpen(w http.ResponseWriter, waitMs int64) {
	if waitMs <= 0 {
		return
	}
	wait := time.Duration(min(waitMs, command.MaxWaitMs)) * time.Millisecond
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(wait + a.writeTimeout))
}

// streamDeadline is set before each write of an event stream: the write and
// the quiet time until the next heartbeat must both fit.
func (a *api) streamDeadline(rc *http.ResponseController) {
	_ = rc.SetWriteDeadline(time.Now().Add(a.heartbeat + a.writeTimeout))
}

// writeChunked writes a large answer (a snapshot) in pieces, moving the
// write deadline before each: a slow but steady reader gets the whole of it,
// a stalled one is cut off within a plain request's budget.
func (a *api) writeChunked(w http.ResponseWriter, b []byte) {
	const chunk = 256 << 10
	rc := http.NewResponseController(w)
	for len(b) > 0 {
		n := min(chunk, len(b))
		_ = rc.SetWriteDeadline(time.Now().Add(a.writeTimeout))
		if _, err := w.Write(b[:n]); err != nil {
			return
		}
		b = b[n:]
	}
}

// untimed serves a debugging handler (pprof: a CPU profile runs for as long
// as asked) without the plain-request write deadline.
func untimed(h http.Handler) http.Handler {
	if h == nil {
		return nil
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).SetWriteDeadline(time.Time{})
		h.ServeHTTP(w, r)
	})
}
