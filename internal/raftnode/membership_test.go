package raftnode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/testutil"
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
			// A leader that could not hand leadership on in time removed
			// itself as leader: the others elect one.
			testutil.Eventually(t, 20*time.Second, "a remaining node leads, with the other two as members", func() error {
				for id, n := range nodes {
					if id == leaving || n.raft.State() != raft.Leader {
						continue
					}
					cfg, err := n.configuration()
					if err != nil {
						return err
					}
					if len(cfg.Servers) != 2 {
						return fmt.Errorf("after %s left, the leader %s has members %+v", leaving, id, cfg.Servers)
					}
					for _, s := range cfg.Servers {
						if string(s.ID) == leaving {
							t.Fatalf("%s is still a member after leaving", leaving)
						}
					}
					return nil
				}
				return fmt.Errorf("no remaining node leads after %s left", leaving)
			})
		})
	}
}

// tamperAnswer delivers the first forwarded request to path to the leader,
// which acts on it, and gives the asking node answer's result instead of the
// leader's answer.
type tamperAnswer struct {
	next     http.RoundTripper
	path     string
	answer   func(r *http.Request) (*http.Response, error)
	left     atomic.Int32
	tampered atomic.Int32
}

func (a *tamperAnswer) RoundTrip(r *http.Request) (*http.Response, error) {
	res, err := a.next.RoundTrip(r)
	if err == nil && r.URL.Path == a.path && a.left.Add(-1) >= 0 {
		a.tampered.Add(1)
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return a.answer(r)
	}
	return res, err
}

// loseAnswer: the asking node sees an error (not a dial error).
func loseAnswer(*http.Request) (*http.Response, error) {
	return nil, errors.New("test: the leader's answer was lost")
}

// answerUnknown: the answer of a leader that lost leadership before the
// change committed (503, outcome unknown).
func answerUnknown(r *http.Request) (*http.Response, error) {
	body := `{"code":"unavailable","message":"remove: leadership was lost before the change committed","unknown":true}`
	return &http.Response{StatusCode: http.StatusServiceUnavailable, Header: http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(strings.NewReader(body)), ContentLength: int64(len(body)), Request: r}, nil
}

// forwardedChange runs do on a follower of a fresh 3-node cluster whose
// first forward to path the leader acts on but answer replaces; other is the
// third node. It fails unless that forward was made.
func forwardedChange(t *testing.T, path string, answer func(*http.Request) (*http.Response, error),
	do func(ctx context.Context, nodes map[string]*Node, leader, asked, other string) error) (nodes map[string]*Node, leader, asked, other string, err error) {
	t.Helper()
	nodes, leader = openTestCluster(t, []string{"n1", "n2", "n3"}, 0, nil)
	asked = followerKnowingLeader(t, nodes, leader)
	for id := range nodes {
		if id != leader && id != asked {
			other = id
		}
	}
	tamper := &tamperAnswer{next: nodes[asked].fwdClient.Transport, path: path, answer: answer}
	tamper.left.Store(1)
	nodes[asked].fwdClient.Transport = tamper
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // hang guard only
	defer cancel()
	err = do(ctx, nodes, leader, asked, other)
	if tamper.tampered.Load() != 1 {
		t.Fatalf("the leader's answer was not replaced (the request was never forwarded to %s)", path)
	}
	return nodes, leader, asked, other, err
}

// A member change sent through a follower whose forward reached the leader
// but whose answer was lost: a join or a transfer to a named voter is sent
// again (twice is once), a removal that then finds the member gone is done,
// and a transfer to "any voter" is not sent again (it would move leadership
// twice) but answers unavailable, having moved it once.
func TestMemberChangeAfterLostAnswer(t *testing.T) {
	var n4addr string
	// A removed node stops hearing from the leader: on hashicorp/raft it
	// forgets the leader after a heartbeat timeout, and the answer to a node
	// removing itself is lost only then (the etcd engine's removed node keeps
	// its last leader, and asks it again).
	var leaving atomic.Pointer[Node]
	answer := func(r *http.Request) (*http.Response, error) {
		if n := leaving.Load(); n != nil && n.Engine() == EngineHashicorp {
			for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
				if addr, _ := n.raft.LeaderWithID(); addr == "" {
					break
				}
			}
		}
		return loseAnswer(r)
	}
	for _, c := range []struct {
		name, path string
		do         func(ctx context.Context, asked *Node, nodes map[string]*Node, leader, other string) error
		check      func(t *testing.T, err error, nodes map[string]*Node, leader, asked, other string)
	}{
		{"join is sent again", "/forward/join",
			func(ctx context.Context, asked *Node, _ map[string]*Node, _, _ string) error {
				return asked.Join(ctx, "n4", n4addr)
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
					if s.ID == "n4" && string(s.Address) == n4addr {
						found++
					}
				}
				if found != 1 || len(cfg.Servers) != 4 {
					t.Fatalf("members %+v; want n4 added once", cfg.Servers)
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
		{"a follower that removed itself finds itself gone", "/forward/remove",
			func(ctx context.Context, asked *Node, _ map[string]*Node, _, _ string) error {
				leaving.Store(asked)
				return asked.Leave(ctx)
			},
			func(t *testing.T, err error, nodes map[string]*Node, leader, asked, _ string) {
				if err != nil {
					t.Fatalf("leave after a lost answer: %v", err)
				}
				if hasMember(nodes[leader], asked) {
					t.Fatalf("%s is still a member", asked)
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
				testutil.Eventually(t, 10*time.Second, leader+" hands leadership on (the transfer was made)", func() bool { return nodes[leader].raft.State() != raft.Leader })
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			leaving.Store(nil)
			// The leader checks who answers at a new member's address: a
			// real node waits there.
			n4addr = openLoneNode(t, "n4").cfg.RaftAddr
			nodes, leader, asked, other, err := forwardedChange(t, c.path, answer,
				func(ctx context.Context, nodes map[string]*Node, leader, asked, other string) error {
					return c.do(ctx, nodes[asked], nodes, leader, other)
				})
			c.check(t, err, nodes, leader, asked, other)
			if c.name == "transfer to a named voter is sent again" && nodes[asked].raft.State() != raft.Leader {
				t.Fatalf("%s asked to lead but does not", asked)
			}
		})
	}
}

// A leader that loses leadership after Raft appended a membership change, but
// before it committed, cannot tell whether it will take effect (a chaos soak
// found a removal that did, answered 500, and left the operator thinking the
// member was still in). Asked on the leader, a removal or a join is sent again
// until a leader answers — a removal that then finds the member gone is done
// — and a transfer to any voter is not sent again but answers "outcome
// unknown"; an error that is not about the outcome is returned as it is.
func TestMemberChangeWhoseLeaderLostLeadership(t *testing.T) {
	nodes, leader := openTestCluster(t, []string{"n1"}, 0, nil)
	n := nodes[leader]
	lostErr := changeErr("remove n9", raft.ErrLeadershipLost)
	if ae := apierror.From(lostErr); ae.Code != apierror.Unavailable || !errors.Is(lostErr, errChangeUnknown) || !errors.Is(lostErr, raft.ErrLeadershipLost) {
		t.Fatalf("changeErr(ErrLeadershipLost) = %v (code %s); want unavailable wrapping errChangeUnknown and the raft error", lostErr, ae.Code)
	}
	if err := changeErr("remove n9", raft.ErrNotLeader); !errors.Is(err, raft.ErrNotLeader) || errors.Is(err, errChangeUnknown) {
		t.Fatalf("changeErr(ErrNotLeader) = %v; want it to stay ErrNotLeader (not appended: sent again)", err)
	}
	notFound := apierror.New(apierror.NotFound, "no member %q", "n9")
	for _, c := range []struct {
		name    string
		how     memberRetry
		answers []error // what local returns, call by call
		calls   int
		want    apierror.Code // "" for success
	}{
		{"removal found gone after the loss is done", doneIfGone, []error{lostErr, notFound}, 2, ""},
		{"removal not made is made again", doneIfGone, []error{lostErr, nil}, 2, ""},
		{"join is sent again", repeatable, []error{lostErr, nil}, 2, ""},
		{"transfer to any voter is not sent again", once, []error{lostErr, nil}, 1, apierror.Unavailable},
		{"a removal of an unknown member without a loss is not_found", doneIfGone, []error{notFound}, 1, apierror.NotFound},
	} {
		t.Run(c.name, func(t *testing.T) {
			calls := 0
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := n.onLeader(ctx, "/forward/test", memberRequest{ID: "n9"}, c.how, func() error {
				calls++
				return c.answers[min(calls, len(c.answers))-1]
			})
			if calls != c.calls {
				t.Fatalf("local ran %d times, want %d", calls, c.calls)
			}
			if got := apierror.CodeOf(err); got != c.want {
				t.Fatalf("onLeader = %v; want code %q", err, c.want)
			}
			if c.want == apierror.Unavailable && !strings.Contains(apierror.From(err).Message, "outcome is unknown") {
				t.Fatalf("the answer does not say the outcome is unknown: %v", err)
			}
		})
	}

	// The leader's forwarding handler marks such an error for the follower.
	rec := httptest.NewRecorder()
	n.serveMember(func(memberRequest) error { return lostErr })(rec, httptest.NewRequest(http.MethodPost, "/forward/remove", strings.NewReader(`{"id":"n9"}`)))
	var we wireError
	if err := json.Unmarshal(rec.Body.Bytes(), &we); err != nil || rec.Code != http.StatusServiceUnavailable || !we.Unknown || we.Code != apierror.Unavailable {
		t.Fatalf("forwarded answer %d %s (%v); want 503 unavailable with unknown:true", rec.Code, rec.Body, err)
	}
}

// The same through a follower: the leader made the change but its answer
// says the outcome is unknown. A removal is sent again and, finding the
// member gone, is done; a transfer to any voter is not sent again.
func TestForwardedMemberChangeWithUnknownOutcome(t *testing.T) {
	for _, c := range []struct {
		name, path string
		do         func(ctx context.Context, asked *Node, other string) error
		check      func(t *testing.T, err error, nodes map[string]*Node, leader, other string)
	}{
		{"removal", "/forward/remove",
			func(ctx context.Context, asked *Node, other string) error { return asked.Remove(ctx, other) },
			func(t *testing.T, err error, nodes map[string]*Node, leader, other string) {
				if err != nil {
					t.Fatalf("remove with an unknown outcome, then found gone: %v", err)
				}
				cfg, cerr := nodes[leader].configuration()
				if cerr != nil {
					t.Fatal(cerr)
				}
				for _, s := range cfg.Servers {
					if string(s.ID) == other {
						t.Fatalf("%s is still in the configuration %+v", other, cfg.Servers)
					}
				}
			}},
		{"transfer to any voter", "/forward/transfer",
			func(ctx context.Context, asked *Node, _ string) error { return asked.TransferLeadership(ctx, "") },
			func(t *testing.T, err error, _ map[string]*Node, _, _ string) {
				if ae := apierror.From(err); err == nil || ae.Code != apierror.Unavailable || !strings.Contains(ae.Message, "outcome is unknown") {
					t.Fatalf("transfer to any voter with an unknown outcome: %v; want unavailable, outcome unknown", err)
				}
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			nodes, leader, _, other, err := forwardedChange(t, c.path, answerUnknown,
				func(ctx context.Context, nodes map[string]*Node, _, asked, other string) error {
					return c.do(ctx, nodes[asked], other)
				})
			c.check(t, err, nodes, leader, other)
		})
	}
}

// A membership change the engine refused before it reached the log is a
// retryable 503, one that may have reached it says so, and neither is a 500.
func TestChangeErrCodes(t *testing.T) {
	for _, tc := range []struct {
		err     error
		code    apierror.Code
		unknown bool
	}{
		{raft.ErrNotLeader, apierror.Unavailable, false},
		{raft.ErrLeadershipTransferInProgress, apierror.Unavailable, false},
		{raft.ErrEnqueueTimeout, apierror.Unavailable, false},
		{raft.ErrLeadershipLost, apierror.Unavailable, true},
		{raft.ErrRaftShutdown, apierror.Unavailable, true},
	} {
		err := changeErr("remove n4", tc.err)
		if c := apierror.CodeOf(err); c != tc.code {
			t.Errorf("%v: code %q, want %q", tc.err, c, tc.code)
		}
		if got := errors.Is(err, errChangeUnknown); got != tc.unknown {
			t.Errorf("%v: outcome unknown %v, want %v", tc.err, got, tc.unknown)
		}
		if !errors.Is(err, tc.err) {
			t.Errorf("%v: the cause is lost: %v", tc.err, err)
		}
	}
}
