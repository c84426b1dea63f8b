package raftnode

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/fsm"
	"github.com/dlock/dlock/internal/state"
	"github.com/dlock/dlock/internal/testutil"
)

// pastDeadlineCtx is a context whose deadline has passed but whose Done is not
// closed: the state of a stdlib context between its deadline and the moment
// its timer fires (Err() is nil until then).
type pastDeadlineCtx struct{ context.Context }

func (pastDeadlineCtx) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

func registerMemberEnvelope(requestID string) *command.Envelope {
	return &command.Envelope{ClientID: "c", RequestID: requestID, Body: &command.RegisterMember{ID: "zz", RaftAddr: "x:1"}}
}

func hasMember(n *Node, id string) bool {
	found := false
	n.fsm.Read(func(s *state.State) {
		for _, m := range s.Members() {
			if m.ID == id {
				found = true
			}
		}
	})
	return found
}

// At its deadline Apply proposes nothing and answers a retriable error, even
// while ctx.Err() is still nil: never (nil, nil), which callers would read as
// a success and dereference.
func TestApplyPastDeadlineIsUnavailableNotNilNil(t *testing.T) {
	n := openSingleNode(t)
	done := make(chan struct{})
	var resp *fsm.Response
	var err error
	go func() {
		defer close(done)
		resp, err = n.Apply(pastDeadlineCtx{context.Background()}, registerMemberEnvelope("r1"))
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Apply past its deadline did not return (it waits for a Done that never closes)")
	}
	if err == nil {
		t.Fatalf("Apply past its deadline returned response %+v and no error", resp)
	}
	if c := apierror.CodeOf(err); c != apierror.Unavailable && c != apierror.NoLeader {
		t.Fatalf("Apply past its deadline: %v (code %q); want unavailable or no_leader", err, c)
	}
	if ae := apierror.From(err); ae.RetryAfter <= 0 {
		t.Fatalf("Apply past its deadline: %v has no Retry-After", err)
	}
	if hasMember(n, "zz") {
		t.Fatal("Apply past its deadline committed the command")
	}
}

// The same with real stdlib contexts, at the instant their deadline passes.
func TestApplyAtStdlibDeadlineNeverReturnsNilNil(t *testing.T) {
	n := openSingleNode(t)
	bad := 0
	for range 2000 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Microsecond)
		d, _ := ctx.Deadline()
		for time.Now().Before(d) {
		}
		resp, err := n.Apply(ctx, registerMemberEnvelope("r"))
		cancel()
		if err == nil && resp == nil {
			bad++
		}
	}
	if bad > 0 {
		t.Fatalf("%d of 2000 applies at their deadline returned (nil, nil)", bad)
	}
}

// blockingObserver stalls the FSM apply of the node it belongs to while that
// node is the blocked one: a stuck leader (GC pause, stalled disk, SIGSTOP)
// as its followers see it.
type blockingObserver struct {
	id      string
	mu      *sync.Mutex
	blocked *string
	release chan struct{}
}

func (o *blockingObserver) Applied(uint64, []state.Event) {
	o.mu.Lock()
	block := *o.blocked == o.id
	o.mu.Unlock()
	if block {
		<-o.release
	}
}
func (o *blockingObserver) Restored(*state.State) {}

// stuckLeaderCluster is a three-node cluster whose leader's FSM stalls from
// now on (until the test ends); it returns the nodes and one follower's id.
func stuckLeaderCluster(t *testing.T, applyTimeout time.Duration) (map[string]*Node, string) {
	t.Helper()
	return stalledNodeCluster(t, applyTimeout, true)
}

// stalledNodeCluster is a three-node cluster in which one node's FSM stalls
// from now on (until the test ends): the leader's (stallLeader) or that of a
// follower that knows the leader. It returns the nodes and that follower's id.
func stalledNodeCluster(t *testing.T, applyTimeout time.Duration, stallLeader bool) (map[string]*Node, string) {
	t.Helper()
	var mu sync.Mutex
	blocked := ""
	release := make(chan struct{})
	nodes, leader := openTestCluster(t, []string{"n1", "n2", "n3"}, applyTimeout, func(id string) []fsm.Observer {
		return []fsm.Observer{&blockingObserver{id: id, mu: &mu, blocked: &blocked, release: release}}
	})
	t.Cleanup(func() { close(release) }) // runs before the shutdowns
	follower := followerKnowingLeader(t, nodes, leader)
	mu.Lock()
	if stallLeader {
		blocked = leader
	} else {
		blocked = follower
	}
	mu.Unlock()
	return nodes, follower
}

// A write forwarded to a leader that does not answer in time has an unknown
// outcome: the client is told unavailable (503, retry), not internal (500) —
// although Apply's own timeout context, not the request's, ran out.
func TestForwardedWriteToStuckLeaderIsUnavailable(t *testing.T) {
	nodes, follower := stuckLeaderCluster(t, time.Second)
	reqCtx := context.Background()
	_, err := nodes[follower].Apply(reqCtx, &command.Envelope{ClientID: "c", RequestID: "fwd-1",
		Body: &command.CreateSession{TTLms: 5000}})
	if err == nil {
		t.Fatal("a write through a stuck leader succeeded")
	}
	pub, internal := apierror.Public(reqCtx, err)
	if internal || (pub.Code != apierror.Unavailable && pub.Code != apierror.NoLeader) {
		t.Fatalf("a forwarded write that timed out: %v -> code %s; want unavailable or no_leader (503, retriable)", err, pub.Code)
	}
	if pub.RetryAfter <= 0 {
		t.Fatalf("a forwarded write that timed out: %v has no Retry-After", err)
	}
}

// One forward attempt ends after ForwardAttemptTimeout even when the request
// may wait much longer, so Apply can try again (perhaps with a new leader),
// and its failure is an unknown outcome, not a bare context error.
func TestForwardAttemptHasItsOwnTimeout(t *testing.T) {
	nodes, follower := stuckLeaderCluster(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 4*ForwardAttemptTimeout)
	defer cancel()
	start := time.Now()
	_, err := nodes[follower].forwardApply(ctx, &command.Envelope{ClientID: "c", RequestID: "fwd-2",
		Body: &command.CreateSession{TTLms: 5000}})
	took := time.Since(start)
	if !errors.Is(err, errUnknown) {
		t.Fatalf("a forward attempt to a stuck leader: %v; want an unknown outcome", err)
	}
	if took > ForwardAttemptTimeout+time.Second {
		t.Fatalf("a forward attempt took %v; want about ForwardAttemptTimeout (%v)", took, ForwardAttemptTimeout)
	}
}

// The leader's client-facing error comes back through the forward with its
// code, instead of turning into a 500 on the forwarding node.
func TestForwardedWriteKeepsLeaderErrorCode(t *testing.T) {
	nodes, leader := openTestCluster(t, []string{"n1", "n2", "n3"}, 0, nil)
	follower := followerKnowingLeader(t, nodes, leader)
	// Over MaxEntryBytes, which the leader checks, but under the forward
	// body limit.
	big := &command.Envelope{ClientID: "c", RequestID: "big",
		Body: &command.RegisterMember{ID: "big", RaftAddr: strings.Repeat("a", command.MaxEntryBytes+1024)}}
	_, err := nodes[follower].Apply(context.Background(), big)
	if c := apierror.CodeOf(err); c != apierror.TooLarge {
		t.Fatalf("a too-large write through a follower: %v (code %q); want too_large", err, c)
	}
}

// followerKnowingLeader picks a node other than leader and waits until it
// knows where the leader is (so it can forward).
func followerKnowingLeader(t *testing.T, nodes map[string]*Node, leader string) string {
	t.Helper()
	var follower string
	for id := range nodes {
		if id != leader {
			follower = id
			break
		}
	}
	testutil.Eventually(t, 5*time.Second, "the follower knows a leader", func() bool { _, ok := nodes[follower].leaderAddr(); return ok })
	return follower
}

// stuckFollowerCluster is a three-node cluster where one follower, which knows
// the leader, stops applying entries from now on: the state a removed member
// is left in, since the leader no longer sends it the log. It returns the
// nodes and that follower's id.
func stuckFollowerCluster(t *testing.T) (map[string]*Node, string) {
	t.Helper()
	return stalledNodeCluster(t, 0, false)
}

// A follower that cannot apply what the leader committed answers a
// linearizable read "unavailable" once CatchUpTimeout has passed, instead of
// holding the request (and the node's graceful shutdown, which waits for open
// requests) until the client gives up.
func TestReadOnFollowerThatCannotCatchUpIsUnavailable(t *testing.T) {
	nodes, follower := stuckFollowerCluster(t)
	// A grant through the follower commits on the leader; the follower
	// forwards it and never applies it (a grant has events, which the
	// stalled observer blocks on).
	key, err := command.NormalizeName("stuck")
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 60*time.Second) // hang guard only: CI machines are slow
	defer wcancel()
	resp, err := nodes[follower].Apply(wctx, &command.Envelope{ClientID: "c", RequestID: "stuck-1",
		Body: &command.Acquire{Name: key, TTLms: 5000}})
	if err != nil {
		t.Fatalf("a write forwarded by the stuck follower: %v", err)
	}
	if got := nodes[follower].FSM().AppliedIndex(); got >= resp.Index {
		t.Fatalf("the follower applied index %d though its state machine is stalled", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*CatchUpTimeout) // hang guard only
	defer cancel()
	err = nodes[follower].LinearizableRead(ctx)
	if ctx.Err() != nil {
		t.Fatalf("the read waited for its client's whole deadline (%v)", err)
	}
	ae := apierror.From(err)
	if ae.Code != apierror.Unavailable || ae.RetryAfter <= 0 || !strings.Contains(ae.Message, "retry through another node") {
		t.Fatalf("a read on a follower that cannot catch up: %v (code %s, Retry-After %v); want unavailable, Retry-After, retry elsewhere", err, ae.Code, ae.RetryAfter)
	}
	// CatchUp itself: the same bound, and at once for an applied index.
	if err := nodes[follower].CatchUp(ctx, resp.Index); apierror.CodeOf(err) != apierror.Unavailable {
		t.Fatalf("CatchUp to an index the follower cannot apply: %v", err)
	}
	if err := nodes[follower].CatchUp(ctx, nodes[follower].FSM().AppliedIndex()); err != nil {
		t.Fatalf("CatchUp to an applied index: %v", err)
	}
}

// A linearizable read on a leader whose FSM lags its commit waits for the
// commit, or answers unavailable: a follower may already have applied (and
// streamed to a watcher) what the leader has not, so the leader's own applied
// index is not enough.
func TestLinearizableReadOnALaggingLeaderWaitsForTheCommit(t *testing.T) {
	nodes, follower := stuckLeaderCluster(t, 0)
	leader := ""
	for id, n := range nodes {
		if n.raft.State() == raft.Leader {
			leader = id
		}
	}
	if leader == "" || leader == follower {
		t.Fatalf("no leader apart from %s", follower)
	}
	key, err := command.NormalizeName("ahead")
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(context.Background())
	defer wcancel()
	go func() {
		// Its answer waits for the stalled leader's FSM: only the commit matters.
		_, _ = nodes[follower].Apply(wctx, &command.Envelope{ClientID: "c", RequestID: "ahead-1",
			Body: &command.Acquire{Name: key, TTLms: 60000}})
	}()
	testutil.Eventually(t, 30*time.Second, "the follower applies the grant", func() bool {
		held := false
		nodes[follower].FSM().Read(func(s *state.State) { held = s.GetLock(key).Held })
		return held
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*CatchUpTimeout) // hang guard only
	defer cancel()
	err = nodes[leader].LinearizableRead(ctx)
	if err == nil {
		t.Fatalf("a linearizable read on the leader (applied %d) answered although a follower applied index %d, which the leader's FSM has not",
			nodes[leader].FSM().AppliedIndex(), nodes[follower].FSM().AppliedIndex())
	}
	if ae := apierror.From(err); ae.Code != apierror.Unavailable || ctx.Err() != nil {
		t.Fatalf("a read on a leader whose FSM lags its commit: %v (code %s); want unavailable within CatchUpTimeout", err, ae.Code)
	}
}

// A forwarded answer says whether it came from the dedup table, as the
// leader's own does: the forwarding node decides on it (a grant made by an
// earlier try of the same request).
func TestForwardedAnswerSaysReplayed(t *testing.T) {
	nodes, leader := openTestCluster(t, []string{"n1", "n2", "n3"}, 0, nil)
	follower := followerKnowingLeader(t, nodes, leader)
	key, err := command.NormalizeName("replayed")
	if err != nil {
		t.Fatal(err)
	}
	env := func() *command.Envelope {
		return &command.Envelope{ClientID: "c", RequestID: "same-1", Body: &command.Acquire{Name: key, TTLms: 5000}}
	}
	first, err := nodes[follower].Apply(context.Background(), env())
	if err != nil || first.Result.Replayed {
		t.Fatalf("first try through the follower: %+v, %v; want a fresh answer", first, err)
	}
	again, err := nodes[follower].Apply(context.Background(), env())
	if err != nil || !again.Result.Replayed || again.Result.Token != first.Result.Token {
		t.Fatalf("the same request again through the follower: %+v, %v; want the first answer (token %d) marked Replayed", again, err, first.Result.Token)
	}
}

// The leader's endorsement of a forwarded write (SetEndorser) reaches the
// forwarding node's Apply with the answer; a write the leader proposes for
// its own client, or a leader without an endorser, carries none.
func TestForwardedAnswerCarriesTheLeadersEndorsement(t *testing.T) {
	nodes, leader := openTestCluster(t, []string{"n1", "n2", "n3"}, 0, nil)
	follower := followerKnowingLeader(t, nodes, leader)
	tick := func(via string) *fsm.Response {
		t.Helper()
		r, err := nodes[via].Apply(context.Background(), &command.Envelope{ClientID: "c", Body: &command.Tick{}})
		if err != nil {
			t.Fatalf("tick through %s: %v", via, err)
		}
		return r
	}
	if r := tick(follower); r.Endorsement != "" {
		t.Fatalf("endorsed %q by a leader without an endorser", r.Endorsement)
	}
	for id, n := range nodes {
		n.SetEndorser(func(e *command.Envelope, resp *fsm.Response) string {
			return fmt.Sprintf("%s endorses %s's entry %d", id, e.ClientID, resp.Index)
		})
	}
	r := tick(follower)
	if want := fmt.Sprintf("%s endorses c's entry %d", leader, r.Index); r.Endorsement != want {
		t.Fatalf("endorsement through the follower: %q, want %q", r.Endorsement, want)
	}
	if r := tick(leader); r.Endorsement != "" {
		t.Fatalf("the leader's own write carries endorsement %q", r.Endorsement)
	}
}
