package state

import (
	"bytes"
	"strconv"
	"strings"
	"testing"

	"github.com/dlock/dlock/internal/command"
)

// lastEnded is the newest ended grant of a key (History's first ended one).
func lastEnded(t *testing.T, s *State, key string) GrantRecord {
	t.Helper()
	for _, g := range s.History(key, 100) {
		if g.Cause != 0 {
			return g
		}
	}
	t.Fatalf("no ended grant of %q in %+v", key, s.History(key, 100))
	return GrantRecord{}
}

// Every way a grant ends is kept with its cause.
func TestHistoryEndCauses(t *testing.T) {
	el := command.ElectionKey("boss")
	cases := []struct {
		name string
		key  string
		end  func(h *harness, r command.Result) // ends the grant r of key by "c1"
		want EndCause
	}{
		{"release", "a", func(h *harness, r command.Result) {
			mustStatus(t, h.release("c1", "a", r.LeaseID, r.Token), command.StatusOK)
		}, EndReleased},
		{"expire", "a", func(h *harness, r command.Result) {
			mustStatus(t, h.do("", &command.ExpireLeases{Leases: []command.LeaseGen{{LeaseID: r.LeaseID, Gen: h.s.leases[r.LeaseID].Gen}}}), command.StatusOK)
		}, EndExpired},
		{"revoke", "a", func(h *harness, r command.Result) {
			mustStatus(t, h.do("op", &command.Revoke{Name: "a", Token: r.Token, Reason: "stuck"}), command.StatusOK)
		}, EndRevoked},
		{"takeover", "a", func(h *harness, r command.Result) {
			mustStatus(t, h.takeover("c1", "a", lid(9), ttl, 0), command.StatusOK)
		}, EndTakenOver},
		{"cancelled grant", "a", func(h *harness, r command.Result) {
			mustStatus(t, h.do("", &command.CancelWait{Wait: command.WaitRef{LeaseID: r.LeaseID, Name: "a", Seq: r.Seq}, ReleaseIfGranted: true}), command.StatusOK)
		}, EndReleased},
		{"resign", el, func(h *harness, r command.Result) {
			mustStatus(t, h.release("c1", el, r.LeaseID, r.Token), command.StatusOK)
		}, EndResigned},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			b := &command.Acquire{Name: tc.key, LeaseID: lid(1), TTLms: ttl, Value: "host-1:/jobs/7"}
			r := h.do("c1", b)
			mustStatus(t, r, command.StatusOK)
			tc.end(h, r)
			g := lastEnded(t, h.s, tc.key)
			if g.Cause != tc.want || g.Token != r.Token || g.ClientID != "c1" || g.Value != "host-1:/jobs/7" || g.TTLms != ttl ||
				g.GrantedAt == 0 || g.EndedAt < g.GrantedAt {
				t.Fatalf("record %+v; want cause %v, token %d, client c1, the value, ttl %d", g, tc.want, r.Token, ttl)
			}
			if tc.want == EndRevoked && g.Reason != "stuck" {
				t.Fatalf("revoke reason %q", g.Reason)
			}
		})
	}
	t.Run("session deleted", func(t *testing.T) {
		h := newHarness(t)
		h.session("c1", lid(1), ttl)
		r := h.sacquire("c1", "a", lid(1), 0)
		mustStatus(t, h.do("c1", &command.DeleteSession{LeaseID: lid(1)}), command.StatusOK)
		if g := lastEnded(t, h.s, "a"); g.Cause != EndSessionDeleted || g.Token != r.Token {
			t.Fatalf("record %+v", g)
		}
	})
}

// History shows the current grant first, then the ended ones newest first,
// and keeps them when nobody holds or waits for the lock.
func TestHistoryOrderAndCurrentGrant(t *testing.T) {
	h := newHarness(t)
	var tokens []uint64
	for i := 1; i <= 3; i++ {
		r := h.acquire("c", "job", lid(i), ttl, 0)
		tokens = append(tokens, r.Token)
		mustStatus(t, h.release("c", "job", r.LeaseID, r.Token), command.StatusOK)
	}
	if h.s.GetLock("job").Held {
		t.Fatal("held")
	}
	r := h.acquire("d", "job", lid(10), ttl, 0)
	got := h.s.History("job", 10)
	if len(got) != 4 || got[0].Token != r.Token || got[0].Cause != 0 || got[0].EndedAt != 0 || got[0].ClientID != "d" {
		t.Fatalf("history %+v: want the current grant first", got)
	}
	for i, g := range got[1:] {
		if g.Token != tokens[2-i] || g.Cause != EndReleased {
			t.Fatalf("history %+v: want ended grants newest first", got)
		}
	}
	if got := h.s.History("job", 2); len(got) != 2 || got[1].Token != tokens[2] {
		t.Fatalf("limit 2: %+v", got)
	}
	if got := h.s.History("nothing", 10); len(got) != 0 {
		t.Fatalf("history of an unknown name: %+v", got)
	}
}

// Each bound drops the oldest records first: per name, in all, in bytes,
// and by age on the lease clock when the leader commits a trim.
func TestHistoryRetentionBounds(t *testing.T) {
	cycle := func(h *harness, name string, n int, value string) {
		for i := 0; i < n; i++ {
			h.idx++
			r := h.do("c", &command.Acquire{Name: name, LeaseID: lid(1000 + int(h.idx)), TTLms: ttl, Value: value})
			mustStatus(t, r, command.StatusOK)
			mustStatus(t, h.release("c", name, r.LeaseID, r.Token), command.StatusOK)
		}
	}
	setRet := func(h *harness, r HistoryRetention) {
		mustStatus(t, h.do("", &command.SetHistoryRetention{PerName: r.PerName, MaxEntries: r.MaxEntries, MaxBytes: r.MaxBytes, MaxAgeMs: r.MaxAgeMs}), command.StatusOK)
	}
	ended := func(s *State, name string) []uint64 {
		var out []uint64
		for _, g := range s.History(name, 1000) {
			out = append(out, g.Token)
		}
		return out
	}
	t.Run("per name", func(t *testing.T) {
		h := newHarness(t)
		cycle(h, "a", DefaultHistoryPerName+5, "")
		got := ended(h.s, "a")
		if len(got) != DefaultHistoryPerName || got[0] != h.s.LastToken() || got[len(got)-1] != h.s.LastToken()-DefaultHistoryPerName+1 {
			t.Fatalf("kept %v; want the newest %d", got, DefaultHistoryPerName)
		}
		// Lowering the bound trims every name at once.
		setRet(h, HistoryRetention{3, DefaultHistoryMaxEntries, DefaultHistoryMaxBytes, DefaultHistoryMaxAgeMs})
		if got := ended(h.s, "a"); len(got) != 3 || got[0] != h.s.LastToken() {
			t.Fatalf("after lowering the bound: %v", got)
		}
		// 0 keeps none.
		setRet(h, HistoryRetention{0, DefaultHistoryMaxEntries, DefaultHistoryMaxBytes, DefaultHistoryMaxAgeMs})
		cycle(h, "b", 2, "")
		if n, _ := h.s.HistoryStats(); n != 0 {
			t.Fatalf("%d records kept with a per-name bound of 0", n)
		}
	})
	t.Run("total entries, oldest first across names", func(t *testing.T) {
		h := newHarness(t)
		setRet(h, HistoryRetention{16, 5, DefaultHistoryMaxBytes, DefaultHistoryMaxAgeMs})
		cycle(h, "a", 3, "")
		cycle(h, "b", 4, "")
		if got := ended(h.s, "a"); len(got) != 1 {
			t.Fatalf("a kept %v; want only its newest (the 5 newest of all are a's last and b's 4)", got)
		}
		if got := ended(h.s, "b"); len(got) != 4 {
			t.Fatalf("b kept %v", got)
		}
		if n, _ := h.s.HistoryStats(); n != 5 {
			t.Fatalf("%d records", n)
		}
	})
	t.Run("bytes", func(t *testing.T) {
		h := newHarness(t)
		big := strings.Repeat("v", command.MaxValueLen)
		budget := int64(3 * (recordOverhead + len("a") + len("c") + command.MaxValueLen))
		setRet(h, HistoryRetention{16, 1000, budget, DefaultHistoryMaxAgeMs})
		cycle(h, "a", 5, big)
		n, b := h.s.HistoryStats()
		if n != 3 || b > budget {
			t.Fatalf("%d records of %d bytes; want 3 within %d", n, b, budget)
		}
	})
	t.Run("age on the lease clock", func(t *testing.T) {
		h := newHarness(t)
		setRet(h, HistoryRetention{16, 1000, DefaultHistoryMaxBytes, 60_000})
		cycle(h, "old", 2, "")
		h.step = 30_000
		h.do("", &command.Tick{})
		h.step = 10
		cycle(h, "new", 2, "")
		// The old records are 30 s old: a trim now keeps everything.
		mustStatus(t, h.do("", &command.TrimHistory{}), command.StatusOK)
		if got := ended(h.s, "old"); len(got) != 2 {
			t.Fatalf("trimmed too early: %v", got)
		}
		h.step = 30_100
		h.do("", &command.Tick{})
		h.step = 10
		due, ok := h.s.HistoryTimer()
		if !ok || due > 0 {
			t.Fatalf("history timer %d %v: the old records are due", due, ok)
		}
		mustStatus(t, h.do("", &command.TrimHistory{}), command.StatusOK)
		if got := ended(h.s, "old"); len(got) != 0 {
			t.Fatalf("old records kept: %v", got)
		}
		if got := ended(h.s, "new"); len(got) != 2 {
			t.Fatalf("new records dropped: %v", got)
		}
		// The trim told the leader when the next record is due.
		if tm := ofType(h.ev, EventHistoryTimer); len(tm) != 1 || tm[0].RemainingMs <= 0 || tm[0].RemainingMs > 60_000 {
			t.Fatalf("timer events %+v", tm)
		}
	})
	t.Run("out of range", func(t *testing.T) {
		h := newHarness(t)
		for _, r := range []HistoryRetention{{-1, 1, 1, 1000}, {MaxHistoryPerName + 1, 1, 1, 1000}, {1, -1, 1, 1000}, {1, 1, -1, 1000}, {1, 1, 1, 999}, {1, 1, 1, MaxHistoryMaxAgeMs + 1}} {
			mustStatus(t, h.do("", &command.SetHistoryRetention{PerName: r.PerName, MaxEntries: r.MaxEntries, MaxBytes: r.MaxBytes, MaxAgeMs: r.MaxAgeMs}), command.StatusInvalid)
		}
		if h.s.HistoryRetentionBounds() != DefaultHistoryRetention() {
			t.Fatal("a refused retention changed the bounds")
		}
	})
}

// Revoke ends the grant named by its token, hands the lock to the next
// waiter in the same step with a higher token, and the revoked holder's
// renew answers lock_lost with its token.
func TestRevoke(t *testing.T) {
	h := newHarness(t)
	first := h.acquire("worker-1", "billing/batch-job", lid(1), ttl, 0)
	waiter := h.acquire("worker-2", "billing/batch-job", lid(2), ttl, 60_000)
	mustStatus(t, waiter, command.StatusQueued)

	mustStatus(t, h.do("op", &command.Revoke{Name: "billing/batch-job", Token: first.Token + 1, Reason: "x"}), command.StatusNotHolder)
	mustStatus(t, h.do("op", &command.Revoke{Name: "billing/batch-job", Token: first.Token, Reason: strings.Repeat("r", command.MaxReasonLen+1)}), command.StatusInvalid)
	r := h.do("op", &command.Revoke{Name: "billing/batch-job", Token: first.Token, Reason: "stuck"})
	mustStatus(t, r, command.StatusOK)
	if r.Token != first.Token || r.Message != "1" {
		t.Fatalf("revoke answer %+v", r)
	}
	wantTypes(t, h.ev, EventRevoked, EventAcquired, EventHistoryTimer, EventLeaseGone, EventWaitGone, EventLeaseTimer)
	if ev := ofType(h.ev, EventRevoked)[0]; ev.Reason != "stuck" || ev.Cause != CauseRevoked || ev.Token != first.Token || ev.ClientID != "worker-1" {
		t.Fatalf("revoked event %+v", ev)
	}
	li := h.s.GetLock("billing/batch-job")
	if !li.Held || li.Holder.ClientID != "worker-2" || li.Holder.Token <= first.Token {
		t.Fatalf("after revoke %+v: want worker-2 with a higher token", li)
	}
	lost := h.renew("worker-1", "billing/batch-job", lid(1), first.Token, 0)
	mustStatus(t, lost, command.StatusLockLost)
	if lost.Token != first.Token {
		t.Fatalf("lock_lost names token %d, want %d", lost.Token, first.Token)
	}
	// Someone else renewing with that token learns nothing.
	mustStatus(t, h.renew("worker-9", "billing/batch-job", lid(1), first.Token, 0), command.StatusNotHolder)
	// Token 0 revokes whoever holds it.
	r = h.do("op", &command.Revoke{Name: "billing/batch-job"})
	mustStatus(t, r, command.StatusOK)
	if r.Token != li.Holder.Token || h.s.GetLock("billing/batch-job").Held {
		t.Fatalf("revoke all: %+v, lock %+v", r, h.s.GetLock("billing/batch-job"))
	}
	mustStatus(t, h.do("op", &command.Revoke{Name: "billing/batch-job"}), command.StatusNotHolder)
	// A session that held the lock lives on: only its grant was revoked.
	h.session("s", lid(5), ttl)
	sr := h.sacquire("s", "other", lid(5), 0)
	mustStatus(t, h.do("op", &command.Revoke{Name: "other", Token: sr.Token}), command.StatusOK)
	if _, ok := h.s.Lease(lid(5)); !ok {
		t.Fatal("revoking a session's grant ended the session")
	}
}

// A grant with a lock-delay that ends by expiry or revoke keeps the lock
// from everyone until the leader commits the delay's end; waiters keep
// their places. A clean release starts no delay.
func TestLockDelay(t *testing.T) {
	h := newHarness(t)
	r := h.do("c1", &command.Acquire{Name: "a", LeaseID: lid(1), TTLms: ttl, LockDelayMs: 5000})
	mustStatus(t, r, command.StatusOK)
	mustStatus(t, h.acquire("c2", "a", lid(2), ttl, 60_000), command.StatusQueued)
	mustStatus(t, h.do("", &command.ExpireLeases{Leases: []command.LeaseGen{{LeaseID: lid(1), Gen: h.s.leases[lid(1)].Gen}}}), command.StatusOK)
	dt := ofType(h.ev, EventDelayTimer)
	if len(dt) != 1 || dt[0].Token != r.Token || dt[0].RemainingMs != 5000 || dt[0].Name != "a" {
		t.Fatalf("delay timer events %+v", dt)
	}
	li := h.s.GetLock("a")
	if li.Held || li.DelayedUntil != h.ts+5000 || li.Waiters != 1 {
		t.Fatalf("in the delay: %+v", li)
	}
	// An immediate acquire is told how long is left; a waiting one queues.
	d := h.acquire("c3", "a", lid(3), ttl, 0)
	mustStatus(t, d, command.StatusLockDelayed)
	if d.TTLms <= 0 || d.TTLms > 5000 {
		t.Fatalf("lock_delayed with %d ms left", d.TTLms)
	}
	mustStatus(t, h.acquire("c4", "a", lid(4), ttl, 60_000), command.StatusQueued)
	// A stale end (another grant's token) changes nothing.
	before, rev := dump(h.s), h.s.Revision()
	mustStatus(t, h.do("", &command.EndLockDelay{Name: "a", Token: r.Token + 7}), command.StatusOK)
	h.checkNoChange(before, rev)
	if got := h.s.DelayTimers(); len(got) != 1 || got[0].Token != r.Token {
		t.Fatalf("delay timers %+v", got)
	}
	// A restart in the middle keeps the delay and its waiters.
	rs, err := Restore(h.s.Snapshot())
	if err != nil || !bytes.Equal(rs.Snapshot(), h.s.Snapshot()) || len(rs.DelayTimers()) != 1 {
		t.Fatalf("restore in a delay: %v", err)
	}
	mustStatus(t, h.do("", &command.EndLockDelay{Name: "a", Token: r.Token}), command.StatusOK)
	li = h.s.GetLock("a")
	if !li.Held || li.Holder.ClientID != "c2" || li.DelayedUntil != 0 || li.Waiters != 1 {
		t.Fatalf("after the delay: %+v; want c2, then c4 waiting", li)
	}
	// Watchers see the delay end, then (at the same revision) the hand-off.
	wantTypes(t, h.ev, EventDelayEnded, EventAcquired, EventWaitGone, EventLeaseTimer)
	if e := h.ev[0]; e.Token != r.Token || e.Name != "a" || !e.Type.Public() {
		t.Fatalf("delay_ended event %+v, want token %d", e, r.Token)
	}
	if a := ofType(h.ev, EventAcquired); len(a) != 1 || a[0].Cause != CauseHandoff || a[0].Revision != h.ev[0].Revision {
		t.Fatalf("acquired events %+v", a)
	}

	// A delay with nobody waiting keeps the lock in the table, then drops it.
	h2 := newHarness(t)
	r2 := h2.do("c1", &command.Acquire{Name: "b", LeaseID: lid(1), TTLms: ttl, LockDelayMs: 1000})
	mustStatus(t, h2.do("op", &command.Revoke{Name: "b", Token: r2.Token}), command.StatusOK)
	if h2.s.GetLock("b").DelayedUntil == 0 {
		t.Fatal("revoke started no delay")
	}
	mustStatus(t, h2.do("", &command.EndLockDelay{Name: "b", Token: r2.Token}), command.StatusOK)
	if e := ofType(h2.ev, EventDelayEnded); len(e) != 1 || e[0].Token != r2.Token || len(ofType(h2.ev, EventAcquired)) != 0 {
		t.Fatalf("end of a delay nobody waited for: events %+v", h2.ev)
	}
	if h2.s.locks.Len() != 0 {
		t.Fatal("a free lock nobody waits for stayed in the table")
	}
	// A clean release starts none.
	r3 := h2.do("c1", &command.Acquire{Name: "b", LeaseID: lid(3), TTLms: ttl, LockDelayMs: 1000})
	mustStatus(t, h2.release("c1", "b", lid(3), r3.Token), command.StatusOK)
	if len(h2.s.DelayTimers()) != 0 || h2.s.locks.Len() != 0 {
		t.Fatal("a release started a lock-delay")
	}
	if g := lastEnded(t, h2.s, "b"); g.LockDelayMs != 1000 {
		t.Fatalf("record %+v does not show the grant's lock-delay", g)
	}
	mustStatus(t, h2.do("c1", &command.Acquire{Name: "b", LeaseID: lid(4), TTLms: ttl, LockDelayMs: command.MaxLockDelayMs + 1}), command.StatusInvalid)
}

// A lock holder may carry a value (from command version 7), replace it with
// a renew, and it shows in GET, events and the history.
func TestLockValues(t *testing.T) {
	h := newHarness(t)
	r := h.do("c1", &command.Acquire{Name: "a", LeaseID: lid(1), TTLms: ttl, Value: "pid 42 on host-1"})
	mustStatus(t, r, command.StatusOK)
	if li := h.s.GetLock("a"); li.Value != "pid 42 on host-1" {
		t.Fatalf("value %q", li.Value)
	}
	mustStatus(t, h.do("c1", &command.Renew{Name: "a", LeaseID: lid(1), Token: r.Token, Value: strings.Repeat("v", command.MaxValueLen+1), SetValue: true}), command.StatusInvalid)
	mustStatus(t, h.do("c1", &command.Renew{Name: "a", LeaseID: lid(1), Token: r.Token, Value: "step 2", SetValue: true}), command.StatusOK)
	if v := ofType(h.ev, EventValueChanged); len(v) != 1 || v[0].Value != "step 2" {
		t.Fatalf("value events %+v", h.ev)
	}
	// A renew without SetValue keeps it.
	mustStatus(t, h.renew("c1", "a", lid(1), r.Token, 0), command.StatusOK)
	if li := h.s.GetLock("a"); li.Value != "step 2" {
		t.Fatalf("value %q after a plain renew", li.Value)
	}
	mustStatus(t, h.release("c1", "a", lid(1), r.Token), command.StatusOK)
	if g := lastEnded(t, h.s, "a"); g.Value != "step 2" {
		t.Fatalf("record %+v", g)
	}
	// An acquire of version 6 or older with a value on a lock was refused;
	// a replay refuses it again.
	old := &command.Envelope{TS: h.ts + 10, ClientID: "c1", Version: 5, Body: &command.Acquire{Name: "a", LeaseID: lid(2), TTLms: ttl, Value: "x"}}
	h.idx++
	if res := h.s.Apply(h.idx, old); res.Status != command.StatusInvalid {
		t.Fatalf("a version 5 acquire with a lock value: %v", res.Status)
	}
}

// With several holders (a counting lock), each grant ends on its own
// record; a revoke without a token ends every grant there is at that
// moment, not the waiter it lets in; a lock-delay is for a plain mutex.
func TestRevokeEveryHolderOfACountingLock(t *testing.T) {
	h := newHarness(t)
	a := h.do("a", &command.Acquire{Name: "sem", LeaseID: lid(1), TTLms: ttl, Limit: 2})
	b := h.do("b", &command.Acquire{Name: "sem", LeaseID: lid(2), TTLms: ttl, Limit: 2})
	mustStatus(t, a, command.StatusOK)
	mustStatus(t, b, command.StatusOK)
	mustStatus(t, h.do("c", &command.Acquire{Name: "sem", LeaseID: lid(3), TTLms: ttl, Limit: 2, WaitMs: 60_000}), command.StatusQueued)
	if got := h.s.History("sem", 10); len(got) != 2 || got[0].Token != b.Token || got[1].Token != a.Token || got[0].Cause != 0 {
		t.Fatalf("history of two holders: %+v", got)
	}
	mustStatus(t, h.do("op", &command.Revoke{Name: "sem", Token: a.Token + 100, Reason: "x"}), command.StatusNotHolder)
	r := h.do("op", &command.Revoke{Name: "sem", Reason: "drain"})
	mustStatus(t, r, command.StatusOK)
	if r.Message != strings.Join([]string{uintStr(a.Token), uintStr(b.Token)}, " ") {
		t.Fatalf("revoked tokens %q, want both holders'", r.Message)
	}
	li := h.s.GetLock("sem")
	if !li.Held || len(li.Holders) != 1 || li.Holders[0].ClientID != "c" {
		t.Fatalf("after revoking every holder: %+v; want c let in", li)
	}
	got := h.s.History("sem", 10)
	if len(got) != 3 || got[1].Cause != EndRevoked || got[2].Cause != EndRevoked || got[1].Reason != "drain" {
		t.Fatalf("history %+v", got)
	}
	mustStatus(t, h.do("d", &command.Acquire{Name: "sem2", LeaseID: lid(4), TTLms: ttl, Limit: 2, LockDelayMs: 1000}), command.StatusInvalid)
	mustStatus(t, h.do("d", &command.Acquire{Name: "tree", LeaseID: lid(5), TTLms: ttl, Subtree: true, LockDelayMs: 1000}), command.StatusInvalid)
}

func uintStr(v uint64) string { return strconv.FormatUint(v, 10) }
