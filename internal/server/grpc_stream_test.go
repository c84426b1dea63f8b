package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	dlockv1 "github.com/dlock/dlock/api/dlock/v1"
	"github.com/dlock/dlock/internal/grpcapi"
	"github.com/dlock/dlock/internal/server"
	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
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
		testutil.Eventually(t, 5*time.Second, "c2 queued", func() bool { return getLock(t, c, leader, "billing/a").Waiters == 1 })
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
		testutil.Eventually(t, 10*time.Second, "the session to expire after the stream closed", func() bool { return !getLock(t, c, leader, "ka/lock").Held })
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
		testutil.Eventually(t, 5*time.Second, "waiter queued", func() bool { return getLock(t, c, leader, "cancel/me").Waiters == 1 })
		wcancel()
		if err := <-errc; status.Code(err) != codes.Canceled {
			t.Fatalf("cancelled acquire answered %v", err)
		}
		testutil.Eventually(t, 5*time.Second, "the wait to be withdrawn", func() bool { return getLock(t, c, leader, "cancel/me").Waiters == 0 })
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

// A gRPC watch whose client stops reading does not hold its stream and its
// watcher slot for as long as the connection lives (gRPC flow control blocks
// the server's send for good): the call ends as soon as its watcher falls
// behind, or when one message has waited the write budget, as an HTTP stream
// does at its write deadline. With one watch allowed per connection, a
// second watch on the connection is refused until the first has ended. The
// client, once it reads again, gets what was sent, then UNAVAILABLE with the
// reason.
func TestGRPCWatchOfClientThatStopsReading(t *testing.T) {
	for _, tc := range []struct {
		name    string
		limits  server.Limits
		history int // the node's kept events: how far a watcher may fall behind
		cycles  int // lock/unlock cycles written meanwhile; 0: until the stream ends
		reason  string
	}{
		{"falls behind", server.Limits{}, 64, 0, "fell behind"},
		// Enough to fill the client's window and the server's send quota
		// (about 2 × 64 KiB of events), far fewer than the kept history.
		{"send waits too long", server.Limits{WriteTimeout: time.Second}, 0, 300, "took no message"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.limits.Service.MaxWatchersPerConn = 1
			c := testcluster.NewWith(t, 1, testcluster.Options{WatchHistory: tc.history, Limits: tc.limits})
			id := c.WaitLeader(10 * time.Second)
			// A small fixed window (no BDP growth), so the server's sends
			// block after a few hundred events.
			cc, err := grpc.NewClient(c.GRPCAddr(id), grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			// watch opens a watch: an open stream sends its revision header
			// first; a refused one has none and ends with the refusal.
			watch := func(ctx context.Context) (grpc.ServerStreamingClient[dlockv1.WatchResponse], error) {
				ws, err := dlockv1.NewWatchServiceClient(cc).Watch(ctx, &dlockv1.WatchRequest{Prefix: "slow/"})
				if err != nil {
					return nil, err
				}
				md, err := ws.Header()
				if err == nil && len(md.Get(grpcapi.RevisionKey)) == 0 {
					_, err = ws.Recv()
				}
				return ws, err
			}
			ws, err := watch(ctx)
			if err != nil {
				t.Fatal(err)
			}
			// slotFree opens a second watch on the connection: refused while
			// the first holds the connection's one slot.
			slotFree := func() bool {
				sctx, scancel := context.WithCancel(ctx)
				defer scancel()
				_, err := watch(sctx)
				if err != nil && status.Code(err) != codes.ResourceExhausted {
					t.Fatalf("a second watch: %v", err)
				}
				return err == nil
			}
			if slotFree() {
				t.Fatal("a second watch on the connection was accepted while the first is open")
			}
			name := "slow/" + strings.Repeat("n", 240) // large events: fewer needed
			cycle := func(i int) {
				var out map[string]any
				code, err := c.Do(ctx, http.MethodPost, c.URL(id)+"/api/v1/locks/"+name+"/acquire", map[string]any{"client_id": "w", "ttl_ms": 5000}, &out)
				if err != nil || code != 200 {
					t.Fatalf("acquire %d: %d %v", i, code, err)
				}
				code, err = c.Do(ctx, http.MethodPost, c.URL(id)+"/api/v1/locks/"+name+"/release",
					map[string]any{"client_id": "w", "lease_id": out["lease_id"], "fencing_token": out["fencing_token"]}, nil)
				if err != nil || code != 200 {
					t.Fatalf("release %d: %d %v", i, code, err)
				}
			}
			if tc.cycles == 0 {
				for i := 0; i%25 != 0 || !slotFree(); i++ {
					if i == 5000 {
						t.Fatal("5000 lock/unlock cycles unread, and the watch still holds its slot")
					}
					cycle(i)
				}
			} else {
				for i := range tc.cycles {
					cycle(i)
				}
				testutil.Eventually(t, 20*time.Second, "the watch of a client that reads nothing still holds its slot 20 s after the last event", func() bool { return slotFree() })
			}
			// Reading again: what was sent, then the reason.
			n := 0
			for {
				_, err := ws.Recv()
				if err == nil {
					n++
					continue
				}
				st := status.Convert(err)
				if st.Code() != codes.Unavailable || !strings.Contains(st.Message(), tc.reason) {
					t.Fatalf("after %d events the stream ended with %v; want UNAVAILABLE saying %q", n, err, tc.reason)
				}
				break
			}
			if n == 0 {
				t.Fatal("the client got no events before the end")
			}
		})
	}
}
