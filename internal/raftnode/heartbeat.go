package raftnode

import (
	"sync"

	"github.com/hashicorp/raft"
)

// serialTransport is raft's NetworkTransport without the heartbeat fast path.
//
// With the fast path, hashicorp/raft (v1.7.3) handles a heartbeat on the
// transport's goroutine by calling appendEntries, which is documented as
// "must only be called from the main thread": a heartbeat from a newer
// leader sets the term and steps the node down concurrently with the main
// loop. On a leader that resumes after a pause (SIGSTOP, a long GC, a frozen
// VM) with proposals queued, the main loop can then dispatch those
// proposals under the NEW term it never won. The new leader's later
// AppendEntries match those forged entries by (index, term), so they are
// never truncated: the node applies commands the cluster never committed,
// and its state forks (docs/reliability.md, "The root cause"; upstream:
// hashicorp/raft issue #695, open as of v1.7.3). Without the
// fast path every heartbeat goes through the main loop, serialised with
// dispatch, and a term change always ends leadership before anything else
// is appended.
//
// It also guards raft's append pipelines (pipeline.go) and closes them with
// the transport.
type serialTransport struct {
	*raft.NetworkTransport

	mu     sync.Mutex
	closed bool
	pipes  map[*guardedPipeline]struct{}
}

func newSerialTransport(t *raft.NetworkTransport) *serialTransport {
	return &serialTransport{NetworkTransport: t, pipes: map[*guardedPipeline]struct{}{}}
}

// SetHeartbeatHandler keeps heartbeats on the main loop (see the type).
func (*serialTransport) SetHeartbeatHandler(func(raft.RPC)) {}
