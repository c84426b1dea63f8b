package httpapi

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strings"
	"time"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/service"
)

// RequestIDHeader carries the request id in both directions.
const RequestIDHeader = "X-Request-Id"

// maxRequestIDLen bounds a client-chosen request id, which ends up in every
// log line of the request.
const maxRequestIDLen = 128

type ctxKey struct{}

type requestInfo struct {
	id   string
	base *slog.Logger
}

// logger tags base with the request id. It is built only when a line is
// written: most requests log nothing, and slog's With formats its attributes
// eagerly.
func (ri *requestInfo) logger() *slog.Logger {
	return ri.base.With(slog.String("request_id", ri.id))
}

// RequestID returns the id of the HTTP request that ctx belongs to, or "" if
// none, so the service layer can tag its own log lines with it.
func RequestID(ctx context.Context) string {
	if ri, ok := ctx.Value(ctxKey{}).(*requestInfo); ok {
		return ri.id
	}
	return ""
}

// requestLogger is the request's logger, which tags every line with the
// request id, or fallback outside a request.
func requestLogger(ctx context.Context, fallback *slog.Logger) *slog.Logger {
	if ri, ok := ctx.Value(ctxKey{}).(*requestInfo); ok {
		return ri.logger()
	}
	return fallback
}

// validRequestID accepts a caller's id only if it is short visible ASCII, so
// a header cannot smuggle control characters or bulk into the logs; anything
// else is replaced by a fresh id rather than refused, since the id is only a
// tracing aid.
func validRequestID(id string) bool {
	if id == "" || len(id) > maxRequestIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			return false
		}
	}
	return true
}

// middleware tags the request with an id, recovers panics into a JSON 500 and
// logs one line per request.
func (a *api) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		id := r.Header.Get(RequestIDHeader)
		if !validRequestID(id) {
			id = rand.Text()
		}
		w.Header().Set(RequestIDHeader, id)
		ri := &requestInfo{id: id, base: a.log}
		r = r.WithContext(service.WithRemote(context.WithValue(r.Context(), ctxKey{}, ri), "http", r.RemoteAddr))
		if r.Body == nil || r.Body == http.NoBody {
			bodyDone(w) // nothing to read: see deadlines.go
		}
		sw := &statusWriter{ResponseWriter: w}

		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v) // net/http's own way to abort a response quietly
				}
				ri.logger().LogAttrs(r.Context(), slog.LevelError, "panic serving request",
					slog.String("panic", fmt.Sprint(v)), slog.String("stack", string(debug.Stack())))
				if !sw.wroteHeader {
					a.writeError(sw, r, apierror.Wrap(apierror.Internal, fmt.Errorf("panic: %v", v), ""))
				}
			}
			if ri.base.Enabled(r.Context(), slog.LevelDebug) {
				ri.logger().LogAttrs(r.Context(), slog.LevelDebug, "http request",
					slog.String("method", r.Method),
					slog.String("path", logPath(r.URL.EscapedPath())),
					slog.Int("status", sw.statusCode()),
					slog.Duration("duration", time.Since(start)))
			}
		}()
		next.ServeHTTP(sw, r)
	})
}

// logPath hides the session id of session paths: a session id is a lease id,
// the holder's secret capability (design.md §2), and must never reach a log.
// Lock names are public and stay.
func logPath(p string) string {
	rest, ok := strings.CutPrefix(p, sessionsPrefix+"/")
	if !ok || rest == "" {
		return p
	}
	if _, sub, ok := strings.Cut(rest, "/"); ok {
		return sessionsPrefix + "/{id}/" + sub
	}
	return sessionsPrefix + "/{id}"
}

// statusWriter remembers the status for the log line and whether a panic
// can still be answered.
type statusWriter struct {
	http.ResponseWriter
	status      int
	wroteHeader bool
}

func (w *statusWriter) WriteHeader(code int) {
	// 1xx answers are informational; the final status is still to come.
	if !w.wroteHeader && code >= 200 {
		w.status = code
		w.wroteHeader = true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if !w.wroteHeader {
		w.status = http.StatusOK
		w.wroteHeader = true
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) statusCode() int {
	if !w.wroteHeader {
		return http.StatusOK
	}
	return w.status
}

// Unwrap lets http.ResponseController reach the connection's writer (flush,
// deadlines) through this wrapper.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Flush keeps the http.Flusher that streaming handlers type-assert for.
func (w *statusWriter) Flush() {
	if !w.wroteHeader {
		w.status = http.StatusOK
		w.wroteHeader = true
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}
