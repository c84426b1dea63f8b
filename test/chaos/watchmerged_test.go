package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	dlockclient "github.com/dlock/dlock/client"
)

// The watcher of a sharded cluster: one merged stream over every shard
// (GET /api/v1/watch, docs/api.md "Sharded clusters"), read here rather
// than through the Go client, whose Watch resumes from one revision. A
// shard split off during the run joins the stream at the split. Every
// event carries its shard and that shard's revision; a broken connection
// resumes on another node with from_revisions, shard by shard exactly
// where it left off, as the single-group client does with from_revision:
// at the last revision it delivered of each shard, skipping the events of
// that revision it already has (a revision can carry several events, and a
// connection can break between them). Only a refusal as compacted starts
// a new segment, from a new list: a break.

// mergedIdle bounds the silence of a merged stream (the server sends a
// heartbeat every 15 s), as the Go client does.
const mergedIdle = 45 * time.Second

// errMergedIdle ends a connection that stayed silent for mergedIdle.
var errMergedIdle = errors.New("the stream stayed silent too long")

// mergedPlace is where a merged stream stands, per shard id. A shard split
// off during the stream joins it (its id appears in an event's revision
// vector) and is tracked from then on.
type mergedPlace struct {
	known []bool   // the stream carries this shard
	from  []uint64 // the first revision the segment wanted, per shard
	last  []uint64 // the last revision delivered (0: none yet)
	count []int    // how many events of last were delivered
	// skip: events of the resumed revision the current connection will
	// repeat, per shard.
	skip []int
	// asked: the revision the current connection asked for, per shard.
	asked []uint64
}

func newMergedPlace(from []uint64) *mergedPlace {
	p := &mergedPlace{}
	for k, f := range from {
		p.learn(k, f)
	}
	return p
}

// learn adds shard id to the stream from revision from; false if it is
// there already.
func (p *mergedPlace) learn(id int, from uint64) bool {
	if p.knows(id) {
		return false
	}
	for len(p.known) <= id {
		p.known = append(p.known, false)
		p.from = append(p.from, 0)
		p.last = append(p.last, 0)
		p.count = append(p.count, 0)
		p.skip = append(p.skip, 0)
		p.asked = append(p.asked, 0)
	}
	p.known[id], p.from[id], p.asked[id] = true, from, from
	return true
}

func (p *mergedPlace) knows(id int) bool { return id >= 0 && id < len(p.known) && p.known[id] }

// query is from_revisions for the next connection, and resets skip.
func (p *mergedPlace) query() string {
	var parts []string
	for k := range p.from {
		if !p.known[k] {
			continue
		}
		p.asked[k], p.skip[k] = p.from[k], 0
		if p.last[k] > 0 {
			p.asked[k], p.skip[k] = p.last[k], p.count[k]
		}
		parts = append(parts, fmt.Sprintf("%d:%d", k, p.asked[k]))
	}
	return strings.Join(parts, ",")
}

// deliver reports whether an event of shard k is new, and records it.
func (p *mergedPlace) deliver(k int, rev uint64) bool {
	if !p.knows(k) || rev < p.asked[k] {
		return false
	}
	if p.skip[k] > 0 && rev == p.asked[k] {
		p.skip[k]--
		return false
	}
	p.skip[k] = 0
	if rev == p.last[k] {
		p.count[k]++
	} else {
		p.last[k], p.count[k] = rev, 1
	}
	return true
}

// maxShardID bounds the shard ids a stream may name (the map holds at
// most 256 ranges).
const maxShardID = 4096

// mergedEvent is an event of a merged stream.
type mergedEvent struct {
	dlockclient.WatchEvent
	Shard     *int              `json:"shard"`
	Revisions map[string]uint64 `json:"revisions"`
}

// runMerged follows the merged stream until ctx ends.
func (w *streamWatcher) runMerged(ctx context.Context) {
	node := 0
	for ctx.Err() == nil {
		revs, err := listRevisionsAt(w.nodes[node%len(w.nodes)], w.minShards(), 5*time.Second)
		if err != nil {
			node++
			sleepCtx(ctx, 100*time.Millisecond)
			continue
		}
		from := make([]uint64, len(revs))
		for k, r := range revs {
			from[k] = r + 1
		}
		w.mu.Lock()
		w.segs = append(w.segs, watchSegment{from: from, to: append([]uint64(nil), revs...), start: w.clk.now()})
		w.mu.Unlock()
		place := newMergedPlace(from)
		backoff := 50 * time.Millisecond
		for ctx.Err() == nil {
			progressed, compacted, err := w.readMerged(ctx, w.nodes[node%len(w.nodes)], place)
			if compacted {
				w.mu.Lock()
				w.breaks++
				w.mu.Unlock()
				break
			}
			if err == nil || ctx.Err() != nil {
				continue
			}
			// Broken, refused or silent: resume on the next node.
			node++
			if progressed {
				backoff = 50 * time.Millisecond
			}
			sleepCtx(ctx, backoff)
			backoff = min(2*backoff, time.Second)
		}
		w.mu.Lock()
		w.segs[len(w.segs)-1].end = w.clk.now()
		w.mu.Unlock()
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// readMerged reads one connection. compacted: the node no longer has the
// revisions to resume from (list again); err: the connection ended or was
// refused otherwise (resume elsewhere).
func (w *streamWatcher) readMerged(ctx context.Context, base string, place *mergedPlace) (progressed, compacted bool, err error) {
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	q := url.Values{"from_revisions": {place.query()}}
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, base+"/api/v1/watch?"+q.Encode(), nil)
	if err != nil {
		return false, false, err
	}
	req.Header.Set("Accept", "text/event-stream")
	idle := time.AfterFunc(5*time.Second, func() { cancel(errMergedIdle) })
	defer idle.Stop()
	res, err := streamClient.Do(req)
	if err != nil {
		return false, false, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
		code := errorCode(body)
		if code == "compacted" {
			return false, true, nil
		}
		if res.StatusCode == http.StatusBadRequest {
			// The harness asked for something the API refuses: say so
			// (it is retried, so a refusal that lasts shows as a stuck
			// watcher too).
			w.noteErr(fmt.Sprintf("%s refused from_revisions=%s: %d %s", base, q.Get("from_revisions"), res.StatusCode, strings.TrimSpace(string(body))))
		}
		return false, false, fmt.Errorf("%s: %d %s", base, res.StatusCode, code)
	}
	idle.Reset(mergedIdle)
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	var event string
	var data bytes.Buffer
	for sc.Scan() {
		idle.Reset(mergedIdle)
		line := sc.Bytes()
		if len(line) == 0 {
			if event == "" && data.Len() == 0 {
				continue
			}
			if event == "error" {
				if errorCode(data.Bytes()) == "compacted" {
					return progressed, true, nil
				}
				return progressed, false, fmt.Errorf("%s ended the stream: %s", base, data.String())
			}
			var ev mergedEvent
			if err := json.Unmarshal(data.Bytes(), &ev); err != nil {
				w.noteErr(fmt.Sprintf("%s sent a bad event %q: %v", base, data.String(), err))
			} else if ev.Shard == nil {
				w.noteErr(fmt.Sprintf("%s sent an event of a merged stream without its shard: %s", base, data.String()))
			} else if *ev.Shard < 0 || *ev.Shard >= maxShardID {
				w.noteErr(fmt.Sprintf("%s sent an event of shard %d: %s", base, *ev.Shard, data.String()))
			} else {
				if ev.Revisions[strconv.Itoa(*ev.Shard)] != ev.Revision {
					w.noteErr(fmt.Sprintf("%s sent an event whose revision vector does not carry its own revision: %s", base, data.String()))
				}
				// A shard split off one the stream carries joins it: from
				// the revision after its vector entry, or from this very
				// event if it is the new shard's first.
				for sid, rev := range ev.Revisions {
					id, err := strconv.Atoi(sid)
					if err != nil || id < 0 || id >= maxShardID {
						w.noteErr(fmt.Sprintf("%s sent a revision vector with shard %q: %s", base, sid, data.String()))
						continue
					}
					from := rev + 1
					if id == *ev.Shard {
						from = ev.Revision
					}
					if place.learn(id, from) {
						w.join(id, from)
					}
				}
				if place.deliver(*ev.Shard, ev.Revision) {
					w.add(*ev.Shard, ev.WatchEvent)
					progressed = true
				}
			}
			event = ""
			data.Reset()
			continue
		}
		if line[0] == ':' {
			continue
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "event":
			event = string(value)
		case "data":
			if data.Len() > 0 {
				data.WriteByte('\n')
			}
			data.Write(value)
		}
	}
	if ctx.Err() != nil {
		return progressed, false, nil
	}
	err = sc.Err()
	switch {
	case context.Cause(rctx) == errMergedIdle:
		err = errMergedIdle
	case err == nil:
		err = io.ErrUnexpectedEOF
	}
	return progressed, false, fmt.Errorf("%s: %w", base, err)
}

// join adds shard id, which joined the stream at revision from, to the
// open segment.
func (w *streamWatcher) join(id int, from uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	seg := &w.segs[len(w.segs)-1]
	for len(seg.to) <= id {
		// Not carried (yet): covers nothing.
		seg.from = append(seg.from, math.MaxUint64)
		seg.to = append(seg.to, 0)
	}
	seg.from[id], seg.to[id] = from, from-1
}

func (w *streamWatcher) noteErr(s string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.errs) < 100 {
		w.errs = append(w.errs, s)
	}
}

// errorCode is the code of an API error body, "" if it is none.
func errorCode(body []byte) string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) != nil {
		return ""
	}
	return e.Error.Code
}

// streamClient reads the merged streams (no overall timeout: a stream
// lasts; every connection is bounded by its idle timer).
var streamClient = &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 2, IdleConnTimeout: 5 * time.Second}}
