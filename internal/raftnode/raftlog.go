// Raft's own log lines (hashicorp/raft logs through hclog) go to the node's
// slog logger, so they share its format (text or JSON) and its node=ID
// attribute, and a message that repeats for one peer is rate-limited.

package raftnode

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
)

// raftLogEvery is how often one repeating Raft message about one peer is
// logged; the repeats in between are counted into the next line.
const raftLogEvery = 10 * time.Second

// quietRaftMessages are what Raft logs as warnings or errors in ordinary
// operation; they are logged at debug level instead. A node starting with an
// empty log (a new member that is about to be sent a snapshot) looks for its
// last entry and does not find it; a node shutting down cuts its peers'
// connections mid-read ("transport shutdown").
var quietRaftMessages = []string{"failed to get log", "log not found", "transport shutdown"}

// peerFailureMessages are Raft's errors about failing to reach one peer. The
// node itself is fine (a peer that is down or not started yet is an everyday
// event, which the leader's peer-health state also names), so they are
// warnings.
var peerFailureMessages = []string{"failed to make requestVote RPC", "failed to heartbeat to",
	"failed to appendEntries to", "failed to pipeline appendEntries"}

// aboutPeer reports whether a Raft line is one of peerFailureMessages.
func aboutPeer(msg string) bool {
	for _, m := range peerFailureMessages {
		if strings.HasPrefix(msg, m) {
			return true
		}
	}
	return false
}

// quiet reports whether a Raft line is ordinary operation (quietRaftMessages
// in its message or its error).
func quiet(msg string, args []any) bool {
	for _, q := range quietRaftMessages {
		if strings.Contains(msg, q) {
			return true
		}
		for i := 1; i < len(args); i += 2 {
			if strings.Contains(fmt.Sprint(args[i]), q) {
				return true
			}
		}
	}
	return false
}

// hclogAdapter is an hclog.Logger writing to a slog.Logger.
type hclogAdapter struct {
	sl    *slog.Logger
	name  string
	args  []any
	level *hclog.Level
	lim   *repeatLimiter
	now   func() time.Time
	// stopping: the node (or the whole dev cluster) is shutting down, so
	// Raft's complaints about peers that went away are expected: debug.
	stopping *atomic.Bool
}

// newRaftLogger returns Raft's logger, writing to sl at level (hclog's names:
// trace, debug, info, warn, error; default warn).
func newRaftLogger(sl *slog.Logger, level string) hclog.Logger {
	lv := hclog.LevelFromString(level)
	if lv == hclog.NoLevel {
		lv = hclog.Warn
	}
	return &hclogAdapter{sl: sl, name: "raft", level: &lv, lim: &repeatLimiter{last: map[string]*repeat{}}, now: time.Now, stopping: &atomic.Bool{}}
}

type repeat struct {
	at         time.Time
	suppressed int
}

// repeatLimiter remembers when each (message, peer) was last logged.
type repeatLimiter struct {
	mu   sync.Mutex
	last map[string]*repeat
}

// allow reports whether a line with key may be logged now, and how many
// lines with the same key were dropped since the last one that was.
func (r *repeatLimiter) allow(key string, now time.Time) (bool, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.last[key]
	if p == nil {
		if len(r.last) > 1024 {
			clear(r.last) // peers come and go; never grow without bound
		}
		r.last[key] = &repeat{at: now}
		return true, 0
	}
	if now.Sub(p.at) < raftLogEvery {
		p.suppressed++
		return false, 0
	}
	n := p.suppressed
	p.at, p.suppressed = now, 0
	return true, n
}

// peerOf is the peer a Raft line is about, if it names one.
func peerOf(args []any) string {
	for i := 0; i+1 < len(args); i += 2 {
		if k, _ := args[i].(string); k == "peer" || k == "id" || k == "address" {
			return fmt.Sprint(args[i+1])
		}
	}
	return ""
}

func (h *hclogAdapter) Log(level hclog.Level, msg string, args ...any) {
	if level < *h.level || level == hclog.Off {
		return
	}
	sl := slogLevel(level)
	if sl > slog.LevelWarn && aboutPeer(msg) {
		sl = slog.LevelWarn
	}
	if sl >= slog.LevelWarn && (h.stopping.Load() || quiet(msg, args)) {
		sl = slog.LevelDebug
	}
	attrs := make([]any, 0, len(h.args)+len(args)+4)
	attrs = append(attrs, "component", h.name)
	attrs = append(attrs, h.args...)
	attrs = append(attrs, args...)
	if sl >= slog.LevelWarn {
		ok, dropped := h.lim.allow(msg+"\x00"+peerOf(args), h.now())
		if !ok {
			return
		}
		if dropped > 0 {
			attrs = append(attrs, "repeated", dropped)
		}
	}
	h.sl.Log(context.Background(), sl, msg, attrs...)
}

func slogLevel(l hclog.Level) slog.Level {
	switch l {
	case hclog.Trace, hclog.Debug:
		return slog.LevelDebug
	case hclog.Info:
		return slog.LevelInfo
	case hclog.Warn:
		return slog.LevelWarn
	}
	return slog.LevelError
}

func (h *hclogAdapter) Trace(msg string, args ...any) { h.Log(hclog.Trace, msg, args...) }
func (h *hclogAdapter) Debug(msg string, args ...any) { h.Log(hclog.Debug, msg, args...) }
func (h *hclogAdapter) Info(msg string, args ...any)  { h.Log(hclog.Info, msg, args...) }
func (h *hclogAdapter) Warn(msg string, args ...any)  { h.Log(hclog.Warn, msg, args...) }
func (h *hclogAdapter) Error(msg string, args ...any) { h.Log(hclog.Error, msg, args...) }
func (h *hclogAdapter) IsTrace() bool                 { return *h.level <= hclog.Trace }
func (h *hclogAdapter) IsDebug() bool                 { return *h.level <= hclog.Debug }
func (h *hclogAdapter) IsInfo() bool                  { return *h.level <= hclog.Info }
func (h *hclogAdapter) IsWarn() bool                  { return *h.level <= hclog.Warn }
func (h *hclogAdapter) IsError() bool                 { return *h.level <= hclog.Error }
func (h *hclogAdapter) ImpliedArgs() []any            { return h.args }
func (h *hclogAdapter) Name() string                  { return h.name }
func (h *hclogAdapter) SetLevel(l hclog.Level)        { *h.level = l }
func (h *hclogAdapter) GetLevel() hclog.Level         { return *h.level }

func (h *hclogAdapter) With(args ...any) hclog.Logger {
	c := *h
	c.args = append(append([]any(nil), h.args...), args...)
	return &c
}

func (h *hclogAdapter) Named(name string) hclog.Logger {
	c := *h
	c.name = h.name + "." + name
	return &c
}

func (h *hclogAdapter) ResetNamed(name string) hclog.Logger {
	c := *h
	c.name = name
	return &c
}

func (h *hclogAdapter) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(h.StandardWriter(opts), "", 0)
}

func (h *hclogAdapter) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return writerFunc(func(p []byte) (int, error) {
		h.Log(hclog.Info, strings.TrimSpace(string(p)))
		return len(p), nil
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
