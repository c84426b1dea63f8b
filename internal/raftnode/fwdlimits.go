package raftnode

import (
	"net/http"
	"time"
)

// Limits of the forwarding server. It listens on the raft port, which
// anything that can reach the node can connect to, so a slow or idle client
// must not hold its connections: the Mux gives a connection
// DefaultHandshakeTimeout to send its type byte, then these apply. Forwarded
// calls are short (one commit or one leadership check; blocking waits happen
// on the follower), so the budgets are generous and fixed.
const (
	// fwdReadTimeout bounds reading a whole forwarded request (at most
	// maxForwardBody).
	fwdReadTimeout = 30 * time.Second
	// fwdWriteTimeout bounds the time from the request to the end of the
	// answer: longer than an apply may take (ApplyTimeout, plus a commit).
	fwdWriteTimeout = time.Minute
	// fwdIdleTimeout outlasts the forward client's IdleConnTimeout (90 s), so
	// the client, not the server, closes an idle connection and never sends
	// on one the server is closing.
	fwdIdleTimeout = 2 * time.Minute
	// fwdMaxHeaderBytes: forwarded requests carry a handful of headers.
	fwdMaxHeaderBytes = 16 << 10
)

func limitForwardServer(s *http.Server) {
	s.ReadTimeout = fwdReadTimeout
	s.WriteTimeout = fwdWriteTimeout
	s.IdleTimeout = fwdIdleTimeout
	s.MaxHeaderBytes = fwdMaxHeaderBytes
}
