package state

import (
	"bytes"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/dlock/dlock/internal/command"
)

const ttl = 30_000

func TestAcquireFreeLockGetsToken1(t *testing.T) {
	h := newHarness(t)
	r := h.acquire("c1", "billing/batch-job", lid(1), ttl, 0)
	mustStatus(t, r, command.StatusOK)
	if r.Token != 1 || r.LeaseID != lid(1) || r.TTLms != ttl || r.Seq != h.idx || r.Revision != 1 {
		t.Fatalf("result = %+v", r)
	}
	if r.ExpiresAt != h.ts+ttl {
		t.Fatalf("expires_at = %d, want %d", r.ExpiresAt, h.ts+ttl)
	}
	wantTypes(t, h.ev, EventAcquired, EventLeaseTimer)
	a := findEvent(t, h.ev, EventAcquired)
	if a.Name != "billing/batch-job" || a.ClientID != "c1" || a.Token != 1 || a.Cause != CauseAcquire || a.LeaseID != lid(1) || a.Seq != h.idx {
		t.Fatalf("acquired event = %+v", a)
	}
	lt := findEvent(t, h.ev, EventLeaseTimer)
	if lt.LeaseID != lid(1) || lt.Gen != 1 || lt.RemainingMs != ttl {
		t.Fatalf("lease timer = %+v", lt)
	}
	info := h.s.GetLock("billing/batch-job")
	holder := command.Holder{ClientID: "c1", Token: 1, GrantedAt: h.ts, ExpiresAt: h.ts + ttl}
	want := LockInfo{Name: "billing/batch-job", Held: true, Holder: holder, Limit: 1, Holders: []Holder{{Holder: holder}}}
	if !reflect.DeepEqual(info, want) {
		t.Fatalf("GetLock = %+v, want %+v", info, want)
	}
	if h.s.LastToken() != 1 || h.s.Revision() != 1 || h.s.Index() != h.idx || h.s.LastTS() != h.ts {
		t.Fatalf("counters: token %d rev %d index %d ts %d", h.s.LastToken(), h.s.Revision(), h.s.Index(), h.s.LastTS())
	}
	if free := h.s.GetLock("other"); !reflect.DeepEqual(free, LockInfo{Name: "other", Limit: 1}) {
		t.Fatalf("GetLock of a free lock = %+v", free)
	}
}

func TestTokensStrictlyIncreaseAcrossLocks(t *testing.T) {
	h := newHarness(t)
	var last uint64
	n := 0
	for round := 0; round < 5; round++ {
		held := map[string]command.Result{}
		for _, name := range []string{"a", "b", "c/d"} {
			n++
			r := h.acquire("c-"+name, name, lid(n), ttl, 0)
			mustStatus(t, r, command.StatusOK)
			if r.Token <= last {
				t.Fatalf("token %d after %d", r.Token, last)
			}
			last = r.Token
			held[name] = r
		}
		for _, name := range []string{"b", "a", "c/d"} {
			mustStatus(t, h.release("c-"+name, name, held[name].LeaseID, held[name].Token), command.StatusOK)
		}
	}
	if h.s.LastToken() != last || last != 15 {
		t.Fatalf("LastToken = %d, last granted %d", h.s.LastToken(), last)
	}
	if h.s.locks.Len() != 0 || len(h.s.leases) != 0 {
		t.Fatalf("table not empty after releasing everything:\n%s", dump(h.s))
	}
}

func TestAcquireHeldLockWithoutWaitChangesNothing(t *testing.T) {
	h := newHarness(t)
	mustStatus(t, h.acquire("c1", "a", lid(1), ttl, 0), command.StatusOK)
	grantTS := h.ts
	before, rev := dump(h.s), h.s.Revision()
	snapBefore := h.s.Snapshot()

	for _, tc := range []struct {
		name string
		do   func() command.Result
	}{
		{"implicit", func() command.Result { return h.acquire("c2", "a", lid(2), ttl, 0) }},
		{"implicit-other-ttl", func() command.Result { return h.acquire("c3", "a", lid(3), command.MaxTTLms, 0) }},
	} {
		r := tc.do()
		mustStatus(t, r, command.StatusLockHeld)
		want := command.Holder{ClientID: "c1", Token: 1, GrantedAt: grantTS, ExpiresAt: grantTS + ttl}
		if r.Holder != want || !r.LeaseID.IsZero() || r.Token != 0 || r.Revision != rev {
			t.Fatalf("%s: result %+v, want holder %+v", tc.name, r, want)
		}
		h.checkNoChange(before, rev)
	}
	if _, ok := h.s.Lease(lid(2)); ok {
		t.Fatal("refused acquire left a lease behind")
	}
	// Snapshot bytes differ only in the index, timestamp and lease clock
	// header.
	snapAfter := h.s.Snapshot()
	h.s.index, h.s.ts, h.s.clock = 1, grantTS, grantTS-startTS
	if got := h.s.Snapshot(); string(got) != string(snapBefore) {
		t.Fatalf("snapshot changed beyond index/ts/clock")
	}
	_ = snapAfter
}

func TestWaitersQueueInFIFOOrder(t *testing.T) {
	h := newHarness(t)
	mustStatus(t, h.acquire("holder", "a", lid(1), ttl, 0), command.StatusOK)
	var seqs []uint64
	for i, c := range []string{"c2", "c3", "c4"} {
		rev := h.s.Revision()
		r := h.acquire(c, "a", lid(2+i), ttl, 5_000*int64(i+1))
		mustStatus(t, r, command.StatusQueued)
		if r.Seq != h.idx || r.LeaseID != lid(2+i) || r.Token != 0 || r.Revision != rev+1 {
			t.Fatalf("queued result %+v", r)
		}
		seqs = append(seqs, r.Seq)
		wantTypes(t, h.ev, EventQueued, EventWaitTimer)
		q := findEvent(t, h.ev, EventQueued)
		if q.Name != "a" || q.ClientID != c || q.LeaseID != lid(2+i) || q.Seq != h.idx {
			t.Fatalf("queued event %+v", q)
		}
		if wt := findEvent(t, h.ev, EventWaitTimer); wt.RemainingMs != 5_000*int64(i+1) || wt.Seq != h.idx || wt.LeaseID != lid(2+i) || wt.Name != "a" {
			t.Fatalf("wait timer %+v", wt)
		}
		// A waiting implicit lease is not active: its TTL counts from the grant.
		l, ok := h.s.Lease(lid(2 + i))
		if !ok || l.Active || l.ExpiresAt() != 0 {
			t.Fatalf("waiting lease = %+v, %v", l, ok)
		}
	}
	lk, _ := h.s.locks.Get(&Lock{Name: "a"})
	var order []string
	for _, w := range lk.Queue() {
		order = append(order, w.ClientID)
	}
	if !slices.Equal(order, []string{"c2", "c3", "c4"}) {
		t.Fatalf("queue order %v", order)
	}
	if h.s.GetLock("a").Waiters != 3 {
		t.Fatalf("waiters = %d", h.s.GetLock("a").Waiters)
	}
	// An implicit lease cannot ask again: its id is in use.
	before, rev := dump(h.s), h.s.Revision()
	mustStatus(t, h.acquire("c3", "a", lid(3), ttl, 1000), command.StatusInvalid)
	h.checkNoChange(before, rev)
	_ = seqs
}

func TestReleaseHandsOffToQueueHead(t *testing.T) {
	h := newHarness(t)
	mustStatus(t, h.acquire("c1", "a", lid(1), ttl, 0), command.StatusOK)
	r2 := h.acquire("c2", "a", lid(2), 20_000, 60_000)
	r3 := h.acquire("c3", "a", lid(3), 40_000, 60_000)
	mustStatus(t, r2, command.StatusQueued)
	mustStatus(t, r3, command.StatusQueued)

	rev := h.s.Revision()
	r := h.release("c1", "a", lid(1), 1)
	mustStatus(t, r, command.StatusOK)
	if r.Revision != rev+1 {
		t.Fatalf("release revision %d, want %d (one step)", r.Revision, rev+1)
	}
	wantTypes(t, h.ev, EventReleased, EventLeaseGone, EventWaitGone, EventAcquired, EventLeaseTimer)
	rel, gone, wg, acq, lt := findEvent(t, h.ev, EventReleased), findEvent(t, h.ev, EventLeaseGone), findEvent(t, h.ev, EventWaitGone), findEvent(t, h.ev, EventAcquired), findEvent(t, h.ev, EventLeaseTimer)
	if rel.Name != "a" || rel.ClientID != "c1" || rel.Token != 1 || rel.Cause != CauseReleased {
		t.Fatalf("released %+v", rel)
	}
	if gone.LeaseID != lid(1) {
		t.Fatalf("lease gone %+v", gone)
	}
	if wg.LeaseID != lid(2) || wg.Seq != r2.Seq || wg.Name != "a" {
		t.Fatalf("wait gone %+v", wg)
	}
	if acq.Name != "a" || acq.ClientID != "c2" || acq.Token != 2 || acq.Cause != CauseHandoff || acq.LeaseID != lid(2) || acq.Seq != r2.Seq {
		t.Fatalf("acquired %+v", acq)
	}
	if lt.LeaseID != lid(2) || lt.RemainingMs != 20_000 {
		t.Fatalf("lease timer %+v", lt)
	}
	st := h.s.LockHolder("a")
	if st.Holder != lid(2) || st.Token != 2 || st.GrantSeq != r2.Seq {
		t.Fatalf("holder %+v", st)
	}
	l2, _ := h.s.Lease(lid(2))
	if !l2.Active || l2.RenewedAt != h.ts || l2.ExpiresAt() != h.ts+20_000 {
		t.Fatalf("granted lease %+v: its TTL must count from the grant", l2)
	}
	if _, ok := h.s.Lease(lid(1)); ok {
		t.Fatal("released implicit lease still exists")
	}
	if h.s.GetLock("a").Holder.GrantedAt != h.ts {
		t.Fatal("granted_at not the hand-off time")
	}

	mustStatus(t, h.release("c2", "a", lid(2), 2), command.StatusOK)
	if st := h.s.LockHolder("a"); st.Holder != lid(3) || st.Token != 3 {
		t.Fatalf("second hand-off: %+v", st)
	}
	mustStatus(t, h.release("c3", "a", lid(3), 3), command.StatusOK)
	wantTypes(t, h.ev, EventReleased, EventLeaseGone)
	if h.s.locks.Len() != 0 || len(h.s.leases) != 0 {
		t.Fatalf("table not empty:\n%s", dump(h.s))
	}
}

func TestReleaseAndRenewRequireHolderProof(t *testing.T) {
	for _, op := range []string{"release", "renew"} {
		t.Run(op, func(t *testing.T) {
			h := newHarness(t)
			mustStatus(t, h.acquire("c1", "a", lid(1), ttl, 0), command.StatusOK) // token 1
			mustStatus(t, h.acquire("c9", "z", lid(9), ttl, 0), command.StatusOK) // token 2
			mustStatus(t, h.acquire("c2", "a", lid(2), ttl, 9999), command.StatusQueued)
			mustStatus(t, h.session("c3", lid(3), ttl), command.StatusOK)
			before, rev := dump(h.s), h.s.Revision()
			cases := []struct {
				name, client, lock string
				lease              command.LeaseID
				token              uint64
			}{
				{"wrong token (older)", "c1", "a", lid(1), 0},
				{"wrong token (another lock's)", "c1", "a", lid(1), 2},
				{"wrong token (future)", "c1", "a", lid(1), 3},
				{"wrong lease (a waiter's)", "c1", "a", lid(2), 1},
				{"wrong lease (a session)", "c1", "a", lid(3), 1},
				{"wrong lease (zero)", "c1", "a", command.LeaseID{}, 1},
				{"wrong lease (unknown)", "c1", "a", lid(77), 1},
				{"wrong client", "c2", "a", lid(1), 1},
				{"empty client", "", "a", lid(1), 1},
				{"waiter with holder's token", "c2", "a", lid(2), 1},
				{"wrong lock", "c1", "z", lid(1), 1},
				{"free lock", "c1", "free", lid(1), 1},
				{"non-canonical name", "c1", "/a", lid(1), 1},
			}
			for _, tc := range cases {
				var r command.Result
				if op == "release" {
					r = h.release(tc.client, tc.lock, tc.lease, tc.token)
				} else {
					r = h.renew(tc.client, tc.lock, tc.lease, tc.token, 0)
				}
				if r.Status != command.StatusNotHolder {
					t.Fatalf("%s: status %v, want not_holder", tc.name, r.Status)
				}
				h.checkNoChange(before, rev)
			}
		})
	}
}

func TestRenewExtendsLease(t *testing.T) {
	h := newHarness(t)
	mustStatus(t, h.acquire("c1", "a", lid(1), ttl, 0), command.StatusOK)
	h.step = 1000
	gen := func() uint64 { l, _ := h.s.Lease(lid(1)); return l.Gen }
	g0 := gen()
	r := h.renew("c1", "a", lid(1), 1, 0)
	mustStatus(t, r, command.StatusOK)
	if r.TTLms != ttl || r.ExpiresAt != h.ts+ttl || r.LeaseID != lid(1) || gen() != g0+1 {
		t.Fatalf("renew keep-ttl: %+v gen %d", r, gen())
	}
	wantTypes(t, h.ev, EventLeaseTimer)
	if lt := findEvent(t, h.ev, EventLeaseTimer); lt.Gen != g0+1 || lt.RemainingMs != ttl {
		t.Fatalf("lease timer %+v", lt)
	}
	r = h.renew("c1", "a", lid(1), 1, 5_000)
	mustStatus(t, r, command.StatusOK)
	if r.TTLms != 5_000 || r.ExpiresAt != h.ts+5_000 || gen() != g0+2 {
		t.Fatalf("renew new ttl: %+v", r)
	}
	if h.s.GetLock("a").Holder.ExpiresAt != h.ts+5_000 || h.s.GetLock("a").Holder.Token != 1 {
		t.Fatalf("holder view %+v", h.s.GetLock("a").Holder)
	}
	before, rev := dump(h.s), h.s.Revision()
	for _, bad := range []int64{-1, 1, command.MinTTLms - 1, command.MaxTTLms + 1, 1 << 40} {
		r := h.renew("c1", "a", lid(1), 1, bad)
		mustStatus(t, r, command.StatusInvalid)
		if r.Message == "" {
			t.Error("invalid without a message")
		}
		h.checkNoChange(before, rev)
	}
	for _, ok := range []int64{command.MinTTLms, command.MaxTTLms} {
		r := h.renew("c1", "a", lid(1), 1, ok)
		mustStatus(t, r, command.StatusOK)
		if r.TTLms != ok {
			t.Fatalf("ttl %d not taken", ok)
		}
	}
}

func TestIdempotentReacquireBySameSession(t *testing.T) {
	h := newHarness(t)
	mustStatus(t, h.session("c1", lid(1), ttl), command.StatusOK)
	first := h.sacquire("c1", "a", lid(1), 0)
	mustStatus(t, first, command.StatusOK)
	h.step = 500
	for _, wait := range []int64{0, 10_000} {
		genBefore := func() uint64 { l, _ := h.s.Lease(lid(1)); return l.Gen }()
		r := h.sacquire("c1", "a", lid(1), wait)
		mustStatus(t, r, command.StatusOK)
		if r.Token != first.Token || r.Seq != first.Seq || r.LeaseID != lid(1) || r.ExpiresAt != h.ts+ttl {
			t.Fatalf("re-acquire %+v, first %+v", r, first)
		}
		l, _ := h.s.Lease(lid(1))
		if l.Gen != genBefore+1 || l.RenewedAt != h.ts {
			t.Fatalf("lease not refreshed: %+v", l)
		}
		wantTypes(t, h.ev, EventLeaseTimer)
	}
	if h.s.LastToken() != first.Token {
		t.Fatal("re-acquire drew a token")
	}

	// A session already waiting: same place, no change at all.
	mustStatus(t, h.acquire("c9", "b", lid(9), ttl, 0), command.StatusOK)
	q := h.sacquire("c1", "b", lid(1), 10_000)
	mustStatus(t, q, command.StatusQueued)
	before, rev := dump(h.s), h.s.Revision()
	for _, wait := range []int64{0, 10_000, 20_000} {
		r := h.sacquire("c1", "b", lid(1), wait)
		mustStatus(t, r, command.StatusQueued)
		if r.Seq != q.Seq {
			t.Fatalf("re-queue seq %d, want %d", r.Seq, q.Seq)
		}
		h.checkNoChange(before, rev)
	}
}

func TestSameClientNewLeaseTakesOver(t *testing.T) {
	h := newHarness(t)
	mustStatus(t, h.acquire("c1", "a", lid(1), ttl, 0), command.StatusOK)
	mustStatus(t, h.acquire("c2", "a", lid(2), ttl, 60_000), command.StatusQueued)
	for _, wait := range []int64{0, 60_000} {
		old := h.s.LockHolder("a")
		newID := lid(int(10 + wait/1000))
		r := h.takeover("c1", "a", newID, 12_000, wait)
		mustStatus(t, r, command.StatusOK)
		if r.Token != old.Token+1 || r.LeaseID != newID || r.Seq != h.idx || r.TTLms != 12_000 {
			t.Fatalf("takeover result %+v", r)
		}
		wantTypes(t, h.ev, EventReleased, EventLeaseGone, EventAcquired, EventLeaseTimer)
		rel, gone, acq := findEvent(t, h.ev, EventReleased), findEvent(t, h.ev, EventLeaseGone), findEvent(t, h.ev, EventAcquired)
		if rel.Cause != CauseTakeover || rel.Token != old.Token || rel.LeaseID != old.Holder || rel.ClientID != "c1" || gone.LeaseID != old.Holder {
			t.Fatalf("release event %+v / %+v", rel, gone)
		}
		if acq.Cause != CauseTakeover || acq.Token != r.Token || acq.ClientID != "c1" || acq.LeaseID != newID {
			t.Fatalf("acquire event %+v", acq)
		}
		if _, ok := h.s.Lease(old.Holder); ok {
			t.Fatal("old implicit lease survived the takeover")
		}
		// The old incarnation can no longer release or renew.
		before, rev := dump(h.s), h.s.Revision()
		mustStatus(t, h.release("c1", "a", old.Holder, old.Token), command.StatusNotHolder)
		mustStatus(t, h.renew("c1", "a", old.Holder, old.Token, 0), command.StatusNotHolder)
		h.checkNoChange(before, rev)
		// The queue is untouched.
		if h.s.GetLock("a").Waiters != 1 {
			t.Fatal("takeover disturbed the queue")
		}
	}

	// Takeover from a session of the same client: the session survives, without the lock.
	mustStatus(t, h.session("c5", lid(50), ttl), command.StatusOK)
	mustStatus(t, h.sacquire("c5", "s", lid(50), 0), command.StatusOK)
	mustStatus(t, h.sacquire("c5", "t", lid(50), 0), command.StatusOK)
	r := h.takeover("c5", "s", lid(51), ttl, 0)
	mustStatus(t, r, command.StatusOK)
	l, ok := h.s.Lease(lid(50))
	if !ok || h.s.LockHolder("s").Holder != lid(51) || h.s.LockHolder("t").Holder != lid(50) {
		t.Fatalf("session after takeover: %+v %v", l, ok)
	}
	// And a different session of the same client takes over from an implicit lease.
	mustStatus(t, h.session("c5", lid(52), ttl), command.StatusOK)
	r2 := h.stakeover("c5", "s", lid(52), 0)
	mustStatus(t, r2, command.StatusOK)
	if r2.Token <= r.Token || h.s.LockHolder("s").Holder != lid(52) {
		t.Fatalf("session takeover %+v", r2)
	}
	// Another client never takes over, even when it asks to.
	mustStatus(t, h.acquire("c6", "s", lid(60), ttl, 0), command.StatusLockHeld)
	mustStatus(t, h.takeover("c6", "s", lid(61), ttl, 0), command.StatusLockHeld)
}

// Without Takeover, an acquire by the holder's (or a waiter's) client_id
// under another lease is an ordinary acquirer: it is refused or waits, and
// the lease that holds the lock keeps it. Knowing a client_id takes nothing.
func TestSameClientWithoutTakeoverIsAnOrdinaryAcquirer(t *testing.T) {
	h := newHarness(t)
	first := h.acquire("c1", "a", lid(1), ttl, 0)
	mustStatus(t, first, command.StatusOK)

	// No wait: lock_held, naming the holder, and nothing changes.
	before, rev := dump(h.s), h.s.Revision()
	r := h.acquire("c1", "a", lid(2), ttl, 0)
	mustStatus(t, r, command.StatusLockHeld)
	if r.Holder.ClientID != "c1" || r.Holder.Token != first.Token {
		t.Fatalf("lock_held holder %+v", r.Holder)
	}
	h.checkNoChange(before, rev)
	// Under a session of the same client: the same.
	mustStatus(t, h.session("c1", lid(3), ttl), command.StatusOK)
	before, rev = dump(h.s), h.s.Revision()
	mustStatus(t, h.sacquire("c1", "a", lid(3), 0), command.StatusLockHeld)
	h.checkNoChange(before, rev)

	// With a wait: queued behind the holder, who still renews.
	q1 := h.acquire("c1", "a", lid(4), ttl, 60_000)
	mustStatus(t, q1, command.StatusQueued)
	mustStatus(t, h.acquire("c2", "a", lid(5), ttl, 60_000), command.StatusQueued)
	mustStatus(t, h.renew("c1", "a", lid(1), first.Token, 0), command.StatusOK)
	if hl := h.s.LockHolder("a"); hl.Holder != lid(1) || hl.Token != first.Token {
		t.Fatalf("holder changed to %+v", hl)
	}
	// The holder releases: FIFO hand-off to c1's wait, then c2's.
	mustStatus(t, h.release("c1", "a", lid(1), first.Token), command.StatusOK)
	if hl := h.s.LockHolder("a"); hl.Holder != lid(4) || hl.GrantSeq != q1.Seq {
		t.Fatalf("hand-off went to %+v", hl)
	}
	// Taking over the lock itself needs the flag; with it, a new token and
	// the old holder can no longer renew.
	cur := h.s.LockHolder("a")
	mustStatus(t, h.acquire("c1", "a", lid(8), ttl, 0), command.StatusLockHeld)
	r = h.takeover("c1", "a", lid(8), ttl, 0)
	mustStatus(t, r, command.StatusOK)
	if r.Token != h.s.LastToken() || r.Token <= cur.Token || r.LeaseID != lid(8) {
		t.Fatalf("takeover %+v after token %d", r, cur.Token)
	}
	mustStatus(t, h.renew("c1", "a", lid(4), cur.Token, 0), command.StatusNotHolder)

	// A place in line: a second wait by the same client without the flag is
	// appended behind c2; it takes no one's place, not even its own
	// client's. With the flag, the client's place moves to the new lease.
	mustStatus(t, h.acquire("other", "b", lid(10), ttl, 0), command.StatusOK)
	mustStatus(t, h.acquire("c1", "b", lid(11), ttl, 60_000), command.StatusQueued)
	mustStatus(t, h.acquire("c2", "b", lid(12), ttl, 60_000), command.StatusQueued)
	mustStatus(t, h.acquire("c1", "b", lid(13), ttl, 60_000), command.StatusQueued)
	lk, _ := h.s.locks.Get(&Lock{Name: "b"})
	if q := lk.Queue(); len(q) != 3 || q[0].LeaseID != lid(11) || q[1].LeaseID != lid(12) || q[2].LeaseID != lid(13) {
		t.Fatalf("queue %+v", q)
	}
	q3 := h.takeover("c1", "b", lid(14), ttl, 60_000)
	mustStatus(t, q3, command.StatusQueued)
	lk, _ = h.s.locks.Get(&Lock{Name: "b"})
	if q := lk.Queue(); len(q) != 3 || q[0].LeaseID != lid(14) || q[1].LeaseID != lid(12) || q[2].LeaseID != lid(13) {
		t.Fatalf("queue after takeover of the place %+v", q)
	}
	if _, ok := h.s.Lease(lid(11)); ok {
		t.Fatal("the wait taken over kept its lease")
	}
	mustStatus(t, h.release("other", "b", lid(10), h.s.LockHolder("b").Token), command.StatusOK)
	if hl := h.s.LockHolder("b"); hl.Holder != lid(14) || hl.GrantSeq != q3.Seq {
		t.Fatalf("hand-off of b went to %+v", hl)
	}

	// Elections share the rule: a campaign by the leader's candidate id
	// under another lease waits behind it unless it takes over.
	key := command.ElectionKey("db/primary")
	el := h.do("cand", &command.Acquire{Name: key, LeaseID: lid(20), TTLms: ttl, Value: "v1"})
	mustStatus(t, el, command.StatusOK)
	mustStatus(t, h.do("cand", &command.Acquire{Name: key, LeaseID: lid(21), TTLms: ttl, WaitMs: 60_000, Value: "v2"}), command.StatusQueued)
	if e := h.s.GetElection("db/primary"); e.Token != el.Token || e.Value != "v1" {
		t.Fatalf("election leader changed without takeover: %+v", e)
	}
	mustStatus(t, h.do("cand", &command.Acquire{Name: key, LeaseID: lid(22), TTLms: ttl, Value: "v3", Takeover: true}), command.StatusOK)
	if e := h.s.GetElection("db/primary"); e.Token == el.Token || e.Value != "v3" {
		t.Fatalf("election after takeover %+v", e)
	}
}

// Acquires logged before command version 5 had no Takeover field and always
// took over from the same client's other lease: replaying them must do what
// they did then, so they decode with Takeover set.
func TestVersion4AcquireStillTakesOver(t *testing.T) {
	h := newHarness(t)
	first := h.acquire("c1", "a", lid(1), ttl, 0)
	mustStatus(t, first, command.StatusOK)
	mustStatus(t, h.acquire("holder", "q", lid(2), ttl, 0), command.StatusOK)
	mustStatus(t, h.acquire("c1", "q", lid(3), ttl, 60_000), command.StatusQueued)

	v4 := func(b *command.Acquire) command.Result {
		h.idx++
		h.ts += h.step
		raw := command.Encode(&command.Envelope{TS: h.ts, Clock: h.ts - startTS, ClientID: "c1", Body: b})
		// Version 4 wrote the same layout without the trailing MaxWaiters
		// and Takeover fields, nor version 6's Limit, Shared and Subtree,
		// nor version 7's LockDelayMs (all zero here).
		if raw[1] != command.Version || !bytes.Equal(raw[len(raw)-6:], make([]byte, 6)) {
			t.Fatalf("unexpected current encoding %x", raw)
		}
		raw = raw[:len(raw)-6]
		raw[1] = 4
		dec, err := command.Decode(raw)
		if err != nil {
			t.Fatalf("version 4 acquire refused: %v", err)
		}
		return h.applyEnv(dec)
	}
	r := v4(&command.Acquire{Name: "a", LeaseID: lid(4), TTLms: ttl})
	mustStatus(t, r, command.StatusOK)
	if r.Token <= first.Token || h.s.LockHolder("a").Holder != lid(4) {
		t.Fatalf("version 4 acquire did not take over: %+v", r)
	}
	mustStatus(t, h.renew("c1", "a", lid(1), first.Token, 0), command.StatusNotHolder)
	// And a version 4 queued acquire moves the same client's place.
	q := v4(&command.Acquire{Name: "q", LeaseID: lid(5), TTLms: ttl, WaitMs: 60_000})
	mustStatus(t, q, command.StatusQueued)
	if _, ok := h.s.WaitSeq(lid(3), "q"); ok || h.s.GetLock("q").Waiters != 1 {
		t.Fatal("version 4 queued acquire did not move the place in line")
	}
}

func TestSameClientRequeueKeepsPlace(t *testing.T) {
	h := newHarness(t)
	mustStatus(t, h.acquire("holder", "a", lid(1), ttl, 0), command.StatusOK)
	r1 := h.acquire("c1", "a", lid(2), ttl, 10_000)
	mustStatus(t, r1, command.StatusQueued)
	mustStatus(t, h.acquire("c2", "a", lid(3), ttl, 10_000), command.StatusQueued)
	r1b := h.takeover("c1", "a", lid(4), 7_000, 20_000)
	mustStatus(t, r1b, command.StatusQueued)
	if r1b.Seq != h.idx || r1b.LeaseID != lid(4) {
		t.Fatalf("requeue %+v", r1b)
	}
	wantTypes(t, h.ev, EventWaitGone, EventLeaseGone, EventWaitTimer)
	if wg, lg, wt := findEvent(t, h.ev, EventWaitGone), findEvent(t, h.ev, EventLeaseGone), findEvent(t, h.ev, EventWaitTimer); wg.LeaseID != lid(2) || wg.Seq != r1.Seq || lg.LeaseID != lid(2) || wt.LeaseID != lid(4) || wt.RemainingMs != 20_000 {
		t.Fatalf("events %+v", h.ev)
	}
	if _, ok := h.s.Lease(lid(2)); ok {
		t.Fatal("replaced wait's lease survived")
	}
	lk, _ := h.s.locks.Get(&Lock{Name: "a"})
	if len(lk.Queue()) != 2 || lk.Queue()[0].LeaseID != lid(4) || lk.Queue()[1].LeaseID != lid(3) {
		t.Fatalf("queue %+v", lk.Queue())
	}
	if lk.Queue()[0].Deadline != h.ts+20_000 || lk.Queue()[0].Seq != r1b.Seq {
		t.Fatalf("replaced waiter %+v", lk.Queue()[0])
	}
	// The old wait is gone for good: expiring or cancelling it does nothing.
	before, rev := dump(h.s), h.s.Revision()
	mustStatus(t, h.do("x", &command.CancelWait{Wait: command.WaitRef{LeaseID: lid(2), Name: "a", Seq: r1.Seq}, ReleaseIfGranted: true}), command.StatusNotWaiting)
	r := h.do("x", &command.ExpireWaits{Waits: []command.WaitRef{{LeaseID: lid(2), Name: "a", Seq: r1.Seq}}})
	mustStatus(t, r, command.StatusOK)
	h.checkNoChange(before, rev)

	mustStatus(t, h.release("holder", "a", lid(1), 1), command.StatusOK)
	if st := h.s.LockHolder("a"); st.Holder != lid(4) || st.GrantSeq != r1b.Seq {
		t.Fatalf("hand-off went to %+v", st)
	}
	l, _ := h.s.Lease(lid(4))
	if l.TTLms != 7_000 {
		t.Fatalf("new lease ttl %d", l.TTLms)
	}

	// A session of the same client replacing an implicit wait.
	mustStatus(t, h.acquire("c7", "q", lid(70), ttl, 10_000), command.StatusOK)
	mustStatus(t, h.acquire("c8", "q", lid(80), ttl, 10_000), command.StatusQueued)
	mustStatus(t, h.session("c8", lid(81), ttl), command.StatusOK)
	rs := h.stakeover("c8", "q", lid(81), 10_000)
	mustStatus(t, rs, command.StatusQueued)
	if _, ok := h.s.Lease(lid(80)); ok {
		t.Fatal("implicit wait replaced by a session wait survived")
	}
	if seq, ok := h.s.WaitSeq(lid(81), "q"); !ok || seq != rs.Seq {
		t.Fatalf("session wait %d %v", seq, ok)
	}
}

func TestDedupReturnsFirstResult(t *testing.T) {
	h := newHarness(t)
	first := h.req("c1", "r1", &command.Acquire{Name: "a", LeaseID: lid(1), TTLms: ttl})
	mustStatus(t, first, command.StatusOK)
	mustStatus(t, h.req("c1", "r2", &command.Release{Name: "a", LeaseID: lid(1), Token: 1}), command.StatusOK)
	mustStatus(t, h.acquire("c2", "a", lid(2), ttl, 0), command.StatusOK) // state changed since

	before, rev := dump(h.s), h.s.Revision()
	for _, b := range []command.Body{
		&command.Acquire{Name: "a", LeaseID: lid(3), TTLms: ttl}, // the retry (leader drew a new lease id)
		&command.Acquire{Name: "other", LeaseID: lid(4), TTLms: ttl},
		&command.Release{Name: "a", LeaseID: lid(2), Token: 2},
		&command.CreateSession{LeaseID: lid(5), TTLms: ttl},
	} {
		if r := replayed(t, h.req("c1", "r1", b)); r != first {
			t.Fatalf("dedup hit = %+v, want first result %+v", r, first)
		}
		h.checkNoChange(before, rev)
	}
	if got, ok := h.s.Lookup("c1", "r1"); !ok || got != first {
		t.Fatalf("Lookup = %+v, %v", got, ok)
	}
	if _, ok := h.s.Lookup("c1", "nope"); ok {
		t.Fatal("Lookup of unknown request found something")
	}
	// A refusal is remembered too.
	held := h.req("c3", "x", &command.Acquire{Name: "a", LeaseID: lid(6), TTLms: ttl})
	mustStatus(t, held, command.StatusLockHeld)
	mustStatus(t, h.release("c2", "a", lid(2), 2), command.StatusOK)
	if r := replayed(t, h.req("c3", "x", &command.Acquire{Name: "a", LeaseID: lid(7), TTLms: ttl})); r != held {
		t.Fatalf("retried refusal = %+v, want %+v", r, held)
	}
	// A different request id, or the same id from another client, acts again.
	r := h.req("c3", "y", &command.Acquire{Name: "a", LeaseID: lid(8), TTLms: ttl})
	mustStatus(t, r, command.StatusOK)
	r = h.req("c4", "r1", &command.Acquire{Name: "b", LeaseID: lid(9), TTLms: ttl})
	mustStatus(t, r, command.StatusOK)
	if r.LeaseID != lid(9) {
		t.Fatalf("other client's r1 returned %+v", r)
	}
	// No request id: never deduplicated.
	mustStatus(t, h.takeover("c4", "b", lid(10), ttl, 0), command.StatusOK) // takeover, new token
	if h.s.LockHolder("b").Holder != lid(10) {
		t.Fatal("acquire without request id deduplicated")
	}
}

// A queued acquire's dedup entry becomes its grant when the wait is granted,
// so a retry whose first answer was lost learns the truth even after the grant
// ended; a wait that timed out, was cancelled or was moved to a newer lease of
// the same client stays "queued" (never granted).
func TestDedupOfQueuedAcquireFollowsItsGrant(t *testing.T) {
	h := newHarness(t)
	mustStatus(t, h.acquire("a", "l", lid(1), ttl, 0), command.StatusOK)
	q2 := h.req("b", "b-1", &command.Acquire{Name: "l", LeaseID: lid(2), TTLms: ttl, WaitMs: 60_000})
	mustStatus(t, q2, command.StatusQueued)
	q3 := h.req("c", "c-1", &command.Acquire{Name: "l", LeaseID: lid(3), TTLms: ttl, WaitMs: 60_000})
	mustStatus(t, q3, command.StatusQueued)
	q4 := h.req("d", "d-1", &command.Acquire{Name: "l", LeaseID: lid(4), TTLms: ttl, WaitMs: 60_000})
	mustStatus(t, q4, command.StatusQueued)
	// d restarts and queues again with a new lease: its first request's wait is gone.
	q5 := h.req("d", "d-2", &command.Acquire{Name: "l", LeaseID: lid(5), TTLms: ttl, WaitMs: 60_000, Takeover: true})
	mustStatus(t, q5, command.StatusQueued)
	// c's wait times out.
	mustStatus(t, h.do("dlock", &command.ExpireWaits{Waits: []command.WaitRef{{LeaseID: lid(3), Name: "l", Seq: q3.Seq}}}), command.StatusOK)

	if r, _ := h.s.Lookup("b", "b-1"); r != q2 {
		t.Fatalf("before the grant: %+v, want %+v", r, q2)
	}
	mustStatus(t, h.release("a", "l", lid(1), 1), command.StatusOK) // hands off to b
	r, _ := h.s.Lookup("b", "b-1")
	if r.Status != command.StatusOK || r.LeaseID != lid(2) || r.Token != 2 || r.Seq != q2.Seq || r.TTLms != ttl {
		t.Fatalf("after the grant: %+v, want ok with lease 2, token 2, seq %d", r, q2.Seq)
	}
	// The retry is answered with the grant and changes nothing.
	before, rev := dump(h.s), h.s.Revision()
	if got := replayed(t, h.req("b", "b-1", &command.Acquire{Name: "l", LeaseID: lid(9), TTLms: ttl, WaitMs: 60_000})); got != r {
		t.Fatalf("retry = %+v, want %+v", got, r)
	}
	h.checkNoChange(before, rev)
	// b's grant ends; the entry still says granted.
	mustStatus(t, h.release("b", "l", lid(2), 2), command.StatusOK) // hands off to d's second wait
	if got, _ := h.s.Lookup("b", "b-1"); got != r {
		t.Fatalf("after the grant ended: %+v, want %+v", got, r)
	}
	for _, c := range []struct {
		client, req string
		want        command.Result
	}{{"c", "c-1", q3}, {"d", "d-1", q4}} {
		if got, _ := h.s.Lookup(c.client, c.req); got != c.want {
			t.Fatalf("%s %s never granted, yet remembered as %+v", c.client, c.req, got)
		}
	}
	if got, _ := h.s.Lookup("d", "d-2"); got.Status != command.StatusOK || got.Token != 3 || got.LeaseID != lid(5) {
		t.Fatalf("d-2 granted: remembered as %+v", got)
	}
	// The rewritten entry survives a snapshot.
	rs, err := Restore(h.s.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := rs.Lookup("b", "b-1"); got != r {
		t.Fatalf("after restore: %+v, want %+v", got, r)
	}
}

func TestDedupTableIsBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("slow")
	}
	s := New()
	n := DedupCapacity + 10
	for i := 1; i <= n; i++ {
		s.Apply(uint64(i), &command.Envelope{TS: int64(i), ClientID: "c", RequestID: itoa(i), Body: &command.RegisterMember{}})
	}
	if s.dedupRing.count != DedupCapacity || len(s.dedup) != DedupCapacity {
		t.Fatalf("dedup holds %d/%d", s.dedupRing.count, len(s.dedup))
	}
	for i := 1; i <= 10; i++ {
		if _, ok := s.Lookup("c", itoa(i)); ok {
			t.Fatalf("oldest entry %d not forgotten", i)
		}
	}
	for _, i := range []int{11, n / 2, n} {
		if _, ok := s.Lookup("c", itoa(i)); !ok {
			t.Fatalf("entry %d forgotten", i)
		}
	}
	b := s.Snapshot()
	r, err := Restore(b)
	if err != nil {
		t.Fatal(err)
	}
	if string(r.Snapshot()) != string(b) {
		t.Fatal("full dedup ring does not re-snapshot identically")
	}
	// Both forget the same next entry.
	for _, st := range []*State{s, r} {
		st.Apply(uint64(n+1), &command.Envelope{TS: int64(n + 1), ClientID: "c", RequestID: "new", Body: &command.RegisterMember{}})
	}
	if string(r.Snapshot()) != string(s.Snapshot()) {
		t.Fatal("restored dedup ring evicts differently")
	}
	// Eviction keeps the digest: incremental and from scratch agree, and
	// so do the two replicas.
	if d := s.Digest(); d != s.FullDigest() || d != r.Digest() || r.Digest() != r.FullDigest() {
		t.Fatalf("digests after evictions: %016x (from scratch %016x), restored %016x (%016x)", d, s.FullDigest(), r.Digest(), r.FullDigest())
	}
	if _, ok := r.Lookup("c", itoa(11)); ok {
		t.Fatal("restored ring did not evict the oldest")
	}
}

func itoa(i int) string {
	const digits = "0123456789"
	if i == 0 {
		return "0"
	}
	var b []byte
	for ; i > 0; i /= 10 {
		b = append([]byte{digits[i%10]}, b...)
	}
	return string(b)
}

func TestSessions(t *testing.T) {
	h := newHarness(t)
	r := h.session("c1", lid(1), 10_000)
	mustStatus(t, r, command.StatusOK)
	if r.LeaseID != lid(1) || r.TTLms != 10_000 || r.ExpiresAt != h.ts+10_000 {
		t.Fatalf("create %+v", r)
	}
	wantTypes(t, h.ev, EventSessionCreated, EventLeaseTimer)
	if sc, lt := findEvent(t, h.ev, EventSessionCreated), findEvent(t, h.ev, EventLeaseTimer); sc.ClientID != "c1" || lt.Gen != 1 || lt.RemainingMs != 10_000 || lt.LeaseID != lid(1) {
		t.Fatalf("events %+v", h.ev)
	}

	// Creation is refused for a bad TTL or a used / missing id.
	before, rev := dump(h.s), h.s.Revision()
	for _, tc := range []struct {
		id  command.LeaseID
		ttl int64
	}{{lid(2), 999}, {lid(2), 600_001}, {lid(2), 0}, {lid(1), 10_000}, {command.LeaseID{}, 10_000}} {
		mustStatus(t, h.session("c2", tc.id, tc.ttl), command.StatusInvalid)
		h.checkNoChange(before, rev)
	}

	// Keepalive: generation increases, expiry moves.
	h.step = 3000
	for i := 0; i < 3; i++ {
		g := func() uint64 { l, _ := h.s.Lease(lid(1)); return l.Gen }()
		r := h.do("c1", &command.KeepAlive{LeaseID: lid(1)})
		mustStatus(t, r, command.StatusOK)
		l, _ := h.s.Lease(lid(1))
		if l.Gen != g+1 || r.ExpiresAt != h.ts+10_000 || l.RenewedAt != h.ts {
			t.Fatalf("keepalive %+v lease %+v", r, l)
		}
		wantTypes(t, h.ev, EventLeaseTimer)
	}
	// Keepalive without a client id is accepted (the id is the capability).
	mustStatus(t, h.do("", &command.KeepAlive{LeaseID: lid(1)}), command.StatusOK)
	before, rev = dump(h.s), h.s.Revision()
	mustStatus(t, h.do("c2", &command.KeepAlive{LeaseID: lid(1)}), command.StatusSessionNotFound)
	mustStatus(t, h.do("c1", &command.KeepAlive{LeaseID: lid(99)}), command.StatusSessionNotFound)
	mustStatus(t, h.do("c2", &command.DeleteSession{LeaseID: lid(1)}), command.StatusSessionNotFound)
	mustStatus(t, h.do("c1", &command.DeleteSession{LeaseID: lid(99)}), command.StatusSessionNotFound)
	h.checkNoChange(before, rev)

	// An implicit lease is not a session.
	mustStatus(t, h.acquire("c1", "imp", lid(5), ttl, 0), command.StatusOK)
	before, rev = dump(h.s), h.s.Revision()
	mustStatus(t, h.do("c1", &command.KeepAlive{LeaseID: lid(5)}), command.StatusSessionNotFound)
	mustStatus(t, h.do("c1", &command.DeleteSession{LeaseID: lid(5)}), command.StatusSessionNotFound)
	mustStatus(t, h.sacquire("c1", "x", lid(5), 0), command.StatusSessionNotFound)
	// Another client's session is refused; so is an unknown one.
	mustStatus(t, h.sacquire("c2", "x", lid(1), 0), command.StatusSessionNotFound)
	mustStatus(t, h.sacquire("c2", "x", lid(1), 5000), command.StatusSessionNotFound)
	mustStatus(t, h.sacquire("c1", "x", lid(98), 0), command.StatusSessionNotFound)
	mustStatus(t, h.sacquire("c1", "x", command.LeaseID{}, 0), command.StatusSessionNotFound)
	h.checkNoChange(before, rev)

	// Many locks under one session; others queue behind them; it waits for one.
	for _, n := range []string{"s/b", "s/a", "s/c"} {
		r := h.sacquire("c1", n, lid(1), 0)
		mustStatus(t, r, command.StatusOK)
		if r.LeaseID != lid(1) || r.ExpiresAt != func() int64 { l, _ := h.s.Lease(lid(1)); return l.ExpiresAt() }() {
			t.Fatalf("session acquire %+v", r)
		}
	}
	mustStatus(t, h.acquire("w1", "s/a", lid(10), ttl, 60_000), command.StatusQueued)
	mustStatus(t, h.acquire("w2", "s/c", lid(11), ttl, 60_000), command.StatusQueued)
	mustStatus(t, h.acquire("w3", "s/c", lid(12), ttl, 60_000), command.StatusQueued)
	mustStatus(t, h.acquire("o", "busy", lid(13), ttl, 0), command.StatusOK)
	q := h.sacquire("c1", "busy", lid(1), 60_000)
	mustStatus(t, q, command.StatusQueued)
	if l, _ := h.s.Lease(lid(1)); l.ExpiresAt() == 0 {
		t.Fatal("session inactive")
	}

	tok := h.s.LastToken()
	r = h.do("c1", &command.DeleteSession{LeaseID: lid(1)})
	mustStatus(t, r, command.StatusOK)
	if _, ok := h.s.Lease(lid(1)); ok {
		t.Fatal("deleted session still exists")
	}
	// Locks released in name order, each handed off at once; the wait dropped.
	var kinds []string
	for _, e := range h.ev {
		switch e.Type {
		case EventReleased:
			kinds = append(kinds, "rel:"+e.Name+":"+e.Cause)
		case EventAcquired:
			kinds = append(kinds, "acq:"+e.Name+":"+e.ClientID+":"+e.Cause)
		case EventDequeued:
			kinds = append(kinds, "deq:"+e.Name+":"+e.Cause)
		case EventSessionDeleted:
			kinds = append(kinds, "del:"+e.ClientID+":"+e.Cause)
		}
	}
	// The waits go first, so no release can let the ending session in.
	want := []string{
		"deq:busy:session_deleted",
		"rel:s/a:session_deleted", "acq:s/a:w1:handoff",
		"rel:s/b:session_deleted",
		"rel:s/c:session_deleted", "acq:s/c:w2:handoff",
		"del:c1:session_deleted",
	}
	if !slices.Equal(kinds, want) {
		t.Fatalf("delete events\n got %v\nwant %v", kinds, want)
	}
	if h.s.LockHolder("s/a").Token != tok+1 || h.s.LockHolder("s/c").Token != tok+2 || h.s.GetLock("s/b").Held {
		t.Fatalf("after delete: %+v %+v %+v", h.s.LockHolder("s/a"), h.s.LockHolder("s/c"), h.s.GetLock("s/b"))
	}
	if h.s.GetLock("busy").Waiters != 0 {
		t.Fatal("deleted session's wait still queued")
	}
	// Gone for good.
	before, rev = dump(h.s), h.s.Revision()
	mustStatus(t, h.do("c1", &command.KeepAlive{LeaseID: lid(1)}), command.StatusSessionNotFound)
	mustStatus(t, h.do("c1", &command.DeleteSession{LeaseID: lid(1)}), command.StatusSessionNotFound)
	mustStatus(t, h.sacquire("c1", "s/b", lid(1), 0), command.StatusSessionNotFound)
	h.checkNoChange(before, rev)
	// A session id cannot be reused by an implicit acquire while it lives.
	mustStatus(t, h.session("c1", lid(20), ttl), command.StatusOK)
	mustStatus(t, h.acquire("c1", "y", lid(20), ttl, 0), command.StatusInvalid)
}

func TestExpireLeasesOnlyAtMatchingGeneration(t *testing.T) {
	h := newHarness(t)
	mustStatus(t, h.acquire("c1", "a", lid(1), ttl, 0), command.StatusOK)
	mustStatus(t, h.acquire("c2", "a", lid(2), ttl, 60_000), command.StatusQueued)
	l1, _ := h.s.Lease(lid(1))
	staleGen := l1.Gen
	mustStatus(t, h.renew("c1", "a", lid(1), 1, 0), command.StatusOK) // renewal after the reaper looked

	before, rev := dump(h.s), h.s.Revision()
	for _, lg := range [][]command.LeaseGen{
		{{LeaseID: lid(1), Gen: staleGen}},
		{{LeaseID: lid(1), Gen: staleGen + 2}},
		{{LeaseID: lid(99), Gen: 1}},
		{{LeaseID: lid(2), Gen: 0}}, // a waiting implicit lease is not running
		{{LeaseID: lid(2), Gen: 1}},
		{},
	} {
		r := h.do("reaper", &command.ExpireLeases{Leases: lg})
		mustStatus(t, r, command.StatusOK)
		if r.Token != 0 {
			t.Fatalf("expired count %d", r.Token)
		}
		h.checkNoChange(before, rev)
	}

	l1, _ = h.s.Lease(lid(1))
	r := h.do("reaper", &command.ExpireLeases{Leases: []command.LeaseGen{{LeaseID: lid(1), Gen: l1.Gen}, {LeaseID: lid(1), Gen: l1.Gen}}})
	mustStatus(t, r, command.StatusOK)
	if r.Token != 1 {
		t.Fatalf("expired count %d, want 1", r.Token)
	}
	wantTypes(t, h.ev, EventExpired, EventLeaseGone, EventWaitGone, EventAcquired, EventLeaseTimer)
	if e := findEvent(t, h.ev, EventExpired); e.Name != "a" || e.ClientID != "c1" || e.Token != 1 || e.Cause != CauseExpired {
		t.Fatalf("expired event %+v", e)
	}
	if e := findEvent(t, h.ev, EventAcquired); e.ClientID != "c2" || e.Cause != CauseHandoff || e.Token != 2 {
		t.Fatalf("hand-off event %+v", e)
	}
	// The expired holder's proof is worthless now.
	mustStatus(t, h.release("c1", "a", lid(1), 1), command.StatusNotHolder)

	// A session expires: its locks are handed on, its waits dropped.
	mustStatus(t, h.session("s", lid(10), ttl), command.StatusOK)
	mustStatus(t, h.sacquire("s", "x", lid(10), 0), command.StatusOK)
	mustStatus(t, h.acquire("w", "x", lid(11), ttl, 60_000), command.StatusQueued)
	mustStatus(t, h.sacquire("s", "a", lid(10), 60_000), command.StatusQueued)
	ls, _ := h.s.Lease(lid(10))
	r = h.do("reaper", &command.ExpireLeases{Leases: []command.LeaseGen{{LeaseID: lid(10), Gen: ls.Gen}}})
	if r.Token != 1 {
		t.Fatalf("session not expired: %+v", r)
	}
	findEvent(t, h.ev, EventSessionExpired)
	if e := findEvent(t, h.ev, EventDequeued); e.Name != "a" || e.Cause != CauseExpired {
		t.Fatalf("dequeued %+v", e)
	}
	if e := findEvent(t, h.ev, EventExpired); e.Name != "x" {
		t.Fatalf("expired %+v", e)
	}
	if h.s.LockHolder("x").Holder != lid(11) {
		t.Fatal("session's lock not handed off")
	}
}

func TestExpireWaitsAndCancelWaitActOnlyOnExactWait(t *testing.T) {
	for _, op := range []string{"expire", "cancel"} {
		t.Run(op, func(t *testing.T) {
			h := newHarness(t)
			mustStatus(t, h.acquire("c1", "a", lid(1), ttl, 0), command.StatusOK)
			mustStatus(t, h.acquire("c1", "b", lid(3), ttl, 0), command.StatusOK)
			w := h.acquire("c2", "a", lid(2), ttl, 60_000)
			mustStatus(t, w, command.StatusQueued)
			mustStatus(t, h.acquire("c4", "a", lid(4), ttl, 60_000), command.StatusQueued)
			do := func(ref command.WaitRef) command.Result {
				if op == "expire" {
					r := h.do("reaper", &command.ExpireWaits{Waits: []command.WaitRef{ref}})
					mustStatus(t, r, command.StatusOK)
					if r.Token == 0 {
						r.Status = command.StatusNotWaiting // normalise: nothing expired
					}
					return r
				}
				return h.do("srv", &command.CancelWait{Wait: ref})
			}
			before, rev := dump(h.s), h.s.Revision()
			for _, ref := range []command.WaitRef{
				{LeaseID: lid(2), Name: "a", Seq: w.Seq + 1},
				{LeaseID: lid(2), Name: "a", Seq: w.Seq - 1},
				{LeaseID: lid(2), Name: "a", Seq: 0},
				{LeaseID: lid(2), Name: "b", Seq: w.Seq},
				{LeaseID: lid(2), Name: "/a", Seq: w.Seq},
				{LeaseID: lid(1), Name: "a", Seq: w.Seq},
				{LeaseID: lid(4), Name: "a", Seq: w.Seq},
				{LeaseID: lid(99), Name: "a", Seq: w.Seq},
				{Name: "a", Seq: w.Seq},
			} {
				mustStatus(t, do(ref), command.StatusNotWaiting)
				h.checkNoChange(before, rev)
			}
			r := do(command.WaitRef{LeaseID: lid(2), Name: "a", Seq: w.Seq})
			if op == "cancel" {
				mustStatus(t, r, command.StatusOK)
			} else if r.Token != 1 {
				t.Fatalf("expired %d waits", r.Token)
			}
			wantTypes(t, h.ev, EventDequeued, EventWaitGone, EventLeaseGone)
			cause := map[string]string{"expire": CauseTimeout, "cancel": CauseCancelled}[op]
			if e := findEvent(t, h.ev, EventDequeued); e.Name != "a" || e.ClientID != "c2" || e.Cause != cause || e.Seq != w.Seq {
				t.Fatalf("dequeued %+v", e)
			}
			if _, ok := h.s.Lease(lid(2)); ok {
				t.Fatal("lease of a dropped wait survived")
			}
			if h.s.LockHolder("a").Holder != lid(1) || h.s.GetLock("a").Waiters != 1 {
				t.Fatal("dropping a wait disturbed the lock")
			}
			// Dropping it again does nothing.
			before, rev = dump(h.s), h.s.Revision()
			mustStatus(t, do(command.WaitRef{LeaseID: lid(2), Name: "a", Seq: w.Seq}), command.StatusNotWaiting)
			h.checkNoChange(before, rev)
		})
	}
}

func TestExpireWaitsBatch(t *testing.T) {
	h := newHarness(t)
	mustStatus(t, h.acquire("c1", "a", lid(1), ttl, 0), command.StatusOK)
	mustStatus(t, h.session("s", lid(5), ttl), command.StatusOK)
	w2 := h.acquire("c2", "a", lid(2), ttl, 60_000)
	w3 := h.sacquire("s", "a", lid(5), 60_000)
	r := h.do("reaper", &command.ExpireWaits{Waits: []command.WaitRef{
		{LeaseID: lid(2), Name: "a", Seq: w2.Seq},
		{LeaseID: lid(5), Name: "a", Seq: w3.Seq},
		{LeaseID: lid(2), Name: "a", Seq: w2.Seq},
	}})
	if r.Token != 2 {
		t.Fatalf("expired %d", r.Token)
	}
	if _, ok := h.s.Lease(lid(5)); !ok {
		t.Fatal("a session must survive the expiry of its wait")
	}
	if h.s.GetLock("a").Waiters != 0 {
		t.Fatal("waits left")
	}
}

func TestCancelWaitReleaseIfGranted(t *testing.T) {
	h := newHarness(t)
	mustStatus(t, h.acquire("c1", "a", lid(1), ttl, 0), command.StatusOK)
	w := h.acquire("c2", "a", lid(2), ttl, 60_000)
	mustStatus(t, w, command.StatusQueued)
	mustStatus(t, h.acquire("c3", "a", lid(3), ttl, 60_000), command.StatusQueued)
	mustStatus(t, h.release("c1", "a", lid(1), 1), command.StatusOK) // c2's wait is granted
	ref := command.WaitRef{LeaseID: lid(2), Name: "a", Seq: w.Seq}

	before, rev := dump(h.s), h.s.Revision()
	for _, c := range []command.CancelWait{
		{Wait: ref}, // not waiting any more, and not asked to release
		{Wait: command.WaitRef{LeaseID: lid(2), Name: "a", Seq: w.Seq + 1}, ReleaseIfGranted: true},
		{Wait: command.WaitRef{LeaseID: lid(2), Name: "b", Seq: w.Seq}, ReleaseIfGranted: true},
		{Wait: command.WaitRef{LeaseID: lid(3), Name: "a", Seq: w.Seq}, ReleaseIfGranted: true},
	} {
		c := c
		mustStatus(t, h.do("srv", &c), command.StatusNotWaiting)
		h.checkNoChange(before, rev)
	}
	r := h.do("srv", &command.CancelWait{Wait: ref, ReleaseIfGranted: true})
	mustStatus(t, r, command.StatusOK)
	if e := findEvent(t, h.ev, EventReleased); e.Cause != CauseCancelled || e.ClientID != "c2" || e.Token != 2 {
		t.Fatalf("released %+v", e)
	}
	if e := findEvent(t, h.ev, EventAcquired); e.ClientID != "c3" || e.Cause != CauseHandoff || e.Token != 3 {
		t.Fatalf("hand-off %+v", e)
	}
	if _, ok := h.s.Lease(lid(2)); ok {
		t.Fatal("cancelled lease survived")
	}
	// Repeating it does nothing: the lock now belongs to another grant.
	before, rev = dump(h.s), h.s.Revision()
	mustStatus(t, h.do("srv", &command.CancelWait{Wait: ref, ReleaseIfGranted: true}), command.StatusNotWaiting)
	h.checkNoChange(before, rev)

	// A session: the grant of its wait is released, a later grant is not.
	mustStatus(t, h.session("s", lid(10), ttl), command.StatusOK)
	mustStatus(t, h.acquire("o", "b", lid(11), ttl, 0), command.StatusOK)
	sw := h.sacquire("s", "b", lid(10), 60_000)
	mustStatus(t, sw, command.StatusQueued)
	tok := h.s.LastToken()
	mustStatus(t, h.release("o", "b", lid(11), tok), command.StatusOK)
	if h.s.LockHolder("b").GrantSeq != sw.Seq {
		t.Fatal("session wait not granted")
	}
	mustStatus(t, h.release("s", "b", lid(10), tok+1), command.StatusOK)
	again := h.sacquire("s", "b", lid(10), 0)
	mustStatus(t, again, command.StatusOK)
	before, rev = dump(h.s), h.s.Revision()
	mustStatus(t, h.do("srv", &command.CancelWait{Wait: command.WaitRef{LeaseID: lid(10), Name: "b", Seq: sw.Seq}, ReleaseIfGranted: true}), command.StatusNotWaiting)
	h.checkNoChange(before, rev)
	if h.s.LockHolder("b").Holder != lid(10) {
		t.Fatal("later grant released")
	}
	// The direct grant's own seq does release it (the acquire never waited, but
	// the requester may still cancel it).
	mustStatus(t, h.do("srv", &command.CancelWait{Wait: command.WaitRef{LeaseID: lid(10), Name: "b", Seq: again.Seq}, ReleaseIfGranted: true}), command.StatusOK)
	if h.s.GetLock("b").Held {
		t.Fatal("grant of the cancelled acquire not released")
	}
	if _, ok := h.s.Lease(lid(10)); !ok {
		t.Fatal("session ended by a cancel")
	}
}

func TestTTLAndWaitBounds(t *testing.T) {
	cases := []struct {
		ttl, wait int64
		ok        bool
	}{
		{command.MinTTLms, 0, true},
		{command.MaxTTLms, 0, true},
		{command.MinTTLms - 1, 0, false},
		{command.MaxTTLms + 1, 0, false},
		{0, 0, false},
		{-1000, 0, false},
		{ttl, -1, false},
		{ttl, command.MaxWaitMs, true},
		{ttl, command.MaxWaitMs + 1, false},
		{ttl, 1, true},
	}
	for _, held := range []bool{false, true} {
		for _, tc := range cases {
			h := newHarness(t)
			if held {
				mustStatus(t, h.acquire("o", "a", lid(100), ttl, 0), command.StatusOK)
			}
			before, rev := dump(h.s), h.s.Revision()
			r := h.acquire("c", "a", lid(1), tc.ttl, tc.wait)
			if !tc.ok {
				mustStatus(t, r, command.StatusInvalid)
				h.checkNoChange(before, rev)
				continue
			}
			want := command.StatusOK
			if held {
				want = command.StatusLockHeld
				if tc.wait > 0 {
					want = command.StatusQueued
				}
			}
			mustStatus(t, r, want)
		}
	}
	// Session acquires check the wait bound too.
	h := newHarness(t)
	mustStatus(t, h.session("c", lid(1), ttl), command.StatusOK)
	before, rev := dump(h.s), h.s.Revision()
	mustStatus(t, h.sacquire("c", "a", lid(1), -1), command.StatusInvalid)
	mustStatus(t, h.sacquire("c", "a", lid(1), command.MaxWaitMs+1), command.StatusInvalid)
	h.checkNoChange(before, rev)
}

func TestBadNamesRejected(t *testing.T) {
	h := newHarness(t)
	mustStatus(t, h.session("c", lid(1), ttl), command.StatusOK)
	before, rev := dump(h.s), h.s.Revision()
	for i, name := range []string{"", "/", "/a", "a//b", "a/", ".", "..", "a/../b", "a/./b", "a b", "é", strings.Repeat("x", 257)} {
		mustStatus(t, h.acquire("c", name, lid(10+i), ttl, 0), command.StatusInvalid)
		mustStatus(t, h.sacquire("c", name, lid(1), 1000), command.StatusInvalid)
		h.checkNoChange(before, rev)
	}
	mustStatus(t, h.acquire("c", strings.Repeat("x", 256), lid(5), ttl, 0), command.StatusOK)
}

func TestTimersRelativeToNewestTimestamp(t *testing.T) {
	h := newHarness(t)
	h.step = 100
	mustStatus(t, h.session("c1", lid(1), 10_000), command.StatusOK)
	sessTS := h.ts
	mustStatus(t, h.acquire("c2", "a", lid(2), 20_000, 0), command.StatusOK)
	grantTS := h.ts
	w := h.acquire("c3", "a", lid(3), 5_000, 7_000)
	waitTS := h.ts
	mustStatus(t, h.do("n", &command.RegisterMember{ID: "n1"}), command.StatusOK)
	// Commands that change nothing still move the clock forward.
	h.step = 1000
	mustStatus(t, h.acquire("c4", "a", lid(4), ttl, 0), command.StatusLockHeld)
	now := h.ts
	leases, waits := h.s.Timers()
	sort.Slice(leases, func(i, j int) bool { return string(leases[i].LeaseID[:]) < string(leases[j].LeaseID[:]) })
	want := []LeaseTimer{
		{LeaseID: lid(1), Gen: 1, RemainingMs: sessTS + 10_000 - now},
		{LeaseID: lid(2), Gen: 1, RemainingMs: grantTS + 20_000 - now},
	}
	sort.Slice(want, func(i, j int) bool { return string(want[i].LeaseID[:]) < string(want[j].LeaseID[:]) })
	if !slices.Equal(leases, want) {
		t.Fatalf("lease timers %+v, want %+v (waiting lease 3 must not run)", leases, want)
	}
	wantW := []WaitTimer{{Wait: command.WaitRef{LeaseID: lid(3), Name: "a", Seq: w.Seq}, RemainingMs: waitTS + 7_000 - now}}
	if !slices.Equal(waits, wantW) {
		t.Fatalf("wait timers %+v, want %+v", waits, wantW)
	}
	// A timestamp going backwards in the log does not move the clock back.
	h.idx++
	h.applyEnv(&command.Envelope{TS: now - 5000, ClientID: "n", Body: &command.RegisterMember{ID: "n1"}})
	if h.s.LastTS() != now {
		t.Fatalf("clock went back to %d", h.s.LastTS())
	}
	l2, _ := h.s.Timers()
	if len(l2) != 2 {
		t.Fatal("timers changed")
	}
}

func TestRevisionMovesOnlyOnChange(t *testing.T) {
	h := newHarness(t)
	// checkStep (run on every command) asserts the general rule; these are
	// the edge cases worth naming.
	mustStatus(t, h.do("n", &command.RegisterMember{ID: "n1", RaftAddr: "r", APIAddr: "a"}), command.StatusOK)
	if h.s.Revision() != 1 {
		t.Fatal("member registration is a change")
	}
	mustStatus(t, h.do("n", &command.RegisterMember{ID: "n1", RaftAddr: "r", APIAddr: "a"}), command.StatusOK)
	if h.s.Revision() != 1 {
		t.Fatal("re-registering the same member is not a change")
	}
	mustStatus(t, h.do("n", &command.RegisterMember{ID: "n1", RaftAddr: "r", APIAddr: "b"}), command.StatusOK)
	mustStatus(t, h.do("n", &command.RegisterMember{ID: "n0", RaftAddr: "r0", APIAddr: "a0"}), command.StatusOK)
	mustStatus(t, h.do("n", &command.RegisterMember{}), command.StatusInvalid)
	if h.s.Revision() != 3 {
		t.Fatalf("revision %d", h.s.Revision())
	}
	if m := h.s.Members(); len(m) != 2 || m[0].ID != "n0" || m[1] != (Member{ID: "n1", RaftAddr: "r", APIAddr: "b"}) {
		t.Fatalf("members %+v", m)
	}
	mustStatus(t, h.do("reaper", &command.ExpireLeases{}), command.StatusOK)
	mustStatus(t, h.do("reaper", &command.ExpireWaits{}), command.StatusOK)
	if h.s.Revision() != 3 {
		t.Fatal("empty expiries changed the revision")
	}
	// Results report the revision they reflect.
	r := h.acquire("c", "a", lid(1), ttl, 0)
	if r.Revision != 4 {
		t.Fatalf("result revision %d", r.Revision)
	}
	r = h.acquire("d", "a", lid(2), ttl, 0)
	if r.Revision != 4 {
		t.Fatalf("refusal revision %d", r.Revision)
	}
}

func TestReads(t *testing.T) {
	h := newHarness(t)
	for i, n := range []string{"a/1", "a/2", "a/3", "ab", "b/1"} {
		mustStatus(t, h.acquire("c"+n, n, lid(i+1), ttl, 0), command.StatusOK)
	}
	mustStatus(t, h.acquire("w", "a/2", lid(20), ttl, 1000), command.StatusQueued)
	names := func(l []LockInfo) []string {
		var out []string
		for _, x := range l {
			out = append(out, x.Name)
		}
		return out
	}
	cases := []struct {
		prefix, after string
		limit         int
		want          []string
		more          bool
	}{
		{"", "", 10, []string{"a/1", "a/2", "a/3", "ab", "b/1"}, false},
		{"a/", "", 10, []string{"a/1", "a/2", "a/3"}, false},
		{"a/", "", 2, []string{"a/1", "a/2"}, true},
		{"a/", "a/2", 2, []string{"a/3"}, false},
		{"a/", "a/1", 2, []string{"a/2", "a/3"}, false},
		{"a", "", 10, []string{"a/1", "a/2", "a/3", "ab"}, false},
		{"b/", "", 10, []string{"b/1"}, false},
		{"c", "", 10, nil, false},
		{"a/", "zzz", 10, nil, false},
		{"", "a/3", 1, []string{"ab"}, true},
	}
	for _, tc := range cases {
		got, more := h.s.ListLocks(tc.prefix, tc.after, tc.limit)
		if !slices.Equal(names(got), tc.want) || more != tc.more {
			t.Errorf("ListLocks(%q,%q,%d) = %v,%v; want %v,%v", tc.prefix, tc.after, tc.limit, names(got), more, tc.want, tc.more)
		}
	}
	got, _ := h.s.ListLocks("a/2", "", 1)
	if len(got) != 1 || got[0].Waiters != 1 || got[0].Holder.ClientID != "ca/2" {
		t.Fatalf("list entry %+v", got)
	}
	c := h.s.Counts()
	if c != (Counts{Locks: 5, Held: 5, Waiters: 1, Leases: 6, Sessions: 0, Grants: 5}) {
		t.Fatalf("counts %+v", c)
	}
	if seq, ok := h.s.WaitSeq(lid(20), "a/2"); !ok || seq != h.idx {
		t.Fatalf("WaitSeq %d %v", seq, ok)
	}
	if _, ok := h.s.WaitSeq(lid(20), "a/1"); ok {
		t.Fatal("WaitSeq on the wrong lock")
	}
	l, ok := h.s.Lease(lid(1))
	if !ok || l.Locks().Len() != 0 || l.Waits().Len() != 0 || l.ClientID != "ca/1" {
		t.Fatalf("Lease copy %+v", l)
	}
}

func TestElections(t *testing.T) {
	h := newHarness(t)
	key := command.ElectionKey("db/primary")
	mustStatus(t, h.session("cand-1", lid(1), 20_000), command.StatusOK)
	sessTS := h.ts
	r1 := h.do("cand-1", &command.Acquire{Name: key, LeaseID: lid(1), Session: true, Value: "10.0.0.1"})
	mustStatus(t, r1, command.StatusOK)
	acq := findEvent(t, h.ev, EventAcquired)
	if acq.Value != "10.0.0.1" || acq.Name != key || acq.ClientID != "cand-1" || acq.At != h.ts {
		t.Fatalf("acquired %+v", acq)
	}
	grantTS := h.ts
	r2 := h.do("cand-2", &command.Acquire{Name: key, LeaseID: lid(2), TTLms: 5_000, WaitMs: 60_000, Value: "10.0.0.2"})
	mustStatus(t, r2, command.StatusQueued)
	el := h.s.GetElection("db/primary")
	want := ElectionInfo{Name: "db/primary", HasLeader: true, CandidateID: "cand-1", Value: "10.0.0.1", Token: r1.Token,
		Since: grantTS, ExpiresAt: sessTS + 20_000, Campaigners: 1}
	if el != want {
		t.Fatalf("GetElection = %+v, want %+v", el, want)
	}
	if got := h.s.GetElection("other"); got != (ElectionInfo{Name: "other"}) {
		t.Fatalf("empty election %+v", got)
	}
	// Elections share the table but are not listed as locks.
	mustStatus(t, h.acquire("c", "db", lid(3), ttl, 0), command.StatusOK)
	if got, _ := h.s.ListLocks("", "", 10); len(got) != 1 || got[0].Name != "db" {
		t.Fatalf("ListLocks = %+v", got)
	}

	// Proclaim: the leader changes its value.
	rev := h.s.Revision()
	r := h.do("cand-1", &command.Proclaim{Name: key, LeaseID: lid(1), Token: r1.Token, Value: "10.0.0.9"})
	mustStatus(t, r, command.StatusOK)
	if r.Token != r1.Token || r.Revision != rev+1 {
		t.Fatalf("proclaim %+v", r)
	}
	wantTypes(t, h.ev, EventProclaimed)
	if e := h.ev[0]; !e.Type.Public() || e.Value != "10.0.0.9" || e.ClientID != "cand-1" || e.Token != r1.Token || e.Name != key {
		t.Fatalf("proclaimed %+v", e)
	}
	if h.s.GetElection("db/primary").Value != "10.0.0.9" {
		t.Fatal("value not replaced")
	}
	// The same value again, a bad proof or an oversized value change nothing.
	before, rev := dump(h.s), h.s.Revision()
	mustStatus(t, h.do("cand-1", &command.Proclaim{Name: key, LeaseID: lid(1), Token: r1.Token, Value: "10.0.0.9"}), command.StatusOK)
	for _, p := range []struct {
		client string
		p      command.Proclaim
	}{
		{"cand-1", command.Proclaim{Name: key, LeaseID: lid(1), Token: r1.Token + 1, Value: "x"}},
		{"cand-1", command.Proclaim{Name: key, LeaseID: lid(2), Token: r1.Token, Value: "x"}},
		{"cand-2", command.Proclaim{Name: key, LeaseID: lid(1), Token: r1.Token, Value: "x"}},
		{"cand-1", command.Proclaim{Name: command.ElectionKey("other"), LeaseID: lid(1), Token: r1.Token, Value: "x"}},
	} {
		p := p
		mustStatus(t, h.do(p.client, &p.p), command.StatusNotHolder)
	}
	// Proclaim names an election; on a plain lock name it is refused.
	mustStatus(t, h.do("cand-1", &command.Proclaim{Name: "db/primary", LeaseID: lid(1), Token: r1.Token, Value: "x"}), command.StatusInvalid)
	mustStatus(t, h.do("cand-1", &command.Proclaim{Name: key, LeaseID: lid(1), Token: r1.Token, Value: strings.Repeat("v", command.MaxValueLen+1)}), command.StatusInvalid)
	mustStatus(t, h.do("cand-3", &command.Acquire{Name: key, LeaseID: lid(4), TTLms: ttl, WaitMs: 1000, Value: strings.Repeat("v", command.MaxValueLen+1)}), command.StatusInvalid)
	h.checkNoChange(before, rev)
	mustStatus(t, h.do("cand-1", &command.Proclaim{Name: key, LeaseID: lid(1), Token: r1.Token, Value: strings.Repeat("v", command.MaxValueLen)}), command.StatusOK)

	// Resign: the next campaigner leads at once, with its own value.
	mustStatus(t, h.release("cand-1", key, lid(1), r1.Token), command.StatusOK)
	acq = findEvent(t, h.ev, EventAcquired)
	if acq.ClientID != "cand-2" || acq.Value != "10.0.0.2" || acq.Cause != CauseHandoff {
		t.Fatalf("hand-off %+v", acq)
	}
	el = h.s.GetElection("db/primary")
	if el.CandidateID != "cand-2" || el.Value != "10.0.0.2" || el.Campaigners != 0 || el.ExpiresAt != h.ts+5_000 {
		t.Fatalf("after resign %+v", el)
	}
	// A restarted leader (same candidate id, new lease) takes over with its new value.
	tok := h.s.LastToken()
	r = h.do("cand-2", &command.Acquire{Name: key, LeaseID: lid(5), TTLms: 5_000, Value: "10.0.0.22", Takeover: true})
	mustStatus(t, r, command.StatusOK)
	if el := h.s.GetElection("db/primary"); el.Value != "10.0.0.22" || el.Token != tok+1 {
		t.Fatalf("after takeover %+v", el)
	}
	// The last leader leaves: no leader, no value left behind.
	mustStatus(t, h.release("cand-2", key, lid(5), tok+1), command.StatusOK)
	if el := h.s.GetElection("db/primary"); el.HasLeader || el.Value != "" {
		t.Fatalf("empty election %+v", el)
	}
	if _, ok := h.s.locks.Get(&Lock{Name: key}); ok {
		t.Fatal("empty election left in the table")
	}
}

// etcd's Campaign by the current leader with a new value proclaims it; so
// does dlock's (same token, new value, a proclaimed event).
func TestRecampaignBySameSessionUpdatesValue(t *testing.T) {
	h := newHarness(t)
	key := command.ElectionKey("e")
	mustStatus(t, h.session("c", lid(1), ttl), command.StatusOK)
	first := h.do("c", &command.Acquire{Name: key, LeaseID: lid(1), Session: true, Value: "old"})
	mustStatus(t, first, command.StatusOK)
	r := h.do("c", &command.Acquire{Name: key, LeaseID: lid(1), Session: true, Value: "new"})
	mustStatus(t, r, command.StatusOK)
	if v := h.s.GetElection("e").Value; v != "new" {
		t.Fatalf("re-campaign kept value %q, want %q", v, "new")
	}
	if r.Token != first.Token || h.s.LastToken() != first.Token {
		t.Fatalf("re-campaign token %d (last %d), want the first grant's %d", r.Token, h.s.LastToken(), first.Token)
	}
	// Watchers learn the new value as they would from a proclaim.
	wantTypes(t, h.ev, EventProclaimed, EventLeaseTimer)
	if e := findEvent(t, h.ev, EventProclaimed); e.Name != key || e.Value != "new" || e.ClientID != "c" || e.Token != first.Token {
		t.Fatalf("proclaimed %+v", e)
	}
	// The same value again only refreshes the lease.
	mustStatus(t, h.do("c", &command.Acquire{Name: key, LeaseID: lid(1), Session: true, Value: "new"}), command.StatusOK)
	wantTypes(t, h.ev, EventLeaseTimer)
}

func TestTokenKeyBootstrapAndRotation(t *testing.T) {
	h := newHarness(t)
	if _, _, ok := h.s.SigningKey(); ok {
		t.Fatal("a new state has a signing key")
	}
	if r := h.do("dlock", &command.SetTokenKey{}); r.Status != command.StatusInvalid {
		t.Fatalf("empty seed: %+v", r)
	}
	h.do("dlock", &command.SetTokenKey{Seed: [32]byte{1}})
	_, id1, ok := h.s.SigningKey()
	if !ok {
		t.Fatal("no signing key after bootstrap")
	}
	// A second bootstrap (another leader raced) changes nothing.
	rev := h.s.Revision()
	h.do("dlock", &command.SetTokenKey{Seed: [32]byte{2}})
	if _, id, _ := h.s.SigningKey(); id != id1 || h.s.Revision() != rev {
		t.Fatal("a second bootstrap replaced the key")
	}
	// Rotation makes a new current key and keeps the old public key only.
	h.do("dlock", &command.SetTokenKey{Seed: [32]byte{3}, Rotate: true})
	seed, id3, _ := h.s.SigningKey()
	if id3 == id1 || seed != ([32]byte{3}) {
		t.Fatal("rotation did not install the new key")
	}
	keys := h.s.TokenKeys()
	if len(keys) != 2 || keys[0].ID != id1 || keys[0].Current || !keys[1].Current {
		t.Fatalf("keys after rotation: %+v", keys)
	}
	for _, k := range keys {
		if k.Seed != ([32]byte{}) {
			t.Fatal("TokenKeys exposes a seed")
		}
	}
	if h.s.tokenKeys[0].Seed != ([32]byte{}) {
		t.Fatal("the retired key kept its seed")
	}
	// Rotating to the current key again is a no-op; old keys are bounded.
	rev = h.s.Revision()
	h.do("dlock", &command.SetTokenKey{Seed: [32]byte{3}, Rotate: true})
	if h.s.Revision() != rev {
		t.Fatal("re-installing the current key changed the state")
	}
	for i := 10; i < 30; i++ {
		h.do("dlock", &command.SetTokenKey{Seed: [32]byte{byte(i)}, Rotate: true})
	}
	if n := len(h.s.TokenKeys()); n != MaxTokenKeys {
		t.Fatalf("%d keys kept, want %d", n, MaxTokenKeys)
	}
}

func TestACLTokens(t *testing.T) {
	h := newHarness(t)
	root := &command.SetACLToken{AccessorID: [16]byte{1}, SecretHash: [32]byte{1}, Description: "root",
		Rules: []command.ACLRule{{Prefix: "", Perms: command.PermAll}}, Bootstrap: true}
	if r := h.do("admin", root); r.Status != command.StatusOK {
		t.Fatalf("bootstrap: %+v", r)
	}
	// A second bootstrap is refused: only the first one wins.
	again := *root
	again.AccessorID, again.SecretHash = [16]byte{9}, [32]byte{9}
	if r := h.do("admin", &again); r.Status != command.StatusInvalid {
		t.Fatalf("second bootstrap: %+v", r)
	}
	worker := &command.SetACLToken{AccessorID: [16]byte{2}, SecretHash: [32]byte{2},
		Rules: []command.ACLRule{{Prefix: "billing/", Perms: command.PermLock | command.PermRead}}, ClientIDs: []string{"worker-*", "cron"}}
	if r := h.do("admin", worker); r.Status != command.StatusOK {
		t.Fatalf("worker token: %+v", r)
	}
	tok, ok := h.s.ACLTokenBySecret([32]byte{2})
	if !ok {
		t.Fatal("worker token not found by secret")
	}
	for _, c := range []struct {
		perm uint8
		name string
		want bool
	}{
		{command.PermLock, "billing/job", true},
		{command.PermRead, "billing/", true},
		{command.PermLock, "payments/job", false},
		{command.PermElect, "billing/job", false},
		{command.PermLock | command.PermRead, "billing/x", true},
		{command.PermAdmin, "", false},
	} {
		if got := tok.Allows(c.perm, c.name); got != c.want {
			t.Errorf("Allows(%b, %q) = %v", c.perm, c.name, got)
		}
	}
	for id, want := range map[string]bool{"worker-1": true, "worker-": true, "cron": true, "cronx": false, "other": false} {
		if tok.AllowsClient(id) != want {
			t.Errorf("AllowsClient(%q) != %v", id, want)
		}
	}
	// Another token may not take an existing secret.
	thief := &command.SetACLToken{AccessorID: [16]byte{3}, SecretHash: [32]byte{2}, Rules: worker.Rules}
	if r := h.do("admin", thief); r.Status != command.StatusInvalid {
		t.Fatalf("secret reuse: %+v", r)
	}
	for _, bad := range []*command.SetACLToken{
		{SecretHash: [32]byte{4}, Rules: worker.Rules},
		{AccessorID: [16]byte{4}, Rules: worker.Rules},
		{AccessorID: [16]byte{4}, SecretHash: [32]byte{4}, Rules: []command.ACLRule{{Prefix: "x"}}},
		{AccessorID: [16]byte{4}, SecretHash: [32]byte{4}, Rules: []command.ACLRule{{Perms: 0x40}}},
		{AccessorID: [16]byte{4}, SecretHash: [32]byte{4}, ClientIDs: []string{""}},
	} {
		if r := h.do("admin", bad); r.Status != command.StatusInvalid {
			t.Errorf("%+v accepted: %+v", bad, r)
		}
	}
	// Revocation is immediate in the state.
	if r := h.do("admin", &command.DeleteACLToken{AccessorID: [16]byte{2}}); r.Status != command.StatusOK {
		t.Fatalf("revoke: %+v", r)
	}
	if _, ok := h.s.ACLTokenBySecret([32]byte{2}); ok {
		t.Fatal("a revoked token still resolves")
	}
	if r := h.do("admin", &command.DeleteACLToken{AccessorID: [16]byte{2}}); r.Status == command.StatusOK {
		t.Fatal("revoking twice succeeded")
	}
	if n := len(h.s.ACLTokens()); n != 1 {
		t.Fatalf("%d tokens left, want 1", n)
	}
}

// replayed checks that r is an answer from the dedup table and returns it as
// the first answer was (Replayed is the only difference).
func replayed(t *testing.T, r command.Result) command.Result {
	t.Helper()
	if !r.Replayed {
		t.Fatalf("a repeated request's answer %+v is not marked Replayed", r)
	}
	r.Replayed = false
	return r
}

// The waiter cap travels in the acquire (Acquire.MaxWaiters) and the state
// machine enforces it, so acquires that race past the service's early check
// cannot grow the queue beyond it.
func TestWaiterCapIsEnforcedByTheStateMachine(t *testing.T) {
	h := newHarness(t)
	capped := func(client string, lease int, max int64) command.Result {
		return h.do(client, &command.Acquire{Name: "q", LeaseID: lid(lease), TTLms: 5000, WaitMs: 60_000, MaxWaiters: max})
	}
	takingOver := func(client string, lease int, max int64) command.Result {
		return h.do(client, &command.Acquire{Name: "q", LeaseID: lid(lease), TTLms: 5000, WaitMs: 60_000, MaxWaiters: max, Takeover: true})
	}
	mustStatus(t, capped("holder", 1, 2), command.StatusOK)
	mustStatus(t, capped("w1", 2, 2), command.StatusQueued)
	mustStatus(t, capped("w2", 3, 2), command.StatusQueued)

	// The third waiter is refused and nothing changes.
	before, rev := dump(h.s), h.s.Revision()
	r := capped("w3", 4, 2)
	mustStatus(t, r, command.StatusQueueFull)
	h.checkNoChange(before, rev)
	if _, ok := h.s.Lease(lid(4)); ok {
		t.Fatal("a refused wait left its lease behind")
	}
	// Without waiting it is the usual lock_held; a larger cap, or none,
	// lets it in line.
	mustStatus(t, h.do("w3", &command.Acquire{Name: "q", LeaseID: lid(5), TTLms: 5000, MaxWaiters: 2}), command.StatusLockHeld)

	// A client already in line takes over its own place with a new lease:
	// no waiter is added, so the full queue does not refuse it. Without
	// takeover it would be one more waiter, and is refused.
	mustStatus(t, capped("w1", 8, 2), command.StatusQueueFull)
	mustStatus(t, takingOver("w1", 6, 2), command.StatusQueued)
	if q := h.s.GetLock("q"); q.Waiters != 2 {
		t.Fatalf("waiters %d after a re-queue, want 2", q.Waiters)
	}
	// The holder's own client takes over at once, cap or not.
	mustStatus(t, takingOver("holder", 7, 2), command.StatusOK)

	// One place frees up: the next one fits again.
	mustStatus(t, h.do("w2", &command.CancelWait{Wait: command.WaitRef{LeaseID: lid(3), Name: "q", Seq: 3}}), command.StatusOK)
	mustStatus(t, capped("w3", 8, 2), command.StatusQueued)
	mustStatus(t, capped("w4", 9, 2), command.StatusQueueFull)
	mustStatus(t, capped("w4", 10, 3), command.StatusQueued)
	mustStatus(t, capped("w5", 11, 0), command.StatusQueued)
	mustStatus(t, capped("w6", 12, -1), command.StatusQueued)
	if q := h.s.GetLock("q"); q.Waiters != 5 {
		t.Fatalf("waiters %d, want 5", q.Waiters)
	}

	// The refusal is not remembered: a retry of the request (same
	// request_id) is judged afresh, refused while the queue is full and let
	// in line once it is not.
	r1 := h.req("w9", "req-9", &command.Acquire{Name: "q", LeaseID: lid(13), TTLms: 5000, WaitMs: 60_000, MaxWaiters: 5})
	mustStatus(t, r1, command.StatusQueueFull)
	if _, ok := h.s.Lookup("w9", "req-9"); ok {
		t.Fatal("a queue_full refusal was remembered")
	}
	r2 := h.req("w9", "req-9", &command.Acquire{Name: "q", LeaseID: lid(14), TTLms: 5000, WaitMs: 60_000, MaxWaiters: 5})
	if r2.Status != command.StatusQueueFull || r2.Replayed {
		t.Fatalf("retry of a refused acquire into a full queue: %+v", r2)
	}
	mustStatus(t, h.do("w6", &command.CancelWait{Wait: command.WaitRef{LeaseID: lid(12), Name: "q", Seq: 14}}), command.StatusOK)
	r3 := h.req("w9", "req-9", &command.Acquire{Name: "q", LeaseID: lid(15), TTLms: 5000, WaitMs: 60_000, MaxWaiters: 5})
	if r3.Status != command.StatusQueued || r3.Replayed {
		t.Fatalf("retry once a place is free: %+v", r3)
	}
	if again := h.req("w9", "req-9", &command.Acquire{Name: "q", LeaseID: lid(16), TTLms: 5000, WaitMs: 60_000, MaxWaiters: 5}); !again.Replayed || again.Seq != r3.Seq {
		t.Fatalf("a retry after the wait queued: %+v, want the replayed %+v", again, r3)
	}
}
