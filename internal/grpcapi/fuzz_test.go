package grpcapi

import (
	"context"
	"log/slog"
	"testing"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	dlockv1 "github.com/dlock/dlock/api/dlock/v1"
	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/service"
)

// FuzzLockRequests feeds arbitrary wire bytes to the lock calls' decoding
// (protobuf) and handlers: no panic, and every refusal is a status whose code
// comes from apierror's table.
func FuzzLockRequests(f *testing.F) {
	seed, _ := proto.Marshal(&dlockv1.AcquireRequest{Name: "a/b", ClientId: "c", TtlMs: 5000, WaitTimeoutMs: 10})
	f.Add(seed)
	seed, _ = proto.Marshal(&dlockv1.ReleaseRequest{Name: "a", ClientId: "c", FencingToken: 3, LeaseId: "x"})
	f.Add(seed)
	f.Add([]byte{0xff, 0x01})
	svc := &fake{
		acquire: func(_ context.Context, req service.AcquireRequest) (*service.AcquireResponse, error) {
			if req.Name == "" || req.ClientID == "" {
				return nil, apierror.New(apierror.InvalidArgument, "bad")
			}
			return &service.AcquireResponse{Acquired: false, Holder: &service.Holder{ClientID: "h"}}, apierror.New(apierror.LockHeld, "held")
		},
		getLock: func(_ context.Context, name string, _ bool) (*service.LockView, error) {
			return &service.LockView{Name: name}, nil
		},
	}
	a := &api{svc: svc, log: slog.New(slog.DiscardHandler), closing: make(chan struct{})}
	ls := &lockServer{a}
	known := map[string]bool{}
	for _, c := range []apierror.Code{apierror.InvalidArgument, apierror.LockHeld} {
		known[apierror.GRPCCode(c).String()] = true
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var acq dlockv1.AcquireRequest
		if proto.Unmarshal(b, &acq) == nil {
			if _, err := ls.Acquire(context.Background(), &acq); err != nil {
				if code := status.Code(err).String(); !known[code] {
					t.Fatalf("acquire refused with unexpected code %s: %v", code, err)
				}
			}
		}
		var get dlockv1.GetLockRequest
		if proto.Unmarshal(b, &get) == nil {
			if _, err := ls.GetLock(context.Background(), &get); err != nil {
				t.Fatalf("get failed: %v", err)
			}
		}
	})
}
