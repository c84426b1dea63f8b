package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ErrCompacted: a watch asked for revisions the node no longer keeps (it
// keeps the last 10,000 events), or the node's history restarted from a
// snapshot. List again and watch from the listed revision + 1. The error is
// a *CompactedError.
var ErrCompacted = errors.New("dlock: watch history compacted")

// CompactedError ends a Watch whose revisions are no longer kept.
type CompactedError struct {
	// Requested is the revision the watch asked for, or would have resumed
	// from.
	Requested uint64
	// Current is the newest revision of the node that refused, 0 if
	// unknown. A consistent restart point comes from ListWithRevision.
	Current uint64
	// Message is the server's explanation.
	Message string
}

func (e *CompactedError) Error() string {
	if e.Message != "" {
		return fmt.Sprintf("dlock: watch from revision %d: compacted: %s", e.Requested, e.Message)
	}
	return fmt.Sprintf("dlock: watch from revision %d: history compacted (current revision %d); list again and watch from the listed revision + 1",
		e.Requested, e.Current)
}

// Is makes errors.Is(err, ErrCompacted) true.
func (e *CompactedError) Is(target error) bool { return target == ErrCompacted }

// WatchEvent is one state change (docs/api.md, Watch).
type WatchEvent struct {
	Revision uint64 `json:"revision"`
	// Type is acquired, released, expired, revoked, value_changed,
	// delay_ended (a lock-delay ran out; the hand-off it lets in follows
	// at the same revision), queued or dequeued for locks; elected,
	// resigned, expired, revoked, proclaimed, queued or dequeued for
	// elections; session_created, session_expired or session_deleted.
	Type string `json:"type"`
	// Kind is lock, election or session.
	Kind         string `json:"kind"`
	Name         string `json:"name,omitempty"`
	ClientID     string `json:"client_id,omitempty"`
	FencingToken uint64 `json:"fencing_token,omitempty"`
	// Cause says why: handoff, takeover, timeout, cancelled, expired, ...
	Cause string `json:"cause,omitempty"`
	// Value is an election leader's value (elected, proclaimed).
	Value string `json:"value,omitempty"`
	// At is when it happened, in the leader's wall clock (for display).
	At time.Time `json:"at"`
	// Mode is a lock grant's or wait's mode (acquired, released, expired,
	// queued, dequeued): ModeExclusive or ModeShared; Subtree says it
	// covers the names below.
	Mode    string `json:"mode,omitempty"`
	Subtree bool   `json:"subtree,omitempty"`
	// Shard and Revisions are set on a stream merged over several shards
	// of a sharded cluster (docs/api.md, Sharded clusters): the event's
	// shard id (Revision is that shard's), and every shard's revision
	// after this event — the stream's place, which Watch resumes from by
	// itself and WatchRevisions can resume from later (NextRevisions).
	Shard     *int           `json:"shard,omitempty"`
	Revisions map[int]uint64 `json:"revisions,omitempty"`
}

// NextRevisions is where to resume a merged watch after the event whose
// Revisions is v: per shard, the first revision wanted (each + 1). Pass
// it to WatchRevisions.
func NextRevisions(v map[int]uint64) map[int]uint64 {
	out := make(map[int]uint64, len(v))
	for id, r := range v {
		out[id] = r + 1
	}
	return out
}

// Watch streams every state change under the name prefix ("" for all) from
// fromRevision on (0: from now on), in revision order, until ctx ends or the
// loop stops:
//
//	for ev, err := range c.Watch(ctx, "billing/", rev+1) {
//		if err != nil {
//			return err // errors.Is(err, client.ErrCompacted): list again
//		}
//		...
//	}
//
// Any node serves watches. When a stream breaks (the node died, it cut a
// slow watcher off, the connection went silent) Watch resumes on another
// node where it left off, so the loop sees every event exactly once. The
// sequence ends with an error only when retrying cannot help: an error
// wrapping ErrCompacted (a *CompactedError) when the revisions to resume from
// are no longer kept, or ErrInvalidArgument for a bad prefix.
//
// To see every change after a read, list then watch: ListWithRevision, then
// Watch from its revision + 1.
//
// On a sharded cluster a prefix that spans several shards is one merged
// stream whose revisions are per shard: fromRevision must be 0 there (a
// revision means nothing across shards: use WatchRevisions to start from a
// place), each event carries its Shard and the stream's Revisions, and a
// broken stream resumes from that per-shard place, every shard exactly
// where it left off. A range split while the stream is open joins it.
func (c *Client) Watch(ctx context.Context, prefix string, fromRevision uint64) iter.Seq2[WatchEvent, error] {
	return c.watch(ctx, &watchState{prefix: prefix, from: fromRevision})
}

// WatchRevisions is Watch over a prefix of a sharded cluster from a
// per-shard place: from[id] is the first revision wanted of shard id (from
// ListWithRevisions, each + 1, or NextRevisions of the last event's
// Revisions). A shard split off one named in from after that place joins
// the stream at the split; nil or empty from watches from now.
func (c *Client) WatchRevisions(ctx context.Context, prefix string, from map[int]uint64) iter.Seq2[WatchEvent, error] {
	w := &watchState{prefix: prefix}
	if len(from) > 0 {
		w.shards = newShardPlace(from)
	}
	return c.watch(ctx, w)
}

func (c *Client) watch(ctx context.Context, w *watchState) iter.Seq2[WatchEvent, error] {
	return func(yield func(WatchEvent, error) bool) {
		err := c.follow(ctx, streamSpec{
			what:    "watch",
			path:    w.path,
			comment: w.comment,
			record: func(r sseRecord) (bool, error) {
				var ev WatchEvent
				if err := json.Unmarshal(r.data, &ev); err != nil {
					return false, fmt.Errorf("dlock: watch: bad event from the server: %w", err)
				}
				if !w.deliver(ev) {
					return true, nil
				}
				return yield(ev, nil), nil
			},
			rejected: func(aerr *APIError) error {
				if aerr.Code == CodeCompacted {
					return c.compacted(ctx, w.resumeFrom(), aerr)
				}
				return aerr
			},
		})
		if err != nil {
			yield(WatchEvent{}, err)
		}
	}
}

// watchState is where a watch stands, to resume it exactly there.
//
// One revision can carry several events (a release and the hand-off to the
// next in line; a session's expiry and its locks), and a stream can break
// between two of them. So a watch resumes at the last revision it delivered,
// not after it, and skips the events of that revision it already delivered:
// every node sends the same events in the same order. (The price: if the
// node resumed on has evicted part of that revision from its history, the
// watch ends with ErrCompacted even though everything after it is kept.)
type watchState struct {
	prefix string
	// from is the revision the current connection asked for (0: now).
	from uint64
	// skip is how many events of revision from to drop on this connection.
	skip int
	// last and lastCount: the last revision delivered and how many of its
	// events were.
	last      uint64
	lastCount int
	// start is where the server said a from-now watch starts.
	start uint64
	// shards is a merged stream's place (nil: one group's stream).
	shards *shardPlace
}

// shardPlace is where a merged stream stands, per shard id: watchState's
// bookkeeping for each shard. A shard split off during the stream is
// learnt from the first event whose Revisions names it.
type shardPlace struct {
	from      map[int]uint64 // the first revision the current connection asked for
	skip      map[int]int
	last      map[int]uint64
	lastCount map[int]int
}

func newShardPlace(from map[int]uint64) *shardPlace {
	p := &shardPlace{from: map[int]uint64{}, skip: map[int]int{}, last: map[int]uint64{}, lastCount: map[int]int{}}
	for id, r := range from {
		p.from[id] = r
	}
	return p
}

// learn adds a shard the stream carries from revision from on.
func (p *shardPlace) learn(id int, from uint64) {
	if _, ok := p.from[id]; !ok {
		p.from[id] = from
	}
}

// query is from_revisions for the next connection; it resets skip.
func (p *shardPlace) query() string {
	ids := make([]int, 0, len(p.from))
	for id := range p.from {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	parts := make([]string, len(ids))
	for i, id := range ids {
		p.skip[id] = 0
		if p.last[id] > 0 {
			p.from[id], p.skip[id] = p.last[id], p.lastCount[id]
		}
		parts[i] = fmt.Sprintf("%d:%d", id, p.from[id])
	}
	return strings.Join(parts, ",")
}

func (p *shardPlace) deliver(id int, rev uint64) bool {
	from, ok := p.from[id]
	if !ok || rev < from {
		return false
	}
	if p.skip[id] > 0 && rev == from {
		p.skip[id]--
		return false
	}
	p.skip[id] = 0
	if rev == p.last[id] {
		p.lastCount[id]++
	} else {
		p.last[id], p.lastCount[id] = rev, 1
	}
	return true
}

// parseRevisions reads "id:revision,..." (a merged stream's opening
// comment); nil if it is not that.
func parseRevisions(s string) map[int]uint64 {
	out := map[int]uint64{}
	for _, part := range strings.Split(s, ",") {
		a, b, ok := strings.Cut(strings.TrimSpace(part), ":")
		id, err1 := strconv.Atoi(a)
		r, err2 := strconv.ParseUint(b, 10, 64)
		if !ok || err1 != nil || err2 != nil || id < 0 {
			return nil
		}
		out[id] = r
	}
	return out
}

// resumeFrom is the revision the next connection asks for.
func (w *watchState) resumeFrom() uint64 {
	switch {
	case w.last > 0:
		return w.last
	case w.from == 0 && w.start > 0:
		// Nothing delivered yet: resume where the first stream started,
		// not at the next node's "now".
		return w.start
	}
	return w.from
}

func (w *watchState) path() string {
	if w.shards != nil {
		q := url.Values{"from_revisions": {w.shards.query()}}
		if w.prefix != "" {
			q.Set("prefix", w.prefix)
		}
		return "/watch?" + q.Encode()
	}
	w.from, w.skip = w.resumeFrom(), 0
	if w.last > 0 {
		w.skip = w.lastCount
	}
	w.start = 0
	q := url.Values{}
	if w.prefix != "" {
		q.Set("prefix", w.prefix)
	}
	if w.from > 0 {
		q.Set("from_revision", strconv.FormatUint(w.from, 10))
	}
	if len(q) == 0 {
		return "/watch"
	}
	return "/watch?" + q.Encode()
}

// comment reads the stream's opening comment, ": dlock watch from revision
// N", or a merged stream's ": dlock watch from revisions 0:N0,1:N1,…".
func (w *watchState) comment(text string) {
	if w.from != 0 || w.last != 0 || w.shards != nil {
		return
	}
	if v, ok := strings.CutPrefix(text, "dlock watch from revisions "); ok {
		// A from-now merged stream: resume where it started, not at the
		// next node's now, even before its first event.
		if from := parseRevisions(v); from != nil {
			w.shards = newShardPlace(from)
		}
		return
	}
	if v, ok := strings.CutPrefix(text, "dlock watch from revision "); ok {
		if n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64); err == nil {
			w.start = n
		}
	}
}

// deliver reports whether an event is new to the caller, and records it.
func (w *watchState) deliver(ev WatchEvent) bool {
	if ev.Shard != nil {
		if w.shards == nil {
			w.shards = newShardPlace(nil)
		}
		// A shard the place lacks joined the stream (a split, or a server
		// that opened no place comment): from the revision after its
		// entry, or from this event if it is that shard's first.
		for id, r := range ev.Revisions {
			if id == *ev.Shard {
				w.shards.learn(id, ev.Revision)
			} else {
				w.shards.learn(id, r+1)
			}
		}
		return w.shards.deliver(*ev.Shard, ev.Revision)
	}
	if ev.Revision < w.from {
		return false
	}
	if w.skip > 0 && ev.Revision == w.from {
		w.skip--
		return false
	}
	w.skip = 0
	if ev.Revision == w.last {
		w.lastCount++
	} else {
		w.last, w.lastCount = ev.Revision, 1
	}
	return true
}

var currentRevision = regexp.MustCompile(`current (\d+)`)

// compacted builds the error of a watch refused as compacted, with the
// current revision from the server's message, else from the cluster.
func (c *Client) compacted(ctx context.Context, requested uint64, aerr *APIError) error {
	e := &CompactedError{Requested: requested, Message: aerr.Message}
	if m := currentRevision.FindStringSubmatch(aerr.Message); m != nil {
		e.Current, _ = strconv.ParseUint(m[1], 10, 64)
	} else if ctx.Err() == nil {
		cctx, cancel := context.WithTimeout(ctx, min(2*time.Second, c.reqTimeout))
		defer cancel()
		if ci, err := c.Cluster(cctx); err == nil {
			e.Current = ci.Revision
		}
	}
	return e
}

// ListWithRevisions is ListWithRevision for a prefix of a sharded cluster:
// it returns, per shard id, the revision each shard's part was read at
// (nil on one group: use the revision then). WatchRevisions from
// NextRevisions of it sees every later change exactly once.
func (c *Client) ListWithRevisions(ctx context.Context, prefix string) ([]LockStatus, map[int]uint64, error) {
	var revs map[int]uint64
	locks, _, err := c.listPages(ctx, prefix, 10000, func(out *listResponse) { revs = out.Revisions })
	return locks, revs, err
}

// ListWithRevision is List that also returns the revision the list was read
// at: Watch from that revision + 1 sees every later change exactly once
// (list-then-watch). A list longer than one page (10,000 locks) is read
// page by page; the revision is then the first page's, and the first events
// may repeat changes that later pages already show.
func (c *Client) ListWithRevision(ctx context.Context, prefix string) ([]LockStatus, uint64, error) {
	return c.list(ctx, prefix, 10000)
}

// list reads every page of GET /locks; limit 0 is the server's default.
func (c *Client) list(ctx context.Context, prefix string, limit int) ([]LockStatus, uint64, error) {
	return c.listPages(ctx, prefix, limit, nil)
}

// listPages is list; first, when set, sees the first page's answer.
func (c *Client) listPages(ctx context.Context, prefix string, limit int, first func(*listResponse)) ([]LockStatus, uint64, error) {
	var all []LockStatus
	var rev uint64
	after := ""
	for {
		q := url.Values{}
		if prefix != "" {
			q.Set("prefix", prefix)
		}
		if after != "" {
			q.Set("after", after)
		}
		if limit > 0 {
			q.Set("limit", strconv.Itoa(limit))
		}
		path := "/locks"
		if len(q) > 0 {
			path += "?" + q.Encode()
		}
		var out listResponse
		if _, err := c.do(ctx, call{method: http.MethodGet, path: path, out: &out}); err != nil {
			return nil, 0, err
		}
		if after == "" {
			rev = out.Revision
			if first != nil {
				first(&out)
			}
		}
		all = append(all, out.Locks...)
		if !out.More || len(out.Locks) == 0 {
			return all, rev, nil
		}
		after = out.Locks[len(out.Locks)-1].Name
	}
}

// Server-Sent Events streams (Watch, Election.Observe).

const (
	// streamIdle is how long a stream may stay silent before it counts as
	// broken: the server sends a heartbeat every 15 s.
	streamIdle = 45 * time.Second
	// maxRecordLine bounds one line of a stream.
	maxRecordLine = 1 << 20
)

var errStreamIdle = errors.New("the stream stayed silent too long")

// sseRecord is one Server-Sent Events record.
type sseRecord struct {
	id    string
	event string
	data  []byte
}

// streamSpec is one kind of stream for follow.
type streamSpec struct {
	what string
	// path is called before each connection: where to resume.
	path func() string
	// comment receives comment lines (may be nil).
	comment func(text string)
	// record handles a record; more false stops the stream, an error ends
	// it for good. Error records never reach it.
	record func(sseRecord) (more bool, err error)
	// rejected maps an answer that retrying cannot fix to the stream's
	// final error (may be nil).
	rejected func(*APIError) error
}

// follow reads a stream, reconnecting with backoff to another node when it
// breaks, until ctx ends (nil), the handler stops it (nil), or an error
// that retrying cannot fix.
func (c *Client) follow(ctx context.Context, s streamSpec) error {
	backoff := backoffMin
	for {
		if ctx.Err() != nil {
			return nil
		}
		c.discover(ctx)
		base, wait := c.target()
		if wait > 0 {
			sleep(ctx, wait)
			continue
		}
		progressed, final, err := c.readStream(ctx, base, &s)
		if final {
			return err
		}
		if progressed {
			backoff = backoffMin
		}
		c.log.Debug("dlock: stream broke; resuming on another node", "stream", s.what, "node", base, "err", err)
		sleep(ctx, jitter(backoff))
		backoff = min(2*backoff, backoffMax)
	}
}

// readStream reads one connection's records. final says the stream is over
// (err nil: ctx ended or the handler stopped); otherwise err says why the
// connection broke and progressed whether it delivered anything first.
func (c *Client) readStream(ctx context.Context, base string, s *streamSpec) (progressed, final bool, err error) {
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, base+"/api/v1"+s.path(), nil)
	if err != nil {
		return false, true, err
	}
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("User-Agent", "dlock-go-client")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	// Bound the wait for the answer, then each silence between lines.
	idle := time.AfterFunc(c.reqTimeout, func() { cancel(errStreamIdle) })
	defer idle.Stop()
	res, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return false, true, nil
		}
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		c.failed(base, 0, notSent(err))
		return false, false, fmt.Errorf("%w: %s: %w", ErrUnavailable, base, err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(res.Body, maxAnswer))
		aerr := decodeError(res.StatusCode, data)
		if retryable(res.StatusCode) {
			c.failed(base, retryAfter(res.Header), false)
			return false, false, aerr
		}
		if s.rejected != nil {
			return false, true, s.rejected(aerr)
		}
		return false, true, aerr
	}
	idle.Reset(streamIdle)
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 0, 4096), maxRecordLine)
	var rec sseRecord
	var data bytes.Buffer
	hasData := false
	for sc.Scan() {
		idle.Reset(streamIdle)
		line := sc.Bytes()
		if len(line) == 0 {
			if rec.event == "" && !hasData {
				continue
			}
			rec.data = data.Bytes()
			if rec.event == "error" {
				aerr := decodeError(0, rec.data)
				if aerr.Code == CodeCompacted && s.rejected != nil {
					return progressed, true, s.rejected(aerr)
				}
				// Cut off (slow watcher, node shutting down): resume.
				c.failed(base, 0, false)
				return progressed, false, aerr
			}
			// The handler may block in the caller's loop body: that is not
			// the stream's silence.
			idle.Stop()
			more, herr := s.record(rec)
			if herr != nil || !more {
				return progressed, true, herr
			}
			progressed = true
			idle.Reset(streamIdle)
			rec, hasData = sseRecord{}, false
			data.Reset()
			continue
		}
		if line[0] == ':' {
			if s.comment != nil {
				s.comment(strings.TrimSpace(string(line[1:])))
			}
			continue
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "event":
			rec.event = string(value)
		case "id":
			rec.id = string(value)
		case "data":
			if hasData {
				data.WriteByte('\n')
			}
			data.Write(value)
			hasData = true
		}
	}
	if ctx.Err() != nil {
		return progressed, true, nil
	}
	err = sc.Err()
	switch {
	case context.Cause(rctx) == errStreamIdle:
		err = errStreamIdle
	case err == nil:
		err = io.ErrUnexpectedEOF
	}
	c.failed(base, 0, false)
	return progressed, false, fmt.Errorf("%w: %s: %w", ErrUnavailable, base, err)
}
