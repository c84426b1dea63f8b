package state

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/dlock/dlock/internal/command"
)

// lid is a lease id chosen by the test, as the leader would draw one.
func lid(n int) command.LeaseID {
	var id command.LeaseID
	id[0] = 0xA5
	id[1] = byte(n >> 16)
	id[2] = byte(n >> 8)
	id[3] = byte(n)
	for i := 4; i < 16; i++ {
		id[i] = byte(n*7 + i)
	}
	return id
}

const startTS = 1_700_000_000_000

// harness applies commands with increasing index and timestamp, round-tripping
// every envelope through the log encoding, and checks the invariants and the
// event rules after every step.
type harness struct {
	t   testing.TB
	s   *State
	idx uint64
	ts  int64
	// step is how far the timestamp moves per command.
	step int64
	ev   []Event
	log  [][]byte
}

func newHarness(t testing.TB) *harness {
	return &harness{t: t, s: New(), ts: startTS, step: 10}
}

func (h *harness) applyEnv(e *command.Envelope) command.Result {
	h.t.Helper()
	raw := command.Encode(e)
	dec, err := command.Decode(raw)
	if err != nil {
		h.t.Fatalf("decode of own encoding: %v", err)
	}
	h.log = append(h.log, raw)
	before := leaseSet(h.s)
	revBefore := h.s.Revision()
	dumpBefore := dump(h.s)
	r := h.s.Apply(h.idx, dec)
	h.ev = h.s.TakeEvents()
	checkInvariants(h.t, h.s)
	checkStep(h.t, h.s, revBefore, dumpBefore, dump(h.s), before, h.ev, r)
	return r
}

func (h *harness) req(client, reqID string, b command.Body) command.Result {
	h.t.Helper()
	h.idx++
	h.ts += h.step
	// One leader with a true clock: the lease clock moves with the wall
	// clock. Tests of skew build their envelopes themselves.
	return h.applyEnv(&command.Envelope{TS: h.ts, Clock: h.ts - startTS, ClientID: client, RequestID: reqID, Body: b})
}

func (h *harness) do(client string, b command.Body) command.Result {
	h.t.Helper()
	return h.req(client, "", b)
}

func (h *harness) acquire(client, name string, lease command.LeaseID, ttl, wait int64) command.Result {
	h.t.Helper()
	return h.do(client, &command.Acquire{Name: name, LeaseID: lease, TTLms: ttl, WaitMs: wait})
}

// takeover is acquire with Takeover: it takes the lock, or the place in
// line, from another lease of the same client.
func (h *harness) takeover(client, name string, lease command.LeaseID, ttl, wait int64) command.Result {
	h.t.Helper()
	return h.do(client, &command.Acquire{Name: name, LeaseID: lease, TTLms: ttl, WaitMs: wait, Takeover: true})
}

// stakeover is sacquire with Takeover.
func (h *harness) stakeover(client, name string, session command.LeaseID, wait int64) command.Result {
	h.t.Helper()
	return h.do(client, &command.Acquire{Name: name, LeaseID: session, Session: true, WaitMs: wait, Takeover: true})
}

func (h *harness) sacquire(client, name string, session command.LeaseID, wait int64) command.Result {
	h.t.Helper()
	return h.do(client, &command.Acquire{Name: name, LeaseID: session, Session: true, WaitMs: wait})
}

func (h *harness) release(client, name string, lease command.LeaseID, token uint64) command.Result {
	h.t.Helper()
	return h.do(client, &command.Release{Name: name, LeaseID: lease, Token: token})
}

func (h *harness) renew(client, name string, lease command.LeaseID, token uint64, ttl int64) command.Result {
	h.t.Helper()
	return h.do(client, &command.Renew{Name: name, LeaseID: lease, Token: token, TTLms: ttl})
}

func (h *harness) session(client string, id command.LeaseID, ttl int64) command.Result {
	h.t.Helper()
	return h.do(client, &command.CreateSession{LeaseID: id, TTLms: ttl})
}

// mustStatus fails unless r has status want.
func mustStatus(t testing.TB, r command.Result, want command.Status) {
	t.Helper()
	if r.Status != want {
		t.Fatalf("status = %v (%q), want %v; result %+v", r.Status, r.Message, want, r)
	}
}

// checkNoChange asserts that the state is as it was (index and timestamp
// aside) and that nothing was emitted.
func (h *harness) checkNoChange(before string, rev uint64) {
	h.t.Helper()
	if got := dump(h.s); got != before {
		h.t.Fatalf("state changed:\nbefore:\n%s\nafter:\n%s", before, got)
	}
	if h.s.Revision() != rev {
		h.t.Fatalf("revision moved from %d to %d", rev, h.s.Revision())
	}
	if len(h.ev) != 0 {
		h.t.Fatalf("events emitted: %+v", h.ev)
	}
}

// evTypes lists the types of events.
func evTypes(ev []Event) []EventType {
	out := make([]EventType, len(ev))
	for i, e := range ev {
		out[i] = e.Type
	}
	return out
}

// wantTypes checks the events' types. Public events must come in the given
// order, and so must internal ones; how the two kinds interleave is not part of
// the contract.
func wantTypes(t testing.TB, ev []Event, want ...EventType) {
	t.Helper()
	split := func(ts []EventType) (pub, internal []EventType) {
		for _, x := range ts {
			if x.Public() {
				pub = append(pub, x)
			} else {
				internal = append(internal, x)
			}
		}
		return
	}
	// The history's age timer comes with the first kept record; its own
	// tests check it, the others need not list it.
	got := evTypes(ev)
	if !slices.Contains(want, EventHistoryTimer) {
		got = slices.DeleteFunc(got, func(x EventType) bool { return x == EventHistoryTimer })
	}
	gp, gi := split(got)
	wp, wi := split(want)
	if !slices.Equal(gp, wp) || !slices.Equal(gi, wi) {
		t.Fatalf("event types = %v, want %v\nevents: %+v", evTypes(ev), want, ev)
	}
}

// ofType returns the events of one type, in order.
func ofType(ev []Event, typ EventType) []Event {
	var out []Event
	for _, e := range ev {
		if e.Type == typ {
			out = append(out, e)
		}
	}
	return out
}

// findEvent returns the only event of a type.
func findEvent(t testing.TB, ev []Event, typ EventType) Event {
	t.Helper()
	var out []Event
	for _, e := range ev {
		if e.Type == typ {
			out = append(out, e)
		}
	}
	if len(out) != 1 {
		t.Fatalf("%d events of type %v in %+v", len(out), typ, ev)
	}
	return out[0]
}

// dump is an independent, canonical text form of the replicated state without
// index, timestamp, revision and the dedup table, so that "nothing changed"
// can be checked across commands. It includes the derived per-lease lock and
// wait sets, which Snapshot does not store. (Hand-rolled rather than fmt: it
// runs several times per step in the randomized test.)
func dump(s *State) string {
	b := make([]byte, 0, 256+len(s.leases)*160+s.locks.Len()*160)
	num := func(v uint64) { b = strconv.AppendUint(b, v, 10); b = append(b, ' ') }
	inum := func(v int64) { b = strconv.AppendInt(b, v, 10); b = append(b, ' ') }
	str := func(v string) { b = strconv.AppendQuote(b, v); b = append(b, ' ') }
	id := func(v command.LeaseID) { b = hex.AppendEncode(b, v[:]); b = append(b, ' ') }
	flag := func(v bool) { b = strconv.AppendBool(b, v); b = append(b, ' ') }
	b = append(b, "lastToken "...)
	num(s.lastToken)
	mids := make([]string, 0, len(s.members))
	for m := range s.members {
		mids = append(mids, m)
	}
	sort.Strings(mids)
	for _, t := range s.ACLTokens() {
		b = append(b, "\nacl "...)
		b = hex.AppendEncode(b, t.AccessorID[:])
		b = append(b, ' ')
		b = hex.AppendEncode(b, t.SecretHash[:])
		b = append(b, ' ')
		str(t.Description)
		inum(t.CreatedAt)
		inum(t.ExpiresAt)
		for _, r := range t.Rules {
			str(r.Prefix)
			num(uint64(r.Perms))
		}
		for _, c := range t.ClientIDs {
			str(c)
		}
		for _, c := range t.CertCNs {
			str("cn:" + c)
		}
	}
	for _, k := range s.tokenKeys {
		b = append(b, "\ntokenkey "...)
		b = hex.AppendEncode(b, k.ID[:])
		b = append(b, ' ')
		b = hex.AppendEncode(b, k.Seed[:])
		b = append(b, ' ')
		inum(k.CreatedAt)
		flag(k.Current)
		num(k.MaxToken)
	}
	for _, m := range mids {
		mm := s.members[m]
		b = append(b, "\nmember "...)
		str(m)
		str(mm.ID)
		str(mm.RaftAddr)
		str(mm.APIAddr)
		str(mm.Version)
	}
	for _, lid := range sortedLeaseIDs(s) {
		l := s.leases[lid]
		b = append(b, "\nlease "...)
		id(lid)
		id(l.ID)
		str(l.ClientID)
		inum(int64(l.TTLms))
		flag(l.Session)
		flag(l.Active)
		num(l.Gen)
		inum(l.RenewedAt)
		b = append(b, "locks "...)
		for _, n := range l.Locks().Sorted() {
			str(n)
		}
		b = append(b, "waits "...)
		for _, n := range l.Waits().Sorted() {
			str(n)
			seq, _ := l.Waits().Get(n)
			num(seq)
		}
	}
	s.locks.Ascend(func(lk *Lock) bool {
		b = append(b, "\nlock "...)
		str(lk.Name)
		str(lk.Value())
		num(uint64(lk.Limit()))
		flag(lk.Shared())
		if x := lk.extra; x != nil {
			b = append(b, "delay "...)
			inum(x.delayMs)
			num(x.delayToken)
			inum(x.delayUntil)
			inum(x.delayClock)
		}
		b = append(b, "holders "...)
		for _, g := range lk.Grants() {
			id(g.LeaseID)
			num(g.Token)
			inum(g.GrantedAt)
			num(g.GrantSeq)
			flag(g.Subtree)
		}
		b = append(b, "queue "...)
		for _, w := range lk.Queue() {
			id(w.LeaseID)
			str(w.ClientID)
			num(w.Seq)
			num(w.Place)
			inum(w.EnqueuedAt)
			inum(w.Deadline)
			str(w.Value)
			inum(w.LockDelayMs)
			flag(w.Shared)
			flag(w.Subtree)
			b = append(b, "; "...)
		}
		return true
	})
	rt := s.hist.retention
	b = append(b, "\nhistory "...)
	inum(rt.PerName)
	inum(rt.MaxEntries)
	inum(rt.MaxBytes)
	inum(rt.MaxAgeMs)
	num(s.hist.seq)
	s.hist.byName.Ascend(func(h *lockHistory) bool {
		b = append(b, "\nhist "...)
		str(h.name)
		for _, g := range h.recs {
			b = fmt.Appendf(b, "%+v; ", g)
		}
		return true
	})
	b = fmt.Appendf(b, "\nshard %+v", s.shard)
	return string(b)
}

// fullDump adds what dump leaves out.
func fullDump(s *State) string {
	var b strings.Builder
	fmt.Fprintf(&b, "index=%d ts=%d revision=%d\n", s.index, s.ts, s.revision)
	b.WriteString(dump(s))
	s.dedupRing.each(func(e *dedupEntry) {
		fmt.Fprintf(&b, "dedup %q %q %+v\n", e.key.client, e.key.request, e.result)
	})
	return b.String()
}

func sortedLeaseIDs(s *State) []command.LeaseID {
	ids := make([]command.LeaseID, 0, len(s.leases))
	for id := range s.leases {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b command.LeaseID) int { return bytes.Compare(a[:], b[:]) })
	return ids
}

func leaseSet(s *State) map[command.LeaseID]bool {
	m := make(map[command.LeaseID]bool, len(s.leases))
	for id := range s.leases {
		m[id] = true
	}
	return m
}

// checkInvariants verifies the structural rules of the replicated state.
func checkInvariants(t testing.TB, s *State) {
	t.Helper()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("invariant broken at index %d: %s\nstate:\n%s", s.index, fmt.Sprintf(format, args...), dump(s))
	}
	// The incremental digest must equal one computed from scratch: a
	// mutation that skipped its digest hook shows here.
	if d, full := s.Digest(), s.FullDigest(); d != full {
		fail("incremental digest %016x, from scratch %016x", d, full)
	}
	// A retired token key is bounded by the token counter at its
	// retirement: at most today's, and no lower than an older key's.
	var bound uint64
	for i, k := range s.tokenKeys {
		switch {
		case k.Current && (i != len(s.tokenKeys)-1 || k.MaxToken != 0):
			fail("token key %d is current but not the newest, or bounded (%d)", i, k.MaxToken)
		case !k.Current && (k.MaxToken > s.lastToken || k.MaxToken < bound):
			fail("retired token key %d has bound %d (last token %d, older key's bound %d)", i, k.MaxToken, s.lastToken, bound)
		}
		if !k.Current {
			bound = k.MaxToken
		}
	}
	tokens := map[uint64]string{}
	prev := ""
	first := true
	s.locks.Ascend(func(lk *Lock) bool {
		if !first && lk.Name <= prev {
			fail("lock table out of order: %q after %q", lk.Name, prev)
		}
		first, prev = false, lk.Name
		if !command.ValidKey(lk.Name) {
			fail("lock %q has a non-canonical name", lk.Name)
		}
		if len(lk.Value()) > command.MaxValueLen {
			fail("lock %q value of %d bytes", lk.Name, len(lk.Value()))
		}
		// A lock is in the table only while held, waited for or in a
		// lock-delay; a delay is on a free lock of limit 1.
		if _, dtoken, delayed := lk.Delayed(); delayed {
			if lk.Held() || lk.lockDelayMs() != 0 || dtoken > s.lastToken || lk.Limit() != 1 {
				fail("lock %q is delayed by token %d but held, with a grant's delay, or counting", lk.Name, dtoken)
			}
		} else if !lk.Held() && len(lk.Queue()) == 0 {
			fail("lock %q is in the table but unused", lk.Name)
		}
		_, election := command.SplitKey(lk.Name)
		n := lk.NumHolders()
		switch {
		case lk.Limit() < 1 || lk.Limit() > command.MaxLimit:
			fail("lock %q has limit %d", lk.Name, lk.Limit())
		case lk.Shared() && lk.Limit() != 1:
			fail("lock %q is shared with limit %d", lk.Name, lk.Limit())
		case !lk.Shared() && n > lk.Limit():
			fail("lock %q has %d exclusive holders, limit %d", lk.Name, n, lk.Limit())
		case n == 0 && lk.Shared():
			fail("lock %q is shared without holders", lk.Name)
		case election && (lk.Limit() != 1 || lk.Shared() || lk.subtreeHolders() != 0):
			fail("election %q has a limit, a mode or a subtree", lk.Name)
		}
		subtrees := 0
		for i, g := range lk.Grants() {
			holder := s.leases[g.LeaseID]
			if holder == nil {
				fail("lock %q held by unknown lease %x", lk.Name, g.LeaseID)
			}
			if !holder.Locks().Has(lk.Name) {
				fail("lock %q: holder lease does not list it", lk.Name)
			}
			if !holder.Active {
				fail("lock %q: holder lease is not active", lk.Name)
			}
			if g.Token == 0 || g.Token > s.lastToken {
				fail("lock %q token %d outside 1..%d", lk.Name, g.Token, s.lastToken)
			}
			if other, dup := tokens[g.Token]; dup {
				fail("token %d on both %q and %q", g.Token, other, lk.Name)
			}
			tokens[g.Token] = lk.Name
			if g.GrantSeq == 0 || placeOfSeq(g.GrantSeq) > placeOf(s.index, s.index+1<<48-1) {
				fail("lock %q grant seq %d after index %d", lk.Name, g.GrantSeq, s.index)
			}
			if i > 0 && g.Token <= lk.grantAt(i-1).Token {
				fail("lock %q holders out of grant order", lk.Name)
			}
			if lk.grantIndex(g.LeaseID) != i {
				fail("lock %q: a lease holds it twice", lk.Name)
			}
			if g.Subtree {
				subtrees++
			}
		}
		if subtrees != lk.subtreeHolders() {
			fail("lock %q counts %d subtree holders, has %d", lk.Name, lk.subtreeHolders(), subtrees)
		}
		var prevPlace uint64
		for _, w := range lk.Queue() {
			if w.Place <= prevPlace {
				fail("lock %q: queue out of line order", lk.Name)
			}
			prevPlace = w.Place
			if lk.grantIndex(w.LeaseID) >= 0 {
				fail("lock %q: a holder also waits for it", lk.Name)
			}
		}
		// One client may hold and wait, or wait twice, under different
		// leases: without takeover a client_id is no claim on anything.
		leases := map[command.LeaseID]bool{}
		for _, w := range lk.Queue() {
			l := s.leases[w.LeaseID]
			if l == nil {
				fail("lock %q: waiter with unknown lease %x", lk.Name, w.LeaseID)
			}
			if seq, ok := l.Waits().Get(lk.Name); !ok || seq != w.Seq {
				fail("lock %q: waiter lease does not list the wait (seq %d, listed %d %v)", lk.Name, w.Seq, seq, ok)
			}
			if w.ClientID != l.ClientID {
				fail("lock %q: waiter client %q but lease client %q", lk.Name, w.ClientID, l.ClientID)
			}
			if leases[w.LeaseID] {
				fail("lock %q: lease waits twice", lk.Name)
			}
			leases[w.LeaseID] = true
			if w.Seq == 0 || placeOfSeq(w.Seq) > placeOf(s.index, s.index+1<<48-1) {
				fail("lock %q: wait seq %d outside 1..%d", lk.Name, w.Seq, s.index)
			}
		}
		return true
	})
	checkHistory(t, s, fail)
	for id, l := range s.leases {
		if l.ID != id || id.IsZero() {
			fail("lease key %x has id %x", id, l.ID)
		}
		if l.TTLms < command.MinTTLms || l.TTLms > command.MaxTTLms {
			fail("lease %x ttl %d out of range", id, l.TTLms)
		}
		for _, name := range l.Locks().Sorted() {
			lk, _ := s.locks.Get(&Lock{Name: name})
			if lk == nil || lk.grantIndex(id) < 0 {
				fail("lease %x lists lock %q it does not hold", id, name)
			}
		}
		for _, name := range l.Waits().Sorted() {
			seq, _ := l.Waits().Get(name)
			lk, _ := s.locks.Get(&Lock{Name: name})
			found := false
			if lk != nil {
				for _, w := range lk.Queue() {
					if w.LeaseID == id && w.Seq == seq {
						found = true
					}
				}
			}
			if !found {
				fail("lease %x lists a wait on %q@%d that is not queued", id, name, seq)
			}
		}
		if l.Session {
			if !l.Active {
				fail("session %x not active", id)
			}
		} else {
			if l.Locks().Len()+l.Waits().Len() != 1 {
				fail("implicit lease %x holds %d and waits for %d locks", id, l.Locks().Len(), l.Waits().Len())
			}
			if l.Active != (l.Locks().Len() == 1) {
				fail("implicit lease %x active=%v but holds %d", id, l.Active, l.Locks().Len())
			}
		}
	}
	checkLockModel(t, s)
}

// checkStep verifies the per-command rules: revision moves by one exactly when
// the state changes, events carry the new revision, and lease ids never reach a
// public event field or a refusal.
func checkStep(t testing.TB, s *State, revBefore uint64, dumpBefore, dumpAfter string, leasesBefore map[command.LeaseID]bool, ev []Event, r command.Result) {
	t.Helper()
	changed := dumpAfter != dumpBefore
	switch {
	case changed && s.revision != revBefore+1:
		t.Fatalf("index %d: state changed but revision went %d -> %d", s.index, revBefore, s.revision)
	case !changed && s.revision != revBefore:
		t.Fatalf("index %d: state unchanged but revision went %d -> %d (events %+v)", s.index, revBefore, s.revision, ev)
	}
	if len(ev) > 0 && !changed {
		t.Fatalf("index %d: events without a state change: %+v", s.index, ev)
	}
	for _, e := range ev {
		if e.Revision != s.revision {
			t.Fatalf("index %d: event %+v has revision %d, state is at %d", s.index, e, e.Revision, s.revision)
		}
		if e.Type.String() == "" {
			t.Fatalf("event type %d has no name", e.Type)
		}
	}
	ids := leaseSet(s)
	for id := range leasesBefore {
		ids[id] = true
	}
	for _, e := range ev {
		if !e.Type.Public() {
			continue
		}
		for id := range ids {
			hexID, rawID := id.String(), string(id[:])
			for _, f := range []string{e.Name, e.ClientID, e.Cause, e.Value} {
				if strings.Contains(strings.ToLower(f), hexID) || strings.Contains(f, rawID) {
					t.Fatalf("public event %+v shows lease id %x", e, id)
				}
			}
		}
	}
	// A refusal must not hand the holder's lease id to someone else.
	if r.Status == command.StatusLockHeld && !r.LeaseID.IsZero() {
		t.Fatalf("lock_held result carries lease id %x", r.LeaseID)
	}
	if r.Status == command.StatusLockHeld {
		for id := range ids {
			if strings.Contains(r.Holder.ClientID, id.String()) {
				t.Fatalf("lock_held holder shows a lease id")
			}
		}
	}
}

// checkHistory: every record is in the age index once, the totals add up,
// every bound holds, and each name's records are in end order.
func checkHistory(t testing.TB, s *State, fail func(string, ...any)) {
	t.Helper()
	rt := s.hist.retention
	var count, size int64
	refs := 0
	s.hist.byName.Ascend(func(h *lockHistory) bool {
		if len(h.recs) == 0 || int64(len(h.recs)) > rt.PerName {
			fail("history of %q has %d records (per-name bound %d)", h.name, len(h.recs), rt.PerName)
		}
		var last uint64
		for i := range h.recs {
			g := &h.recs[i]
			if g.Seq <= last || g.Seq > s.hist.seq || g.Token == 0 || g.Token > s.lastToken || g.Cause == 0 {
				fail("history of %q: record %+v out of order or inconsistent", h.name, *g)
			}
			last = g.Seq
			if ref, ok := s.hist.byAge.Get(histRef{seq: g.Seq}); !ok || ref.name != h.name {
				fail("history record %d of %q missing from the age index", g.Seq, h.name)
			}
			count++
			size += recordBytes(h.name, g)
		}
		return true
	})
	s.hist.byAge.Ascend(func(histRef) bool { refs++; return true })
	if count != s.hist.count || size != s.hist.bytes || int64(refs) != count {
		fail("history totals %d/%d bytes, counted %d/%d, %d in the age index", s.hist.count, s.hist.bytes, count, size, refs)
	}
	if count > rt.MaxEntries || size > rt.MaxBytes {
		fail("history of %d records, %d bytes, over its bounds %+v", count, size, rt)
	}
}
