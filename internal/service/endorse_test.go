package service

import (
	"context"
	"testing"
	"time"

	"github.com/dlock/dlock/fence"
	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/command"
)

// The leader endorses a forwarded write only when it is a grant made by that
// very command, with the proof the answering node would sign; nothing else
// (a refusal, a place in line, a grant answered again from the dedup table, a
// release) carries an endorsement, so the follower reads those from its own
// state as before.
func TestEndorseSignsOnlyGrantsMadeByTheCommand(t *testing.T) {
	ctx := context.Background()
	n, s := keyedService(t)
	key, _ := command.NormalizeName("jobs/x")
	grant := &command.Envelope{ClientID: "a", RequestID: "r1", Body: &command.Acquire{Name: key, TTLms: 30_000}}
	steps := []struct {
		what     string
		e        *command.Envelope
		endorsed bool
	}{
		{"a grant", grant, true},
		{"the same request again (from the dedup table)", grant, false},
		{"a refusal (held)", &command.Envelope{ClientID: "b", Body: &command.Acquire{Name: key, TTLms: 30_000}}, false},
		{"a place in line", &command.Envelope{ClientID: "c", Body: &command.Acquire{Name: key, TTLms: 30_000, WaitMs: 60_000}}, false},
		{"an election's grant", &command.Envelope{ClientID: "d", Body: &command.Acquire{Name: command.ElectionKey("boss"), TTLms: 30_000, Value: "v"}}, true},
	}
	var first *command.Result
	for _, st := range steps {
		resp, err := n.Apply(ctx, st.e)
		if err != nil {
			t.Fatalf("%s: %v", st.what, err)
		}
		got := s.endorse(st.e, resp)
		if (got != "") != st.endorsed {
			t.Fatalf("%s (status %s): endorsement %q, want one: %v", st.what, resp.Result.Status, got, st.endorsed)
		}
		if !st.endorsed {
			continue
		}
		a := st.e.Body.(*command.Acquire)
		ref := fence.LeaseRef(resp.Result.LeaseID.String())
		if want := s.proof(a.Name, resp.Result.Token, st.e.ClientID, ref); got != want {
			t.Fatalf("%s: endorsed %q, the node's own proof is %q", st.what, got, want)
		}
		if first == nil {
			first = &resp.Result
		}
	}
	// The release hands the lock to the one in line: a grant, but not one
	// made by the command that is answered.
	rel := &command.Envelope{ClientID: "a", Body: &command.Release{Name: key, LeaseID: first.LeaseID, Token: first.Token}}
	resp, err := n.Apply(ctx, rel)
	if err != nil || resp.Result.Status != command.StatusOK {
		t.Fatalf("release: %+v %v", resp, err)
	}
	if got := s.endorse(rel, resp); got != "" {
		t.Fatalf("a release was endorsed: %q", got)
	}
}

// A follower answers a grant the leader endorsed at once — it does not wait
// to apply the grant itself (before, a second commit round on a quiet
// cluster) — and the proof verifies with the published keys, for a lock and
// for an election. An election's refusal names the current leader from the
// follower's own state, so that answer still waits for the follower to apply
// what the leader answered from.
func TestFollowerAnswersAnEndorsedGrantWithoutApplyingIt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // hang guard only
	defer cancel()
	n := newFakeNode(true)
	s := New(n, nil, nil)
	t.Cleanup(s.Close)
	n.endorseAsLeader(t)
	if _, err := n.Apply(ctx, &command.Envelope{ClientID: "dlock", Body: &command.SetTokenKey{Seed: [32]byte{7}}}); err != nil {
		t.Fatal(err)
	}
	r, err := s.Acquire(ctx, AcquireRequest{Name: "jobs/x", ClientID: "w", TTLms: 30_000})
	if err != nil || !r.Acquired {
		t.Fatalf("acquire through a lagging follower: %+v %v", r, err)
	}
	c, err := s.Campaign(ctx, CampaignRequest{Name: "boss", CandidateID: "c1", TTLms: 30_000, Value: "one"})
	if err != nil || !c.Leader {
		t.Fatalf("campaign through a lagging follower: %+v %v", c, err)
	}
	if got := n.local.AppliedIndex(); got != 0 {
		t.Fatalf("the follower applied up to %d; the test needs it to have applied nothing", got)
	}
	ks := n.leaderKeySet(t)
	if err := ks.Verify("jobs/x", r.FencingToken, "w", r.LeaseRef, r.TokenProof); err != nil {
		t.Fatalf("the lock's endorsed proof does not verify: %v", err)
	}
	if err := ks.Verify(command.ElectionKey("boss"), c.FencingToken, "c1", c.LeaseRef, c.TokenProof); err != nil {
		t.Fatalf("the election's endorsed proof does not verify: %v", err)
	}

	answered := make(chan error, 1)
	var lost *CampaignResponse
	go func() {
		var err error
		lost, err = s.Campaign(ctx, CampaignRequest{Name: "boss", CandidateID: "c2", TTLms: 30_000})
		answered <- err
	}()
	select {
	case err := <-answered:
		t.Fatalf("an election's refusal answered (%v) before the follower applied the leader's answer", err)
	case <-time.After(20 * time.Millisecond):
	}
	n.ship()
	if err := <-answered; apierror.CodeOf(err) != apierror.LockHeld || lost == nil || lost.Current == nil || lost.Current.CandidateID != "c1" {
		t.Fatalf("refused campaign: %+v %v; want lock_held naming c1", lost, err)
	}
}
