package service

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/fsm"
	"github.com/dlock/dlock/internal/state"
	"github.com/dlock/dlock/internal/watch"
)

// A request waiting for this node to apply what the leader answered (a
// follower that was removed from the cluster never does) ends when the node
// shuts down, so graceful shutdown, which waits for open requests, is not held
// up by it. The grant it could not answer is given back unless the client can
// retry into it with its request_id.
func TestShutdownEndsWaitForLocalStateToCatchUp(t *testing.T) {
	for _, tc := range []struct {
		requestID string
		wantHeld  bool
	}{
		{requestID: "", wantHeld: false},
		{requestID: "retry-me", wantHeld: true},
	} {
		t.Run("request_id="+tc.requestID, func(t *testing.T) {
			ctx := context.Background()
			n := newFakeNode(true)
			s := New(n, watch.NewHub(0, 0), nil)
			if _, err := n.Apply(ctx, &command.Envelope{ClientID: "dlock", Body: &command.SetTokenKey{Seed: [32]byte{7}}}); err != nil {
				t.Fatal(err)
			}
			n.ship()
			done := make(chan error, 1)
			go func() {
				_, err := s.Acquire(ctx, AcquireRequest{Name: "jobs/x", ClientID: "w", TTLms: 30_000, RequestID: tc.requestID})
				done <- err
			}()
			// The leader has granted it; this node never applies the grant.
			for {
				n.mu.Lock()
				committed := len(n.log)
				n.mu.Unlock()
				if committed == 2 {
					break
				}
				time.Sleep(time.Millisecond)
			}
			select {
			case err := <-done:
				t.Fatalf("acquire answered (%v) before this node applied its grant", err)
			case <-time.After(20 * time.Millisecond):
			}
			s.Close()
			select {
			case err := <-done:
				if ae := apierror.From(err); ae.Code != apierror.Unavailable || !errors.Is(err, errShuttingDown) {
					t.Fatalf("acquire ended by shutdown: %v (code %s); want unavailable, shutting down", err, ae.Code)
				}
			case <-time.After(10 * time.Second): // hang guard only
				t.Fatal("shutdown did not end the wait for the local state to catch up")
			}
			key, _ := command.NormalizeName("jobs/x")
			var li state.LockInfo
			n.leader.Read(func(st *state.State) { li = st.GetLock(key) })
			if li.Held != tc.wantHeld {
				t.Fatalf("after the unanswered grant the lock is held=%v, want %v", li.Held, tc.wantHeld)
			}
		})
	}
}

// A queued acquire whose node cannot apply the leader's answer (behind, cut
// off, removed) is answered unavailable. With a request_id its place in line
// is kept for the client's retry through another node (withdrawing it would
// turn that retry into a wait_timeout); without one it is withdrawn.
func TestQueuedAcquireOnNodeThatCannotCatchUp(t *testing.T) {
	for _, tc := range placeInLineCases {
		t.Run("request_id="+tc.requestID, func(t *testing.T) {
			ctx := context.Background()
			n := newFakeNode(true)
			s := New(n, watch.NewHub(0, 0), nil)
			t.Cleanup(s.Close)
			held := make(chan error, 1)
			go func() {
				_, err := s.Acquire(ctx, AcquireRequest{Name: "job", ClientID: "holder", TTLms: 30_000})
				held <- err
			}()
			for shipping := true; shipping; { // this node follows until the holder has the lock
				n.ship()
				select {
				case err := <-held:
					if err != nil {
						t.Fatal(err)
					}
					shipping = false
				case <-time.After(time.Millisecond):
				}
			}
			n.stuck.Store(true) // from now on it falls behind for good
			_, err := s.Acquire(ctx, AcquireRequest{Name: "job", ClientID: "waiter", TTLms: 30_000, WaitTimeoutMs: 600_000, RequestID: tc.requestID})
			if c := apierror.CodeOf(err); c != apierror.Unavailable {
				t.Fatalf("a queued acquire on a node that cannot catch up: %v (code %s); want unavailable", err, c)
			}
			key, _ := command.NormalizeName("job")
			var li state.LockInfo
			n.leader.Read(func(st *state.State) { li = st.GetLock(key) })
			if li.Waiters != tc.wantWaiters {
				t.Fatalf("waiters on the leader after the answer: %d, want %d", li.Waiters, tc.wantWaiters)
			}
		})
	}
}

// retryingNode is a fakeNode whose Apply of an acquire loses the first answer
// and commits the same envelope again, as raftnode.Node.Apply does after a
// leadership change left the outcome unknown (errUnknown): the state machine
// answers the second entry from its dedup table (same client id, same
// server-made request id).
type retryingNode struct{ *fakeNode }

func (n *retryingNode) FSM() *fsm.FSM { return n.fakeNode.FSM() }

func (n *retryingNode) Apply(ctx context.Context, e *command.Envelope) (*fsm.Response, error) {
	if _, ok := e.Body.(*command.Acquire); ok {
		if _, err := n.fakeNode.Apply(ctx, e); err != nil {
			return nil, err
		}
	}
	return n.fakeNode.Apply(ctx, e)
}

// A grant that cannot be answered because the node cannot catch up is given
// back when the request had no request_id of the client's — also when the
// node's own resend after an unknown outcome was answered from the dedup table
// (replayedGrant), not only when it came straight from its entry.
func TestUnanswerableReplayedGrantIsGivenBack(t *testing.T) {
	ctx := context.Background()
	ln := newFakeNode(true)
	n := &retryingNode{ln}
	s := New(n, watch.NewHub(0, 0), nil)
	t.Cleanup(s.Close)
	if _, err := ln.Apply(ctx, &command.Envelope{ClientID: "dlock", Body: &command.SetTokenKey{Seed: [32]byte{7}}}); err != nil {
		t.Fatal(err)
	}
	ln.ship()
	ln.stuck.Store(true) // this node applies nothing more: CatchUp fails
	done := make(chan error, 1)
	go func() {
		_, err := s.Acquire(ctx, AcquireRequest{Name: "jobs/x", ClientID: "w", TTLms: 600_000})
		done <- err
	}()
	select {
	case err := <-done:
		if c := apierror.CodeOf(err); c != apierror.Unavailable {
			t.Fatalf("acquire on a node that cannot catch up: %v (code %s); want unavailable", err, c)
		}
	case <-time.After(10 * time.Second): // hang guard only
		t.Fatal("acquire hung")
	}
	key, _ := command.NormalizeName("jobs/x")
	var li state.LockInfo
	ln.leader.Read(func(st *state.State) { li = st.GetLock(key) })
	if li.Held {
		t.Fatalf("the acquire (no request_id) was answered unavailable, yet the lock stays held by %q (token %d) until its lease ends",
			li.Holder.ClientID, li.Holder.Token)
	}
}
