package raftnode

import (
	"testing"

	"github.com/hashicorp/raft"
)

// Raft must see the same optional transport features through the wrapper
// (pre-vote, close), and no heartbeat fast path: with one, a heartbeat from
// a newer term can race a resumed leader's dispatch (heartbeat.go).
func TestSerialTransportKeepsFeaturesDropsFastPath(t *testing.T) {
	var tr raft.Transport = serialTransport{}
	if _, ok := tr.(raft.WithPreVote); !ok {
		t.Error("the wrapper hides pre-vote from raft")
	}
	if _, ok := tr.(raft.WithClose); !ok {
		t.Error("the wrapper hides Close from raft")
	}
	called := false
	serialTransport{}.SetHeartbeatHandler(func(raft.RPC) { called = true })
	if called {
		t.Error("the heartbeat handler was used")
	}
}
