package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dlockv1 "github.com/dlock/dlock/api/dlock/v1"
	dlockclient "github.com/dlock/dlock/client"
)

// Watchers over gRPC. On a one-group cluster a second watcher per node
// follows the cluster through the gRPC WatchService instead of the Go
// client's SSE stream, and joins the same checks (watchers_test.go). There
// is no gRPC client library to resume a broken stream, so the watcher does
// what docs/api.md asks of a client: it resumes on the next node at the last
// revision it delivered, dropping the events of that revision it already
// has (a stream can break between two events of one revision, and every
// node sends them in the same order). Resumed that way, the stretch counts
// as unbroken: a node that repeated, reordered or skipped an event shows as
// a stream that differs from the others. Only a refusal as compacted ends
// the stretch (counted as a break; the watcher lists again).

// grpcResume is where a gRPC watcher's stretch stands.
type grpcResume struct {
	// from and skip: the next stream starts at from and drops the first
	// skip events of revision from (ones already delivered).
	from uint64
	skip int
	// last and lastCount: the last revision delivered and how many of its
	// events.
	last      uint64
	lastCount int
}

// next is where to resume after a break.
func (p *grpcResume) next() {
	if p.last > 0 {
		p.from, p.skip = p.last, p.lastCount
	}
}

// deliver says whether an event of revision rev is new to the stretch.
func (p *grpcResume) deliver(rev uint64) bool {
	if rev < p.from {
		return false
	}
	if p.skip > 0 && rev == p.from {
		p.skip--
		return false
	}
	p.skip = 0
	if rev == p.last {
		p.lastCount++
	} else {
		p.last, p.lastCount = rev, 1
	}
	return true
}

// runGRPC follows the cluster through nodes' WatchService, starting on
// node first and moving on to the next node after each break.
func (w *streamWatcher) runGRPC(ctx context.Context, watch []dlockv1.WatchServiceClient, first int) {
	node := first
	for ctx.Err() == nil {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, rev, err := w.cl.ListWithRevision(lctx, "")
		cancel()
		if err != nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		w.mu.Lock()
		w.segs = append(w.segs, watchSegment{from: []uint64{rev + 1}, to: []uint64{rev}, start: w.clk.now()})
		w.mu.Unlock()
		at := &grpcResume{from: rev + 1}
		for ctx.Err() == nil {
			err := w.streamGRPC(ctx, watch[node%len(watch)], at)
			node++
			if ctx.Err() != nil {
				break
			}
			if status.Code(err) == codes.OutOfRange {
				w.mu.Lock()
				w.breaks++
				w.mu.Unlock()
				break
			}
			at.next()
			w.mu.Lock()
			w.resumes++
			w.mu.Unlock()
			time.Sleep(50 * time.Millisecond)
		}
		w.mu.Lock()
		w.segs[len(w.segs)-1].end = w.clk.now()
		w.mu.Unlock()
	}
}

// streamGRPC reads one Watch call until it ends, adding the events new to
// the stretch. A stream that ends without an error (the server closes a
// watch only with a status) is recorded as one.
func (w *streamWatcher) streamGRPC(ctx context.Context, wc dlockv1.WatchServiceClient, at *grpcResume) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := wc.Watch(sctx, &dlockv1.WatchRequest{FromRevision: at.from})
	if err != nil {
		return err
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) && ctx.Err() == nil {
				w.mu.Lock()
				w.errs = append(w.errs, fmt.Sprintf("at %s: a gRPC watch ended without a status", fmtT(w.clk.now())))
				w.mu.Unlock()
			}
			return err
		}
		e := resp.GetEvent()
		if e == nil {
			w.mu.Lock()
			w.errs = append(w.errs, fmt.Sprintf("at %s: a gRPC watch message without an event", fmtT(w.clk.now())))
			w.mu.Unlock()
			continue
		}
		if e.Revision < at.from {
			w.mu.Lock()
			w.errs = append(w.errs, fmt.Sprintf("at %s: a gRPC watch from revision %d sent an event of revision %d", fmtT(w.clk.now()), at.from, e.Revision))
			w.mu.Unlock()
			continue
		}
		if at.deliver(e.Revision) {
			w.add(0, dlockclient.WatchEvent{Revision: e.Revision, Type: e.Type, Kind: e.Kind, Name: e.Name,
				ClientID: e.ClientId, FencingToken: e.FencingToken, Cause: e.Cause, Value: e.Value})
		}
	}
}

// A stream that breaks inside a revision resumes at that revision and takes
// only the events it had not delivered; one that breaks between revisions
// resumes at the last one and takes none of it again.
func TestGRPCResume(t *testing.T) {
	type ev struct {
		rev uint64
		n   int // the event's place in its revision, from 1
	}
	// The cluster's events: revision 5 has three, 6 one, 7 two.
	all := []ev{{5, 1}, {5, 2}, {5, 3}, {6, 1}, {7, 1}, {7, 2}}
	// stream is what a node sends for a watch from rev: every event from it.
	stream := func(from uint64) []ev {
		var out []ev
		for _, e := range all {
			if e.rev >= from {
				out = append(out, e)
			}
		}
		return out
	}
	for _, c := range []struct {
		name   string
		breaks []int // how many events each stream sends before it breaks
	}{
		{"no break", []int{6}},
		{"inside a revision", []int{2, 6}},
		{"between revisions", []int{3, 6}},
		{"inside a revision, twice", []int{1, 2, 6}},
		{"inside a later revision", []int{5, 3}},
		{"at once", []int{0, 6}},
	} {
		t.Run(c.name, func(t *testing.T) {
			at := &grpcResume{from: 5}
			var got []ev
			for i, k := range c.breaks {
				if i > 0 {
					at.next()
				}
				for _, e := range stream(at.from)[:min(k, len(stream(at.from)))] {
					if at.deliver(e.rev) {
						got = append(got, e)
					}
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(all) {
				t.Fatalf("delivered %v, want %v", got, all)
			}
		})
	}
}
