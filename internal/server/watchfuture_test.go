package server_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dlockv1 "github.com/dlock/dlock/api/dlock/v1"
	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/testcluster"
)

// A watch from a revision the cluster has not reached would stay silent
// until it got there — for a huge from_revision, for ever. Every protocol
// refuses it with invalid_argument naming the current revision, while a
// from_revision up to the cluster's revision + 1 is served even by a node
// that has not applied that revision yet.
func TestWatchFromFutureRevisionRefused(t *testing.T) {
	c := testcluster.New(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	node := c.Follower()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	const huge = "18446744073709551615"
	code, _ := sse(t, ctx, c.URL(node)+"/api/v1/watch?from_revision="+huge)
	if code != 400 {
		t.Fatalf("SSE watch from %s: status %d, want 400", huge, code)
	}
	var e errBody
	if st, err := c.Do(ctx, "GET", c.URL(node)+"/api/v1/watch?from_revision="+huge, nil, &e); err != nil || st != 400 ||
		e.Error.Code != "invalid_argument" || !strings.Contains(e.Error.Message, "current revision is") {
		t.Fatalf("SSE watch from %s: %d %+v %v", huge, st, e, err)
	}

	// A server stream reports its refusal on the first Recv.
	ws, err := dlockv1.NewWatchServiceClient(dialGRPC(t, c.GRPCAddr(node))).Watch(ctx, &dlockv1.WatchRequest{FromRevision: 1 << 62})
	if err == nil {
		_, err = ws.Recv()
	}
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "current revision is") {
		t.Fatalf("gRPC watch from 2^62: %v", err)
	}

	w := wsDial(t, c, node)
	w.send(map[string]any{"id": "w1", "op": "watch", "from_revision": uint64(1 << 62)})
	if a := w.answer("w1"); a.Error == nil || a.Error.Code != "invalid_argument" || !strings.Contains(a.Error.Message, "current revision is") {
		t.Fatalf("WebSocket watch from 2^62: %+v", a)
	}

	// A client that saw revision R on the leader may watch from R+1 on a
	// follower at once, whether or not the follower has applied R yet.
	for i := 0; i < 10; i++ {
		var got service.AcquireResponse
		name := fmt.Sprintf("future/%d", i)
		if st, err := c.Do(ctx, "POST", c.URL(leader)+"/api/v1/locks/"+name+"/acquire", map[string]any{"client_id": "a", "ttl_ms": 30000}, &got); err != nil || st != 200 {
			t.Fatalf("acquire %s: %d %v", name, st, err)
		}
		wctx, wcancel := context.WithCancel(ctx)
		code, events := sse(t, wctx, fmt.Sprintf("%s/api/v1/watch?prefix=future/&from_revision=%d", c.URL(node), got.Revision+1))
		if code != 200 {
			wcancel()
			t.Fatalf("watch from revision %d (one past the leader's answer) on a follower: %d", got.Revision+1, code)
		}
		if st, err := c.Do(ctx, "POST", c.URL(leader)+"/api/v1/locks/"+name+"/release",
			map[string]any{"client_id": "a", "fencing_token": got.FencingToken, "lease_id": got.LeaseID}, nil); err != nil || st != 200 {
			t.Fatalf("release: %d %v", st, err)
		}
		select {
		case rec := <-events:
			// Nothing before from_revision (the acquire) is sent.
			if id, _ := strconv.ParseUint(rec.id, 10, 64); rec.event != "released" || id < got.Revision+1 {
				t.Fatalf("first event from %d: %+v", got.Revision+1, rec)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no event after the release")
		}
		wcancel()
	}
}
