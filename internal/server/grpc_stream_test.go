package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dlockv1 "github.com/dlock/dlock/api/dlock/v1"
	"github.com/dlock/dlock/internal/grpcapi"
	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/testcluster"
)

func eventOf(e *dlockv1.Event) service.WatchEvent {
	return service.WatchEvent{Revision: e.Revision, Type: e.Type, Kind: e.Kind, Name: e.Name, ClientID: e.ClientId,
		FencingToken: e.FencingToken, Cause: e.Cause, Value: e.Value, At: tm(e.At)}
}

// recvAll receives from a server stream on its own goroutine, so a test can
// wait for messages with a bound.
func recvAll[T any](s grpc.ServerStreamingClient[T]) <-chan *T {
	ch := make(chan *T, 256)
	go func() {
		defer close(ch)
		for {
			m, err := s.Recv()
			if err != nil {
				return
			}
			ch <- m
		}
	}()
	return ch
}

func next[T any](t *testing.T, ch <-chan *T, what string) *T {
	t.Helper()
	select {
	case m, ok := <-ch:
		if !ok {
			t.Fatalf("%s: stream ended", what)
		}
		return m
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: nothing within 10 s", what)
	}
	return nil
}

// The gRPC streams on one cluster: watch (same events as SSE, and compacted),
// observe, the keepalive stream, and a cancelled wait.
func TestGRPCStreams(t *testing.T) {
	c := testcluster.NewWith(t, 3, testcluster.Options{WatchHistory: 4})
	leader := c.WaitLeader(10 * time.Second)
	follower := c.Follower()
	cc := dialGRPC(t, c.GRPCAddr(follower))
	locks := dlockv1.NewLockServiceClient(cc)
	// Each part bounds its own calls, so one that hangs cannot eat the others' time.
	bounded := func(t *testing.T) context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		t.Cleanup(cancel)
		return ctx
	}

	t.Run("watch sees what SSE sees", func(t *testing.T) {
		ctx := bounded(t)
		list, err := locks.ListLocks(ctx, &dlockv1.ListLocksRequest{Prefix: "billing/"})
		if err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithCancel(ctx)
		defer wcancel()
		ws, err := dlockv1.NewWatchServiceClient(dialGRPC(t, c.GRPCAddr(leader))).Watch(wctx,
			&dlockv1.WatchRequest{Prefix: "billing/", FromRevision: list.Revision + 1})
		if err != nil {
			t.Fatal(err)
		}
		// The header arrives once the watch is in place.
		hdr, err := ws.Header()
		if v := hdr.Get(grpcapi.RevisionKey); err != nil || len(v) != 1 {
			t.Fatalf("watch header %v %v", v, err)
		} else if _, err := strconv.ParseUint(v[0], 10, 64); err != nil {
			t.Fatalf("watch header %q: %v", v[0], err)
		}
		onGRPC := recvAll(ws)
		_, onSSE := sse(t, wctx, c.URL(follower)+fmt.Sprintf("/api/v1/watch?prefix=billing/&from_revision=%d", list.Revision+1))

		a, err := locks.Acquire(ctx, &dlockv1.AcquireRequest{Name: "billing/a", ClientId: "c1", TtlMs: 30000})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := locks.Acquire(ctx, &dlockv1.AcquireRequest{Name: "other/x", ClientId: "c9", TtlMs: 30000}); err != nil {
			t.Fatal(err)
		}
		waiter := make(chan error, 1)
		go func() {
			_, err := locks.Acquire(ctx, &dlockv1.AcquireRequest{Name: "billing/a", ClientId: "c2", TtlMs: 30000, WaitTimeoutMs: 30000})
			waiter <- err
		}()
		waitFor(t, 5*time.Second, "c2 queued", func() bool { return getLock(t, c, leader, "billing/a").Waiters == 1 })
		if _, err := locks.Release(ctx, &dlockv1.ReleaseRequest{Name: "billing/a", ClientId: "c1", FencingToken: a.FencingToken, LeaseId: a.LeaseId}); err != nil {
			t.Fatal(err)
		}
		if err := <-waiter; err != nil {
			t.Fatalf("waiter: %v", err)
		}
		want := []string{"acquired billing/a c1", "queued billing/a c2", "released billing/a c1", "acquired billing/a c2"}
		for i, w := range want {
			g := eventOf(next(t, onGRPC, "grpc event").Event)
			s := nextEvent(t, onSSE, 5*time.Second)
			if got := g.Type + " " + g.Name + " " + g.ClientID; got != w {
				t.Fatalf("grpc event %d: %q, want %q", i, got, w)
			}
			if !g.At.Equal(s.At) || g.Revision != s.Revision || g.Type != s.Type || g.Kind != s.Kind || g.Name != s.Name ||
				g.ClientID != s.ClientID || g.FencingToken != s.FencingToken || g.Cause != s.Cause || g.Value != s.Value {
				t.Fatalf("event %d: grpc %+v, sse %+v", i, g, s)
			}
		}
	})

	t.Run("watch from a compacted revision", func(t *testing.T) {
		ctx := bounded(t)
		// More events than the 4 kept, so revision 1 is gone.
		for i := range 3 {
			name := fmt.Sprintf("compact/%d", i)
			a, err := locks.Acquire(ctx, &dlockv1.AcquireRequest{Name: name, ClientId: "c", TtlMs: 30000})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := locks.Release(ctx, &dlockv1.ReleaseRequest{Name: name, ClientId: "c", FencingToken: a.FencingToken, LeaseId: a.LeaseId}); err != nil {
				t.Fatal(err)
			}
		}
		ws, err := dlockv1.NewWatchServiceClient(cc).Watch(ctx, &dlockv1.WatchRequest{FromRevision: 1})
		if err != nil {
			t.Fatal(err)
		}
		_, err = ws.Recv()
		st := status.Convert(err)
		var code string
		for _, d := range st.Details() {
			if ed, ok := d.(*dlockv1.ErrorDetail); ok {
				code = ed.Code
			}
		}
		if st.Code() != codes.OutOfRange || code != "compacted" {
			t.Fatalf("got %v (detail %q)", err, code)
		}
	})

	t.Run("observe follows the leadership", func(t *testing.T) {
		ctx := bounded(t)
		elections := dlockv1.NewElectionServiceClient(cc)
		octx, ocancel := context.WithCancel(ctx)
		defer ocancel()
		obs, err := elections.Observe(octx, &dlockv1.ObserveRequest{Name: "scheduler"})
		if err != nil {
			t.Fatal(err)
		}
		views := recvAll(obs)
		view := func() *dlockv1.Election { return next(t, views, "observe").Election }
		if v := view(); v.Leader != nil || v.Name != "scheduler" {
			t.Fatalf("initial view %+v", v)
		}
		a, err := elections.Campaign(ctx, &dlockv1.CampaignRequest{Name: "scheduler", CandidateId: "A", Value: "a:1", TtlMs: 30000})
		if err != nil {
			t.Fatal(err)
		}
		if v := view(); v.Leader.GetCandidateId() != "A" || v.Leader.GetValue() != "a:1" {
			t.Fatalf("view after A %+v", v)
		}
		bch := make(chan error, 1)
		go func() {
			_, err := elections.Campaign(ctx, &dlockv1.CampaignRequest{Name: "scheduler", CandidateId: "B", Value: "b:1", TtlMs: 30000, WaitTimeoutMs: 30000})
			bch <- err
		}()
		if v := view(); v.Campaigners != 1 || v.Leader.GetCandidateId() != "A" {
			t.Fatalf("view after B queued %+v", v)
		}
		if _, err := elections.Resign(ctx, &dlockv1.ResignRequest{Name: "scheduler", CandidateId: "A", FencingToken: a.FencingToken, LeaseId: a.LeaseId}); err != nil {
			t.Fatal(err)
		}
		if v := view(); v.Leader != nil {
			t.Fatalf("expected a vacancy between leaders, got %+v", v)
		}
		if v := view(); v.Leader.GetCandidateId() != "B" || v.Leader.GetFencingToken() <= a.FencingToken || v.Campaigners != 0 {
			t.Fatalf("view after hand-off %+v", v)
		}
		if err := <-bch; err != nil {
			t.Fatalf("B: %v", err)
		}
	})

	t.Run("keepalive stream keeps a session alive while open", func(t *testing.T) {
		ctx := bounded(t)
		sessions := dlockv1.NewSessionServiceClient(cc)
		s, err := sessions.CreateSession(ctx, &dlockv1.CreateSessionRequest{ClientId: "ka", TtlMs: 1000})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := locks.Acquire(ctx, &dlockv1.AcquireRequest{Name: "ka/lock", ClientId: "ka", SessionId: s.SessionId}); err != nil {
			t.Fatal(err)
		}
		kctx, kcancel := context.WithCancel(ctx)
		stream, err := sessions.KeepAliveStream(kctx, &dlockv1.KeepAliveStreamRequest{SessionId: s.SessionId, ClientId: "ka"})
		if err != nil {
			t.Fatal(err)
		}
		renewals := recvAll(stream)
		// Three TTLs: the session would long be gone without the stream.
		deadline := time.Now().Add(3 * time.Second)
		n := 0
		for time.Now().Before(deadline) {
			if r := next(t, renewals, "keepalive"); r.TtlMs != 1000 {
				t.Fatalf("renewal %+v", r)
			}
			n++
		}
		if n < 4 {
			t.Fatalf("%d renewals in 3 s with a 1 s TTL", n)
		}
		if v := getLock(t, c, leader, "ka/lock"); !v.Held {
			t.Fatalf("session lock lost while the stream was open: %+v", v)
		}
		kcancel()
		waitFor(t, 10*time.Second, "the session to expire after the stream closed", func() bool { return !getLock(t, c, leader, "ka/lock").Held })
	})

	t.Run("cancelling a waiting acquire withdraws the wait", func(t *testing.T) {
		ctx := bounded(t)
		h, err := locks.Acquire(ctx, &dlockv1.AcquireRequest{Name: "cancel/me", ClientId: "holder", TtlMs: 30000})
		if err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() {
			_, err := locks.Acquire(wctx, &dlockv1.AcquireRequest{Name: "cancel/me", ClientId: "waiter", TtlMs: 30000, WaitTimeoutMs: 60000})
			errc <- err
		}()
		waitFor(t, 5*time.Second, "waiter queued", func() bool { return getLock(t, c, leader, "cancel/me").Waiters == 1 })
		wcancel()
		if err := <-errc; status.Code(err) != codes.Canceled {
			t.Fatalf("cancelled acquire answered %v", err)
		}
		waitFor(t, 5*time.Second, "the wait to be withdrawn", func() bool { return getLock(t, c, leader, "cancel/me").Waiters == 0 })
		if v := getLock(t, c, leader, "cancel/me"); !v.Held || v.Holder.FencingToken != h.FencingToken {
			t.Fatalf("holder disturbed: %+v", v)
		}
	})

	t.Run("streams end when the node shuts down", func(t *testing.T) {
		ctx := bounded(t)
		ws, err := dlockv1.NewWatchServiceClient(cc).Watch(ctx, &dlockv1.WatchRequest{Prefix: "x/"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ws.Header(); err != nil {
			t.Fatal(err)
		}
		sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
		defer scancel()
		if err := c.Server(follower).Shutdown(sctx); err != nil {
			t.Fatalf("shutdown: %v", err)
		}
		_, err = ws.Recv()
		if errors.Is(err, io.EOF) || status.Code(err) != codes.Unavailable {
			t.Fatalf("watch on a stopping node ended with %v", err)
		}
	})
}
