package state

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/dlock/dlock/internal/command"
)

// gen is a seeded random command generator. It peeks at a reference replica to
// aim commands at real holders, waits and generations, and mixes in wrong
// tokens, stale generations, foreign sessions and repeated request ids.
type gen struct {
	rng       *rand.Rand
	s         *State
	idx       uint64
	ts        int64
	clock     int64 // the lease clock; mostly follows ts, not always
	nextLease int
	clients   []string
	hot       []string
	cold      []string
	sessions  []command.LeaseID // every session ever created, live or not
	reqs      []dedupKey        // request ids used so far
	reqN      int
	// contention phases pile waiters onto the hot locks.
	contention bool
	// retry is an idempotent command to propose again (a retry after an
	// unknown outcome), with the core state it must leave unchanged.
	retry *command.Envelope
	// revoked are grants a Revoke was aimed at, for their holders' renewals.
	revoked []*command.Envelope
}

func newGen(seed uint64, s *State) *gen {
	g := &gen{rng: rand.New(rand.NewPCG(seed, seed*0x9e3779b97f4a7c15+1)), s: s, ts: startTS}
	for i := 0; i < 12; i++ {
		g.clients = append(g.clients, fmt.Sprintf("client-%d", i))
	}
	// "hot" and "hot/a" take subtree grants over the others; "sem" is a
	// counting lock (limit 3), "rw" mostly shared.
	g.hot = []string{"hot/a", "hot/b", command.ElectionKey("leader"), "hot", "hot/a/x", "sem", "rw"}
	for i := 0; i < 40; i++ {
		g.cold = append(g.cold, fmt.Sprintf("cold/%02d", i))
	}
	g.cold = append(g.cold, "cold", "cold", "cold")
	return g
}

func (g *gen) pct(p int) bool { return g.rng.IntN(100) < p }

func (g *gen) client() string { return g.clients[g.rng.IntN(len(g.clients))] }

func (g *gen) name() string {
	if g.pct(70) {
		return g.hot[g.rng.IntN(len(g.hot))]
	}
	return g.cold[g.rng.IntN(len(g.cold))]
}

// value is a campaign value for election keys (a few distinct ones, so
// proclaiming the same value again happens), nothing for plain locks.
func (g *gen) value(name string) string {
	if _, el := command.SplitKey(name); !el && !g.pct(3) {
		return ""
	}
	if g.pct(1) {
		return strings.Repeat("v", command.MaxValueLen+1)
	}
	return fmt.Sprintf("node-%d", g.rng.IntN(4))
}

// shape gives an acquire its limit, mode and subtree flag: mostly what its
// lock is used with, sometimes a mismatch or an invalid one.
func (g *gen) shape(b *command.Acquire) {
	if _, el := command.SplitKey(b.Name); el {
		if g.pct(2) {
			b.Shared = true
		}
		return
	}
	switch b.Name {
	case "sem":
		b.Limit = 3
		if g.pct(5) {
			b.Limit = []int64{0, 2, 4}[g.rng.IntN(3)]
		}
	case "rw":
		b.Shared = g.pct(75)
	default:
		b.Shared = g.pct(30)
	}
	switch {
	case b.Name == "hot" || b.Name == "hot/a" || b.Name == "cold":
		b.Subtree = g.pct(50)
	case g.pct(5):
		b.Subtree = true
	}
	switch {
	case g.pct(1):
		b.Limit = []int64{-1, command.MaxLimit + 1}[g.rng.IntN(2)]
	case g.pct(2):
		b.Shared, b.Limit = true, 3
	}
}

// holder picks one grant of a held lock.
func (g *gen) holder(lk *Lock) Grant {
	return lk.grantAt(g.rng.IntN(lk.NumHolders()))
}

func (g *gen) newLease() command.LeaseID {
	g.nextLease++
	return lid(g.nextLease)
}

func (g *gen) ttl() int64 {
	switch {
	case g.pct(3):
		return []int64{0, -5, command.MinTTLms - 1, command.MaxTTLms + 1}[g.rng.IntN(4)]
	case g.pct(10):
		return []int64{command.MinTTLms, command.MaxTTLms}[g.rng.IntN(2)]
	}
	return command.MinTTLms + g.rng.Int64N(60_000)
}

func (g *gen) wait() int64 {
	switch {
	case g.pct(45):
		return 0
	case g.pct(3):
		return []int64{-1, command.MaxWaitMs + 1}[g.rng.IntN(2)]
	}
	return 1 + g.rng.Int64N(120_000)
}

func (g *gen) heldLocks() []*Lock {
	var out []*Lock
	g.s.locks.Ascend(func(lk *Lock) bool {
		if lk.Held() {
			out = append(out, lk)
		}
		return true
	})
	return out
}

func (g *gen) waits() []command.WaitRef {
	var out []command.WaitRef
	g.s.locks.Ascend(func(lk *Lock) bool {
		for _, w := range lk.Queue() {
			out = append(out, command.WaitRef{LeaseID: w.LeaseID, Name: lk.Name, Seq: w.Seq})
		}
		return true
	})
	return out
}

// session picks a live session most of the time, else any session ever made.
func (g *gen) session() (command.LeaseID, bool) {
	if len(g.sessions) == 0 {
		return command.LeaseID{}, false
	}
	if g.pct(80) {
		var live []command.LeaseID
		for _, id := range g.sessions {
			if g.s.leases[id] != nil {
				live = append(live, id)
			}
		}
		if len(live) > 0 {
			return live[g.rng.IntN(len(live))], true
		}
	}
	return g.sessions[g.rng.IntN(len(g.sessions))], true
}

func (g *gen) anyLease() (command.LeaseID, *Lease) {
	ids := sortedLeaseIDs(g.s)
	if len(ids) == 0 {
		return g.newLease(), nil
	}
	id := ids[g.rng.IntN(len(ids))]
	return id, g.s.leases[id]
}

func (g *gen) perturbWait(w command.WaitRef) command.WaitRef {
	switch g.rng.IntN(3) {
	case 0:
		w.Seq += uint64(g.rng.IntN(3)) + 1
	case 1:
		w.Name = g.name()
	default:
		id, _ := g.anyLease()
		w.LeaseID = id
	}
	return w
}

// next returns the next log entry. Its index is g.idx.
func (g *gen) next() *command.Envelope {
	g.idx++
	// The leader's clock: mostly forward, sometimes still, rarely backwards.
	switch {
	case g.pct(2):
		g.ts -= g.rng.Int64N(500)
	case g.pct(20):
	default:
		g.ts += g.rng.Int64N(3000)
	}
	// The lease clock moves on its own: a new leader's wall clock may jump
	// while the lease clock does not, and a stale entry may carry an older
	// value, which the state machine must ignore.
	clock := g.clock
	switch {
	case g.pct(3):
		clock -= g.rng.Int64N(300)
	case g.pct(10):
	default:
		g.clock += g.rng.Int64N(3000)
		clock = g.clock
	}
	if g.retry != nil {
		e := *g.retry
		g.retry = nil
		e.TS, e.Clock = g.ts, clock
		return &e
	}
	if g.pct(1) {
		g.contention = !g.contention
	}
	e := &command.Envelope{TS: g.ts, Clock: clock, ClientID: g.client()}
	if g.pct(2) {
		e.Body = &command.Tick{}
		return e
	}
	if g.contention && g.pct(60) {
		name := g.hot[g.rng.IntN(len(g.hot))]
		if id, ok := g.session(); ok && g.pct(30) {
			if l := g.s.leases[id]; l != nil {
				e.ClientID = l.ClientID
			}
			e.Body = &command.Acquire{Name: name, LeaseID: id, Session: true, WaitMs: 1 + g.rng.Int64N(100_000), Value: g.value(name)}
		} else {
			e.Body = &command.Acquire{Name: name, LeaseID: g.newLease(), TTLms: g.ttl(), WaitMs: 1 + g.rng.Int64N(100_000), Value: g.value(name)}
		}
	} else if len(g.revoked) > 0 && g.pct(3) {
		r := g.revoked[g.rng.IntN(len(g.revoked))]
		e.ClientID, e.Body = r.ClientID, r.Body
	} else if g.pct(10) {
		e.Body = g.opsBody(e)
	} else {
		e.Body = g.body(e)
	}
	if b, ok := e.Body.(*command.Acquire); ok {
		g.shape(b)
		if g.pct(20) {
			// A node's waiter cap, in the command (negative: none).
			b.MaxWaiters = g.rng.Int64N(6) - 1
		}
	}
	if b, ok := e.Body.(*command.Acquire); ok && g.pct(25) {
		b.LockDelayMs = []int64{1, 500, 5000, command.MaxLockDelayMs, -1, command.MaxLockDelayMs + 1}[g.rng.IntN(6)]
	}
	if b, ok := e.Body.(*command.Renew); ok && g.pct(30) {
		b.SetValue, b.Value = true, g.value(b.Name)
		if g.pct(30) {
			b.Value = fmt.Sprintf("lock-value-%d", g.rng.IntN(3))
		}
	}
	if g.pct(10) {
		if len(g.reqs) > 0 && g.pct(40) {
			k := g.reqs[g.rng.IntN(len(g.reqs))]
			e.ClientID, e.RequestID = k.client, k.request
		} else {
			g.reqN++
			e.RequestID = fmt.Sprintf("req-%d", g.reqN)
			g.reqs = append(g.reqs, dedupKey{e.ClientID, e.RequestID})
		}
	}
	if e.Idempotent() && e.RequestID == "" && g.pct(25) {
		g.retry = e
	}
	return e
}

func (g *gen) body(e *command.Envelope) command.Body {
	switch p := g.rng.IntN(100); {
	case p < 22: // implicit acquire
		b := &command.Acquire{Name: g.name(), LeaseID: g.newLease(), TTLms: g.ttl(), WaitMs: g.wait()}
		b.Value = g.value(b.Name)
		switch {
		case g.pct(2):
			b.Name = []string{"", "/hot/a", "a//b", "x/../y", "é", "@e/", "@x/a", "@e//a"}[g.rng.IntN(8)]
		case g.pct(2):
			b.LeaseID, _ = g.anyLease() // the leader never does this; the FSM must refuse
		case g.pct(1):
			b.LeaseID = command.LeaseID{}
		}
		// Often the same client as the holder (a restarted holder), or as a
		// waiter; half of those ask to take over.
		if lk, _ := g.s.locks.Get(&Lock{Name: b.Name}); lk != nil && lk.Held() && g.pct(25) {
			e.ClientID = g.s.leases[g.holder(lk).LeaseID].ClientID
			if q := lk.Queue(); len(q) > 0 && g.pct(30) {
				e.ClientID = q[g.rng.IntN(len(q))].ClientID
			}
			b.Takeover = g.pct(50)
		} else {
			b.Takeover = g.pct(5)
		}
		return b
	case p < 36: // acquire under a session
		id, ok := g.session()
		if !ok {
			id = g.newLease()
			g.sessions = append(g.sessions, id)
			return &command.CreateSession{LeaseID: id, TTLms: g.ttl()}
		}
		if l := g.s.leases[id]; l != nil && g.pct(85) {
			e.ClientID = l.ClientID
		}
		name := g.name()
		return &command.Acquire{Name: name, LeaseID: id, Session: true, WaitMs: g.wait(), TTLms: g.rng.Int64N(2) * 5000, Value: g.value(name), Takeover: g.pct(50)}
	case p < 48, p < 56: // release / renew
		held := g.heldLocks()
		var name string
		var id command.LeaseID
		var token uint64
		if len(held) > 0 && g.pct(90) {
			lk := held[g.rng.IntN(len(held))]
			gr := g.holder(lk)
			name, id, token = lk.Name, gr.LeaseID, gr.Token
			e.ClientID = g.s.leases[gr.LeaseID].ClientID
			if g.pct(35) {
				switch g.rng.IntN(4) {
				case 0:
					token = token - 1 + uint64(g.rng.IntN(3))*1 // older, same or newer
					if token == gr.Token {
						token++
					}
				case 1:
					id, _ = g.anyLease()
				case 2:
					e.ClientID = g.client()
				default:
					name = g.name()
				}
			}
		} else {
			name, token = g.name(), uint64(g.rng.IntN(int(g.s.lastToken)+2))
			id, _ = g.anyLease()
		}
		if p < 48 {
			return &command.Release{Name: name, LeaseID: id, Token: token}
		}
		ttl := int64(0)
		if g.pct(40) {
			ttl = g.ttl()
		}
		return &command.Renew{Name: name, LeaseID: id, Token: token, TTLms: ttl}
	case p < 60:
		id := g.newLease()
		g.sessions = append(g.sessions, id)
		return &command.CreateSession{LeaseID: id, TTLms: g.ttl()}
	case p < 66, p < 70: // keepalive / delete session
		var id command.LeaseID
		if sid, ok := g.session(); ok && g.pct(90) {
			id = sid
			if l := g.s.leases[id]; l != nil && g.pct(85) {
				e.ClientID = l.ClientID
			}
		} else {
			id, _ = g.anyLease()
		}
		if g.pct(5) {
			e.ClientID = ""
		}
		if p < 66 {
			return &command.KeepAlive{LeaseID: id}
		}
		return &command.DeleteSession{LeaseID: id}
	case p < 80: // the reaper expires leases, sometimes with a stale generation
		e.ClientID = ""
		var b command.ExpireLeases
		for n := 1 + g.rng.IntN(3); n > 0; n-- {
			id, l := g.anyLease()
			gen := uint64(g.rng.IntN(3))
			if l != nil {
				gen = l.Gen
				if g.pct(35) {
					gen = l.Gen - 1
				}
			}
			b.Leases = append(b.Leases, command.LeaseGen{LeaseID: id, Gen: gen})
		}
		return &b
	case p < 88: // the reaper expires waits
		e.ClientID = ""
		var b command.ExpireWaits
		ws := g.waits()
		for n := 1 + g.rng.IntN(3); n > 0 && len(ws) > 0; n-- {
			w := ws[g.rng.IntN(len(ws))]
			if g.pct(30) {
				w = g.perturbWait(w)
			}
			b.Waits = append(b.Waits, w)
		}
		return &b
	case p < 94: // a waiter gives up
		e.ClientID = ""
		ws := g.waits()
		held := g.heldLocks()
		c := &command.CancelWait{ReleaseIfGranted: g.pct(50)}
		switch {
		case len(held) > 0 && g.pct(40):
			lk := held[g.rng.IntN(len(held))]
			gr := g.holder(lk)
			c.Wait = command.WaitRef{LeaseID: gr.LeaseID, Name: lk.Name, Seq: gr.GrantSeq}
			if g.pct(30) {
				c.Wait = g.perturbWait(c.Wait)
			}
		case len(ws) > 0:
			c.Wait = ws[g.rng.IntN(len(ws))]
			if g.pct(30) {
				c.Wait = g.perturbWait(c.Wait)
			}
		default:
			c.Wait = command.WaitRef{LeaseID: g.newLease(), Name: g.name(), Seq: g.idx}
		}
		return c
	case p < 97: // an election leader proclaims a new value
		held := g.heldLocks()
		if len(held) == 0 {
			return &command.Proclaim{Name: g.hot[2], LeaseID: g.newLease(), Token: 1, Value: "x"}
		}
		lk := held[g.rng.IntN(len(held))]
		for _, c := range held {
			if _, el := command.SplitKey(c.Name); el && g.pct(70) {
				lk = c
			}
		}
		b := &command.Proclaim{Name: lk.Name, LeaseID: lk.Holder, Token: lk.Token, Value: g.value(command.ElectionKey("x"))}
		e.ClientID = g.s.leases[lk.Holder].ClientID
		if g.pct(30) {
			switch g.rng.IntN(3) {
			case 0:
				b.Token++
			case 1:
				b.LeaseID, _ = g.anyLease()
			default:
				e.ClientID = g.client()
			}
		}
		return b
	default:
		e.ClientID = "node"
		return &command.RegisterMember{ID: fmt.Sprintf("n%d", g.rng.IntN(4)), RaftAddr: fmt.Sprintf("r%d", g.rng.IntN(3)), APIAddr: "api", Version: []string{"", "v1", "v2 (abc)"}[g.rng.IntN(3)]}
	}
}

// opsBody is an operator's or the leader's command of the lock-operations
// kind: revokes (of a holder, of everyone, of a wrong token), retention
// changes with small bounds (so every bound trims), history trims and the
// end of lock-delays (right, stale or unknown).
func (g *gen) opsBody(e *command.Envelope) command.Body {
	if d := g.s.DelayTimers(); len(d) > 0 && g.pct(15) {
		// Someone tries a lock in its lock-delay, at once or waiting.
		return &command.Acquire{Name: d[g.rng.IntN(len(d))].Name, LeaseID: g.newLease(), TTLms: g.ttl(), WaitMs: g.wait()}
	}
	switch p := g.rng.IntN(100); {
	case p < 45:
		e.ClientID = "operator"
		b := &command.Revoke{Name: g.name(), Reason: []string{"", "stuck", strings.Repeat("r", command.MaxReasonLen+1)}[g.rng.IntN(3)]}
		if held := g.heldLocks(); len(held) > 0 && g.pct(80) {
			lk := held[g.rng.IntN(len(held))]
			b.Name, b.Token = lk.Name, lk.Token
			g.revoked = append(g.revoked, &command.Envelope{ClientID: g.s.leases[lk.Holder].ClientID,
				Body: &command.Renew{Name: lk.Name, LeaseID: lk.Holder, Token: lk.Token}})
			if g.pct(25) {
				b.Token = 0
			} else if g.pct(10) {
				b.Token++
			}
		}
		return b
	case p < 60:
		e.ClientID = ""
		return &command.SetHistoryRetention{PerName: g.rng.Int64N(6), MaxEntries: g.rng.Int64N(60), MaxBytes: 200 + g.rng.Int64N(20_000),
			MaxAgeMs: []int64{1000, 20_000, 200_000, 0}[g.rng.IntN(4)]}
	case p < 75:
		e.ClientID = ""
		return &command.TrimHistory{}
	default:
		e.ClientID = ""
		var delayed []DelayTimer
		for _, d := range g.s.DelayTimers() {
			delayed = append(delayed, d)
		}
		if len(delayed) > 0 && g.pct(85) {
			d := delayed[g.rng.IntN(len(delayed))]
			b := &command.EndLockDelay{Name: d.Name, Token: d.Token}
			if g.pct(15) {
				b.Token--
			}
			return b
		}
		return &command.EndLockDelay{Name: g.name(), Token: uint64(g.rng.IntN(int(g.s.lastToken) + 1))}
	}
}

func queues(s *State) map[string][]Waiter {
	m := map[string][]Waiter{}
	s.locks.Ascend(func(lk *Lock) bool {
		if len(lk.Queue()) > 0 {
			m[lk.Name] = slices.Clone(lk.Queue())
		}
		return true
	})
	return m
}

// checkFIFO: a hand-off goes to a waiter that was queued before the command,
// and everyone who was ahead of it has left the queue by the end of the
// command (granted, timed out, cancelled or ended) — nobody is skipped.
func checkFIFO(t *testing.T, index uint64, before, after map[string][]Waiter, ev []Event) {
	t.Helper()
	for _, e := range ev {
		if e.Type != EventAcquired || e.Cause != CauseHandoff {
			continue
		}
		q := before[e.Name]
		pos := slices.IndexFunc(q, func(w Waiter) bool { return w.LeaseID == e.LeaseID && w.Seq == e.Seq })
		if pos < 0 && e.Seq == index {
			// A takeover of a place in line in another mode, let in at
			// once: checkNoJump checks it.
			continue
		}
		if pos < 0 {
			t.Fatalf("index %d: hand-off of %q to a lease that was not queued: %+v", index, e.Name, e)
		}
		for _, ahead := range q[:pos] {
			if slices.ContainsFunc(after[e.Name], func(w Waiter) bool { return w.LeaseID == ahead.LeaseID && w.Seq == ahead.Seq }) {
				t.Fatalf("index %d: hand-off of %q skipped waiter %+v still in line", index, e.Name, ahead)
			}
		}
	}
}

// step is one applied entry, kept to compare replays.
type stepRecord struct {
	result command.Result
	events []Event
}

// tokenModel follows grants and releases through the public events: every
// grant's token is new and larger than any before it, a lock never has more
// exclusive holders than its limit, and shared and exclusive holders never
// meet.
type tokenModel struct {
	holders   map[string]map[uint64]bool // lock -> token -> shared
	lastToken uint64
}

func (m *tokenModel) apply(t *testing.T, s *State, index uint64, ev []Event) {
	t.Helper()
	for _, e := range ev {
		switch e.Type {
		case EventAcquired:
			hs := m.holders[e.Name]
			for tok, shared := range hs {
				if shared != e.Shared || !e.Shared && len(hs) >= s.GetLock(e.Name).Limit {
					t.Fatalf("index %d: %q granted (token %d, shared %v) while held with token %d (shared %v) by %d", index, e.Name, e.Token, e.Shared, tok, shared, len(hs))
				}
			}
			if e.Token <= m.lastToken {
				t.Fatalf("index %d: token %d granted after %d", index, e.Token, m.lastToken)
			}
			m.lastToken = e.Token
			if hs == nil {
				hs = map[uint64]bool{}
				m.holders[e.Name] = hs
			}
			hs[e.Token] = e.Shared
		case EventReleased, EventExpired, EventRevoked:
			if _, held := m.holders[e.Name][e.Token]; !held {
				t.Fatalf("index %d: %v of %q token %d, but the model has %v", index, e.Type, e.Name, e.Token, m.holders[e.Name])
			}
			delete(m.holders[e.Name], e.Token)
			if len(m.holders[e.Name]) == 0 {
				delete(m.holders, e.Name)
			}
		}
	}
}

func (m *tokenModel) check(t *testing.T, s *State) {
	t.Helper()
	got := map[string]map[uint64]bool{}
	s.locks.Ascend(func(lk *Lock) bool {
		for _, g := range lk.Grants() {
			if got[lk.Name] == nil {
				got[lk.Name] = map[uint64]bool{}
			}
			got[lk.Name][g.Token] = lk.Shared()
		}
		return true
	})
	if !reflect.DeepEqual(got, m.holders) && !(len(got) == 0 && len(m.holders) == 0) {
		t.Fatalf("index %d: state holders %v, events say %v", s.index, got, m.holders)
	}
	if s.lastToken != m.lastToken {
		t.Fatalf("index %d: last token %d, events say %d", s.index, s.lastToken, m.lastToken)
	}
}

func TestDeterminismAndSnapshots(t *testing.T) {
	seeds := []uint64{1, 2, 3, 42}
	steps := 2000
	if testing.Short() {
		seeds, steps = seeds[:2], 1500
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			runDeterminism(t, seed, steps)
		})
	}
}

func runDeterminism(t *testing.T, seed uint64, steps int) {
	a, b := New(), New()
	g := newGen(seed, a)
	model := &tokenModel{holders: map[string]map[uint64]bool{}}
	var (
		log     [][]byte
		records []stepRecord
		first   = map[dedupKey]command.Result{}
	)
	type cut struct {
		at     int // entries applied
		snap   []byte
		dump   string
		digest uint64
	}
	var cuts []cut
	rng := rand.New(rand.NewPCG(seed, 7))
	stats := map[command.Status]int{}
	dedupHits, retries, grantedRetries := 0, 0, 0
	// Every grant so far, by (lease, seq): a retried queued acquire may be
	// answered with its grant only if that grant happened.
	type grantRef struct {
		lease command.LeaseID
		seq   uint64
	}
	grants := map[grantRef]uint64{}
	prevDump := dump(a)
	maxLocks, maxLeases, maxQueue := 0, 0, 0
	// What the lock model did: grants by mode, locks held by several at
	// once, and waiters held back by a grant or a waiter on another name.
	shared, subtree, multi, crossWaits, crossGrants := 0, 0, 0, 0, 0

	for i := 0; i < steps; i++ {
		isRetry := g.retry != nil
		env := g.next()
		raw := command.Encode(env)
		log = append(log, raw)
		ea, err := command.Decode(raw)
		if err != nil {
			t.Fatal(err)
		}
		eb, _ := command.Decode(raw)

		key := dedupKey{env.ClientID, env.RequestID}
		prevFirst, isDup := first[key]
		isDup = isDup && env.RequestID != ""
		coreBefore, revBefore, leasesBefore := prevDump, a.revision, leaseSet(a)

		queuesBefore := queues(a)
		ra := a.Apply(g.idx, ea)
		evA := a.TakeEvents()
		rb := b.Apply(g.idx, eb)
		evB := b.TakeEvents()
		stats[ra.Status]++

		// (a) Two replicas fed the same log agree byte for byte, every step.
		if ra != rb || !reflect.DeepEqual(evA, evB) {
			t.Fatalf("step %d: replicas disagree: %+v vs %+v", i, ra, rb)
		}
		sa := a.Snapshot()
		if !bytes.Equal(sa, b.Snapshot()) {
			t.Fatalf("step %d: snapshots differ", i)
		}
		// The digest covers the whole state incrementally: both replicas
		// agree, and each agrees with a digest computed from scratch.
		if da, fa, db := a.Digest(), a.FullDigest(), b.Digest(); da != fa || da != db {
			t.Fatalf("step %d: digests: incremental %016x, from scratch %016x, other replica %016x", i, da, fa, db)
		}
		// (d) Invariants, revision and event rules.
		checkInvariants(t, a)
		coreAfter := dump(a)
		prevDump = coreAfter
		checkStep(t, a, revBefore, coreBefore, coreAfter, leasesBefore, evA, ra)
		// (c) Tokens increase in grant order and no lock has two holders.
		model.apply(t, a, g.idx, evA)
		checkFIFO(t, g.idx, queuesBefore, queues(a), evA)
		checkNoJump(t, a, g.idx, queuesBefore, evA)
		model.check(t, a)
		if ra.Revision > a.revision {
			t.Fatalf("step %d: result revision %d ahead of state %d", i, ra.Revision, a.revision)
		}

		for _, ev := range evA {
			if ev.Type == EventAcquired {
				grants[grantRef{ev.LeaseID, ev.Seq}] = ev.Token
			}
		}
		// Dedup: a repeated (client, request_id) returns the first result and
		// changes nothing — except that a queued acquire whose wait was
		// granted since is answered with that grant (same lease, same seq).
		if isDup {
			dedupHits++
			if !ra.Replayed {
				t.Fatalf("step %d: a dedup hit not marked Replayed: %+v", i, ra)
			}
			rd := ra
			rd.Replayed = false // the rest of the answer is the first one's
			if granted := prevFirst.Status == command.StatusQueued && rd.Status == command.StatusOK &&
				rd.LeaseID == prevFirst.LeaseID && rd.Seq == prevFirst.Seq && rd.Token != 0; granted {
				if grants[grantRef{rd.LeaseID, rd.Seq}] != rd.Token {
					t.Fatalf("step %d: retry answered with grant %+v that never happened", i, rd)
				}
				grantedRetries++
				prevFirst = rd
				first[key] = rd
			}
			if rd != prevFirst {
				t.Fatalf("step %d: dedup hit returned %+v, first result was %+v", i, rd, prevFirst)
			}
			if coreAfter != coreBefore || len(evA) != 0 || a.revision != revBefore {
				t.Fatalf("step %d: dedup hit changed the state", i)
			}
		} else if env.RequestID != "" && ra.Status == command.StatusQueueFull {
			// Changed nothing and not remembered: a retry is judged afresh.
			if _, ok := a.Lookup(key.client, key.request); ok || coreAfter != coreBefore || a.revision != revBefore {
				t.Fatalf("step %d: a queue_full refusal was remembered or changed the state", i)
			}
		} else if env.RequestID != "" {
			first[key] = ra
			if got, ok := a.Lookup(key.client, key.request); !ok || got != ra {
				t.Fatalf("step %d: result not remembered", i)
			}
		} else if ra.Revision != a.revision {
			t.Fatalf("step %d: result revision %d, state %d", i, ra.Revision, a.revision)
		}
		// A retried idempotent command changes nothing the first one did not
		// (KeepAlive is a fresh renewal, and TrimHistory a trim at a later
		// lease clock, which may drop what has aged since: both are left out).
		if isRetry {
			retries++
			_, ka := env.Body.(*command.KeepAlive)
			_, trim := env.Body.(*command.TrimHistory)
			if !ka && !trim && coreAfter != coreBefore {
				t.Fatalf("step %d: retry of idempotent %T changed the state", i, env.Body)
			}
		}
		// An OK acquire that was acted on names the current grant.
		if acq, ok := env.Body.(*command.Acquire); ok && ra.Status == command.StatusOK && !isDup {
			lk, _ := a.LockGrant(acq.Name, ra.LeaseID)
			if lk.Holder != ra.LeaseID || lk.Token != ra.Token || lk.GrantSeq != ra.Seq {
				t.Fatalf("step %d: acquire result %+v but lock is %+v", i, ra, lk)
			}
		}

		for _, ev := range evA {
			if ev.Type == EventAcquired {
				if ev.Shared {
					shared++
				}
				if ev.Subtree {
					subtree++
				}
				if ev.Cause == CauseHandoff && a.GetLock(ev.Name).Holder.Token != ev.Token && ev.Name != "sem" && ev.Name != "rw" {
					crossGrants++ // let in beside other holders
				}
			}
		}
		a.locks.Ascend(func(lk *Lock) bool {
			if lk.NumHolders() > 1 {
				multi++
			}
			if !lk.Held() && len(lk.Queue()) > 0 {
				crossWaits++
			}
			return true
		})
		records = append(records, stepRecord{ra, evA})
		maxLocks, maxLeases = max(maxLocks, a.locks.Len()), max(maxLeases, len(a.leases))
		a.locks.Ascend(func(lk *Lock) bool { maxQueue = max(maxQueue, len(lk.Queue())); return true })
		if rng.IntN(steps/15+1) == 0 || i == steps/2 {
			cuts = append(cuts, cut{at: i + 1, snap: sa, dump: fullDump(a), digest: a.Digest()})
		}
	}
	final := a.Snapshot()
	finalDump := fullDump(a)

	// (b) Snapshot at a point, restore, replay the rest: identical to never
	// having snapshotted, including every result and event along the way.
	cuts = append(cuts, cut{at: 0, snap: New().Snapshot(), dump: fullDump(New()), digest: New().Digest()})
	finalDigest := a.Digest()
	for _, c := range cuts {
		r, err := Restore(c.snap)
		if err != nil {
			t.Fatalf("restore at %d: %v", c.at, err)
		}
		if got := fullDump(r); got != c.dump {
			t.Fatalf("restore at %d: state differs\n got %s\nwant %s", c.at, got, c.dump)
		}
		if !bytes.Equal(r.Snapshot(), c.snap) {
			t.Fatalf("restore at %d: re-snapshot differs", c.at)
		}
		if r.Digest() != c.digest {
			t.Fatalf("restore at %d: digest %016x, the replica's was %016x", c.at, r.Digest(), c.digest)
		}
		checkInvariants(t, r)
		for j := c.at; j < len(log); j++ {
			e, _ := command.Decode(log[j])
			res := r.Apply(uint64(j+1), e)
			ev := r.TakeEvents()
			if d, full := r.Digest(), r.FullDigest(); d != full {
				t.Fatalf("replay from %d: entry %d: incremental digest %016x, from scratch %016x", c.at, j, d, full)
			}
			if res != records[j].result || !reflect.DeepEqual(ev, records[j].events) {
				t.Fatalf("replay from %d: entry %d gives %+v %+v, straight run gave %+v %+v", c.at, j, res, ev, records[j].result, records[j].events)
			}
		}
		if !bytes.Equal(r.Snapshot(), final) || fullDump(r) != finalDump || r.Digest() != finalDigest {
			t.Fatalf("replay from %d: final state differs", c.at)
		}
	}

	// The run must have exercised what it claims to.
	if model.lastToken < 50 || dedupHits < 10 || retries < 10 || len(cuts) < 5 {
		t.Fatalf("weak run: %d grants, %d dedup hits (%d answered with a later grant), %d retries, %d cuts", model.lastToken, dedupHits, grantedRetries, retries, len(cuts))
	}
	for _, st := range []command.Status{command.StatusOK, command.StatusQueued, command.StatusLockHeld, command.StatusNotHolder,
		command.StatusSessionNotFound, command.StatusInvalid, command.StatusNotWaiting, command.StatusQueueFull, command.StatusLimitMismatch,
		command.StatusLockDelayed, command.StatusLockLost} {
		if stats[st] == 0 {
			t.Fatalf("no %v result in the run: %v", st, stats)
		}
	}
	cnt := map[string]int{}
	for _, rec := range records {
		for _, e := range rec.events {
			cnt[e.Type.String()+"/"+e.Cause]++
		}
	}
	for _, k := range []string{"acquired/acquire", "acquired/handoff", "acquired/takeover", "released/release", "released/takeover",
		"released/cancelled", "released/session_deleted", "expired/expired", "dequeued/timeout", "dequeued/cancelled",
		"dequeued/expired", "session_expired/expired", "session_deleted/session_deleted", "proclaimed/",
		"revoked/revoked", "value_changed/", "delay_timer/", "history_timer/"} {
		if cnt[k] == 0 {
			t.Errorf("seed %d never produced %s; counts %v", seed, k, cnt)
		}
	}
	if maxQueue < 3 || maxLocks < 8 {
		t.Errorf("weak run: at most %d locks, queues of at most %d", maxLocks, maxQueue)
	}
	if shared < 20 || subtree < 10 || multi < 20 || crossWaits < 10 {
		t.Errorf("weak run for the lock model: %d shared and %d subtree grants, %d steps with several holders, %d with a free lock's waiter held back elsewhere",
			shared, subtree, multi, crossWaits)
	}
	t.Logf("lock model: %d shared, %d subtree grants, %d lock-steps with several holders, %d with waiters held back elsewhere, %d let in beside others", shared, subtree, multi, crossWaits, crossGrants)
	t.Logf("seed %d: %d steps, %d tokens, %d dedup hits (%d answered with a later grant), %d retries, max %d locks %d leases queue %d, %d-byte final snapshot, statuses %v",
		seed, steps, model.lastToken, dedupHits, grantedRetries, retries, maxLocks, maxLeases, maxQueue, len(final), stats)
}
