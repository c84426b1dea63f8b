package raftnode

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/testutil"
)

// registerCluster opens three nodes with API addresses, as dlock serve does.
func registerCluster(t *testing.T) (map[string]*Node, map[string]Config, string) {
	cfgs := map[string]Config{}
	nodes, leader := openTestClusterWith(t, []string{"n1", "n2", "n3"}, func(c *Config) {
		c.APIAddr = "127.0.0.1:" + c.ID // recorded, never dialled here
		cfgs[c.ID] = *c
	})
	return nodes, cfgs, leader
}

// A node is ready only once its own member record, with its API address, is
// in the replicated state: clients that list the members after every node is
// ready must find every API address.
func TestReadyMeansRegistered(t *testing.T) {
	nodes, _, _ := registerCluster(t)
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		for id, n := range nodes {
			if n.Ready() == nil && !n.registered(n.selfMember()) {
				t.Fatalf("%s answers ready, but its member record is not in its state", id)
			}
		}
	}
	for id, n := range nodes {
		if err := n.Ready(); err != nil {
			t.Errorf("%s not ready after 3 s: %v", id, err)
		}
	}
	// Each member's record names the build it runs (GET /cluster's version).
	for _, s := range nodes["n1"].Status().Servers {
		if s.Version != memberVersion() || s.Version == "" {
			t.Errorf("member %s has version %q, want %q", s.ID, s.Version, memberVersion())
		}
	}
}

// A restarted node proposes its registration at most once, even while it is
// still applying a long log (it once re-proposed it in a tight loop until
// its own state showed the record: thousands of entries per restart).
func TestRestartRegistersOnce(t *testing.T) {
	nodes, cfgs, leader := registerCluster(t)
	ld := nodes[leader]
	// A log long enough that a restarted follower takes a while to apply it.
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 250 {
				e := &command.Envelope{ClientID: "filler", Body: &command.RegisterMember{ID: fmt.Sprintf("x%d", w), RaftAddr: fmt.Sprintf("127.0.0.1:%d", i+1)}}
				if _, err := ld.Apply(context.Background(), e); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	var follower string
	for id := range nodes {
		if id != leader {
			follower = id
		}
	}
	if err := nodes[follower].Shutdown(); err != nil {
		t.Fatal(err)
	}
	cfg := cfgs[follower]
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	n, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Shutdown() })
	testutil.Eventually(t, 20*time.Second, "restarted "+follower+" ready", func() (bool, string) {
		err := n.Ready()
		return err == nil, fmt.Sprint(err)
	})
	// Give a runaway loop time to show itself.
	time.Sleep(time.Second)
	if f := n.Status().Forwarded; f > 1 {
		t.Fatalf("restarted %s forwarded %d writes, want at most one registration", follower, f)
	}
}

// The leader says a member it cannot reach is unreachable, not a follower
// (dlock members once showed a killed node as follower).
func TestLeaderShowsAStoppedMemberUnreachable(t *testing.T) {
	nodes, leader := openTestClusterWith(t, []string{"n1", "n2", "n3"}, func(*Config) {})
	var stopped string
	for id := range nodes {
		if id != leader {
			stopped = id
			break
		}
	}
	state := func(id string) string {
		for _, s := range nodes[leader].Status().Servers {
			if s.ID == id {
				return s.State
			}
		}
		return ""
	}
	if st := state(stopped); st != "follower" {
		t.Fatalf("%s is %q before it stops, want follower", stopped, st)
	}
	if err := nodes[stopped].Shutdown(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, stopped+" shown unreachable by the leader", func() (bool, string) {
		st := state(stopped)
		return st == "unreachable", st
	})
}
