// Which peers the leader cannot reach, so that GET /cluster says a killed
// node is unreachable instead of calling it a follower.

package raftnode

import (
	"sync"

	"github.com/hashicorp/raft"
)

// peerHealth is the set of peers whose heartbeats from this node (as leader)
// are failing. Raft reports failures and resumptions only on the leader.
type peerHealth struct {
	mu      sync.Mutex
	failing map[string]bool
}

func (p *peerHealth) set(id string, failing bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failing == nil {
		p.failing = map[string]bool{}
	}
	if failing {
		p.failing[id] = true
	} else {
		delete(p.failing, id)
	}
}

func (p *peerHealth) unreachable(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failing[id]
}

// reset forgets every peer: a new term's leader learns afresh.
func (p *peerHealth) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	clear(p.failing)
}

// watchPeers follows Raft's heartbeat observations until the node stops.
func (n *Node) watchPeers() {
	r, ok := n.raft.(*raft.Raft)
	if !ok {
		return // the etcd engine reports peers through its transport
	}
	ch := make(chan raft.Observation, 64)
	obs := raft.NewObserver(ch, false, func(o *raft.Observation) bool {
		switch o.Data.(type) {
		case raft.FailedHeartbeatObservation, raft.ResumedHeartbeatObservation, raft.LeaderObservation:
			return true
		}
		return false
	})
	r.RegisterObserver(obs)
	defer r.DeregisterObserver(obs)
	for {
		select {
		case <-n.ctx.Done():
			return
		case o := <-ch:
			switch d := o.Data.(type) {
			case raft.FailedHeartbeatObservation:
				n.peers.set(string(d.PeerID), true)
			case raft.ResumedHeartbeatObservation:
				n.peers.set(string(d.PeerID), false)
			case raft.LeaderObservation:
				n.peers.reset()
			}
		}
	}
}
