package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dlockv1 "github.com/dlock/dlock/api/dlock/v1"
	dlockclient "github.com/dlock/dlock/client"
)

// Watchers over gRPC and WebSocket. On a one-group cluster a second watcher
// per node follows the cluster through the gRPC WatchService or the
// WebSocket API's watch op (alternating, gRPC only on nodes that serve it)
// instead of the Go client's SSE stream, and joins the same checks
// (watchers_test.go). No client library resumes these streams, so the
// watcher does what docs/api.md asks of a client: it reopens the stream on
// the next node at the last revision it delivered, dropping the events of
// that revision it already has (a stream can break between two events of
// one revision, and every node sends them in the same order). Resumed that
// way, the stretch counts as unbroken: a node that repeated, reordered or
// skipped an event shows as a stream that differs from the others. Only a
// refusal as compacted ends the stretch (counted as a break; the watcher
// lists again).

// rawStream is one watch call from revision from on node's (modulo the
// node count) gRPC or WebSocket API; it hands each event to each and
// returns when the call ends, saying whether it was refused as compacted.
type rawStream func(ctx context.Context, node int, from uint64, each func(dlockclient.WatchEvent)) (compacted bool, err error)

// errRawProtocol marks a message no watch should send: an anomaly, not a
// break.
var errRawProtocol = errors.New("not the watch protocol")

// rawResume is where a resumed watcher's stretch stands.
type rawResume struct {
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
func (p *rawResume) next() {
	if p.last > 0 {
		p.from, p.skip = p.last, p.lastCount
	}
}

// deliver says whether an event of revision rev is new to the stretch.
func (p *rawResume) deliver(rev uint64) bool {
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

// runRaw follows the cluster through open, starting on node first and
// moving on to the next node after each break.
func (w *streamWatcher) runRaw(ctx context.Context, open rawStream, first int) {
	node := first
	for ctx.Err() == nil {
		rev, ok := w.openSegment(ctx)
		if !ok {
			continue
		}
		at := &rawResume{from: rev + 1}
		for ctx.Err() == nil {
			compacted, err := open(ctx, node, at.from, func(ev dlockclient.WatchEvent) {
				switch {
				case ev.Revision < at.from:
					w.noteErr(fmt.Sprintf("at %s: a watch from revision %d sent an event of revision %d", fmtT(w.clk.now()), at.from, ev.Revision))
				case at.deliver(ev.Revision):
					w.add(0, ev)
				}
			})
			node++
			if ctx.Err() != nil {
				break
			}
			if compacted {
				w.mu.Lock()
				w.breaks++
				w.mu.Unlock()
				break
			}
			switch {
			case err == nil:
				w.noteErr(fmt.Sprintf("at %s: a watch ended without saying why", fmtT(w.clk.now())))
			case errors.Is(err, errRawProtocol):
				w.noteErr(fmt.Sprintf("at %s: %v", fmtT(w.clk.now()), err))
			}
			at.next()
			w.mu.Lock()
			w.resumes++
			w.mu.Unlock()
			sleepCtx(ctx, 50*time.Millisecond)
		}
		w.closeSegment()
	}
}

// grpcWatch is rawStream over nodes' gRPC WatchService.
func grpcWatch(watch []dlockv1.WatchServiceClient) rawStream {
	return func(ctx context.Context, node int, from uint64, each func(dlockclient.WatchEvent)) (bool, error) {
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stream, err := watch[node%len(watch)].Watch(sctx, &dlockv1.WatchRequest{FromRevision: from})
		for err == nil {
			var resp *dlockv1.WatchResponse
			if resp, err = stream.Recv(); err != nil {
				break
			}
			e := resp.GetEvent()
			if e == nil {
				return false, fmt.Errorf("%w: a gRPC watch message without an event", errRawProtocol)
			}
			each(dlockclient.WatchEvent{Revision: e.Revision, Type: e.Type, Kind: e.Kind, Name: e.Name,
				ClientID: e.ClientId, FencingToken: e.FencingToken, Cause: e.Cause, Value: e.Value})
		}
		if errors.Is(err, io.EOF) {
			return false, nil // the server ends a watch only with a status
		}
		return status.Code(err) == codes.OutOfRange, err
	}
}

// wsWatch is rawStream over nodes' WebSocket API (urls: each node's HTTP
// base URL).
func wsWatch(urls []string) rawStream {
	return func(ctx context.Context, node int, from uint64, each func(dlockclient.WatchEvent)) (bool, error) {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		conn, _, err := websocket.Dial(dctx, "ws"+strings.TrimPrefix(urls[node%len(urls)], "http")+"/api/v1/ws", nil)
		cancel()
		if err != nil {
			return false, err
		}
		defer conn.CloseNow()
		conn.SetReadLimit(1 << 20)
		msg, _ := json.Marshal(map[string]any{"id": "w", "op": "watch", "from_revision": from})
		if err := conn.Write(ctx, websocket.MessageText, msg); err != nil {
			return false, err
		}
		for {
			_, data, err := conn.Read(ctx)
			if err != nil {
				return false, err
			}
			var m struct {
				ID     string                   `json:"id"`
				Op     string                   `json:"op"`
				Error  *apiError                `json:"error"`
				Event  *dlockclient.WatchEvent  `json:"event"`
				Result *struct{ Watching bool } `json:"result"`
			}
			if err := json.Unmarshal(data, &m); err != nil || m.ID != "w" {
				return false, fmt.Errorf("%w: a WebSocket message that is not the watch's: %.200s", errRawProtocol, data)
			}
			switch {
			case m.Error != nil:
				return m.Error.Code == "compacted", fmt.Errorf("watch ended: %s: %s", m.Error.Code, m.Error.Message)
			case m.Op == "event" && m.Event != nil:
				each(*m.Event)
			case m.Op == "watch" && m.Result != nil && m.Result.Watching:
			default:
				return false, fmt.Errorf("%w: an unexpected WebSocket watch message: %.200s", errRawProtocol, data)
			}
		}
	}
}

// A stream that breaks inside a revision resumes at that revision and takes
// only the events it had not delivered; one that breaks between revisions
// resumes at the last one and takes none of it again.
func TestRawResume(t *testing.T) {
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
			at := &rawResume{from: 5}
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
