package chaos

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/dlock/dlock/fence"
)

// clock is the run's monotonic clock: nanoseconds since the run started.
// Every time in the history is on it.
type clock struct{ start time.Time }

func (c *clock) now() int64 { return int64(time.Since(c.start)) }

// fmtT formats a run-clock time as seconds, e.g. "12.345s".
func fmtT(t int64) string {
	if t == math.MaxInt64 || t < 0 {
		return "∞"
	}
	return fmt.Sprintf("%.3fs", float64(t)/1e9)
}

// Operation kinds.
const (
	kAcquire    = "acquire"
	kRelease    = "release"
	kRenew      = "renew"
	kGet        = "get"
	kSessCreate = "session_create"
	kKeepAlive  = "keepalive"
	kSessDelete = "session_delete"
	kProclaim   = "proclaim" // elections only
)

// Elections are locks in their own namespace (design.md §2): the suite keys
// them as "E:" + name everywhere (history, model, registers) and uses the
// /elections API for them.
const electionPrefix = "E:"

func isElection(key string) bool { return strings.HasPrefix(key, electionPrefix) }

func realName(key string) string { return strings.TrimPrefix(key, electionPrefix) }

// Outcomes.
const (
	oOK          = "ok"
	oHeld        = "lock_held"
	oWaitTimeout = "wait_timeout"
	oLost        = "lock_lost" // granted (OutToken) but ended before the answer: the client never held it
	oNotHolder   = "not_holder"
	oNoSession   = "session_not_found"
	oUnknown     = "unknown" // no definitive answer: the operation may or may not have happened
	oError       = "error"   // a definitive answer the suite did not expect (a 400, say)
)

// Op is one client operation: from the first send to the definitive answer,
// over every retry (each with the same request_id, against any node).
type Op struct {
	ID      int    `json:"id"`
	Proc    int    `json:"proc"` // client index
	Client  string `json:"client"`
	Inc     int    `json:"inc"` // client incarnation (bumped by a client crash)
	Kind    string `json:"kind"`
	Lock    string `json:"lock,omitempty"`
	Session string `json:"session,omitempty"` // session id: session ops, acquires under a session
	Lease   string `json:"lease,omitempty"`   // release/renew: the lease id sent
	Token   uint64 `json:"token,omitempty"`   // release/renew: the token sent
	TTL     int64  `json:"ttl,omitempty"`     // ns: the lease TTL asked for (acquire, session create)
	Wait    int64  `json:"wait,omitempty"`    // ns: wait_timeout of a blocking acquire
	Value   string `json:"value,omitempty"`   // elections: campaign/proclaim value
	// Takeover: an acquire that may take the lock (or a place in line)
	// from another lease of the same client_id.
	Takeover bool `json:"takeover,omitempty"`
	// Limit, Shared and Subtree: what a lock-model acquire asked for.
	Limit   int    `json:"limit,omitempty"`
	Shared  bool   `json:"shared,omitempty"`
	Subtree bool   `json:"subtree,omitempty"`
	ReqID   string `json:"req_id,omitempty"`
	Call    int64  `json:"call"`   // first send
	Return  int64  `json:"return"` // definitive answer; MaxInt64 when unknown

	Out          string `json:"out"`
	OutToken     uint64 `json:"out_token,omitempty"`
	OutLease     string `json:"out_lease,omitempty"`
	OutProof     string `json:"out_proof,omitempty"`     // a grant's token_proof
	OutLeaseRef  string `json:"out_lease_ref,omitempty"` // and lease_ref
	Held         bool   `json:"held,omitempty"`          // get
	HolderClient string `json:"holder_client,omitempty"`
	HolderToken  uint64 `json:"holder_token,omitempty"`
	OutValue     string `json:"out_value,omitempty"` // elections: the leader's value a read saw

	Attempts int      `json:"attempts"`
	Via      []string `json:"via,omitempty"` // the node of each attempt
	Err      string   `json:"err,omitempty"` // last retryable error, or the unexpected answer
}

func (o Op) unknown() bool { return o.Out == oUnknown }

func (o Op) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "#%d [%s, %s] %s(inc %d) %s", o.ID, fmtT(o.Call), fmtT(o.Return), o.Client, o.Inc, o.Kind)
	if o.Lock != "" {
		fmt.Fprintf(&b, " %s", o.Lock)
	}
	if o.Session != "" {
		fmt.Fprintf(&b, " session=%.8s", o.Session)
	}
	if o.Token != 0 {
		fmt.Fprintf(&b, " token=%d", o.Token)
	}
	if o.Lease != "" {
		fmt.Fprintf(&b, " lease=%.8s", o.Lease)
	}
	if o.Value != "" {
		fmt.Fprintf(&b, " value=%q", o.Value)
	}
	if o.TTL != 0 {
		fmt.Fprintf(&b, " ttl=%s", time.Duration(o.TTL))
	}
	if o.Wait != 0 {
		fmt.Fprintf(&b, " wait=%s", time.Duration(o.Wait))
	}
	if o.Takeover {
		b.WriteString(" takeover")
	}
	fmt.Fprintf(&b, " -> %s", o.Out)
	if o.OutToken != 0 {
		fmt.Fprintf(&b, " token=%d", o.OutToken)
	}
	if o.OutLease != "" {
		fmt.Fprintf(&b, " lease=%.8s", o.OutLease)
	}
	if o.Kind == kGet && o.Out == oOK {
		if o.Held {
			fmt.Fprintf(&b, " held by %s token=%d", o.HolderClient, o.HolderToken)
			if o.OutValue != "" {
				fmt.Fprintf(&b, " value=%q", o.OutValue)
			}
		} else {
			b.WriteString(" free")
		}
	}
	if o.Out == oHeld || o.Out == oWaitTimeout {
		if o.HolderClient != "" {
			fmt.Fprintf(&b, " (holder %s token=%d)", o.HolderClient, o.HolderToken)
		}
	}
	fmt.Fprintf(&b, " req=%s attempts=%d via=%s", o.ReqID, o.Attempts, strings.Join(o.Via, ","))
	if o.Err != "" {
		fmt.Fprintf(&b, " err=%q", o.Err)
	}
	return b.String()
}

// write is one write to a fenced register.
type write struct {
	Seq      int    `json:"seq"`
	Lock     string `json:"lock"`
	Client   string `json:"client"`
	Inc      int    `json:"inc"`
	Token    uint64 `json:"token"`
	At       int64  `json:"at"`
	Bound    int64  `json:"bound"` // the writer's lease bound when it decided to write
	Paused   bool   `json:"paused,omitempty"`
	Accepted bool   `json:"accepted"`
	MaxSeen  uint64 `json:"max_seen"`      // the register's max token before this write
	Err      string `json:"err,omitempty"` // the checker failed (not a stale token)
}

// hold is one period in which a client believed it held a lock: from the
// receipt of the grant to the moment it stopped believing (it sent a
// release, its bound — send time of its last answered acquire/renew plus
// the TTL — passed, it was told it no longer holds, or it crashed).
type hold struct {
	Lock    string `json:"lock"`
	Client  string `json:"client"`
	Inc     int    `json:"inc"`
	Token   uint64 `json:"token"`
	Lease   string `json:"lease"`
	Session bool   `json:"session,omitempty"`
	Start   int64  `json:"start"`
	End     int64  `json:"end"`
	Why     string `json:"why"`
	GrantOp int    `json:"grant_op"`
	// The grant's kind, on the lock-model locks.
	Limit   int  `json:"limit,omitempty"`
	Shared  bool `json:"shared,omitempty"`
	Subtree bool `json:"subtree,omitempty"`
}

// history collects everything the checkers read.
type history struct {
	clk *clock
	mu  sync.Mutex

	ops    []*Op
	writes []*write
	holds  []*hold
	maxReg map[string]uint64 // the fenced registers: max token seen per lock
	// fence, when set, decides every fenced write: the fence package's
	// Checker, the one real resources use (useFence).
	fence *fence.Checker
}

// useFence makes the fenced registers a fence.Checker persisted at path.
func (h *history) useFence(path string) error {
	c, err := fence.Open(path)
	if err != nil {
		return err
	}
	h.fence = c
	return nil
}

func (h *history) closeFence() {
	if h.fence != nil {
		_ = h.fence.Close()
	}
}

func newHistory(clk *clock) *history {
	return &history{clk: clk, maxReg: map[string]uint64{}}
}

// begin records the start of an operation (its first send is now).
func (h *history) begin(op *Op) *Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	op.ID = len(h.ops)
	op.Call = h.clk.now()
	op.Return = math.MaxInt64
	op.Out = oUnknown
	h.ops = append(h.ops, op)
	return op
}

// end records a definitive answer (or gives up: out == oUnknown).
func (h *history) end(op *Op, out string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	op.Out = out
	if out == oUnknown {
		op.Return = math.MaxInt64
	} else {
		op.Return = h.clk.now()
	}
}

// fencedWrite is the fenced register: it accepts a write only if its token
// is above the highest it has seen for that lock, or equal and from the same
// holder (the grant writing again) — fence.Checker's rule, and with useFence
// fence.Checker itself decides. A writer that is not
// "paused" checks its bound atomically with the write (a correct client never
// writes after its bound); late reports such a write that was not made.
func (h *history) fencedWrite(lock, client string, inc int, token uint64, bound int64, paused bool) (accepted, late bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	at := h.clk.now()
	if !paused && at >= bound {
		return false, true
	}
	w := &write{Seq: len(h.writes), Lock: lock, Client: client, Inc: inc, Token: token, At: at, Bound: bound,
		Paused: paused, MaxSeen: h.maxReg[lock]}
	if h.fence != nil {
		err := h.fence.Check(lock, token, fmt.Sprintf("%s#%d", client, inc))
		w.Accepted = err == nil
		if err != nil && !errors.Is(err, fence.ErrStaleToken) {
			w.Err = err.Error()
		}
	} else {
		w.Accepted = token >= w.MaxSeen
	}
	if w.Accepted {
		h.maxReg[lock] = max(h.maxReg[lock], token)
	}
	h.writes = append(h.writes, w)
	return w.Accepted, false
}

func (h *history) addHold(hd *hold) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.holds = append(h.holds, hd)
}

// snapshot copies the history for the checkers (operations still in flight
// stay unknown).
func (h *history) snapshot() ([]Op, []write, []hold) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ops := make([]Op, len(h.ops))
	for i, o := range h.ops {
		ops[i] = *o
		ops[i].Via = append([]string(nil), o.Via...)
	}
	ws := make([]write, len(h.writes))
	for i, w := range h.writes {
		ws[i] = *w
	}
	hs := make([]hold, len(h.holds))
	for i, x := range h.holds {
		hs[i] = *x
	}
	return ops, ws, hs
}

// dumpJSON writes the history as JSON lines (one object per line, tagged).
func dumpJSON(path string, ops []Op, ws []write, hs []hold, faults []faultEvent) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	enc := json.NewEncoder(f)
	for i := range faults {
		if err := enc.Encode(map[string]any{"fault": faults[i]}); err != nil {
			return err
		}
	}
	for i := range ops {
		if err := enc.Encode(map[string]any{"op": ops[i]}); err != nil {
			return err
		}
	}
	for i := range ws {
		if err := enc.Encode(map[string]any{"write": ws[i]}); err != nil {
			return err
		}
	}
	for i := range hs {
		if err := enc.Encode(map[string]any{"hold": hs[i]}); err != nil {
			return err
		}
	}
	return nil
}

// opsSlice formats the operations on lock (all locks if "") that overlap
// [from, to], at most max of them.
func opsSlice(ops []Op, lock string, from, to int64, max int) string {
	var sel []Op
	for _, o := range ops {
		if lock != "" && o.Lock != lock {
			continue
		}
		if o.Return < from || o.Call > to {
			continue
		}
		sel = append(sel, o)
	}
	sort.Slice(sel, func(i, j int) bool { return sel[i].Call < sel[j].Call })
	var b strings.Builder
	if len(sel) > max {
		fmt.Fprintf(&b, "    (%d operations; showing the %d nearest)\n", len(sel), max)
		mid := (from + to) / 2
		sort.Slice(sel, func(i, j int) bool { return absDist(sel[i].Call, mid) < absDist(sel[j].Call, mid) })
		sel = sel[:max]
		sort.Slice(sel, func(i, j int) bool { return sel[i].Call < sel[j].Call })
	}
	for _, o := range sel {
		fmt.Fprintf(&b, "    %s\n", o.String())
	}
	return b.String()
}

func absDist(a, b int64) int64 {
	if a > b {
		return a - b
	}
	return b - a
}
