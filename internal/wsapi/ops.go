package wsapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/service"
)

// message is every field any client message may carry; fields lists which
// ones each op accepts.
type message struct {
	ID            string `json:"id"`
	Op            string `json:"op"`
	Name          string `json:"name"`
	ClientID      string `json:"client_id"`
	TTLms         int64  `json:"ttl_ms"`
	SessionID     string `json:"session_id"`
	WaitTimeoutMs int64  `json:"wait_timeout_ms"`
	RequestID     string `json:"request_id"`
	FencingToken  uint64 `json:"fencing_token"`
	LeaseID       string `json:"lease_id"`
	Prefix        string `json:"prefix"`
	FromRevision  uint64 `json:"from_revision"`
	WatchID       string `json:"watch_id"`
	TargetID      string `json:"target_id"`
	Takeover      bool   `json:"takeover"`
	Limit         int64  `json:"limit"`
	Mode          string `json:"mode"`
	Subtree       bool   `json:"subtree"`
	// Token is the ACL token secret of an auth message (auth.go).
	Token string `json:"token"`
	// Value is a holder's value (acquire; renew replaces it when present).
	Value       *string `json:"value"`
	LockDelayMs int64   `json:"lock_delay_ms"`
	// Reason and Kind are revoke's and history's (whose limit is Limit).
	Reason string `json:"reason"`
	Kind   string `json:"kind"`
}

func (m *message) value() string {
	if m.Value == nil {
		return ""
	}
	return *m.Value
}

// election reads kind: "lock" (or absent) or "election".
func (m *message) election() (bool, error) {
	switch m.Kind {
	case "", "lock":
		return false, nil
	case "election":
		return true, nil
	}
	return false, apierror.New(apierror.InvalidArgument, "kind %q must be lock or election", m.Kind)
}

// Ops.
const (
	opAcquire = "acquire"
	opRelease = "release"
	opRenew   = "renew"
	opWatch   = "watch"
	opUnwatch = "unwatch"
	opCancel  = "cancel"
	opEvent   = "event"
	opHistory = "history"
	opRevoke  = "revoke"
)

var fields = map[string][]string{
	opAcquire: {"id", "op", "name", "client_id", "ttl_ms", "session_id", "wait_timeout_ms", "request_id", "takeover", "limit", "mode", "subtree", "value", "lock_delay_ms"},
	opRelease: {"id", "op", "name", "client_id", "fencing_token", "lease_id", "request_id"},
	opRenew:   {"id", "op", "name", "client_id", "fencing_token", "lease_id", "ttl_ms", "request_id", "value"},
	opHistory: {"id", "op", "name", "kind", "limit"},
	opRevoke:  {"id", "op", "name", "kind", "fencing_token", "reason", "client_id", "request_id"},
	opWatch:   {"id", "op", "prefix", "from_revision"},
	opUnwatch: {"id", "op", "watch_id"},
	opCancel:  {"id", "op", "target_id"},
	opAuth:    {"id", "op", "token"},
}

// maxID bounds a message id, which is echoed in every answer to it.
const maxID = 128

// answer is every message the server sends: the id and op it answers, and
// exactly one of result, error or event. holder accompanies a lock_held or
// wait_timeout error, as in the HTTP 409 body.
type answer struct {
	ID     string              `json:"id"`
	Op     string              `json:"op"`
	Result any                 `json:"result,omitempty"`
	Error  *errorBody          `json:"error,omitempty"`
	Holder *service.Holder     `json:"holder,omitempty"`
	Event  *service.WatchEvent `json:"event,omitempty"`
	// FencingToken is, with a lock_lost error, the token of the grant that
	// was lost.
	FencingToken uint64 `json:"fencing_token,omitempty"`
	// Limit is, with a limit_mismatch error, the lock's limit.
	Limit int `json:"limit,omitempty"`
}

// handle decodes one message and starts it. Acquires run on goroutines of
// their own, so a wait never holds up the messages behind it; the other ops
// are short and go to the connection's serial worker, which runs them one at
// a time in the order they arrived. Neither blocks the read loop, which must
// keep reading for the connection's pings and close frames to be handled.
func (c *conn) handle(b []byte) {
	m, err := decode(b)
	if err != nil {
		c.send(c.ctx, &answer{ID: m.ID, Op: m.Op, Error: errorOf(apierror.From(err))})
		return
	}
	if m.Op == opAcquire {
		c.acquire(m)
		return
	}
	if m.Op == opAuth {
		c.send(c.ctx, &answer{ID: m.ID, Op: m.Op, Error: errorOf(apierror.New(apierror.InvalidArgument,
			"auth comes first, once, and only on a cluster that requires a token and a connection opened without one; open a new connection to use another token"))})
		return
	}
	select {
	case c.serial <- m:
	default:
		c.h.limited(limitQueue)
		c.reply(c.ctx, m, nil, apierror.New(apierror.RateLimited,
			"%d messages are already waiting their turn on this connection (the limit); wait for their answers", cap(c.serial)))
	}
}

// worker runs the serial ops in arrival order.
func (c *conn) worker() {
	defer c.wg.Done()
	for {
		select {
		case <-c.ctx.Done():
			return
		case m := <-c.serial:
			c.run(m)
		}
	}
}

func (c *conn) run(m *message) {
	switch m.Op {
	case opRelease:
		resp, err := c.h.svc.Release(c.ctx, service.ReleaseRequest{Name: m.Name, ClientID: m.ClientID,
			FencingToken: m.FencingToken, LeaseID: m.LeaseID, RequestID: m.RequestID})
		c.reply(c.ctx, m, resp, err)
	case opRenew:
		resp, err := c.h.svc.Renew(c.ctx, service.RenewRequest{Name: m.Name, ClientID: m.ClientID,
			FencingToken: m.FencingToken, LeaseID: m.LeaseID, TTLms: m.TTLms, RequestID: m.RequestID, Value: m.Value})
		c.reply(c.ctx, m, resp, err)
	case opHistory:
		el, err := m.election()
		var resp *service.HistoryResponse
		if err == nil {
			resp, err = c.h.svc.History(c.ctx, service.HistoryRequest{Name: m.Name, Election: el, Limit: int(min(max(m.Limit, -1), 1<<20))})
		}
		c.reply(c.ctx, m, resp, err)
	case opRevoke:
		el, err := m.election()
		var resp *service.RevokeResponse
		if err == nil {
			resp, err = c.h.svc.Revoke(c.ctx, service.RevokeRequest{Name: m.Name, Election: el, FencingToken: m.FencingToken,
				Reason: m.Reason, ClientID: m.ClientID, RequestID: m.RequestID})
		}
		c.reply(c.ctx, m, resp, err)
	case opWatch:
		c.watch(m)
	case opUnwatch:
		c.stop(m, m.WatchID, opWatch, map[string]bool{"unwatched": true})
	case opCancel:
		c.stop(m, m.TargetID, opAcquire, map[string]bool{"cancelled": true})
	}
}

// reply sends resp, or err in the API's error shape.
func (c *conn) reply(ctx context.Context, m *message, resp any, err error) {
	a := &answer{ID: m.ID, Op: m.Op}
	if err != nil {
		a.Error = c.publicError(ctx, err)
		if e, ok := errors.AsType[*apierror.Error](err); ok {
			a.FencingToken = e.FencingToken // a renew's lock_lost
		}
	} else {
		a.Result = resp
	}
	c.send(ctx, a)
}

// decode parses one client message strictly: one JSON object, known keys
// spelt exactly and given once, only the keys its op takes. A bad message is
// answered, never guessed at. The returned message carries id and op when
// they could be read, so the error can name them.
func decode(b []byte) (*message, error) {
	// Read id and op leniently first, so that even a broken message's error
	// can name them.
	var head struct {
		ID string `json:"id"`
		Op string `json:"op"`
	}
	_ = json.NewDecoder(bytes.NewReader(b)).Decode(&head)
	m := &message{ID: head.ID, Op: head.Op}
	bad := func(format string, args ...any) error { return apierror.New(apierror.InvalidArgument, format, args...) }
	if !utf8.Valid(b) {
		return m, bad("message is not valid UTF-8")
	}
	keys, err := topKeys(b)
	if err != nil {
		return m, bad("message must be one JSON object: %v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(m); err != nil {
		m = &message{ID: head.ID, Op: head.Op}
		if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok && te.Field != "" {
			return m, bad("field %q has the wrong type (%s)", te.Field, te.Value)
		}
		return m, bad("message is not valid: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	if m.ID == "" || len(m.ID) > maxID {
		return m, bad("id is required: a string of 1 to %d bytes, echoed in every answer to this message", maxID)
	}
	allowed, ok := fields[m.Op]
	if !ok {
		return m, bad("unknown op %q; use acquire, release, renew, history, revoke, watch, unwatch, cancel or (first, when the cluster requires a token) auth", m.Op)
	}
	seen := map[string]bool{}
	for _, k := range keys {
		switch {
		case seen[k]:
			return m, bad("field %q is given more than once", k)
		case !slices.Contains(allowed, k):
			return m, bad("op %s does not take field %q; it takes: %s", m.Op, k, strings.Join(allowed, ", "))
		}
		seen[k] = true
	}
	return m, nil
}

// topKeys lists the keys of the JSON object b in order, duplicates included
// (a decoder into a struct or map would silently keep the last one).
func topKeys(b []byte) ([]string, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, fmt.Errorf("it does not start with {")
	}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		keys = append(keys, tok.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil, err
		}
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("data after the object")
	}
	return keys, nil
}

// start registers a long-running op under its message id, within the
// connection's limits, and returns its context.
func (c *conn) start(m *message) (context.Context, *op, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, dup := c.ops[m.ID]; dup {
		return nil, nil, apierror.New(apierror.InvalidArgument, "id %q is already used by an acquire or watch in progress on this connection; use a new id", m.ID)
	}
	switch {
	case m.Op == opAcquire && c.pending >= c.h.opts.MaxPending:
		c.h.limited(limitAcquires)
		return nil, nil, apierror.New(apierror.RateLimited, "this connection already has %d acquires in flight (the limit); wait for their answers or open another connection", c.pending)
	case m.Op == opWatch && c.watches >= c.h.opts.MaxWatches:
		c.h.limited(limitWatches)
		return nil, nil, apierror.New(apierror.RateLimited, "this connection already has %d open watches, the most one connection may have (dlock serve --max-watchers-per-conn); unwatch one, widen a prefix, or open another connection", c.watches)
	}
	ctx, cancel := context.WithCancel(c.ctx)
	o := &op{kind: m.Op, cancel: cancel, done: make(chan struct{})}
	c.ops[m.ID] = o
	if m.Op == opAcquire {
		c.pending++
	} else {
		c.watches++
	}
	c.wg.Add(1)
	return ctx, o, nil
}

func (c *conn) finish(id string, o *op) {
	c.mu.Lock()
	delete(c.ops, id)
	if o.kind == opAcquire {
		c.pending--
	} else {
		c.watches--
	}
	c.mu.Unlock()
	o.cancel()
	close(o.done)
	c.wg.Done()
}

// acquire runs one acquire on its own goroutine; its answer (the grant, or
// why not) is pushed whenever it comes. Its context ends with the connection,
// which is what withdraws the wait of a client that went away.
func (c *conn) acquire(m *message) {
	ctx, o, err := c.start(m)
	if err != nil {
		c.reply(c.ctx, m, nil, err)
		return
	}
	go func() {
		defer c.finish(m.ID, o)
		resp, err := c.h.svc.Acquire(ctx, service.AcquireRequest{Name: m.Name, ClientID: m.ClientID, TTLms: m.TTLms,
			SessionID: m.SessionID, WaitTimeoutMs: m.WaitTimeoutMs, RequestID: m.RequestID, Takeover: m.Takeover,
			Limit: m.Limit, Mode: m.Mode, Subtree: m.Subtree, Value: m.value(), LockDelayMs: m.LockDelayMs})
		if err != nil {
			a := &answer{ID: m.ID, Op: m.Op, Error: c.publicError(ctx, err)}
			if resp != nil {
				a.Holder, a.FencingToken, a.Limit = resp.Holder, resp.FencingToken, resp.Limit
			}
			c.send(c.ctx, a)
			return
		}
		c.reply(c.ctx, m, resp, nil)
	}()
}

// watch subscribes at once (so the answer's revision is where the stream
// starts, and a compacted from_revision is refused in the answer), then
// pushes events from a goroutine of its own.
func (c *conn) watch(m *message) {
	ctx, o, err := c.start(m)
	if err != nil {
		c.reply(c.ctx, m, nil, err)
		return
	}
	w, err := c.h.svc.Watch(ctx, service.WatchRequest{Prefix: m.Prefix, FromRevision: m.FromRevision})
	if err != nil {
		c.finish(m.ID, o)
		c.reply(c.ctx, m, nil, err)
		return
	}
	c.send(ctx, &answer{ID: m.ID, Op: m.Op, Result: map[string]any{"watching": true, "revision": w.Revision}})
	go func() {
		defer c.finish(m.ID, o)
		defer w.Close()
		events := w.Events()
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-events:
				if !ok {
					if err := w.Err(); err != nil {
						c.send(ctx, &answer{ID: m.ID, Op: m.Op, Error: c.publicError(ctx, err)})
					}
					return
				}
				ev := service.Event(e)
				if !c.send(ctx, &answer{ID: m.ID, Op: opEvent, Event: &ev}) {
					return
				}
			}
		}
	}()
}

// stop ends the acquire or watch registered under target and answers once it
// has ended, so no event of an unwatched watch follows the answer. A
// cancelled acquire also answers for itself (its wait was withdrawn).
func (c *conn) stop(m *message, target, kind string, result any) {
	c.mu.Lock()
	o, ok := c.ops[target]
	c.mu.Unlock()
	if !ok || o.kind != kind {
		c.reply(c.ctx, m, nil, apierror.New(apierror.NotFound, "no %s in progress with id %q on this connection", kind, target))
		return
	}
	o.cancel()
	select {
	case <-o.done:
	case <-c.ctx.Done():
		return
	}
	c.reply(c.ctx, m, result, nil)
}
