package raftnode

import (
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// Raft must see the same optional transport features through the wrapper
// (pre-vote, close), and no heartbeat fast path: with one, a heartbeat from
// a newer term can race a resumed leader's dispatch (heartbeat.go).
func TestSerialTransportKeepsFeaturesDropsFastPath(t *testing.T) {
	var tr raft.Transport = newSerialTransport(nil)
	if _, ok := tr.(raft.WithPreVote); !ok {
		t.Error("the wrapper hides pre-vote from raft")
	}
	if _, ok := tr.(raft.WithClose); !ok {
		t.Error("the wrapper hides Close from raft")
	}

	// A real heartbeat over a real NetworkTransport must reach the main loop
	// (Consumer), never a handler raft installs through the wrapper.
	newTCP := func() *raft.NetworkTransport {
		nt, err := raft.NewTCPTransport("127.0.0.1:0", nil, 2, 2*time.Second, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = nt.Close() })
		return nt
	}
	srv, cli := newTCP(), newTCP()
	wrapped := newSerialTransport(srv)
	var called atomic.Bool
	wrapped.SetHeartbeatHandler(func(rpc raft.RPC) {
		called.Store(true)
		rpc.Respond(&raft.AppendEntriesResponse{Term: 5}, nil)
	})
	consumed := make(chan struct{}, 1)
	go func() {
		select {
		case rpc := <-wrapped.Consumer():
			consumed <- struct{}{}
			rpc.Respond(&raft.AppendEntriesResponse{Term: 5}, nil)
		case <-time.After(5 * time.Second):
		}
	}()
	// Term set, leader address set, no entries, no commit index: exactly
	// what NetworkTransport treats as a heartbeat.
	req := &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{Addr: []byte(cli.LocalAddr())}, Term: 5}
	var resp raft.AppendEntriesResponse
	if err := cli.AppendEntries("srv", srv.LocalAddr(), req, &resp); err != nil {
		t.Fatalf("heartbeat: %v", err)
	}
	if called.Load() {
		t.Error("the heartbeat handler was used")
	}
	select {
	case <-consumed:
	case <-time.After(time.Second):
		t.Error("the heartbeat did not go through the main loop (Consumer)")
	}
}
