package raftnode

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// Raft's lines take the node's format (one JSON object each with
// --log-format json), and a warning that repeats for one peer (a leader
// failing to heartbeat a dead follower, about ten times a second) is logged
// once per raftLogEvery with a count of the repeats.
func TestRaftLogIsStructuredAndRateLimited(t *testing.T) {
	var buf bytes.Buffer
	l := newRaftLogger(slog.New(slog.NewJSONHandler(&buf, nil)).With("node", "n1"), "info").(*hclogAdapter)
	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }
	for range 101 {
		l.Error("failed to heartbeat to", "peer", "127.0.0.1:7081", "error", "connection refused")
		now = now.Add(100 * time.Millisecond)
	}
	l.Error("failed to heartbeat to", "peer", "127.0.0.1:7091", "error", "connection refused")
	l.Named("snapshot").Info("starting snapshot up to", "index", 7)
	l.Warn("failed to get log", "index", 1, "error", "log not found")
	l.Error("failed to decode incoming command", "error", errors.New("transport shutdown"))
	var lines []map[string]any
	for _, ln := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(ln), &m); err != nil {
			t.Fatalf("not one JSON object per line: %q", ln)
		}
		lines = append(lines, m)
	}
	// 101 lines over 10 s for one peer: the first, then one after 10 s with
	// the 99 in between counted; another peer's line; the snapshot line.
	if len(lines) != 4 {
		t.Fatalf("got %d lines, want 4:\n%s", len(lines), buf.String())
	}
	if lines[1]["repeated"] != float64(99) || lines[0]["node"] != "n1" || lines[0]["component"] != "raft" {
		t.Errorf("lines: %v", lines[:2])
	}
	if lines[3]["component"] != "raft.snapshot" || lines[3]["index"] != float64(7) {
		t.Errorf("named logger line: %v", lines[3])
	}
	// Failing to reach a peer is about the peer: a warning, never an error
	// (a node of a cluster starting up calls peers not listening yet).
	for _, l := range lines[:3] {
		if l["level"] != "WARN" {
			t.Errorf("a peer that cannot be reached logged at %v: %v", l["level"], l)
		}
	}
}

// A node that was never given --initial-cluster or --join says so, instead of
// claiming an election is under way.
func TestNoLeaderReasonForANodeOutsideAnyCluster(t *testing.T) {
	n, err := Open(Config{ID: "lone", DataDir: t.TempDir(), RaftAddr: freeRaftAddr(t), RaftLogLevel: "off",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Shutdown()
	if err := n.Ready(); err == nil || !strings.Contains(err.Error(), "--initial-cluster") || !strings.Contains(err.Error(), "--join") {
		t.Fatalf("Ready of a node outside any cluster: %v", err)
	}
}
