package state

import (
	"encoding/binary"
	"math/bits"

	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/wire"
)

// The digest fingerprints the WHOLE state — every lock (holder, token, grant,
// value), every waiter in queue order, every lease, member, ACL token,
// signing key and dedup entry, and the counters — so two replicas at the same
// index with different states have different digests (up to 64-bit hash
// collisions). Re-hashing a million locks at every checkpoint would stall
// apply, so the state keeps the sum (mod 2^64) of one hash per record and
// updates it at each mutation: the record's hash is taken out before it
// changes and put back after. The sum is order-independent, so queue order
// is in the records themselves: each waiter's record names the Seq of the
// waiter ahead of it. FullDigest recomputes it all from scratch; the tests
// compare the two after every applied entry, so a mutation that skips its
// hook cannot go unnoticed. No per-record field caches a hash: the memory
// per held lock is unchanged.

// Record kinds, hashed first so records of different kinds never collide by
// construction.
const (
	recLock uint64 = iota + 1
	recWaiter
	recLease
	recMember
	recACL
	recDedup
	recTokenKey
	recCounters
	recGrant
	recLost
)

// hasher is a small word-at-a-time hash (deterministic across processes and
// builds, unlike hash/maphash). It is not cryptographic: it detects
// accidental divergence, it does not resist a forger.
type hasher struct{ h uint64 }

func newHasher(kind uint64) hasher { return hasher{h: kind * 0x9e3779b97f4a7c15} }

func (h *hasher) u64(v uint64) {
	h.h = bits.RotateLeft64((h.h^v)*0xbf58476d1ce4e5b9, 31) * 0x94d049bb133111eb
}

func (h *hasher) i64(v int64) { h.u64(uint64(v)) }

func (h *hasher) bytes(b []byte) {
	h.u64(uint64(len(b)))
	for len(b) >= 8 {
		h.u64(binary.LittleEndian.Uint64(b))
		b = b[8:]
	}
	if len(b) > 0 {
		var tail [8]byte
		copy(tail[:], b)
		h.u64(binary.LittleEndian.Uint64(tail[:]))
	}
}

// sum finalises (the splitmix64 finaliser), so records that differ in one
// word differ in about half the bits of their hashes.
func (h *hasher) sum() uint64 {
	x := h.h
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// recordHasher hashes one record: it encodes it with the snapshot's own
// record writer (snapshot.go), after a kind byte and what places the record
// (a waiter's lock and predecessor, a dedup entry's position), into a reused
// buffer, and hashes those bytes. So a field the snapshot holds is a field
// the digest covers, without a second list of fields to keep in step.
type recordHasher struct{ w wire.Writer }

func (r *recordHasher) begin(kind uint64) *wire.Writer {
	r.w.Buf = append(r.w.Buf[:0], byte(kind))
	return &r.w
}

func (r *recordHasher) sum() uint64 {
	h := newHasher(0)
	h.bytes(r.w.Buf)
	return h.sum()
}

// lock hashes a lock's own fields; its waiters are records of their own.
func (r *recordHasher) lock(lk *Lock) uint64 {
	writeLockHead(r.begin(recLock), lk)
	return r.sum()
}

// waiter hashes one waiter of the named lock; prev is the Seq of the waiter
// ahead of it (0 at the head), which pins its place in line.
func (r *recordHasher) waiter(name string, prev uint64, q *Waiter) uint64 {
	w := r.begin(recWaiter)
	w.String(name)
	w.Uvarint(prev)
	writeWaiter(w, q)
	return r.sum()
}

func (r *recordHasher) lease(l *Lease) uint64 {
	writeLease(r.begin(recLease), l)
	return r.sum()
}

func (r *recordHasher) member(m Member) uint64 {
	writeMember(r.begin(recMember), m)
	return r.sum()
}

func (r *recordHasher) acl(t *ACLToken) uint64 {
	writeACLToken(r.begin(recACL), t)
	return r.sum()
}

// dedup hashes one dedup entry with the key of the entry remembered just
// before it (prev; nil for the oldest), which pins the order in which the
// entries are forgotten. Not the slot it sits in: a replica restored from a
// snapshot holds the same entries in the same order in other slots.
func (r *recordHasher) dedup(prev, e *dedupEntry) uint64 {
	w := r.begin(recDedup)
	if prev != nil {
		w.Bool(true)
		w.String(prev.key.client)
		w.String(prev.key.request)
	} else {
		w.Bool(false)
	}
	writeDedupEntry(w, e)
	return r.sum()
}

// grant hashes one ended grant of the named lock (its Seq places it).
func (r *recordHasher) grant(name string, g *GrantRecord) uint64 {
	w := r.begin(recGrant)
	w.String(name)
	writeGrantRecord(w, g)
	return r.sum()
}

// lostGrant hashes one grant a session lost (its Revision places it).
func (r *recordHasher) lostGrant(id command.LeaseID, g *LostGrant) uint64 {
	w := r.begin(recLost)
	w.Fixed(id[:])
	writeLostGrant(w, g)
	return r.sum()
}

func (r *recordHasher) tokenKey(k *TokenKey) uint64 {
	writeTokenKey(r.begin(recTokenKey), k)
	return r.sum()
}

// Incremental updates. Each out must see the record exactly as its in did.

func (s *State) lockIn(lk *Lock)  { s.sum += s.rh.lock(lk) }
func (s *State) lockOut(lk *Lock) { s.sum -= s.rh.lock(lk) }

func (s *State) leaseIn(l *Lease)  { s.sum += s.rh.lease(l) }
func (s *State) leaseOut(l *Lease) { s.sum -= s.rh.lease(l) }

func (s *State) aclIn(t *ACLToken)  { s.sum += s.rh.acl(t) }
func (s *State) aclOut(t *ACLToken) { s.sum -= s.rh.acl(t) }

// addLease puts a new lease in the table.
func (s *State) addLease(l *Lease) {
	s.leases[l.ID] = l
	s.leaseIn(l)
}

// deleteLease takes a lease out of the table.
func (s *State) deleteLease(l *Lease) {
	s.forgetLost(l.ID)
	s.leaseOut(l)
	delete(s.leases, l.ID)
}

// newLock puts a new, free lock in the table (it is granted or queued for
// in the same step) with the limit it is first taken with.
func (s *State) newLock(name string, limit int64) *Lock {
	lk := &Lock{Name: name}
	if limit > 1 {
		lk.ext().limit = int32(limit)
	}
	s.locks.ReplaceOrInsert(lk)
	s.lockIn(lk)
	return lk
}

// deleteLock takes a lock out of the table; its queue must be empty.
func (s *State) deleteLock(lk *Lock) {
	s.lockOut(lk)
	s.locks.Delete(lk)
}

// setLockValue changes an election's value.
func (s *State) setLockValue(lk *Lock, v string) {
	s.lockOut(lk)
	lk.setValue(v)
	s.lockIn(lk)
}

func prevSeq(q []Waiter, i int) uint64 {
	if i == 0 {
		return 0
	}
	return q[i-1].Seq
}

// queueAppend puts a waiter at the end of a lock's queue.
func (s *State) queueAppend(lk *Lock, w Waiter) {
	q := lk.Queue()
	s.sum += s.rh.waiter(lk.Name, prevSeq(q, len(q)), &w)
	s.waitIndex(lk.Name, &w, true)
	lk.setQueue(append(q, w))
}

// queueReplace puts w in place of the i-th waiter (the one behind it now
// follows w's Seq).
func (s *State) queueReplace(lk *Lock, i int, w Waiter) {
	q := lk.Queue()
	old := q[i]
	s.sum -= s.rh.waiter(lk.Name, prevSeq(q, i), &old)
	s.sum += s.rh.waiter(lk.Name, prevSeq(q, i), &w)
	if i+1 < len(q) {
		s.sum -= s.rh.waiter(lk.Name, old.Seq, &q[i+1])
		s.sum += s.rh.waiter(lk.Name, w.Seq, &q[i+1])
	}
	s.waitIndex(lk.Name, &old, false)
	s.waitIndex(lk.Name, &w, true)
	q[i] = w
}

// queueRemove takes the i-th waiter out of a lock's queue.
func (s *State) queueRemove(lk *Lock, i int) {
	q := lk.Queue()
	prev := prevSeq(q, i)
	s.sum -= s.rh.waiter(lk.Name, prev, &q[i])
	s.waitIndex(lk.Name, &q[i], false)
	if i+1 < len(q) {
		s.sum -= s.rh.waiter(lk.Name, q[i].Seq, &q[i+1])
		s.sum += s.rh.waiter(lk.Name, prev, &q[i+1])
	}
	if i == 0 {
		lk.setQueue(q[1:])
	} else {
		lk.setQueue(append(q[:i], q[i+1:]...))
	}
}

func (s *State) setMember(m Member) {
	if old, ok := s.members[m.ID]; ok {
		s.sum -= s.rh.member(old)
	}
	s.members[m.ID] = m
	s.sum += s.rh.member(m)
}

// dedupOut and dedupIn bracket a change to the result of the entry at pos.
func (s *State) dedupOut(pos int) { s.sum -= s.rh.dedup(s.dedupRing.prev(pos), s.dedupRing.at(pos)) }
func (s *State) dedupIn(pos int)  { s.sum += s.rh.dedup(s.dedupRing.prev(pos), s.dedupRing.at(pos)) }

// dedupEvictOldest takes the oldest entry's record out of the digest, before
// it is overwritten; the next one becomes the oldest.
func (s *State) dedupEvictOldest() {
	r := &s.dedupRing
	oldest, next := r.at(r.head), r.at((r.head+1)%DedupCapacity)
	s.sum -= s.rh.dedup(nil, oldest)
	s.sum -= s.rh.dedup(oldest, next)
	s.sum += s.rh.dedup(nil, next)
}

// recordsSum hashes every record from scratch. It only reads the state (its
// own buffer), so it may run under a read lock.
func (s *State) recordsSum() uint64 {
	var rh recordHasher
	var sum uint64
	s.locks.Ascend(func(lk *Lock) bool {
		sum += rh.lock(lk)
		q := lk.Queue()
		for i := range q {
			sum += rh.waiter(lk.Name, prevSeq(q, i), &q[i])
		}
		return true
	})
	for _, l := range s.leases {
		sum += rh.lease(l)
	}
	for _, m := range s.members {
		sum += rh.member(m)
	}
	for _, t := range s.aclTokens {
		sum += rh.acl(t)
	}
	s.hist.byName.Ascend(func(h *lockHistory) bool {
		for i := range h.recs {
			sum += rh.grant(h.name, &h.recs[i])
		}
		return true
	})
	for id, list := range s.lost {
		for i := range list {
			sum += rh.lostGrant(id, &list[i])
		}
	}
	var prev *dedupEntry
	s.dedupRing.each(func(e *dedupEntry) {
		sum += rh.dedup(prev, e)
		prev = e
	})
	return sum
}

// digestOf combines the record sum with what is small enough to hash whole
// each time: the counters and the (at most MaxTokenKeys) signing keys.
func (s *State) digestOf(records uint64) uint64 {
	h := newHasher(recCounters)
	h.u64(s.index)
	h.i64(s.ts)
	h.i64(s.clock)
	h.u64(s.revision)
	h.u64(s.lastToken)
	h.u64(uint64(s.locks.Len()))
	h.u64(uint64(len(s.leases)))
	h.u64(uint64(s.dedupRing.count))
	h.u64(uint64(len(s.tokenKeys)))
	rt := s.hist.retention
	h.i64(rt.PerName)
	h.i64(rt.MaxEntries)
	h.i64(rt.MaxBytes)
	h.i64(rt.MaxAgeMs)
	h.u64(s.hist.seq)
	h.i64(s.hist.count)
	s.shardDigest(&h)
	var rh recordHasher // not s.rh: Digest may run under a read lock
	for i := range s.tokenKeys {
		h.u64(rh.tokenKey(&s.tokenKeys[i]))
	}
	h.u64(records)
	return h.sum()
}

// Digest fingerprints the whole state in constant time (the record hashes
// are kept up to date as the state changes). Replicas at the same index
// have the same digest; a replica whose state differs in any field of any
// record has, up to a 64-bit hash collision, another one.
func (s *State) Digest() uint64 { return s.digestOf(s.sum) }

// FullDigest is Digest computed from scratch, walking every record. It is
// for tests and offline checks: it takes time in proportion to the state.
func (s *State) FullDigest() uint64 { return s.digestOf(s.recordsSum()) }
