package chaos

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// The linearizability model of one lock (design.md §3), for porcupine.
//
// State: who holds the lock (client, lease, token) and the highest token
// granted on it so far. Operations: acquire (try, or wait in line; with
// ttl_ms or under a session), release, renew, and linearizable GET.
//
// Expiry is the hard part: a lease can end at any moment after its TTL runs
// out, with no operation in the history. The model makes it time-aware and
// conservative. design.md §3/§6 promise that a lease is not expired before
// t_send + TTL, where t_send is when its holder sent the last acquire/renew
// (keepalive, for a session) that succeeded. From the whole history the
// checker computes, for every lease, freeAfter = max over its successful
// grant/renew operations of (call time + TTL) — and for a session also the
// call time of a delete. Before applying any operation whose *return* is at or
// after the holder's freeAfter, the model may also let the holder's lease end
// (a nondeterministic step); before that it may not. So:
//
//   - an expiry earlier than the promise (a grant to someone else, a
//     not_holder, a GET showing the lock free while the lease must still be
//     alive) is a violation;
//   - an expiry later than the promise is allowed (the service may keep a
//     lease up to about one election longer; the liveness checker bounds it);
//   - locks with a 600 s TTL (hot/a, hot/d) never expire in a run, so every
//     operation on them is checked exactly.
//
// The wait queue is not modelled as a queue: a blocking acquire that
// succeeds linearizes at its grant, which the model accepts only when the
// lock is free at that point (the hand-off on release/expiry frees it and
// grants it in one step, which the model sees as a release immediately
// followed by the waiter's acquire). FIFO order is checked separately in the
// liveness phase. An operation without a definitive answer (unknown) may have
// happened or not: both next states are kept.

type mIn struct {
	Kind    string
	Client  string
	Session string // acquire under a session: the session id (it is the lease)
	Lease   string // release/renew
	Token   uint64 // release/renew
	TTL     int64
	Wait    bool
	// Takeover: the acquire may take the lock from the same client's
	// other lease.
	Takeover bool
	Value    string // elections: campaign/proclaim value
	// Election: the key is an election.
	Election bool
	Call     int64
	Return   int64
}

type mOut struct {
	Out          string
	Token        uint64
	Lease        string
	Held         bool
	HolderClient string
	HolderToken  uint64
	Value        string // elections: the value a read saw
}

type mState struct {
	Held      bool
	Client    string
	Lease     string // "" when the grant's answer was lost
	Token     uint64 // 0 when the grant's answer was lost (bound by a later read)
	FreeAfter int64  // the lease may end at or after this time
	Last      uint64 // highest token granted on this lock so far
	Value     string // elections: the leader's value
	// Floor is the earliest time the operations still to linearize can
	// take effect: an expiry at FreeAfter moves it there, and an operation
	// that returned before it cannot come after that expiry.
	Floor int64
}

func (s mState) String() string {
	if !s.Held {
		return fmt.Sprintf("free (last token %d)", s.Last)
	}
	v := ""
	if s.Value != "" {
		v = fmt.Sprintf(" value=%q", s.Value)
	}
	return fmt.Sprintf("held by %s token=%d lease=%.8s%s may-expire-after=%s (last token %d)", s.Client, s.Token, s.Lease, v, fmtT(s.FreeAfter), s.Last)
}

// leaseBounds are the freeAfter times computed from the whole history.
type leaseBounds struct {
	implicit map[string]int64 // lease id → max(call+TTL) of its successful grant/renewals
	session  map[string]int64 // session id → min(delete call, max(call+TTL) of create/keepalives)
}

func computeLeaseBounds(ops []Op) leaseBounds {
	lb := leaseBounds{implicit: map[string]int64{}, session: map[string]int64{}}
	leaseTTL := map[string]int64{}
	sessTTL := map[string]int64{}
	for _, o := range ops {
		if o.Kind == kAcquire && o.Out == oOK && o.Session == "" {
			leaseTTL[o.OutLease] = o.TTL
		}
		if o.Kind == kSessCreate && o.Out == oOK {
			sessTTL[o.Session] = o.TTL
		}
	}
	deleted := map[string]int64{}
	for _, o := range ops {
		switch {
		case o.Kind == kAcquire && o.Out == oOK && o.Session == "":
			lb.implicit[o.OutLease] = max(lb.implicit[o.OutLease], o.Call+o.TTL)
		case o.Kind == kRenew && o.Out == oOK:
			if ttl, ok := leaseTTL[o.Lease]; ok {
				lb.implicit[o.Lease] = max(lb.implicit[o.Lease], o.Call+ttl)
			}
		case (o.Kind == kSessCreate || o.Kind == kKeepAlive) && o.Out == oOK:
			if ttl, ok := sessTTL[o.Session]; ok {
				lb.session[o.Session] = max(lb.session[o.Session], o.Call+ttl)
			}
		case o.Kind == kSessDelete && (o.Out == oOK || o.Out == oUnknown):
			if d, ok := deleted[o.Session]; !ok || o.Call < d {
				deleted[o.Session] = o.Call
			}
		}
	}
	for s, d := range deleted {
		if b, ok := lb.session[s]; !ok || d < b {
			lb.session[s] = d
		}
	}
	return lb
}

// sessionFreeAfter is when a session may be gone (0: at any time — a session
// never acknowledged).
func (lb leaseBounds) sessionFreeAfter(sid string) int64 { return lb.session[sid] }

type lockModel struct{ lb leaseBounds }

func (m *lockModel) freeAfterGrant(in mIn, lease string) int64 {
	if in.Session != "" {
		return m.lb.sessionFreeAfter(in.Session)
	}
	if lease != "" {
		if b, ok := m.lb.implicit[lease]; ok {
			return b
		}
	}
	return in.Call + in.TTL
}

func (m *lockModel) step(st any, input any, output any) []any {
	s, in, out := st.(mState), input.(mIn), output.(mOut)
	if in.Return < s.Floor {
		// It returned before an expiry already taken: it took effect
		// before that expiry, not after.
		return nil
	}
	pres := []mState{s}
	if s.Held && in.Return >= s.FreeAfter {
		// The lease ended just before, at FreeAfter or later: so does
		// every operation linearized from here on.
		pres = append(pres, mState{Last: s.Last, Floor: max(s.Floor, s.FreeAfter)})
	}
	var next []any
	for _, p := range pres {
		for _, n := range m.apply(p, in, out) {
			ns := n.(mState)
			ns.Floor = p.Floor
			next = append(next, ns)
		}
	}
	return next
}

// bindUnknown fills in the token of a holder whose grant answer was lost,
// from a later answer naming the holder; false if it cannot be that holder.
func bindUnknown(p mState, client string, token uint64) (mState, bool) {
	if !p.Held || p.Client != client {
		return p, false
	}
	if p.Token == token {
		return p, true
	}
	if p.Token == 0 && token > p.Last {
		p.Token, p.Last = token, token
		return p, true
	}
	return p, false
}

func (m *lockModel) apply(p mState, in mIn, out mOut) []any {
	one := func(s mState) []any { return []any{s} }
	switch in.Kind {
	case kAcquire:
		grant := func(token uint64, lease string) mState {
			return mState{Held: true, Client: in.Client, Lease: lease, Token: token,
				FreeAfter: m.freeAfterGrant(in, lease), Last: max(p.Last, token), Value: in.Value}
		}
		sameLease := in.Session != "" && p.Held && p.Lease == in.Session
		// takesOver: held by this client under another lease, and the
		// acquire asked to take it over. Without the flag the same
		// client_id is like any other: it is refused or waits.
		takesOver := in.Takeover && p.Held && p.Client == in.Client
		switch out.Out {
		case oOK:
			switch {
			case sameLease && p.Client == in.Client:
				// Acquire by the lease that holds it: same token.
				if s, ok := bindUnknown(p, in.Client, out.Token); ok {
					return one(s)
				}
			case !p.Held, takesOver:
				// A free lock, or a takeover by the same client_id with a new lease.
				if out.Token > p.Last {
					return one(grant(out.Token, out.Lease))
				}
			}
			return nil
		case oHeld:
			if in.Wait || !p.Held || takesOver || sameLease {
				return nil
			}
			if in.Election {
				// An election's conflict names the leader from the answering
				// node's own state (see checkConflictHolders, which checks it
				// on its own); here it only has to be a conflict.
				return one(p)
			}
			if s, ok := bindUnknown(p, out.HolderClient, out.HolderToken); ok {
				return one(s)
			}
			return nil
		case oLost:
			// Granted with this token, and ended before the answer: the grant
			// is a step like any other; its lease (unknown to the client, which
			// never held it) may end from its promise on.
			if (!p.Held || takesOver) && out.Token > p.Last {
				return one(grant(out.Token, ""))
			}
			return nil
		case oWaitTimeout:
			if in.Wait && p.Held && !takesOver && !sameLease {
				return one(p)
			}
			return nil
		case oNoSession:
			if in.Session != "" && in.Return >= m.lb.sessionFreeAfter(in.Session) {
				return one(p)
			}
			return nil
		case oUnknown:
			res := []any{p}
			lease := in.Session
			switch {
			case sameLease && p.Client == in.Client:
			case !p.Held, takesOver:
				g := grant(0, lease)
				g.Last = p.Last
				if lease == "" {
					g.FreeAfter = in.Call + in.TTL
				}
				res = append(res, g)
			}
			return res
		default: // oError: reported elsewhere; no effect assumed
			return one(p)
		}
	case kRelease, kRenew, kProclaim:
		match := p.Held && p.Client == in.Client && p.Lease == in.Lease && p.Token == in.Token
		proclaimed := p
		proclaimed.Value = in.Value
		switch out.Out {
		case oOK:
			if !match {
				return nil
			}
			switch in.Kind {
			case kRelease:
				return one(mState{Last: p.Last})
			case kProclaim:
				return one(proclaimed)
			}
			return one(p)
		case oNotHolder:
			if match {
				return nil
			}
			return one(p)
		case oUnknown:
			if match && in.Kind == kRelease {
				return []any{p, mState{Last: p.Last}}
			}
			if match && in.Kind == kProclaim {
				return []any{p, proclaimed}
			}
			return one(p)
		default:
			return one(p)
		}
	case kGet:
		switch out.Out {
		case oOK:
			if !out.Held {
				if p.Held {
					return nil
				}
				return one(p)
			}
			if s, ok := bindUnknown(p, out.HolderClient, out.HolderToken); ok && s.Value == out.Value {
				return one(s)
			}
			return nil
		default:
			return one(p)
		}
	}
	return one(p)
}

func (m *lockModel) porcupine() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Init: func() []any { return []any{mState{}} },
		Step: m.step,
		DescribeOperation: func(input, output any) string {
			in, out := input.(mIn), output.(mOut)
			s := fmt.Sprintf("%s %s", in.Client, in.Kind)
			if in.Token != 0 {
				s += fmt.Sprintf(" t%d", in.Token)
			}
			if in.Wait {
				s += " (wait)"
			}
			if in.Takeover {
				s += " (takeover)"
			}
			s += " → " + out.Out
			switch {
			case out.Token != 0:
				s += fmt.Sprintf(" t%d", out.Token)
			case out.Held || out.HolderClient != "":
				s += fmt.Sprintf(" [%s t%d]", out.HolderClient, out.HolderToken)
			case in.Kind == kGet && out.Out == oOK:
				s += " free"
			}
			return s
		},
		DescribeState: func(st any) string { return st.(mState).String() },
	}
	return nm.ToModel()
}

func toPorcupine(ops []Op) map[string][]porcupine.Operation {
	by := map[string][]porcupine.Operation{}
	for _, o := range ops {
		// A model lock's grants overlap by design: checkModelHolds.
		if o.Lock == "" || o.Out == oError || isModelLock(o.Lock) {
			continue
		}
		switch o.Kind {
		case kAcquire, kRelease, kRenew, kGet, kProclaim:
		default:
			continue
		}
		in := mIn{Kind: o.Kind, Client: o.Client, Session: o.Session, Lease: o.Lease, Token: o.Token,
			TTL: o.TTL, Wait: o.Wait > 0, Takeover: o.Takeover, Value: o.Value, Election: isElection(o.Lock), Call: o.Call, Return: o.Return}
		if o.Kind == kRelease && o.Session != "" {
			in.Session = ""
		}
		out := mOut{Out: o.Out, Token: o.OutToken, Lease: o.OutLease, Held: o.Held,
			HolderClient: o.HolderClient, HolderToken: o.HolderToken, Value: o.OutValue}
		ret := o.Return
		if o.Out == oUnknown {
			ret = math.MaxInt64
		}
		by[o.Lock] = append(by[o.Lock], porcupine.Operation{ClientId: o.Proc, Input: in, Output: out, Call: o.Call, Return: ret, Metadata: o.ID})
	}
	return by
}

// linResult is the outcome of the linearizability check of one lock.
type linResult struct {
	lock   string
	ops    int
	result porcupine.CheckResult
	took   time.Duration
	detail string // for Illegal: the offending slice
	html   string // visualization file
}

// checkLinearizable checks every lock's history, each bounded by perLock.
func checkLinearizable(ops []Op, perLock time.Duration, outDir string) []linResult {
	m := &lockModel{lb: computeLeaseBounds(ops)}
	model := m.porcupine()
	byLock := toPorcupine(ops)
	locks := make([]string, 0, len(byLock))
	for l := range byLock {
		locks = append(locks, l)
	}
	sort.Strings(locks)
	opByID := map[int]Op{}
	for _, o := range ops {
		opByID[o.ID] = o
	}
	var res []linResult
	for _, l := range locks {
		h := byLock[l]
		start := time.Now()
		r := porcupine.CheckOperationsTimeout(model, h, perLock)
		lr := linResult{lock: l, ops: len(h), result: r, took: time.Since(start)}
		if r == porcupine.Illegal {
			_, info := porcupine.CheckOperationsVerbose(model, h, perLock)
			lr.detail = describeIllegal(info, h, opByID)
			if outDir != "" {
				p := filepath.Join(outDir, "linearizability-"+strings.ReplaceAll(l, "/", "_")+".html")
				if f, err := os.Create(p); err == nil {
					if porcupine.Visualize(model, info, f) == nil {
						lr.html = p
					}
					f.Close()
				}
			}
		}
		res = append(res, lr)
	}
	return res
}

// describeIllegal prints the end of the longest linearizable prefix and the
// operations that could not be linearized after it.
func describeIllegal(info porcupine.LinearizationInfo, h []porcupine.Operation, opByID map[int]Op) string {
	var b strings.Builder
	partials := info.PartialLinearizationsOperations()
	var longest []porcupine.Operation
	for _, part := range partials {
		for _, lin := range part {
			if len(lin) > len(longest) {
				longest = lin
			}
		}
	}
	done := map[int]bool{}
	for _, o := range longest {
		done[o.Metadata.(int)] = true
	}
	fmt.Fprintf(&b, "  longest linearizable prefix: %d of %d operations; its last ones:\n", len(longest), len(h))
	from := max(0, len(longest)-12)
	for _, o := range longest[from:] {
		fmt.Fprintf(&b, "    %s\n", opByID[o.Metadata.(int)].String())
	}
	var rest []Op
	for _, o := range h {
		if id := o.Metadata.(int); !done[id] {
			rest = append(rest, opByID[id])
		}
	}
	sort.Slice(rest, func(i, j int) bool { return rest[i].Call < rest[j].Call })
	fmt.Fprintf(&b, "  operations that could not be linearized after it (earliest first, %d in all):\n", len(rest))
	for i, o := range rest {
		if i == 12 {
			break
		}
		fmt.Fprintf(&b, "    %s\n", o.String())
	}
	return b.String()
}
