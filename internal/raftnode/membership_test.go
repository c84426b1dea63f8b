package raftnode

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// Removing the leader itself hands leadership on first, so when the removal
// returns another voter already leads: the cluster does not wait out an
// election timeout after the removed leader steps down.
// Asked through a follower, the request is forwarded to the leader, which
// hands on and answers "retry"; the follower then asks the new leader.
func TestRemoveLeaderHandsLeadershipOnFirst(t *testing.T) {
	for _, via := range []string{"the leader", "a follower"} {
		t.Run(via, func(t *testing.T) { removeLeaderVia(t, via == "a follower") })
	}
}

func removeLeaderVia(t *testing.T, viaFollower bool) {
	nodes, leader := openTestCluster(t, []string{"n1", "n2", "n3"}, 0, nil)
	asked := leader
	if viaFollower {
		asked = followerKnowingLeader(t, nodes, leader)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // hang guard only
	defer cancel()
	if err := nodes[asked].Remove(ctx, leader); err != nil {
		t.Fatalf("removing the leader %s through %s: %v", leader, asked, err)
	}
	var leading []string
	for id, n := range nodes {
		if id != leader && n.raft.State() == raft.Leader {
			leading = append(leading, id)
		}
	}
	if len(leading) != 1 {
		t.Fatalf("when the removal of the leader returned, other voters leading: %v; want exactly one", leading)
	}
	cfg, err := nodes[leading[0]].configuration()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range cfg.Servers {
		if string(s.ID) == leader {
			t.Fatalf("%s is still a member: %+v", leader, cfg.Servers)
		}
	}
}

// Leave (--leave-on-shutdown) takes this node out of the cluster: a follower
// removes itself through the leader; the leader hands leadership on first.
func TestLeaveRemovesThisNode(t *testing.T) {
	for _, who := range []string{"a follower", "the leader"} {
		t.Run(who, func(t *testing.T) {
			nodes, leader := openTestCluster(t, []string{"n1", "n2", "n3"}, 0, nil)
			leaving := leader
			if who == "a follower" {
				leaving = followerKnowingLeader(t, nodes, leader)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // hang guard only
			defer cancel()
			if err := nodes[leaving].Leave(ctx); err != nil {
				t.Fatalf("%s (%s) leaving: %v", who, leaving, err)
			}
			for id, n := range nodes {
				if id == leaving || n.raft.State() != raft.Leader {
					continue
				}
				cfg, err := n.configuration()
				if err != nil {
					t.Fatal(err)
				}
				if len(cfg.Servers) != 2 {
					t.Fatalf("after %s left, the leader %s has members %+v; want the other two", leaving, id, cfg.Servers)
				}
				for _, s := range cfg.Servers {
					if string(s.ID) == leaving {
						t.Fatalf("%s is still a member after leaving", leaving)
					}
				}
				return
			}
			t.Fatalf("no remaining node leads right after %s left", leaving)
		})
	}
}
