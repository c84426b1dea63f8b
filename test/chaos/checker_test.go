package chaos

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/dlock/dlock/fence"
)

// anomaly is one thing the suite found wrong.
type anomaly struct {
	Kind   string // safety:…, durability:…, liveness:…, api:…
	What   string
	Detail string // the offending history slice
}

func (a anomaly) String() string {
	s := fmt.Sprintf("[%s] %s", a.Kind, a.What)
	if a.Detail != "" {
		s += "\n" + strings.TrimRight(a.Detail, "\n")
	}
	return s
}

// checkHolds: no two holds of one lock overlap. A hold runs from the receipt
// of the grant to when its client stopped believing (design.md §6 bound: the
// send time of its last answered acquire/renew plus the TTL, or earlier).
func checkHolds(ops []Op, holds []hold) []anomaly {
	by := map[string][]hold{}
	for _, h := range holds {
		if h.End > h.Start && !isModelLock(h.Lock) { // checkModelHolds
			by[h.Lock] = append(by[h.Lock], h)
		}
	}
	var out []anomaly
	for lock, hs := range by {
		sort.Slice(hs, func(i, j int) bool { return hs[i].Start < hs[j].Start })
		maxI := -1
		for i := range hs {
			if maxI >= 0 && hs[i].Start < hs[maxI].End {
				a, b := hs[maxI], hs[i]
				out = append(out, anomaly{
					Kind: "safety:two-holders",
					What: fmt.Sprintf("%s: %s(inc %d) held it with token %d during [%s, %s] (%s) while %s(inc %d) held it with token %d from %s (%s)",
						lock, a.Client, a.Inc, a.Token, fmtT(a.Start), fmtT(a.End), a.Why, b.Client, b.Inc, b.Token, fmtT(b.Start), b.Why),
					Detail: opsSlice(ops, lock, a.Start-int64(time.Second), b.Start+int64(time.Second), 30),
				})
			}
			if maxI < 0 || hs[i].End > hs[maxI].End {
				maxI = i
			}
		}
	}
	return out
}

// checkTokens: fencing tokens are unique (one grant per token), strictly
// increasing in real-time grant order (a grant answered before another was
// asked for has a smaller token — across all locks of a shard, since each
// shard's counter is shard-wide, and so across restarts), and every token a
// read or a conflict names belongs to the grant it names. Tokens of
// different shards are not comparable (docs/architecture.md, "Tokens and
// revisions"): each shard's operations are checked on their own.
func checkTokens(ops []Op, m shardMap) []anomaly {
	by := make([][]Op, m.n())
	for _, o := range ops {
		k := m.of(o.Lock)
		by[k] = append(by[k], o)
	}
	var out []anomaly
	for k, part := range by {
		for _, a := range checkTokensIn(part) {
			a.What = shardPrefix(m, k) + a.What
			out = append(out, a)
		}
	}
	return out
}

// checkTokensIn is checkTokens over the operations of one counter.
func checkTokensIn(ops []Op) []anomaly {
	type grant struct {
		op    Op
		token uint64
		lease string
	}
	var grants []grant
	owner := map[uint64]Op{}
	var out []anomaly
	for _, o := range ops {
		if o.Kind != kAcquire || o.Out != oOK {
			continue
		}
		g := grant{op: o, token: o.OutToken, lease: o.OutLease}
		if prev, ok := owner[g.token]; ok {
			if prev.Lock != o.Lock || prev.OutLease != o.OutLease {
				out = append(out, anomaly{Kind: "safety:token-reused",
					What:   fmt.Sprintf("token %d granted twice: op #%d (%s lease %.8s) and op #%d (%s lease %.8s)", g.token, prev.ID, prev.Lock, prev.OutLease, o.ID, o.Lock, o.OutLease),
					Detail: "    " + prev.String() + "\n    " + o.String() + "\n"})
			}
			continue
		}
		owner[g.token] = o
		grants = append(grants, g)
	}
	byCall := append([]grant(nil), grants...)
	sort.Slice(byCall, func(i, j int) bool { return byCall[i].op.Call < byCall[j].op.Call })
	byRet := append([]grant(nil), grants...)
	sort.Slice(byRet, func(i, j int) bool { return byRet[i].op.Return < byRet[j].op.Return })
	j := 0
	var maxG *grant
	for i := range byCall {
		g := byCall[i]
		for j < len(byRet) && byRet[j].op.Return < g.op.Call {
			if maxG == nil || byRet[j].token > maxG.token {
				maxG = &byRet[j]
			}
			j++
		}
		if maxG != nil && maxG.token >= g.token && maxG.op.ID != g.op.ID {
			out = append(out, anomaly{Kind: "safety:token-order",
				What: fmt.Sprintf("token went backwards: op #%d was granted token %d at %s, but op #%d, asked for only at %s, got token %d",
					maxG.op.ID, maxG.token, fmtT(maxG.op.Return), g.op.ID, fmtT(g.op.Call), g.token),
				Detail: "    " + maxG.op.String() + "\n    " + g.op.String() + "\n"})
		}
	}
	// Holder tokens named by reads and conflicts belong to the right client and lock.
	for _, o := range ops {
		if o.HolderToken == 0 {
			continue
		}
		if g, ok := owner[o.HolderToken]; ok && (g.Client != o.HolderClient || g.Lock != o.Lock) {
			out = append(out, anomaly{Kind: "safety:token-mismatch",
				What:   fmt.Sprintf("op #%d names holder %s with token %d on %s, but token %d was granted to %s on %s (op #%d)", o.ID, o.HolderClient, o.HolderToken, o.Lock, o.HolderToken, g.Client, g.Lock, g.ID),
				Detail: "    " + g.String() + "\n    " + o.String() + "\n"})
		}
	}
	return out
}

// fenceStats summarises the fenced registers.
type fenceStats struct {
	writes, accepted, rejected            int
	pausedWrites, pausedRejected          int
	pausedAcceptedAfterNewerGrant         int // accepted although a newer grant existed (the newer holder had not written yet)
	inBoundRejected, acceptedUnknownToken int
}

// checkFence: a write made inside its writer's bound is never rejected (it
// would mean a newer token was written while the writer's lease must still
// have been alive), and every accepted token is one the service granted to
// that client on that lock.
func checkFence(ops []Op, ws []write) ([]anomaly, fenceStats) {
	var st fenceStats
	var out []anomaly
	// A register belongs to one lock, so its tokens are looked up per lock
	// (tokens repeat across the shards of a sharded cluster).
	type grantOf struct {
		lock  string
		token uint64
	}
	owner := map[grantOf]Op{}
	var grants []Op
	for _, o := range ops {
		if o.Kind == kAcquire && o.Out == oOK {
			owner[grantOf{o.Lock, o.OutToken}] = o
			grants = append(grants, o)
		}
	}
	lastWriter := map[string]write{}
	for _, w := range ws {
		st.writes++
		if w.Err != "" {
			out = append(out, anomaly{Kind: "harness:fence-checker-failed",
				What: fmt.Sprintf("the fenced register could not decide %s's write to %s with token %d: %s", w.Client, w.Lock, w.Token, w.Err)})
			continue
		}
		if w.Accepted {
			st.accepted++
		} else {
			st.rejected++
		}
		if g, ok := owner[grantOf{w.Lock, w.Token}]; !ok || g.Client != w.Client {
			if w.Accepted {
				st.acceptedUnknownToken++
				out = append(out, anomaly{Kind: "safety:fence-unknown-token",
					What: fmt.Sprintf("%s's register accepted %s's write with token %d, which no acknowledged grant gave it", w.Lock, w.Client, w.Token)})
			} else {
				// The register did its job, but a client of the harness only
				// writes with its own acknowledged grant's token, so the
				// history and the writes disagree.
				out = append(out, anomaly{Kind: "harness:write-with-unknown-token",
					What: fmt.Sprintf("%s wrote to %s's register with token %d, which no acknowledged grant gave it (the register rejected it)", w.Client, w.Lock, w.Token)})
			}
		}
		if w.Paused {
			st.pausedWrites++
			if !w.Accepted {
				st.pausedRejected++
			} else {
				for _, g := range grants {
					if g.Lock == w.Lock && g.OutToken > w.Token && g.Return < w.At {
						st.pausedAcceptedAfterNewerGrant++
						break
					}
				}
			}
		} else if !w.Accepted {
			st.inBoundRejected++
			prev := lastWriter[w.Lock]
			out = append(out, anomaly{Kind: "safety:fenced-out-inside-bound",
				What: fmt.Sprintf("%s's write to %s with token %d at %s, inside its bound (until %s), was rejected: token %d had already been written (by %s at %s)",
					w.Client, w.Lock, w.Token, fmtT(w.At), fmtT(w.Bound), w.MaxSeen, prev.Client, fmtT(prev.At)),
				Detail: opsSlice(ops, w.Lock, prev.At-int64(2*time.Second), w.At+int64(time.Second), 30)})
		}
		if w.Accepted {
			lastWriter[w.Lock] = w
		}
	}
	return out, st
}

// checkSessions: an acknowledged session is not gone before its bound (send
// time of its last successful create/keepalive plus its TTL) unless it was
// deleted, and never comes back once gone.
func checkSessions(ops []Op) []anomaly {
	ttl := map[string]int64{}
	for _, o := range ops {
		if o.Kind == kSessCreate && o.Out == oOK {
			ttl[o.Session] = o.TTL
		}
	}
	type sref struct{ ok, gone []Op }
	by := map[string]*sref{}
	deleted := map[string]int64{}
	for _, o := range ops {
		if o.Session == "" || o.Kind == kRelease {
			continue
		}
		if _, known := ttl[o.Session]; !known {
			continue
		}
		r := by[o.Session]
		if r == nil {
			r = &sref{}
			by[o.Session] = r
		}
		switch {
		case o.Kind == kSessDelete && (o.Out == oOK || o.Out == oUnknown):
			if d, ok := deleted[o.Session]; !ok || o.Call < d {
				deleted[o.Session] = o.Call
			}
		case (o.Kind == kSessCreate || o.Kind == kKeepAlive) && o.Out == oOK:
			r.ok = append(r.ok, o)
		case o.Out == oNoSession:
			r.gone = append(r.gone, o)
		}
	}
	var out []anomaly
	for sid, r := range by {
		for _, n := range r.gone {
			if d, ok := deleted[sid]; ok && d <= n.Return {
				continue
			}
			for _, s := range r.ok {
				if s.Call+ttl[sid] > n.Return {
					what := fmt.Sprintf("session %.8s was reported gone at %s (op #%d) but a keepalive/create sent at %s (op #%d) promised it until %s",
						sid, fmtT(n.Return), n.ID, fmtT(s.Call), s.ID, fmtT(s.Call+ttl[sid]))
					if s.Call > n.Return {
						what = fmt.Sprintf("session %.8s was reported gone at %s (op #%d) and then kept alive again at %s (op #%d)", sid, fmtT(n.Return), n.ID, fmtT(s.Call), s.ID)
					}
					out = append(out, anomaly{Kind: "durability:session-lost", What: what,
						Detail: "    " + s.String() + "\n    " + n.String() + "\n"})
					break
				}
			}
		}
	}
	return out
}

// checkAPI reports answers a correct service never gives: 500s and
// unexpected statuses, and operations that never got an answer after the
// cluster was healed.
func checkAPI(ops []Op, healedAt int64, internal500 int64) []anomaly {
	var out []anomaly
	for _, o := range ops {
		switch {
		case o.Out == oError:
			out = append(out, anomaly{Kind: "api:unexpected-answer", What: o.String()})
		case o.Out == oUnknown && healedAt > 0 && o.Call > healedAt:
			out = append(out, anomaly{Kind: "liveness:no-answer", What: "no definitive answer within the op's deadline after healing: " + o.String()})
		}
	}
	if internal500 > 0 {
		out = append(out, anomaly{Kind: "api:internal-error", What: fmt.Sprintf("%d answers were 500 internal (a bug by the API's own definition); see the ops' err fields", internal500)})
	}
	return out
}

// checkConflictHolders: a conflict answer (409 lock_held) names the holder at
// the time it was decided (or, for an election, a state read after it). It is
// provably stale when the holder it names had already been released — its
// release/resign answered — before the request was sent; and naming nobody is
// provably wrong on a key that cannot expire (600 s TTL) when no release of it
// overlaps the request. (The linearizability model checks lock
// conflicts exactly; for elections, whose 409 builds "current" from the
// answering node's local state, this checker reports the problem once with a
// count, so the model can go on checking the rest of the history.)
func checkConflictHolders(ops []Op) []anomaly {
	releasedAt := map[string]int64{} // key+token → when its release/resign was answered
	releases := map[string][]Op{}    // key → releases that may have happened
	longKey := map[string]bool{}
	for _, o := range ops {
		if o.Kind == kRelease && (o.Out == oOK || o.Out == oUnknown) {
			releases[o.Lock] = append(releases[o.Lock], o)
		}
		if o.Kind == kRelease && o.Out == oOK {
			k := fmt.Sprintf("%s#%d", o.Lock, o.Token)
			if t, ok := releasedAt[k]; !ok || o.Return < t {
				releasedAt[k] = o.Return
			}
		}
		if o.Kind == kAcquire && o.TTL == int64(longTTL) {
			longKey[o.Lock] = true
		}
	}
	releaseOverlaps := func(o Op) bool {
		for _, r := range releases[o.Lock] {
			if r.Call <= o.Return && r.Return >= o.Call {
				return true
			}
		}
		return false
	}
	type agg struct {
		n       int
		missing int
		example Op
		why     string
	}
	by := map[string]*agg{}
	for _, o := range ops {
		// A model lock's refusal may name a holder of another lock, or
		// none (only waiters ahead): checkModelHolds covers them.
		if o.Kind != kAcquire || o.Out != oHeld || isModelLock(o.Lock) {
			continue
		}
		why := ""
		switch {
		case o.HolderClient == "":
			if longKey[o.Lock] && !releaseOverlaps(o) {
				why = "names no holder (the key cannot expire and nobody released it meanwhile)"
			}
		default:
			if t, ok := releasedAt[fmt.Sprintf("%s#%d", o.Lock, o.HolderToken)]; ok && t < o.Call {
				why = fmt.Sprintf("names %s with token %d, released at %s, before the request was sent", o.HolderClient, o.HolderToken, fmtT(t))
			}
		}
		if why == "" {
			continue
		}
		kind := "lock"
		if isElection(o.Lock) {
			kind = "election"
		}
		a := by[kind]
		if a == nil {
			a = &agg{example: o, why: why}
			by[kind] = a
		}
		a.n++
		if o.HolderClient == "" {
			a.missing++
		}
	}
	var out []anomaly
	for kind, a := range by {
		out = append(out, anomaly{Kind: "api:stale-conflict-holder",
			What: fmt.Sprintf("%d %s conflict answers (409 lock_held) named a holder that was provably not the holder (%d named none); e.g. op #%d %s",
				a.n, kind, a.missing, a.example.ID, a.why),
			Detail: "    " + a.example.String() + "\n"})
	}
	return out
}

// signedKey is the lock-table key a grant's proof is signed over (fence's
// lock argument): the lock's name, or "@e/" and the election's name.
func signedKey(lock string) string {
	if isElection(lock) {
		return "@e/" + realName(lock)
	}
	return lock
}

// checkProofs: every grant answered carries a token proof that verifies
// offline with the published keys, for exactly its lock, token, client and
// lease reference — whichever node answered, whether it signed the grant
// itself or relayed the leader's signature (a follower's forwarded grant).
// It returns the anomalies and how many proofs verified.
func checkProofs(ops []Op, ks *fence.KeySet) ([]anomaly, int) {
	var out []anomaly
	verified := 0
	for _, o := range ops {
		if o.Kind != kAcquire || o.Out != oOK {
			continue
		}
		if o.OutProof == "" {
			out = append(out, anomaly{Kind: "safety:proof-missing",
				What: fmt.Sprintf("op #%d: grant of %s token %d answered without a token_proof (via %v)", o.ID, o.Lock, o.OutToken, o.Via)})
			continue
		}
		if err := ks.Verify(signedKey(o.Lock), o.OutToken, o.Client, o.OutLeaseRef, o.OutProof); err != nil {
			out = append(out, anomaly{Kind: "safety:proof-invalid",
				What:   fmt.Sprintf("op #%d: the token_proof of %s token %d does not verify (via %v): %v", o.ID, o.Lock, o.OutToken, o.Via, err),
				Detail: "    " + o.String() + "\n"})
			continue
		}
		verified++
	}
	return out, verified
}

// checkModelHolds: on the lock-model locks (modelLocks), the holds — each
// from the receipt of a grant to when its client stopped believing — never
// break the lock model: a counting lock never has more than its limit of
// holders at once, an exclusive holder never overlaps another holder of its
// lock, and a subtree holder never overlaps a holder inside its subtree
// unless both are shared. (Tokens stay strictly increasing: checkTokens
// covers every grant, these too.)
func checkModelHolds(ops []Op, holds []hold) []anomaly {
	var hs []hold
	for _, h := range holds {
		if h.End > h.Start && isModelLock(h.Lock) {
			hs = append(hs, h)
		}
	}
	sort.Slice(hs, func(i, j int) bool { return hs[i].Start < hs[j].Start })
	var out []anomaly
	report := func(kind string, a, b hold, why string) {
		out = append(out, anomaly{Kind: kind,
			What: fmt.Sprintf("%s: %s(inc %d) held %s with token %d (shared %v, subtree %v) during [%s, %s] while %s(inc %d) held %s with token %d (shared %v, subtree %v) from %s",
				why, a.Client, a.Inc, a.Lock, a.Token, a.Shared, a.Subtree, fmtT(a.Start), fmtT(a.End), b.Client, b.Inc, b.Lock, b.Token, b.Shared, b.Subtree, fmtT(b.Start)),
			Detail: opsSlice(ops, b.Lock, a.Start-int64(time.Second), b.Start+int64(time.Second), 30)})
	}
	inside := func(name, root string) bool { return strings.HasPrefix(name, root+"/") }
	var active []hold
	for _, h := range hs {
		live := active[:0]
		for _, a := range active {
			if a.End > h.Start {
				live = append(live, a)
			}
		}
		active = live
		same := 0
		for _, a := range active {
			switch {
			case a.Lock == h.Lock && h.Limit > 1:
				same++
				if same >= h.Limit {
					report("safety:over-limit", a, h, fmt.Sprintf("%s has limit %d but %d holders at once", h.Lock, h.Limit, same+1))
				}
			case a.Lock == h.Lock && !(a.Shared && h.Shared):
				report("safety:exclusive-overlap", a, h, "an exclusive holder overlaps another holder")
			case (a.Subtree && inside(h.Lock, a.Lock) || h.Subtree && inside(a.Lock, h.Lock)) && !(a.Shared && h.Shared):
				report("safety:subtree-overlap", a, h, "a subtree holder overlaps a holder inside its subtree")
			}
		}
		active = append(active, h)
	}
	return out
}

// modelStats says what checkModelHolds had to check: the holds of each
// lock-model lock and the most that overlapped at once (more than one shows
// the counting and shared locks were really held side by side).
func modelStats(holds []hold) string {
	by := map[string][]hold{}
	for _, h := range holds {
		if h.End > h.Start && isModelLock(h.Lock) {
			by[h.Lock] = append(by[h.Lock], h)
		}
	}
	locks := make([]string, 0, len(by))
	for l := range by {
		locks = append(locks, l)
	}
	sort.Strings(locks)
	var parts []string
	for _, l := range locks {
		type edge struct {
			at int64
			d  int
		}
		var es []edge
		for _, h := range by[l] {
			es = append(es, edge{h.Start, 1}, edge{h.End, -1})
		}
		sort.Slice(es, func(i, j int) bool { return es[i].at < es[j].at || es[i].at == es[j].at && es[i].d < es[j].d })
		cur, most := 0, 0
		for _, e := range es {
			cur += e.d
			most = max(most, cur)
		}
		parts = append(parts, fmt.Sprintf("%s %d (at most %d at once)", l, len(by[l]), most))
	}
	return strings.Join(parts, ", ")
}
