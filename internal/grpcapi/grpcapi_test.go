package grpcapi

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	dlockv1 "github.com/dlock/dlock/api/dlock/v1"
	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/service"
)

// fake answers the calls the tests set and fails the rest.
type fake struct {
	Service
	acquire   func(ctx context.Context, req service.AcquireRequest) (*service.AcquireResponse, error)
	getLock   func(ctx context.Context, name string, stale bool) (*service.LockView, error)
	keepAlive func(ctx context.Context, req service.KeepAliveRequest) (*service.KeepAliveResponse, error)
}

func (f *fake) Acquire(ctx context.Context, req service.AcquireRequest) (*service.AcquireResponse, error) {
	return f.acquire(ctx, req)
}

func (f *fake) GetLock(ctx context.Context, name string, stale bool) (*service.LockView, error) {
	return f.getLock(ctx, name, stale)
}

func (f *fake) KeepAlive(ctx context.Context, req service.KeepAliveRequest) (*service.KeepAliveResponse, error) {
	return f.keepAlive(ctx, req)
}

func serve(t *testing.T, svc Service) *grpc.ClientConn {
	t.Helper()
	ln := bufconn.Listen(1 << 20)
	s := New(svc, nil, Options{})
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	cc, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return ln.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func detailOf(t *testing.T, err error) (*status.Status, *dlockv1.ErrorDetail) {
	t.Helper()
	st := status.Convert(err)
	for _, d := range st.Details() {
		if ed, ok := d.(*dlockv1.ErrorDetail); ok {
			return st, ed
		}
	}
	t.Fatalf("status %v has no ErrorDetail", st)
	return nil, nil
}

func TestErrorsMapThroughTheTable(t *testing.T) {
	var next error
	f := &fake{getLock: func(context.Context, string, bool) (*service.LockView, error) { return nil, next }}
	client := dlockv1.NewLockServiceClient(serve(t, f))
	for _, c := range []apierror.Code{apierror.InvalidArgument, apierror.NotFound, apierror.SessionNotFound, apierror.LockHeld,
		apierror.WaitTimeout, apierror.NotHolder, apierror.TooLarge, apierror.RateLimited, apierror.NoLeader, apierror.Unavailable,
		apierror.Compacted, apierror.PermissionDenied, apierror.Unauthenticated, apierror.MethodNotAllowed} {
		next = apierror.New(c, "what went wrong: %s", c)
		_, err := client.GetLock(context.Background(), &dlockv1.GetLockRequest{Name: "x"})
		st, d := detailOf(t, err)
		if st.Code() != apierror.GRPCCode(c) || d.Code != string(c) || st.Message() != "what went wrong: "+string(c) {
			t.Errorf("%s: got %v %q detail %+v", c, st.Code(), st.Message(), d)
		}
		if retry := st.Code() == codes.Unavailable || st.Code() == codes.ResourceExhausted; retry != (d.RetryAfterMs >= 1000) {
			t.Errorf("%s: retry_after_ms %d", c, d.RetryAfterMs)
		}
	}
	// Internal errors and plain errors show no cause, only where to look.
	for _, err := range []error{apierror.Wrap(apierror.Internal, errors.New("secret cause"), "boom"), errors.New("secret cause")} {
		next = err
		_, got := client.GetLock(context.Background(), &dlockv1.GetLockRequest{Name: "x"})
		st, d := detailOf(t, got)
		if st.Code() != codes.Internal || d.Code != "internal" || strings.Contains(st.Message(), "secret") || !strings.Contains(st.Message(), "request id") {
			t.Errorf("internal error shown as %v %q %+v", st.Code(), st.Message(), d)
		}
	}
}

func TestLockHeldCarriesTheHolder(t *testing.T) {
	f := &fake{acquire: func(context.Context, service.AcquireRequest) (*service.AcquireResponse, error) {
		return &service.AcquireResponse{Holder: &service.Holder{ClientID: "alice", FencingToken: 7, GrantedAt: time.UnixMilli(1000)}},
			apierror.New(apierror.LockHeld, "held by alice")
	}}
	_, err := dlockv1.NewLockServiceClient(serve(t, f)).Acquire(context.Background(), &dlockv1.AcquireRequest{Name: "x", ClientId: "bob", TtlMs: 5000})
	st, d := detailOf(t, err)
	if st.Code() != codes.FailedPrecondition || d.Code != "lock_held" || d.Holder.GetClientId() != "alice" || d.Holder.GetFencingToken() != 7 ||
		d.Holder.GetGrantedAt().AsTime().UnixMilli() != 1000 || d.Holder.ExpiresAt != nil {
		t.Fatalf("got %v %+v", st, d)
	}
}

// A client that cancels a waiting Acquire cancels the service call's context:
// that is what withdraws the wait.
func TestCancelledCallCancelsTheServiceContext(t *testing.T) {
	started, ended := make(chan struct{}), make(chan error, 1)
	f := &fake{acquire: func(ctx context.Context, req service.AcquireRequest) (*service.AcquireResponse, error) {
		close(started)
		<-ctx.Done()
		ended <- ctx.Err()
		return nil, ctx.Err()
	}}
	client := dlockv1.NewLockServiceClient(serve(t, f))
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := client.Acquire(ctx, &dlockv1.AcquireRequest{Name: "x", ClientId: "c", TtlMs: 5000, WaitTimeoutMs: 60000})
		errc <- err
	}()
	<-started
	cancel()
	select {
	case err := <-ended:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("service ctx ended with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the service call's context was not cancelled")
	}
	if err := <-errc; status.Code(err) != codes.Canceled {
		t.Fatalf("client got %v", err)
	}
}

func TestRequestIDIsEchoed(t *testing.T) {
	f := &fake{getLock: func(context.Context, string, bool) (*service.LockView, error) {
		return &service.LockView{Name: "x"}, nil
	}}
	client := dlockv1.NewLockServiceClient(serve(t, f))
	var hdr metadata.MD
	ctx := metadata.AppendToOutgoingContext(context.Background(), RequestIDKey, "trace-42")
	if _, err := client.GetLock(ctx, &dlockv1.GetLockRequest{Name: "x"}, grpc.Header(&hdr)); err != nil {
		t.Fatal(err)
	}
	if got := hdr.Get(RequestIDKey); len(got) != 1 || got[0] != "trace-42" {
		t.Fatalf("x-request-id header %v", got)
	}
}

// KeepAliveStream renews at TTL/3, rides out a passing failure (retrying it
// sooner than a renewal), and ends with the session's own error once it is
// gone.
func TestKeepAliveStream(t *testing.T) {
	// Long enough that scheduling noise on a busy machine (hundreds of ms under
	// -race) stays well inside the bounds below.
	const ttl = 1800 * time.Millisecond
	var (
		calls atomic.Int32
		mu    sync.Mutex
		at    []time.Time // when each KeepAlive reached the service
	)
	f := &fake{keepAlive: func(ctx context.Context, req service.KeepAliveRequest) (*service.KeepAliveResponse, error) {
		mu.Lock()
		at = append(at, time.Now())
		mu.Unlock()
		switch n := calls.Add(1); {
		case n == 3:
			return nil, apierror.New(apierror.NoLeader, "election under way")
		case n >= 6:
			return nil, apierror.New(apierror.SessionNotFound, "session not found")
		}
		return &service.KeepAliveResponse{TTLms: ttl.Milliseconds(), ExpiresAt: time.Now().Add(ttl)}, nil
	}}
	client := dlockv1.NewSessionServiceClient(serve(t, f))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := client.KeepAliveStream(ctx, &dlockv1.KeepAliveStreamRequest{SessionId: "s"})
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for {
		r, err := stream.Recv()
		if err != nil {
			if st, d := detailOf(t, err); st.Code() != codes.NotFound || d.Code != "session_not_found" {
				t.Fatalf("stream ended with %v", err)
			}
			break
		}
		if r.TtlMs != ttl.Milliseconds() {
			t.Fatalf("response %+v", r)
		}
		got++
	}
	if got != 4 || calls.Load() != 6 {
		t.Fatalf("%d responses from %d renewals; want 4 from 6", got, calls.Load())
	}
	mu.Lock()
	defer mu.Unlock()
	// After a successful renewal the next comes TTL/3 later: not sooner (load
	// on the leader), not much later (margin before expiry). Call 3 failed,
	// so call 4 is the quick retry.
	for i := 1; i < len(at); i++ {
		gap := at[i].Sub(at[i-1])
		if i == 3 {
			if gap >= ttl/4 {
				t.Errorf("retry after a passing failure came %v later; want well under TTL/3 (%v)", gap, ttl/3)
			}
			continue
		}
		if gap < ttl/3-ttl/15 || gap >= ttl/2 {
			t.Errorf("renewal %d came %v after renewal %d; want about TTL/3 = %v", i+1, gap, i, ttl/3)
		}
	}
}

// KeepAliveStream lists each lost grant once: every renewal asks for those
// after the revision the previous one reached, starting from the request's
// lost_after.
func TestKeepAliveStreamSendsEachLostGrantOnce(t *testing.T) {
	all := []service.LostGrant{
		{Kind: "lock", Name: "old", FencingToken: 3, Cause: "revoked", Revision: 5},
		{Kind: "lock", Name: "a", FencingToken: 7, Cause: "revoked", Reason: "stuck", Revision: 12},
		{Kind: "election", Name: "db", FencingToken: 9, Cause: "taken_over", Revision: 30},
	}
	var (
		calls atomic.Int32
		mu    sync.Mutex
		asked []uint64
	)
	f := &fake{keepAlive: func(ctx context.Context, req service.KeepAliveRequest) (*service.KeepAliveResponse, error) {
		mu.Lock()
		asked = append(asked, req.LostAfter)
		mu.Unlock()
		n := calls.Add(1)
		if n > 3 {
			return nil, apierror.New(apierror.SessionNotFound, "session not found")
		}
		// Renewal n happens at revision 10·n; the state read may be newer
		// (revision 30's grant is in the first answer already).
		out := &service.KeepAliveResponse{TTLms: 3000, ExpiresAt: time.Now().Add(3 * time.Second), Revision: 10 * uint64(n), Lost: []service.LostGrant{}}
		for _, g := range all {
			if g.Revision > req.LostAfter && (g.Revision <= 10*uint64(n) || n == 1) {
				out.Lost = append(out.Lost, g)
			}
		}
		return out, nil
	}}
	client := dlockv1.NewSessionServiceClient(serve(t, f))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := client.KeepAliveStream(ctx, &dlockv1.KeepAliveStreamRequest{SessionId: "s", LostAfter: 5})
	if err != nil {
		t.Fatal(err)
	}
	var tokens []uint64
	for {
		r, err := stream.Recv()
		if err != nil {
			break
		}
		for _, g := range r.Lost {
			tokens = append(tokens, g.FencingToken)
			if g.Kind == "election" && (g.Name != "db" || g.Cause != "taken_over") {
				t.Errorf("lost grant %+v", g)
			}
		}
	}
	if !slices.Equal(tokens, []uint64{7, 9}) {
		t.Fatalf("lost tokens sent %v, want [7 9] once each", tokens)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(asked[:3], []uint64{5, 30, 30}) {
		t.Fatalf("lost_after asked %v, want [5 30 30 …]", asked)
	}
}
