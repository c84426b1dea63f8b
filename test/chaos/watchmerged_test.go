package chaos

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	dlockclient "github.com/dlock/dlock/client"
)

// The watcher of a sharded cluster: one merged stream over every shard
// (GET /api/v1/watch, docs/api.md "Sharded clusters"), through the Go
// client's WatchRevisions. Every event carries its shard and the stream's
// per-shard place; a broken connection resumes on another node from that
// place, shard by shard exactly where it left off (the client's job, which
// this checks). A shard split off during the run joins the stream at the
// split. Only a refusal as compacted starts a new segment, from a new
// list: a break.

// runMerged follows the merged stream until ctx ends.
func (w *streamWatcher) runMerged(ctx context.Context) {
	for ctx.Err() == nil {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, revs, err := w.cl.ListWithRevisions(lctx, "")
		cancel()
		if err == nil && len(revs) < w.minShards() {
			// Listed by a node that has not learned every shard yet.
			err = fmt.Errorf("the list has %d shards' revisions, the cluster %d", len(revs), w.minShards())
		}
		if err != nil {
			sleepCtx(ctx, 100*time.Millisecond)
			continue
		}
		seg := watchSegment{start: w.clk.now()}
		for id, r := range revs {
			seg.grow(id)
			seg.from[id], seg.to[id] = r+1, r
		}
		w.mu.Lock()
		w.segs = append(w.segs, seg)
		w.mu.Unlock()
		for ev, err := range w.cl.WatchRevisions(ctx, "", dlockclient.NextRevisions(revs)) {
			if err != nil {
				w.mu.Lock()
				w.breaks++
				var ce *dlockclient.CompactedError
				if !errors.As(err, &ce) && ctx.Err() == nil {
					// When, to find it in the node logs and the schedule.
					w.errs = append(w.errs, fmt.Sprintf("at %s: %v", fmtT(w.clk.now()), err))
				}
				w.mu.Unlock()
				break
			}
			if ev.Shard == nil || *ev.Shard < 0 || *ev.Shard >= maxShardID {
				w.noteErr(fmt.Sprintf("an event of a merged stream without a valid shard: %+v", ev))
				continue
			}
			if ev.Revisions[*ev.Shard] != ev.Revision {
				w.noteErr(fmt.Sprintf("an event whose revision vector does not carry its own revision: %+v", ev))
			}
			// A shard split off one the stream carries joins it: it is
			// covered from the revision after its vector entry, or from
			// this very event if it is the new shard's first.
			for id, r := range ev.Revisions {
				from := r + 1
				if id == *ev.Shard {
					from = ev.Revision
				}
				w.join(id, from)
			}
			w.add(*ev.Shard, ev)
		}
		w.closeSegment()
	}
}

// maxShardID bounds the shard ids a stream may name (the map holds at
// most 256 ranges).
const maxShardID = 4096

// grow makes room for shard id in the segment; a shard it does not carry
// covers nothing.
func (s *watchSegment) grow(id int) {
	for len(s.to) <= id {
		s.from = append(s.from, math.MaxUint64)
		s.to = append(s.to, 0)
	}
}

// join adds shard id, which joined the stream at revision from, to the
// open segment (nothing if the segment carries it already).
func (w *streamWatcher) join(id int, from uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	seg := &w.segs[len(w.segs)-1]
	if id < len(seg.to) && seg.from[id] != math.MaxUint64 {
		return
	}
	seg.grow(id)
	seg.from[id], seg.to[id] = from, from-1
}

func (w *streamWatcher) noteErr(s string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.errs) < 100 {
		w.errs = append(w.errs, s)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
