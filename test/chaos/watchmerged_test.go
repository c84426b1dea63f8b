package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	dlockclient "github.com/dlock/dlock/client"
)

// The watcher of a sharded cluster: one merged stream over every shard
// (GET /api/v1/watch, docs/api.md "Sharded clusters"), read here rather
// than through the Go client, whose Watch resumes from one revision. Every
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

// mergedPlace is where a merged stream stands, per shard.
type mergedPlace struct {
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
	n := len(from)
	return &mergedPlace{from: append([]uint64(nil), from...), last: make([]uint64, n), count: make([]int, n), skip: make([]int, n), asked: make([]uint64, n)}
}

// query is from_revisions for the next connection, and resets skip.
func (p *mergedPlace) query() string {
	parts := make([]string, len(p.from))
	for k := range p.from {
		p.asked[k], p.skip[k] = p.from[k], 0
		if p.last[k] > 0 {
			p.asked[k], p.skip[k] = p.last[k], p.count[k]
		}
		parts[k] = fmt.Sprintf("%d:%d", k, p.asked[k])
	}
	return strings.Join(parts, ",")
}

// deliver reports whether an event of shard k is new, and records it.
func (p *mergedPlace) deliver(k int, rev uint64) bool {
	if rev < p.asked[k] {
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
		revs, err := listRevisionsAt(w.nodes[node%len(w.nodes)], w.shards, 5*time.Second)
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
			} else if *ev.Shard < 0 || *ev.Shard >= w.shards {
				w.noteErr(fmt.Sprintf("%s sent an event of shard %d: %s", base, *ev.Shard, data.String()))
			} else {
				if ev.Revisions[strconv.Itoa(*ev.Shard)] != ev.Revision {
					w.noteErr(fmt.Sprintf("%s sent an event whose revision vector does not carry its own revision: %s", base, data.String()))
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
