package raftnode

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/testutil"
)

// openLoneNode starts a node with an empty data dir and no initial cluster:
// one waiting to be added, as `dlock serve --join` runs.
// It runs the engine of the package's clusters.
func openLoneNode(t *testing.T, id string) *Node {
	t.Helper()
	return openLoneNodeOn(t, id, testEngine())
}

func openLoneNodeOn(t *testing.T, id string, engine EngineKind) *Node {
	t.Helper()
	n, err := Open(Config{ID: id, DataDir: t.TempDir(), RaftAddr: freeRaftAddr(t), Engine: engine,
		RaftLogLevel: "off", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Shutdown() })
	return n
}

func servers(t *testing.T, n *Node) []raft.Server {
	t.Helper()
	cfg, err := n.configuration()
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Servers
}

// A new member's address is checked before it is added: an address that is
// not host:port, one that names an existing member under another spelling
// (localhost for 127.0.0.1: one process would get two votes), one where
// another node answers, and one where nothing answers are all refused with
// 400 invalid_argument and a message that says which, through the leader and
// through a follower, and the configuration is left as it was. The real node
// at its own address is then added, and promoted.
func TestJoinVerifiesTheNewMembersIdentity(t *testing.T) {
	nodes, leader := openTestCluster(t, []string{"n1", "n2", "n3"}, 0, nil)
	follower := followerKnowingLeader(t, nodes, leader)
	n4 := openLoneNode(t, "n4")
	_, port, _ := net.SplitHostPort(nodes["n1"].cfg.RaftAddr)
	dead := freeRaftAddr(t) // nothing listens there
	before := servers(t, nodes[leader])

	for _, c := range []struct {
		name, id, addr, want string
	}{
		{"an alias of a member", "n9", "localhost:" + port, "the raft address of existing member n1"},
		{"not an address", "n9", "not an addr", "is not host:port"},
		{"no port", "n9", "127.0.0.1", "is not host:port"},
		{"a port that is not a number", "n9", "127.0.0.1:raft", "is not host:port"},
		{"port 0", "n9", "127.0.0.1:0", "is not host:port"},
		{"no host", "n9", ":" + port, "is not host:port"},
		{"an unspecified address", "n9", "0.0.0.0:" + port, "does not resolve to an address other nodes can dial"},
		{"a host that does not resolve", "n9", "no-such-host.invalid:7071", "does not resolve"},
		{"another node", "n9", n4.cfg.RaftAddr, "answered as n4, not n9"},
		{"nothing there", "n9", dead, "could not reach " + dead},
	} {
		for _, via := range []string{leader, follower} {
			t.Run(c.name+" via "+via, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // hang guard only
				defer cancel()
				err := nodes[via].Join(ctx, c.id, c.addr)
				if ae := apierror.From(err); err == nil || ae.Code != apierror.InvalidArgument || !strings.Contains(ae.Message, c.want) {
					t.Fatalf("join %s at %q: %v; want invalid_argument saying %q", c.id, c.addr, err, c.want)
				}
				if got := servers(t, nodes[leader]); len(got) != len(before) {
					t.Fatalf("the configuration changed: %+v", got)
				}
			})
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // hang guard only
	defer cancel()
	if err := nodes[follower].Join(ctx, "n4", n4.cfg.RaftAddr); err != nil {
		t.Fatalf("the real n4 at its own address: %v", err)
	}
	for {
		for _, s := range servers(t, nodes[leader]) {
			if s.ID == "n4" && s.Suffrage == raft.Voter {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("n4 was never promoted: %+v", servers(t, nodes[leader]))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// A node of the other replication engine is refused as a new member, with a
// message that says how to start it: it could never catch up (the engines
// speak different protocols on the raft port), and a new data dir takes the
// default engine, which an older cluster may not run.
func TestJoinRefusesANodeOfTheOtherEngine(t *testing.T) {
	nodes, leader := openTestCluster(t, []string{"n1", "n2", "n3"}, 0, nil)
	other := EngineEtcd
	if testEngine() == EngineEtcd {
		other = EngineHashicorp
	}
	n4 := openLoneNodeOn(t, "n4", other)
	before := servers(t, nodes[leader])
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // hang guard only
	defer cancel()
	err := nodes[leader].Join(ctx, "n4", n4.cfg.RaftAddr)
	want := fmt.Sprintf("runs the %s replication engine and this cluster the %s engine", other, testEngine())
	if ae := apierror.From(err); err == nil || ae.Code != apierror.InvalidArgument || !strings.Contains(ae.Message, want) ||
		!strings.Contains(ae.Message, "--raft-engine "+string(testEngine())) {
		t.Fatalf("join of a node of the other engine: %v; want invalid_argument saying %q and the flag to give", err, want)
	}
	if got := servers(t, nodes[leader]); len(got) != len(before) {
		t.Fatalf("the configuration changed: %+v", got)
	}
}

// A non-voter whose address another node answers on (admitted before these
// checks existed) is never promoted to voter.
func TestNonVoterAtAnotherNodesAddressIsNotPromoted(t *testing.T) {
	nodes, _ := openTestCluster(t, []string{"n1", "n2", "n3"}, 0, nil)
	_, port, _ := net.SplitHostPort(nodes["n2"].cfg.RaftAddr)
	// A loaded machine may move leadership right after the first election, so
	// the change is retried on whichever node leads.
	var n *Node
	var lastErr error
	testutil.Eventually(t, 20*time.Second, "n9 added as a non-voter", func() (bool, string) {
		for _, cand := range nodes {
			if !cand.IsLeader() {
				continue
			}
			if lastErr = cand.raft.AddNonvoter("n9", raft.ServerAddress("localhost:"+port), 0, 10*time.Second).Error(); lastErr == nil {
				n = cand
				return true, ""
			}
		}
		return false, fmt.Sprint(lastErr)
	})
	warned := map[raft.ServerID]bool{}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// As the promoter does, round after round: on a loaded machine one
	// round may not hear n2's answer within its second.
	testutil.Eventually(t, 20*time.Second, "the refusal to promote n9 logged", func() bool {
		n.promoteCaughtUp(ctx, warned)
		for _, s := range servers(t, n) {
			if s.ID == "n9" && s.Suffrage != raft.Nonvoter {
				t.Fatalf("n9, an alias of n2, was promoted: %+v", servers(t, n))
			}
		}
		return warned["n9"]
	})
}
