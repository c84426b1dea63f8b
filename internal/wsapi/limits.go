package wsapi

import (
	"net/http"
	"time"
)

// Metric labels of the per-connection limits (Options.Limited).
const (
	limitQueue    = "ws_queue"
	limitAcquires = "ws_acquires_per_conn"
	limitWatches  = "watchers_per_conn"
	// limitUnauthenticated: a WebSocket refused because its IP holds too
	// many connections that have not authenticated yet.
	limitUnauthenticated = "ws_unauthenticated_per_ip"
)

func (h *Handler) limited(limit string) {
	if h.opts.Limited != nil {
		h.opts.Limited(limit)
	}
}

// liftDeadlines clears the HTTP server's per-request read and write
// deadlines before the upgrade. http.Hijacker documents that a hijacked
// connection may keep them and leaves clearing them to the hijacker (today's
// HTTP/1 server happens to clear them; the WebSocket library never does), and
// a kept ReadTimeout would close every WebSocket that lives longer than a
// plain request. The connection bounds itself instead: pings find dead peers,
// and each message write has WriteTimeout.
func liftDeadlines(w http.ResponseWriter) {
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{})
	_ = rc.SetWriteDeadline(time.Time{})
}
