package service

import (
	"errors"
	"time"

	"github.com/dlock/dlock/internal/raftnode"
)

// errNoLeaderHere ends the watches and queued acquires of a node that has
// known no leader for raftnode.NoLeaderWait; noLeaderHere starts the answers.
var errNoLeaderHere = errors.New("this node has known no leader for a while")

const noLeaderHere = "this node has known no leader for a while (it is cut off from the majority, or no longer a member)"

// leaderCheck is how often a node looks whether it knows a leader.
const leaderCheck = 250 * time.Millisecond

// followLeaderless acts on this node having known no leader for
// raftnode.NoLeaderWait: it is cut off from the majority, or no longer a
// member, so it hears of no change. Its watchers would wait in silence for
// events that happen elsewhere, and its queued acquires for grants it would
// never learn of. So every watch ends (no_leader; etcd's WithRequireLeader,
// here always on), Watch refuses new ones, and every queued acquire is
// answered no_leader so its client goes on through another node. It runs until
// Close.
func (s *Service) followLeaderless() {
	t := time.NewTicker(leaderCheck)
	defer t.Stop()
	for {
		select {
		case <-s.life.Done():
			return
		case <-t.C:
		}
		if !s.leaderless() {
			s.noLeader() // re-arms it
			continue
		}
		// Only this goroutine closes the channel, and only an open one;
		// noLeader only replaces a closed one.
		if p := s.leaderGone.Load(); !isClosed(*p) {
			close(*p)
		}
		if s.hub != nil {
			s.hub.EndAll(errNoLeaderHere)
		}
	}
}

func (s *Service) leaderless() bool { return s.node.LeaderlessFor() >= raftnode.NoLeaderWait }

// noLeader is closed while this node has known no leader for NoLeaderWait. A
// closed one is replaced by an open one as soon as a leader is known again —
// here, not only at followLeaderless's next tick: a wait that starts then
// must not be sent away.
func (s *Service) noLeader() <-chan struct{} {
	p := s.leaderGone.Load()
	if isClosed(*p) && !s.leaderless() {
		ch := make(chan struct{})
		if s.leaderGone.CompareAndSwap(p, &ch) {
			return ch
		}
		p = s.leaderGone.Load()
	}
	return *p
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
