package raftnode

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dlock/dlock/internal/apierror"
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

// loseAnswers delivers forwarded requests to path but loses the first n
// answers: the leader acts, the asking node sees an error (not a dial error).
type loseAnswers struct {
	next http.RoundTripper
	path string
	left atomic.Int32
	lost atomic.Int32
}

func (l *loseAnswers) RoundTrip(r *http.Request) (*http.Response, error) {
	res, err := l.next.RoundTrip(r)
	if err == nil && r.URL.Path == l.path && l.left.Add(-1) >= 0 {
		l.lost.Add(1)
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return nil, errors.New("test: the leader's answer was lost")
	}
	return res, err
}

// A member change sent through a follower whose forward reached the leader
// but whose answer was lost: a join or a transfer to a named voter is sent
// again (twice is once), a removal that then finds the member gone is done,
// and a transfer to "any voter" is not sent again (it would move leadership
// twice) but answers unavailable, having moved it once.
func TestMemberChangeAfterLostAnswer(t *testing.T) {
	for _, c := range []struct {
		name, path string
		do         func(ctx context.Context, asked *Node, nodes map[string]*Node, leader, other string) error
		check      func(t *testing.T, err error, nodes map[string]*Node, leader, asked, other string)
	}{
		{"join is sent again", "/forward/join",
			func(ctx context.Context, asked *Node, _ map[string]*Node, _, _ string) error {
				return asked.Join(ctx, "n4", "127.0.0.1:1")
			},
			func(t *testing.T, err error, nodes map[string]*Node, leader, _, _ string) {
				if err != nil {
					t.Fatalf("join after a lost answer: %v", err)
				}
				cfg, cerr := nodes[leader].configuration()
				if cerr != nil {
					t.Fatal(cerr)
				}
				found := 0
				for _, s := range cfg.Servers {
					if s.ID == "n4" && s.Address == "127.0.0.1:1" && s.Suffrage == raft.Nonvoter {
						found++
					}
				}
				if found != 1 || len(cfg.Servers) != 4 {
					t.Fatalf("members %+v; want n4 added once as a non-voter", cfg.Servers)
				}
			}},
		{"removal that finds the member gone is done", "/forward/remove",
			func(ctx context.Context, asked *Node, _ map[string]*Node, _, other string) error {
				return asked.Remove(ctx, other)
			},
			func(t *testing.T, err error, nodes map[string]*Node, leader, _, other string) {
				if err != nil {
					t.Fatalf("remove after a lost answer: %v", err)
				}
				if hasMember(nodes[leader], other) {
					t.Fatalf("%s is still a member", other)
				}
			}},
		{"transfer to a named voter is sent again", "/forward/transfer",
			func(ctx context.Context, asked *Node, _ map[string]*Node, _, _ string) error {
				return asked.TransferLeadership(ctx, asked.cfg.ID)
			},
			func(t *testing.T, err error, _ map[string]*Node, _, asked, _ string) {
				if err != nil {
					t.Fatalf("transfer to %s after a lost answer: %v", asked, err)
				}
			}},
		{"transfer to any voter is not sent again", "/forward/transfer",
			func(ctx context.Context, asked *Node, _ map[string]*Node, _, _ string) error {
				return asked.TransferLeadership(ctx, "")
			},
			func(t *testing.T, err error, nodes map[string]*Node, leader, _, _ string) {
				if ae := apierror.From(err); err == nil || ae.Code != apierror.Unavailable || !strings.Contains(ae.Message, "answer was lost") {
					t.Fatalf("transfer to any voter after a lost answer: %v; want unavailable, answer lost", err)
				}
				// It was acted on once: leadership left the old leader.
				deadline := time.Now().Add(10 * time.Second)
				for nodes[leader].raft.State() == raft.Leader {
					if time.Now().After(deadline) {
						t.Fatalf("%s still leads: the transfer was not made", leader)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			nodes, leader := openTestCluster(t, []string{"n1", "n2", "n3"}, 0, nil)
			asked := followerKnowingLeader(t, nodes, leader)
			var other string
			for id := range nodes {
				if id != leader && id != asked {
					other = id
				}
			}
			lose := &loseAnswers{next: nodes[asked].fwdClient.Transport, path: c.path}
			lose.left.Store(1)
			nodes[asked].fwdClient.Transport = lose
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // hang guard only
			defer cancel()
			err := c.do(ctx, nodes[asked], nodes, leader, other)
			if lose.lost.Load() != 1 {
				t.Fatalf("no answer was lost (the request was never forwarded to %s)", c.path)
			}
			c.check(t, err, nodes, leader, asked, other)
			if c.name == "transfer to a named voter is sent again" && nodes[asked].raft.State() != raft.Leader {
				t.Fatalf("%s asked to lead but does not", asked)
			}
		})
	}
}
