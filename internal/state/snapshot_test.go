package state

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/wire"
)

// rawSnap mirrors the snapshot format field by field, so tests can write
// snapshots the state could never produce (duplicates, dangling references).
type rawSnap struct {
	magic     string
	version   byte
	index     uint64
	ts        int64
	revision  uint64
	lastToken uint64
	clock     int64
	members   []Member
	leases    []rawLease
	locks     []rawLock
	dedup     []rawDedup
	keys      []TokenKey
	acl       []ACLToken
	hist      rawHistory
	lost      []rawLost // version 10
	shard     rawShard  // version 11
}

// rawShard is the shard section (version 11).
type rawShard struct {
	ranged   bool
	from, to string
	splits   []SplitRecord
	mapGen   uint64
	ranges   []command.ShardRange
	removing []string // version 13
}

// rawLost is one session's lost grants (version 10).
type rawLost struct {
	id     command.LeaseID
	grants []LostGrant
}

// rawHistory is the history section (version 9).
type rawHistory struct {
	retention HistoryRetention
	seq       uint64
	names     []string
	recs      [][]GrantRecord
}

type rawLease struct {
	id               command.LeaseID
	client           string
	ttl              int64
	session, active  bool
	gen              uint64
	renewed, created int64
	renewedClock     int64
}

type rawWaiter struct {
	lease         command.LeaseID
	client        string
	seq           uint64
	enq, deadline int64
	value         string
	requestID     string
	clockDeadline int64
	// version 8
	place           uint64
	shared, subtree bool
	// version 9
	lockDelay int64
}

type rawLock struct {
	name     string
	holder   command.LeaseID
	token    uint64
	granted  int64
	grantSeq uint64
	value    string
	queue    []rawWaiter
	// version 8
	limit   uint64
	shared  bool
	subtree bool
	more    []Grant
	// version 9: the grant's lock-delay, a delay in force
	delayMs, delayUntil, delayClock int64
	delayToken                      uint64
}

type rawDedup struct {
	client, request string
	result          command.Result
}

func (r *rawSnap) encode() []byte {
	w := &wire.Writer{}
	w.Fixed([]byte(r.magic))
	w.Byte(r.version)
	w.Uvarint(r.index)
	w.Varint(r.ts)
	w.Uvarint(r.revision)
	w.Uvarint(r.lastToken)
	if r.version >= 6 {
		w.Varint(r.clock)
	}
	w.Uvarint(uint64(len(r.members)))
	for _, m := range r.members {
		w.String(m.ID)
		w.String(m.RaftAddr)
		w.String(m.APIAddr)
		if r.version >= 7 {
			w.String(m.Version)
		}
	}
	w.Uvarint(uint64(len(r.leases)))
	for _, l := range r.leases {
		w.Fixed(l.id[:])
		w.String(l.client)
		w.Varint(l.ttl)
		w.Bool(l.session)
		w.Bool(l.active)
		w.Uvarint(l.gen)
		w.Varint(l.renewed)
		if r.version < 5 {
			w.Varint(l.created)
		}
		if r.version >= 6 {
			w.Varint(l.renewedClock)
		}
	}
	w.Uvarint(uint64(len(r.locks)))
	for _, lk := range r.locks {
		w.String(lk.name)
		w.Fixed(lk.holder[:])
		w.Uvarint(lk.token)
		w.Varint(lk.granted)
		w.Uvarint(lk.grantSeq)
		if r.version >= 2 {
			w.String(lk.value)
		}
		if r.version >= 8 {
			w.Uvarint(lk.limit)
			w.Bool(lk.shared)
			w.Bool(lk.subtree)
			w.Uvarint(uint64(len(lk.more)))
			for _, g := range lk.more {
				w.Fixed(g.LeaseID[:])
				w.Uvarint(g.Token)
				w.Varint(g.GrantedAt)
				w.Uvarint(g.GrantSeq)
				w.Bool(g.Subtree)
			}
		}
		if r.version >= 9 {
			w.Varint(lk.delayMs)
			w.Uvarint(lk.delayToken)
			w.Varint(lk.delayUntil)
			w.Varint(lk.delayClock)
		}
		w.Uvarint(uint64(len(lk.queue)))
		for _, q := range lk.queue {
			w.Fixed(q.lease[:])
			w.String(q.client)
			w.Uvarint(q.seq)
			w.Varint(q.enq)
			w.Varint(q.deadline)
			if r.version >= 6 {
				w.Varint(q.clockDeadline)
			}
			if r.version >= 2 {
				w.String(q.value)
			}
			if r.version >= 5 {
				w.String(q.requestID)
			}
			if r.version >= 8 {
				w.Uvarint(q.place)
				w.Bool(q.shared)
				w.Bool(q.subtree)
			}
			if r.version >= 9 {
				w.Varint(q.lockDelay)
			}
		}
	}
	w.Uvarint(uint64(len(r.dedup)))
	for _, d := range r.dedup {
		w.String(d.client)
		w.String(d.request)
		command.EncodeResult(w, &d.result)
		if r.version >= 8 {
			command.EncodeResultExt(w, &d.result)
		}
	}
	if r.version >= 3 {
		w.Uvarint(uint64(len(r.keys)))
		for _, k := range r.keys {
			w.Fixed(k.ID[:])
			w.Fixed(k.Public)
			w.Fixed(k.Seed[:])
			w.Varint(k.CreatedAt)
			w.Bool(k.Current)
			if r.version >= 6 {
				w.Uvarint(k.MaxToken)
			}
		}
	}
	if r.version >= 4 {
		w.Uvarint(uint64(len(r.acl)))
		for _, t := range r.acl {
			w.Fixed(t.AccessorID[:])
			w.Fixed(t.SecretHash[:])
			w.String(t.Description)
			w.Varint(t.CreatedAt)
			w.Varint(t.ExpiresAt)
			w.Uvarint(uint64(len(t.Rules)))
			for _, rl := range t.Rules {
				w.String(rl.Prefix)
				w.Byte(rl.Perms)
			}
			w.Uvarint(uint64(len(t.ClientIDs)))
			for _, c := range t.ClientIDs {
				w.String(c)
			}
			w.Uvarint(uint64(len(t.CertCNs)))
			for _, c := range t.CertCNs {
				w.String(c)
			}
		}
	}
	if r.version >= 9 {
		h := r.hist
		w.Varint(h.retention.PerName)
		w.Varint(h.retention.MaxEntries)
		w.Varint(h.retention.MaxBytes)
		w.Varint(h.retention.MaxAgeMs)
		w.Uvarint(h.seq)
		w.Uvarint(uint64(len(h.names)))
		for i, n := range h.names {
			w.String(n)
			w.Uvarint(uint64(len(h.recs[i])))
			for _, g := range h.recs[i] {
				w.Uvarint(g.Token)
				w.String(g.ClientID)
				w.String(g.Value)
				w.String(g.Reason)
				w.Varint(g.GrantedAt)
				w.Varint(g.EndedAt)
				w.Varint(g.EndedClock)
				w.Uvarint(g.Seq)
				w.Varint(int64(g.TTLms))
				w.Varint(int64(g.LockDelayMs))
				w.Byte(byte(g.Cause))
			}
		}
	}
	if r.version >= 10 {
		w.Uvarint(uint64(len(r.lost)))
		for _, l := range r.lost {
			w.Fixed(l.id[:])
			w.Uvarint(uint64(len(l.grants)))
			for _, g := range l.grants {
				w.String(g.Key)
				w.Uvarint(g.Token)
				w.Byte(byte(g.Cause))
				w.String(g.Reason)
				w.Uvarint(g.Revision)
			}
		}
	}
	if r.version >= 11 {
		sh := r.shard
		w.Bool(sh.ranged)
		w.String(sh.from)
		w.String(sh.to)
		w.Uvarint(uint64(len(sh.splits)))
		for _, x := range sh.splits {
			w.String(x.At)
			w.Uvarint(x.Group)
			w.Uvarint(x.Index)
			w.String(x.To)
		}
		w.Uvarint(sh.mapGen)
		w.Uvarint(uint64(len(sh.ranges)))
		for _, x := range sh.ranges {
			w.String(x.Start)
			w.Uvarint(x.ID)
			w.Uvarint(x.Group)
			if r.version >= 12 {
				w.Uvarint(uint64(len(x.Replicas)))
				for _, id := range x.Replicas {
					w.String(id)
				}
				w.String(x.Leaving)
			}
		}
		if r.version >= 13 {
			w.Uvarint(uint64(len(sh.removing)))
			for _, id := range sh.removing {
				w.String(id)
			}
		}
	}
	return w.Buf
}

// toRaw reads a state into the raw form (in the canonical order).
func toRaw(s *State) *rawSnap {
	r := &rawSnap{magic: "DLSNAP", version: 13, index: s.index, ts: s.ts, revision: s.revision, lastToken: s.lastToken, clock: s.clock, members: s.Members()}
	for _, id := range sortedLeaseIDs(s) {
		l := s.leases[id]
		r.leases = append(r.leases, rawLease{l.ID, l.ClientID, int64(l.TTLms), l.Session, l.Active, l.Gen, l.RenewedAt, l.RenewedAt - 1, l.RenewedClock})
	}
	s.locks.Ascend(func(lk *Lock) bool {
		rl := rawLock{name: lk.Name, holder: lk.Holder, token: lk.Token, granted: lk.GrantedAt, grantSeq: lk.GrantSeq, value: lk.Value(),
			limit: uint64(lk.Limit()), shared: lk.Shared(), subtree: lk.Held() && lk.grantAt(0).Subtree}
		if x := lk.extra; x != nil {
			rl.delayMs, rl.delayToken, rl.delayUntil, rl.delayClock = x.delayMs, x.delayToken, x.delayUntil, x.delayClock
		}
		for i := 1; i < lk.NumHolders(); i++ {
			rl.more = append(rl.more, lk.grantAt(i))
		}
		for _, q := range lk.Queue() {
			rl.queue = append(rl.queue, rawWaiter{q.LeaseID, q.ClientID, q.Seq, q.EnqueuedAt, q.Deadline, q.Value, q.RequestID, q.ClockDeadline, q.Place, q.Shared, q.Subtree, q.LockDelayMs})
		}
		r.locks = append(r.locks, rl)
		return true
	})
	s.dedupRing.each(func(e *dedupEntry) {
		r.dedup = append(r.dedup, rawDedup{e.key.client, e.key.request, e.result})
	})
	r.keys = append(r.keys, s.tokenKeys...)
	r.acl = s.ACLTokens()
	r.hist = rawHistory{retention: s.hist.retention, seq: s.hist.seq}
	s.hist.byName.Ascend(func(h *lockHistory) bool {
		r.hist.names = append(r.hist.names, h.name)
		r.hist.recs = append(r.hist.recs, append([]GrantRecord(nil), h.recs...))
		return true
	})
	ids := make([]command.LeaseID, 0, len(s.lost))
	for id := range s.lost {
		ids = append(ids, id)
	}
	sortLeaseIDs(ids)
	for _, id := range ids {
		r.lost = append(r.lost, rawLost{id, append([]LostGrant(nil), s.lost[id]...)})
	}
	r.shard = rawShard{s.shard.ranged, s.shard.from, s.shard.to, s.shard.splits, s.shard.mapGen, s.shard.ranges, s.shard.removing}
	return r
}

// beforeVersion10 is what a state restored from an older snapshot holds of
// r: no session remembers a lost grant.
func (r *rawSnap) beforeVersion10() { r.lost = nil }

// beforeVersion9 is what a state restored from an older snapshot holds of
// r: no history (default retention), no lock-delays.
func (r *rawSnap) beforeVersion9() {
	r.beforeVersion10()
	r.hist = rawHistory{retention: DefaultHistoryRetention()}
	for i := range r.locks {
		lk := &r.locks[i]
		lk.delayMs, lk.delayToken, lk.delayUntil, lk.delayClock = 0, 0, 0, 0
		for j := range lk.queue {
			lk.queue[j].lockDelay = 0
		}
	}
}

// sampleState is a small state with every kind of content: members, sessions,
// implicit leases, held locks, queues, dedup entries.
func sampleState(t testing.TB) *State {
	h := newHarness(t)
	h.do("n", &command.RegisterMember{ID: "n1", RaftAddr: "10.0.0.1:7071", APIAddr: "10.0.0.1:7070", Version: "v1.2.3 (0123456789ab)"})
	h.do("n", &command.RegisterMember{ID: "n0", RaftAddr: "10.0.0.0:7071", APIAddr: "10.0.0.0:7070"})
	h.session("s1", lid(1), 20_000)
	h.sacquire("s1", "jobs/a", lid(1), 0)
	h.sacquire("s1", "jobs/b", lid(1), 0)
	h.sacquire("s1", "jobs/c", lid(1), 0)
	h.do("ops", &command.Revoke{Name: "jobs/c", Reason: "stuck"}) // s1 remembers it lost jobs/c
	h.acquire("c2", "jobs/a", lid(2), 15_000, 60_000)
	h.req("c3", "r-1", &command.Acquire{Name: "jobs/a", LeaseID: lid(3), TTLms: 15_000, WaitMs: 60_000})
	h.req("c4", "r-1", &command.Acquire{Name: "solo", LeaseID: lid(4), TTLms: 15_000})
	h.req("c5", "r-9", &command.Acquire{Name: "solo", LeaseID: lid(5), TTLms: 15_000})
	h.session("s6", lid(6), 9_000)
	h.sacquire("s6", "solo", lid(6), 30_000)
	h.do("s1", &command.Acquire{Name: command.ElectionKey("db"), LeaseID: lid(1), Session: true, Value: "10.0.0.1:5432"})
	h.do("c7", &command.Acquire{Name: command.ElectionKey("db"), LeaseID: lid(7), TTLms: 5000, WaitMs: 9000, Value: "10.0.0.7:5432"})
	h.do("dlock", &command.SetTokenKey{Seed: [32]byte{1}})
	h.do("dlock", &command.SetTokenKey{Seed: [32]byte{2}, Rotate: true})
	h.do("admin", &command.SetACLToken{AccessorID: [16]byte{2}, SecretHash: [32]byte{2}, Description: "root",
		Rules: []command.ACLRule{{Prefix: "", Perms: command.PermAll}}, Bootstrap: true})
	h.do("admin", &command.SetACLToken{AccessorID: [16]byte{1}, SecretHash: [32]byte{1}, Description: "worker",
		Rules: []command.ACLRule{{Prefix: "billing/", Perms: command.PermLock | command.PermRead}}, ClientIDs: []string{"worker-*"}, TTLms: 60_000, CertCNs: []string{"worker-1.billing"}})
	return h.s
}

// splitState is the sample state split at "m", then given a shard map.
func splitState(t *testing.T) *State {
	s := sampleState(t)
	r := s.Apply(s.Index()+1, &command.Envelope{TS: s.LastTS(), Body: &command.Split{At: "m", Group: 9}})
	s.TakeEvents()
	if r.Status != command.StatusOK {
		t.Fatalf("split: %+v", r)
	}
	r = s.Apply(s.Index()+1, &command.Envelope{TS: s.LastTS(), Body: &command.SetShardMap{Generation: 1,
		Ranges: []command.ShardRange{{Start: "", ID: 0, Group: 8}, {Start: "m", ID: 1, Group: 9, Replicas: []string{"n1", "n3", "n4"}, Leaving: "n3"}}}})
	if r.Status != command.StatusOK {
		t.Fatalf("set shard map: %+v", r)
	}
	return s
}

// TestRestoreFormat11 restores a version 11 snapshot, written before map
// ranges had replica sets: its ranges come back with none (every node).
func TestRestoreFormat11(t *testing.T) {
	r := toRaw(splitState(t))
	r.version = 11
	for i := range r.shard.ranges {
		r.shard.ranges[i].Replicas, r.shard.ranges[i].Leaving = nil, ""
	}
	s, err := Restore(r.encode())
	if err != nil {
		t.Fatal(err)
	}
	gen, rs := s.ShardMap()
	want := []command.ShardRange{{Start: "", ID: 0, Group: 8}, {Start: "m", ID: 1, Group: 9}}
	if gen != 1 || !reflect.DeepEqual(rs, want) {
		t.Fatalf("map generation %d %+v; want 1 %+v", gen, rs, want)
	}
	if got := s.Snapshot(); got[6] != snapshotVersion {
		t.Fatalf("re-snapshot is version %d", got[6])
	}
}

// TestRestoreFormat12 restores a version 12 snapshot, written before maps
// had removing nodes: none come back, and the map is as written.
func TestRestoreFormat12(t *testing.T) {
	r := toRaw(splitState(t))
	r.version = 12
	s, err := Restore(r.encode())
	if err != nil {
		t.Fatal(err)
	}
	gen, rs := s.ShardMap()
	if gen != 1 || len(rs) != 2 || !reflect.DeepEqual(rs[1].Replicas, []string{"n1", "n3", "n4"}) || len(s.Removing()) != 0 {
		t.Fatalf("map generation %d %+v removing %v", gen, rs, s.Removing())
	}
	if got := s.Snapshot(); got[6] != snapshotVersion {
		t.Fatalf("re-snapshot is version %d", got[6])
	}
}

// removingState is splitState with node n9 being removed.
func removingState(t *testing.T) *State {
	s := splitState(t)
	r := s.Apply(s.Index()+1, &command.Envelope{TS: s.LastTS(), Body: &command.SetShardMap{Generation: 2,
		Ranges:   []command.ShardRange{{Start: "", ID: 0, Group: 8, Replicas: []string{"n1", "n2"}}, {Start: "m", ID: 1, Group: 9, Replicas: []string{"n1", "n3", "n4"}, Leaving: "n3"}},
		Removing: []string{"n9", "n5"}}})
	if r.Status != command.StatusOK || len(s.Removing()) != 2 {
		t.Fatalf("set shard map: %+v", r)
	}
	return s
}

func TestSnapshotFormatIsPinned(t *testing.T) {
	for _, s := range []*State{New(), sampleState(t), splitState(t), removingState(t)} {
		if got, want := s.Snapshot(), toRaw(s).encode(); !bytes.Equal(got, want) {
			t.Fatalf("snapshot format changed (bump snapshotVersion and keep reading v1):\n got %x\nwant %x", got, want)
		}
	}
}

func TestRestoreRoundTrip(t *testing.T) {
	for name, s := range map[string]*State{"empty": New(), "sample": sampleState(t), "removing": removingState(t)} {
		b := s.Snapshot()
		r, err := Restore(b)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !bytes.Equal(r.Snapshot(), b) || fullDump(r) != fullDump(s) {
			t.Fatalf("%s: restored state differs:\n%s\nvs\n%s", name, fullDump(r), fullDump(s))
		}
		checkInvariants(t, r)
		if r.Index() != s.Index() || r.LastTS() != s.LastTS() || r.Revision() != s.Revision() || r.LastToken() != s.LastToken() {
			t.Fatalf("%s: counters differ", name)
		}
		// Restoring never emits events.
		if ev := r.TakeEvents(); len(ev) != 0 {
			t.Fatalf("%s: restore emitted %+v", name, ev)
		}
	}
}

// A newer node reads an older snapshot: version 1 had no lock or waiter
// values; it restores with empty values and snapshots again at the current
// version.
func TestRestoreVersion1Snapshot(t *testing.T) {
	s := sampleState(t)
	r := toRaw(s)
	r.version = 1
	for i := range r.locks {
		r.locks[i].value = ""
		for j := range r.locks[i].queue {
			r.locks[i].queue[j].value = ""
			r.locks[i].queue[j].requestID = ""
		}
	}
	r.keys, r.acl = nil, nil
	want := toRaw(s)
	want.keys, want.acl = nil, nil
	want.beforeVersion9()
	for i := range want.members {
		want.members[i].Version = "" // members' versions came with version 7
	}
	// Without a lease clock in the snapshot, the clock restarts at 0 and
	// every lease has its whole TTL left, each wait its whole wait (as
	// replaying the log, whose entries had no clock, would give).
	want.clock = 0
	for i := range want.leases {
		want.leases[i].renewedClock = 0
	}
	for i := range want.locks {
		want.locks[i].value = ""
		for j := range want.locks[i].queue {
			q := &want.locks[i].queue[j]
			q.value, q.requestID = "", ""
			q.clockDeadline = q.deadline - q.enq
		}
	}
	got, err := Restore(r.encode())
	if err != nil {
		t.Fatalf("version 1 snapshot refused: %v", err)
	}
	if !bytes.Equal(got.Snapshot(), want.encode()) {
		t.Fatal("version 1 snapshot does not restore to the same state at the current version")
	}
	checkInvariants(t, got)
}

func TestRestoreRejectsCorruptSnapshots(t *testing.T) {
	good := sampleState(t).Snapshot()
	raw := func(mod func(r *rawSnap)) []byte {
		r := toRaw(sampleState(t))
		mod(r)
		return r.encode()
	}
	cases := map[string][]byte{
		"nil":                              nil,
		"empty":                            {},
		"short magic":                      []byte("DLSNA"),
		"magic only":                       []byte("DLSNAP"),
		"bad magic":                        append([]byte("XLSNAP"), good[6:]...),
		"lowercase magic":                  append([]byte("dlsnap"), good[6:]...),
		"version 0":                        raw(func(r *rawSnap) { r.version = 0 }),
		"version 14":                       raw(func(r *rawSnap) { r.version = 14 }),
		"a lock outside the shard's range": raw(func(r *rawSnap) { r.shard = rawShard{ranged: true, from: "k"} }),
		"a range without ranged":           raw(func(r *rawSnap) { r.shard = rawShard{to: "m"} }),
		"a range ending before it starts":  raw(func(r *rawSnap) { r.shard = rawShard{ranged: true, from: "m", to: "c"} }),
		"a map without ranges":             raw(func(r *rawSnap) { r.shard.mapGen = 1 }),
		"a map not starting at \"\"": raw(func(r *rawSnap) {
			r.shard.mapGen, r.shard.ranges = 1, []command.ShardRange{{Start: "a", ID: 0, Group: 5}}
		}),
		"unsorted replicas": raw(func(r *rawSnap) {
			r.shard.mapGen, r.shard.ranges = 1, []command.ShardRange{{Start: "", ID: 0, Group: 5, Replicas: []string{"n2", "n1"}}}
		}),
		"v11 map as v12": func() []byte {
			b := raw(func(r *rawSnap) {
				r.version = 11
				r.shard.mapGen, r.shard.ranges = 1, []command.ShardRange{{Start: "", ID: 0, Group: 5}, {Start: "m", ID: 1, Group: 6}}
			})
			b[6] = 12
			return b
		}(),
		"v12 map as v13": func() []byte {
			b := raw(func(r *rawSnap) {
				r.version = 12
				r.shard.mapGen, r.shard.ranges = 1, []command.ShardRange{{Start: "", ID: 0, Group: 5, Replicas: []string{"n1"}}}
			})
			b[6] = 13
			return b
		}(),
		"a removing node that is a replica": raw(func(r *rawSnap) {
			r.shard.mapGen, r.shard.ranges = 1, []command.ShardRange{{Start: "", ID: 0, Group: 5, Replicas: []string{"n1", "n2"}}}
			r.shard.removing = []string{"n2"}
		}),
		"a removing node with an implicit replica set": raw(func(r *rawSnap) {
			r.shard.mapGen, r.shard.ranges = 1, []command.ShardRange{{Start: "", ID: 0, Group: 5}}
			r.shard.removing = []string{"n2"}
		}),
		"a removing node twice": raw(func(r *rawSnap) {
			r.shard.mapGen, r.shard.ranges = 1, []command.ShardRange{{Start: "", ID: 0, Group: 5, Replicas: []string{"n1"}}}
			r.shard.removing = []string{"n2", "n2"}
		}),
		"removing without a map": raw(func(r *rawSnap) { r.shard.removing = []string{"n2"} }),
		"v11 body as v10": func() []byte {
			b := raw(func(r *rawSnap) { r.shard = rawShard{ranged: true} })
			b[6] = 10
			return b
		}(),
		"v8 body as v7": func() []byte {
			b := raw(func(r *rawSnap) {})
			b[6] = 7
			return b
		}(),
		"v7 body as v8": func() []byte {
			b := raw(func(r *rawSnap) { r.version = 7 })
			b[6] = 8
			return b
		}(),
		"limit 0":                raw(func(r *rawSnap) { lockAt(r, "jobs/a").limit = 0 }),
		"limit over the maximum": raw(func(r *rawSnap) { lockAt(r, "jobs/a").limit = command.MaxLimit + 1 }),
		"shared counting lock":   raw(func(r *rawSnap) { lk := lockAt(r, "jobs/a"); lk.limit, lk.shared = 3, true }),
		"holders over the limit": raw(func(r *rawSnap) {
			lk := lockAt(r, "jobs/a")
			lk.more = []Grant{{LeaseID: lid(3), Token: 1, GrantSeq: 1}}
		}),
		"second holder reuses a token": raw(func(r *rawSnap) {
			lk := lockAt(r, "jobs/a")
			lk.limit, lk.more = 2, []Grant{{LeaseID: lid(3), Token: lk.token, GrantSeq: 1}}
		}),
		"holder also waits": raw(func(r *rawSnap) {
			lk := lockAt(r, "jobs/a")
			lk.limit, lk.more = 2, []Grant{{LeaseID: lk.queue[0].lease, Token: 1, GrantSeq: 1}}
		}),
		"free lock with a mode": raw(func(r *rawSnap) {
			lk := lockAt(r, "jobs/a")
			lk.holder, lk.token, lk.granted, lk.grantSeq, lk.shared = command.LeaseID{}, 0, 0, 0, true
		}),
		"free lock without waiters": raw(func(r *rawSnap) {
			lk := lockAt(r, "jobs/a")
			lk.holder, lk.token, lk.granted, lk.grantSeq, lk.queue = command.LeaseID{}, 0, 0, 0, nil
		}),
		"queue out of line order": raw(func(r *rawSnap) {
			q := lockAt(r, "jobs/a").queue
			q[0].place = 1 << 62
		}),
		"election with a limit": raw(func(r *rawSnap) { lockAt(r, command.ElectionKey("db")).limit = 2 }),
		"v6 body as v5": func() []byte {
			b := raw(func(r *rawSnap) {})
			b[6] = 5
			return b
		}(),
		"v5 body as v6": func() []byte {
			b := raw(func(r *rawSnap) { r.version = 5 })
			b[6] = 6
			return b
		}(),
		"v5 body as v4": func() []byte {
			b := raw(func(r *rawSnap) { r.version = 5 })
			b[6] = 4
			return b
		}(),
		"v4 body as v3": func() []byte {
			b := raw(func(r *rawSnap) { r.version = 4 })
			b[6] = 3
			return b
		}(),
		"v4 body as v3 (old)": func() []byte {
			b := raw(func(r *rawSnap) {})
			b[6] = 3
			return b
		}(),
		"acl tokens out of order": raw(func(r *rawSnap) { r.acl[0], r.acl[1] = r.acl[1], r.acl[0] }),
		"acl shared secret":       raw(func(r *rawSnap) { r.acl[1].SecretHash = r.acl[0].SecretHash }),
		"acl rule without perms":  raw(func(r *rawSnap) { r.acl[0].Rules[0].Perms = 0 }),
		"acl unknown perm":        raw(func(r *rawSnap) { r.acl[0].Rules[0].Perms = 0x80 }),
		"v3 body as v2": func() []byte {
			b := raw(func(r *rawSnap) { r.version = 3 })
			b[6] = 2
			return b
		}(),
		"token key id mismatch":  raw(func(r *rawSnap) { r.keys[0].ID[0] ^= 1 }),
		"two current token keys": raw(func(r *rawSnap) { r.keys[0].Current = true; r.keys[0].Seed = [32]byte{1} }),
		"retired key with seed":  raw(func(r *rawSnap) { r.keys[0].Seed = [32]byte{1} }),
		"current key wrong seed": raw(func(r *rawSnap) { r.keys[1].Seed = [32]byte{9} }),
		"current key bounded":    raw(func(r *rawSnap) { r.keys[1].MaxToken = 1 }),
		"retired key bound above the last token": raw(func(r *rawSnap) {
			r.keys[0].MaxToken = r.lastToken + 1
		}),
		"retired key bounds out of order": raw(func(r *rawSnap) {
			r.keys[0].MaxToken = 1
			r.keys = append([]TokenKey{retiredKey(40, 2)}, r.keys...)
		}),
		"too many token keys": raw(func(r *rawSnap) {
			for len(r.keys) <= MaxTokenKeys {
				r.keys = append([]TokenKey{r.keys[0]}, r.keys...)
			}
		}),
		"v2 body as v1": func() []byte {
			b := raw(func(r *rawSnap) { r.version = 2 })
			b[6] = 1
			return b
		}(),
		"v1 body as v2": func() []byte {
			b := raw(func(r *rawSnap) { r.version = 1 })
			b[6] = 2
			return b
		}(),
		"version 255":      raw(func(r *rawSnap) { r.version = 255 }),
		"trailing zero":    append(append([]byte(nil), good...), 0),
		"trailing garbage": append(append([]byte(nil), good...), "garbage"...),
		"two snapshots":    append(append([]byte(nil), good...), good...),
		"waiter of unknown lease": raw(func(r *rawSnap) {
			lk := lockAt(r, "jobs/a")
			lk.queue = append(lk.queue, rawWaiter{lease: lid(999), client: "x", seq: 1})
		}),
		"holder unknown": raw(func(r *rawSnap) { lockAt(r, "jobs/a").holder = lid(999) }),
		"waiter seq 0":   raw(func(r *rawSnap) { lockAt(r, "jobs/a").queue[0].seq = 0 }),
		"bad bool":       badBool(raw(func(r *rawSnap) { r.leases[0].client = "MARK" }), int64(sampleState(t).leases[lid(1)].TTLms)),
		"huge lease count": func() []byte {
			w := &wire.Writer{}
			w.Fixed([]byte("DLSNAP"))
			w.Byte(1)
			w.Uvarint(1)
			w.Varint(1)
			w.Uvarint(1)
			w.Uvarint(1)
			w.Uvarint(0)
			w.Uvarint(1 << 60)
			return w.Buf
		}(),
		"huge string": func() []byte {
			w := &wire.Writer{}
			w.Fixed([]byte("DLSNAP"))
			w.Byte(1)
			w.Uvarint(1)
			w.Varint(1)
			w.Uvarint(1)
			w.Uvarint(1)
			w.Uvarint(1)
			w.Uvarint(1 << 40)
			return w.Buf
		}(),
	}
	for name, b := range cases {
		s, err := Restore(b)
		if err == nil || s != nil {
			t.Errorf("%s: Restore succeeded", name)
		}
	}
	// Truncation at every offset.
	for n := 0; n < len(good); n++ {
		if s, err := Restore(good[:n:n]); err == nil || s != nil {
			t.Fatalf("Restore of %d/%d bytes succeeded", n, len(good))
		}
	}
}

// Restore says it checks every cross-reference. These snapshots are
// internally inconsistent; accepting them lets a replica continue from a state
// the state machine could never reach.
func TestRestoreRejectsInconsistentSnapshots(t *testing.T) {
	// sampleState: leases 1 (session s1: holds jobs/a, jobs/b and leads
	// election db), 2 and 3 (wait on jobs/a), 4 (holds solo), 6 (session
	// waiting on solo), 7 (campaigns for db).
	cases := []struct {
		name string
		mod  func(r *rawSnap)
	}{
		{"duplicate lock name", func(r *rawSnap) {
			dup := *lockAt(r, "solo") // held by lease 4
			dup.token = r.lastToken
			dup.queue = nil
			dup.holder = lid(1)
			r.locks = append(r.locks, dup)
		}},
		{"duplicate lease id", func(r *rawSnap) { r.leases = append(r.leases, r.leases[0]) }},
		{"token above last token", func(r *rawSnap) { r.lastToken = 1 }},
		{"two locks with one token", func(r *rawSnap) { lockAt(r, "jobs/b").token = lockAt(r, "jobs/a").token }},
		{"free lock with queue", func(r *rawSnap) {
			lockAt(r, "solo").holder = command.LeaseID{}
			r.leases = removeLease(r.leases, lid(4))
		}},
		{"holder waits for its own lock", func(r *rawSnap) {
			lk := lockAt(r, "jobs/a")
			lk.queue = append(lk.queue, rawWaiter{lease: lid(1), client: "s1", seq: 3})
		}},
		{"lease waits twice in one queue", func(r *rawSnap) { lk := lockAt(r, "jobs/a"); lk.queue = append(lk.queue, lk.queue[0]) }},
		{"waiter client differs from lease", func(r *rawSnap) { lockAt(r, "jobs/a").queue[0].client = "mallory" }},
		{"implicit lease holding two locks", func(r *rawSnap) { lockAt(r, "jobs/b").holder = lid(4) }},
		{"implicit lease holding nothing", func(r *rawSnap) {
			r.leases = append(r.leases, rawLease{id: lid(200), client: "ghost", ttl: 5000, active: true, gen: 1})
			sortRawLeases(r.leases)
		}},
		{"non-canonical lock name", func(r *rawSnap) { r.locks[len(r.locks)-1].name = "/solo" }},
		{"value over the limit", func(r *rawSnap) { lockAt(r, "solo").value = strings.Repeat("v", command.MaxValueLen+1) }},
		{"leases out of order", func(r *rawSnap) { r.leases[0], r.leases[1] = r.leases[1], r.leases[0] }},
		{"locks out of order", func(r *rawSnap) { r.locks[0], r.locks[1] = r.locks[1], r.locks[0] }},
		{"duplicate dedup key", func(r *rawSnap) { r.dedup = append(r.dedup, r.dedup[0]) }},
		{"zero lease id", func(r *rawSnap) {
			r.leases = append([]rawLease{{client: "z", ttl: 5000, session: true, active: true, gen: 1}}, r.leases...)
		}},
		// s1 lost jobs/c to a revoke.
		{"lost grant of an unknown lease", func(r *rawSnap) { r.lost[0].id = lid(99) }},
		{"lost grant of an implicit lease", func(r *rawSnap) { r.lost[0].id = lid(4) }},
		{"lost grant with a cause other than revoke or takeover", func(r *rawSnap) { r.lost[0].grants[0].Cause = EndReleased }},
		{"lost grant after the revision", func(r *rawSnap) { r.lost[0].grants[0].Revision = r.revision + 1 }},
		{"lost grant token above last token", func(r *rawSnap) { r.lost[0].grants[0].Token = r.lastToken + 1 }},
		{"lost grants out of order", func(r *rawSnap) { r.lost[0].grants = append(r.lost[0].grants, r.lost[0].grants[0]) }},
		{"session with no lost grants", func(r *rawSnap) { r.lost[0].grants = nil }},
		{"session listed twice", func(r *rawSnap) { r.lost = append(r.lost, r.lost[0]) }},
	}
	var accepted []string
	for _, tc := range cases {
		r := toRaw(sampleState(t))
		tc.mod(r)
		if _, err := Restore(r.encode()); err == nil {
			accepted = append(accepted, tc.name)
		}
	}
	if len(accepted) > 0 {
		t.Fatalf("Restore accepts inconsistent snapshots: %s", strings.Join(accepted, "; "))
	}
}

// badBool turns the session flag after the lease marked with client "MARK"
// into a byte that is neither 0 nor 1.
func badBool(b []byte, ttl int64) []byte {
	mark := binary.AppendVarint([]byte("MARK"), ttl)
	i := bytes.Index(b, mark)
	if i < 0 {
		panic("marker not found")
	}
	c := append([]byte(nil), b...)
	c[i+len(mark)] = 5
	return c
}

// lockAt finds a lock of a raw snapshot by name.
func lockAt(r *rawSnap, name string) *rawLock {
	for i := range r.locks {
		if r.locks[i].name == name {
			return &r.locks[i]
		}
	}
	panic("no lock " + name)
}

func removeLease(ls []rawLease, id command.LeaseID) []rawLease {
	var out []rawLease
	for _, l := range ls {
		if l.id != id {
			out = append(out, l)
		}
	}
	return out
}

func sortRawLeases(ls []rawLease) {
	for i := range ls {
		for j := i + 1; j < len(ls); j++ {
			if bytes.Compare(ls[j].id[:], ls[i].id[:]) < 0 {
				ls[i], ls[j] = ls[j], ls[i]
			}
		}
	}
}

// The worst of the accepted inconsistencies: a snapshot with one lock name
// twice restores, and a later ordinary command panics every replica.
func TestRestoreDuplicateLockNameThenApplyDoesNotPanic(t *testing.T) {
	r := toRaw(sampleState(t))
	dup := *lockAt(r, "solo") // held by lease 4
	dup.holder, dup.queue, dup.token = lid(1), nil, r.lastToken+1
	r.lastToken++
	r.locks = append(r.locks, dup)
	s, err := Restore(r.encode())
	if err != nil {
		return // rejected: fine
	}
	panicked := func(f func()) (p any) {
		defer func() { p = recover() }()
		f()
		return nil
	}
	p := panicked(func() {
		for i, id := range []command.LeaseID{lid(4), lid(1)} {
			l := s.leases[id]
			s.Apply(s.index+uint64(i)+1, &command.Envelope{TS: s.ts, Body: &command.ExpireLeases{Leases: []command.LeaseGen{{LeaseID: id, Gen: l.Gen}}}})
		}
	})
	if p != nil {
		t.Fatalf("Restore accepted a snapshot with lock %q twice; expiring its two holders then panics in Apply: %v", dup.name, p)
	}
}

// drain ends every lease of a restored state, then takes and gives back a
// lock: a state Restore accepts must be safe to continue from.
func drain(s *State) {
	idx := s.index
	for _, id := range sortedLeaseIDs(s) {
		l := s.leases[id]
		if l == nil {
			continue
		}
		idx++
		s.Apply(idx, &command.Envelope{TS: s.ts, Body: &command.ExpireLeases{Leases: []command.LeaseGen{{LeaseID: id, Gen: l.Gen}}}})
		if l := s.leases[id]; l != nil && l.Session {
			idx++
			s.Apply(idx, &command.Envelope{TS: s.ts, ClientID: l.ClientID, Body: &command.DeleteSession{LeaseID: id}})
		}
	}
	var names []string
	s.locks.Ascend(func(lk *Lock) bool { names = append(names, lk.Name); return true })
	for i, n := range names {
		if _, err := command.NormalizeName(n); err != nil {
			continue
		}
		idx++
		r := s.Apply(idx, &command.Envelope{TS: s.ts, ClientID: "drain", Body: &command.Acquire{Name: n, LeaseID: lid(1<<20 + i), TTLms: 1000}})
		if r.Status == command.StatusOK {
			idx++
			s.Apply(idx, &command.Envelope{TS: s.ts, ClientID: "drain", Body: &command.Release{Name: n, LeaseID: lid(1<<20 + i), Token: r.Token}})
		}
	}
	s.Timers()
	s.Counts()
	s.ListLocks("", "", 100)
	s.TakeEvents()
}

func FuzzRestore(f *testing.F) {
	f.Add(New().Snapshot())
	f.Add(sampleState(f).Snapshot())
	// A larger state from the random generator.
	a := New()
	g := newGen(99, a)
	for i := 0; i < 300; i++ {
		a.Apply(g.idx+1, g.next())
		a.TakeEvents()
	}
	f.Add(a.Snapshot())
	f.Add([]byte("DLSNAP"))
	f.Add([]byte("DLSNAP\x01"))
	f.Add([]byte("DLSNAP\x02\x00\x00\x00\x00\x00\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := Restore(b)
		if err != nil {
			if s != nil {
				t.Fatal("state and error both returned")
			}
			return
		}
		again := s.Snapshot()
		s2, err := Restore(again)
		if err != nil {
			t.Fatalf("re-snapshot of an accepted snapshot is refused: %v", err)
		}
		if !bytes.Equal(s2.Snapshot(), again) {
			t.Fatal("snapshot is not a fixpoint after one round")
		}
		if p := func() (p any) {
			defer func() { p = recover() }()
			drain(s2)
			return nil
		}(); p != nil {
			t.Fatalf("continuing from an accepted snapshot panics: %v", p)
		}
	})
}

func TestSnapshotOfLargeState(t *testing.T) {
	s := New()
	idx := uint64(0)
	apply := func(client string, b command.Body, want command.Status) {
		t.Helper()
		idx++
		if r := s.Apply(idx, &command.Envelope{TS: startTS + int64(idx), ClientID: client, RequestID: fmt.Sprint(idx), Body: b}); r.Status != want {
			t.Fatalf("status %v, want %v", r.Status, want)
		}
	}
	for i := 0; i < 500; i++ {
		name := fmt.Sprintf("l/%03d", i)
		apply(fmt.Sprintf("c%d", i), &command.Acquire{Name: name, LeaseID: lid(i + 1), TTLms: ttl}, command.StatusOK)
		for j := 0; j < 3; j++ {
			apply(fmt.Sprintf("w%d", j), &command.Acquire{Name: name, LeaseID: lid(10_000 + i*3 + j), TTLms: ttl, WaitMs: 60_000}, command.StatusQueued)
		}
	}
	s.TakeEvents()
	checkInvariants(t, s)
	b := s.Snapshot()
	r, err := Restore(b)
	if err != nil {
		t.Fatal(err)
	}
	if fullDump(r) != fullDump(s) || !bytes.Equal(r.Snapshot(), b) {
		t.Fatal("large state does not round trip")
	}
}

// A lease can encode in as few as 22 bytes (empty client id, small numbers);
// Restore's sanity bound on the lease count must not refuse such a snapshot
// of a state Apply accepted.
func TestRestoreManyCompactLeases(t *testing.T) {
	s := New()
	for i := 1; i <= 20; i++ {
		r := s.Apply(uint64(i), &command.Envelope{TS: 0, ClientID: "", Body: &command.CreateSession{LeaseID: lid(i), TTLms: 1000}})
		mustStatus(t, r, command.StatusOK)
	}
	s.TakeEvents()
	checkInvariants(t, s)
	b := s.Snapshot()
	if _, err := Restore(b); err != nil {
		t.Fatalf("snapshot of a state Apply produced does not restore: %v", err)
	}
}

// A queued campaigner that campaigns again with a new value keeps its place
// and takes office with the new value (a holder's re-campaign proclaims it;
// etcd's Campaign updates a waiting candidate's value too).
func TestRecampaignWhileQueuedTakesTheNewValue(t *testing.T) {
	h := newHarness(t)
	key := command.ElectionKey("e")
	mustStatus(t, h.session("leader", lid(1), ttl), command.StatusOK)
	r1 := h.do("leader", &command.Acquire{Name: key, LeaseID: lid(1), Session: true, Value: "L"})
	mustStatus(t, r1, command.StatusOK)
	mustStatus(t, h.session("cand", lid(2), ttl), command.StatusOK)
	mustStatus(t, h.do("cand", &command.Acquire{Name: key, LeaseID: lid(2), Session: true, WaitMs: 60_000, Value: "old"}), command.StatusQueued)
	mustStatus(t, h.do("cand", &command.Acquire{Name: key, LeaseID: lid(2), Session: true, WaitMs: 60_000, Value: "new"}), command.StatusQueued)
	mustStatus(t, h.release("leader", key, lid(1), r1.Token), command.StatusOK)
	if el := h.s.GetElection("e"); el.CandidateID != "cand" || el.Value != "new" {
		t.Fatalf("after hand-off: %+v; want candidate cand with its latest value %q", el, "new")
	}
}

// Version 4 snapshots have two ACL layouts: token expiry and certificate
// names were added (6439a97) without a new version. These are the exact bytes
// State.Snapshot of the first layout's build (350f8fa) wrote after one
// bootstrap SetACLToken; a node with such a snapshot on disk must start.
func TestRestoreFirstLayoutV4Snapshot(t *testing.T) {
	const v4 = "444c534e4150040180a0abfef962010000000000000101000000000000000000000000000000020000000000000000000000000000000000000000000000000000000000000009626f6f74737472617080a0abfef96201001f00"
	b, err := hex.DecodeString(v4)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Restore(b)
	if err != nil {
		t.Fatalf("version 4 snapshot of the first ACL layout refused: %v", err)
	}
	if toks := s.ACLTokens(); len(toks) != 1 || toks[0].Description != "bootstrap" {
		t.Fatalf("restored ACL tokens %+v", toks)
	}
}

// A token TTL so large that its expiry time would overflow lives for ever
// instead of being expired at birth (the service refuses such TTLs; Apply
// saturates, so entries it accepted before replay the same).
func TestACLTokenHugeTTLSaturates(t *testing.T) {
	h := newHarness(t)
	var acc [16]byte
	var hash [32]byte
	acc[0], hash[0] = 1, 2
	mustStatus(t, h.do("admin", &command.SetACLToken{AccessorID: acc, SecretHash: hash,
		Rules: []command.ACLRule{{Perms: command.PermAll}}, TTLms: 1<<63 - 1}), command.StatusOK)
	tok, _ := h.s.ACLTokenBySecret(hash)
	if tok.Expired(h.ts) {
		t.Fatalf("token with ttl MaxInt64 ms is already expired (ExpiresAt %d)", tok.ExpiresAt)
	}
}

// The time a lease has left is counted on the lease clock, never on wall-clock
// timestamps: here the lease is renewed under one leader, and a second leader
// whose wall clock is 8 s ahead writes one entry a moment later. A third
// leader must still see (nearly) the whole TTL left, not TTL - 8 s.
func TestTimersIgnoreWallClockSkewBetweenLeaders(t *testing.T) {
	s := New()
	const ttl = 10_000
	apply := func(i uint64, ts, clock int64, b command.Body) command.Result {
		r := s.Apply(i, &command.Envelope{TS: ts, Clock: clock, ClientID: "c", Body: b})
		s.TakeEvents()
		return r
	}
	// Leader A, clock true: the session at lease-clock time 5,000.
	mustStatus(t, apply(1, startTS, 5_000, &command.CreateSession{LeaseID: lid(1), TTLms: ttl}), command.StatusOK)
	// Leader B took over 40 ms later on its own monotonic clock (counting on
	// from 5,000), but its wall clock is 8 s ahead.
	mustStatus(t, apply(2, startTS+8_040, 5_040, &command.Tick{}), command.StatusOK)
	leases, _ := s.Timers()
	if len(leases) != 1 || leases[0].RemainingMs != ttl-40 {
		t.Fatalf("timers %+v: want %d ms left (only 40 ms passed on the leaders' clocks)", leases, ttl-40)
	}
	// A log whose lease clock goes backwards (a stale entry) does not move
	// it back.
	mustStatus(t, apply(3, startTS+8_050, 10, &command.Tick{}), command.StatusOK)
	if s.LeaseClock() != 5_040 {
		t.Fatalf("lease clock %d after a stale entry, want 5040", s.LeaseClock())
	}
	// Snapshots keep it.
	r, err := Restore(s.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	if l2, _ := r.Timers(); r.LeaseClock() != 5_040 || len(l2) != 1 || l2[0].RemainingMs != ttl-40 {
		t.Fatalf("restored: clock %d timers %+v", r.LeaseClock(), l2)
	}
}

// A wait's time left is on the lease clock too.
func TestWaitTimersUseTheLeaseClock(t *testing.T) {
	s := New()
	apply := func(i uint64, ts, clock int64, client string, b command.Body) command.Result {
		r := s.Apply(i, &command.Envelope{TS: ts, Clock: clock, ClientID: client, Body: b})
		s.TakeEvents()
		return r
	}
	mustStatus(t, apply(1, startTS, 100, "a", &command.Acquire{Name: "x", LeaseID: lid(1), TTLms: 30_000}), command.StatusOK)
	mustStatus(t, apply(2, startTS, 100, "b", &command.Acquire{Name: "x", LeaseID: lid(2), TTLms: 30_000, WaitMs: 7_000}), command.StatusQueued)
	mustStatus(t, apply(3, startTS+60_000, 300, "c", &command.Tick{}), command.StatusOK)
	if _, waits := s.Timers(); len(waits) != 1 || waits[0].RemainingMs != 6_800 {
		t.Fatalf("wait timers %+v: want 6800 ms left", waits)
	}
}

// A Tick moves the lease clock and nothing else a reader sees.
func TestTickChangesOnlyTheClock(t *testing.T) {
	h := newHarness(t)
	mustStatus(t, h.session("c", lid(1), ttl), command.StatusOK)
	rev := h.s.Revision()
	before := h.s.LeaseClock()
	r := h.do("dlock", &command.Tick{})
	mustStatus(t, r, command.StatusOK)
	if h.s.Revision() != rev || len(h.ev) != 0 || h.s.LeaseClock() <= before {
		t.Fatalf("tick: revision %d -> %d, events %+v, clock %d -> %d", rev, h.s.Revision(), h.ev, before, h.s.LeaseClock())
	}
}

// design.md §3: "Restore + replay gives the same state as never having
// snapshotted." An upgraded node that restores a version-5 snapshot (written
// by the old binary) must end up with the same state as an upgraded node that
// applied the same pre-upgrade (version 2, Clock 0) log from the start.
// (Waits' lease-clock deadlines once differed: waitMs by replay, the time
// left by the snapshot's timestamp by restore.)
func TestVersion5RestoreMatchesLogReplay(t *testing.T) {
	apply := func(s *State, i uint64, ts int64, client string, b command.Body) {
		s.Apply(i, &command.Envelope{TS: ts, ClientID: client, Body: b}) // Clock 0: a version 2 entry
		s.TakeEvents()
	}
	build := func(s *State, upto uint64) {
		steps := []func(){
			func() { apply(s, 1, startTS, "a", &command.Acquire{Name: "x", LeaseID: lid(1), TTLms: 30_000}) },
			func() {
				apply(s, 2, startTS+100, "b", &command.Acquire{Name: "x", LeaseID: lid(2), TTLms: 30_000, WaitMs: 20_000})
			},
			func() { apply(s, 3, startTS+5_000, "c", &command.CreateSession{LeaseID: lid(3), TTLms: 10_000}) },
		}
		for i := uint64(0); i < upto; i++ {
			steps[i]()
		}
	}
	// Replica A: applied the whole log (no snapshot).
	a := New()
	build(a, 3)
	// Replica B: restored the old binary's v5 snapshot taken at index 3.
	src := New()
	build(src, 3)
	raw := toRaw(src)
	raw.version = 5
	b, err := Restore(raw.encode())
	if err != nil {
		t.Fatal(err)
	}
	_, wa := a.Timers()
	_, wb := b.Timers()
	t.Logf("log replay: waits %+v; v5 restore: waits %+v", wa, wb)
	if !bytes.Equal(a.Snapshot(), b.Snapshot()) {
		t.Fatalf("replicas that applied the same log differ after a v5 restore: wait time left %d ms (log) vs %d ms (v5 snapshot)",
			wa[0].RemainingMs, wb[0].RemainingMs)
	}
}

// A version 10 snapshot (before shards could split) restores owning every
// name and snapshots again at the current version with an empty shard
// section.
func TestRestoreVersion10Snapshot(t *testing.T) {
	s := sampleState(t)
	r := toRaw(s)
	r.version = 10
	got, err := Restore(r.encode())
	if err != nil {
		t.Fatalf("version 10 snapshot refused: %v", err)
	}
	if !bytes.Equal(got.Snapshot(), toRaw(s).encode()) || !got.Owns("anything") || got.Digest() != s.Digest() {
		t.Fatal("version 10 snapshot does not restore to the same state")
	}
}

// TestCompareLeaseIDsIsByteOrder: the word-wise comparison the snapshot
// sorts leases with must order ids exactly as bytes.Compare does (Restore
// refuses leases out of that order), including bytes with the high bit set
// on either side of the word boundary.
func TestCompareLeaseIDsIsByteOrder(t *testing.T) {
	var ids []command.LeaseID
	for _, pos := range []int{0, 1, 7, 8, 9, 15} {
		for _, b := range []byte{0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF} {
			var id command.LeaseID
			id[pos] = b
			ids = append(ids, id)
			for i := range id {
				id[i] = 0xFF
			}
			id[pos] = b
			ids = append(ids, id)
		}
	}
	for i := range 200 {
		var id command.LeaseID
		binary.BigEndian.PutUint64(id[:8], uint64(i)*0x9E3779B97F4A7C15)
		binary.BigEndian.PutUint64(id[8:], uint64(i)*0xC2B2AE3D27D4EB4F)
		ids = append(ids, id)
	}
	sign := func(c int) int { return min(max(c, -1), 1) }
	for _, a := range ids {
		for _, b := range ids {
			if got, want := sign(compareLeaseIDs(a, b)), sign(bytes.Compare(a[:], b[:])); got != want {
				t.Fatalf("compareLeaseIDs(%x, %x) = %d, bytes.Compare says %d", a, b, got, want)
			}
		}
	}
}
