package state

import (
	"encoding/binary"
	"math/bits"

	"github.com/dlock/dlock/internal/command"
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

func (h *hasher) bool(b bool) {
	if b {
		h.u64(1)
	} else {
		h.u64(0)
	}
}

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

func (h *hasher) str(s string) {
	h.u64(uint64(len(s)))
	for len(s) >= 8 {
		h.u64(uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
			uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56)
		s = s[8:]
	}
	if len(s) > 0 {
		var tail [8]byte
		copy(tail[:], s)
		h.u64(binary.LittleEndian.Uint64(tail[:]))
	}
}

func (h *hasher) lease(id command.LeaseID) {
	h.u64(binary.LittleEndian.Uint64(id[:8]))
	h.u64(binary.LittleEndian.Uint64(id[8:]))
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

// lockHash is a lock's own fields; its waiters are records of their own.
func lockHash(lk *Lock) uint64 {
	h := newHasher(recLock)
	h.str(lk.Name)
	h.lease(lk.Holder)
	h.u64(lk.Token)
	h.i64(lk.GrantedAt)
	h.u64(lk.GrantSeq)
	h.str(lk.Value())
	return h.sum()
}

// waiterHash is one waiter of the named lock; prev is the Seq of the waiter
// ahead of it (0 at the head), which pins its place in line.
func waiterHash(name string, prev uint64, w *Waiter) uint64 {
	h := newHasher(recWaiter)
	h.str(name)
	h.u64(prev)
	h.lease(w.LeaseID)
	h.str(w.ClientID)
	h.u64(w.Seq)
	h.i64(w.EnqueuedAt)
	h.i64(w.Deadline)
	h.i64(w.ClockDeadline)
	h.str(w.Value)
	h.str(w.RequestID)
	return h.sum()
}

// leaseHash is a lease's fields (its name set is derived from the locks).
func leaseHash(l *Lease) uint64 {
	h := newHasher(recLease)
	h.lease(l.ID)
	h.str(l.ClientID)
	h.i64(int64(l.TTLms))
	h.bool(l.Session)
	h.bool(l.Active)
	h.u64(l.Gen)
	h.i64(l.RenewedAt)
	h.i64(l.RenewedClock)
	return h.sum()
}

func memberHash(m Member) uint64 {
	h := newHasher(recMember)
	h.str(m.ID)
	h.str(m.RaftAddr)
	h.str(m.APIAddr)
	return h.sum()
}

func aclHash(t *ACLToken) uint64 {
	h := newHasher(recACL)
	h.bytes(t.AccessorID[:])
	h.bytes(t.SecretHash[:])
	h.str(t.Description)
	h.i64(t.CreatedAt)
	h.i64(t.ExpiresAt)
	h.u64(uint64(len(t.Rules)))
	for _, r := range t.Rules {
		h.str(r.Prefix)
		h.u64(uint64(r.Perms))
	}
	h.u64(uint64(len(t.ClientIDs)))
	for _, c := range t.ClientIDs {
		h.str(c)
	}
	h.u64(uint64(len(t.CertCNs)))
	for _, c := range t.CertCNs {
		h.str(c)
	}
	return h.sum()
}

// dedupHash is one dedup entry at its position in the ring; with the ring's
// head and count (hashed with the counters) the positions fix the order in
// which entries are forgotten.
func dedupHash(pos int, e *dedupEntry) uint64 {
	h := newHasher(recDedup)
	h.u64(uint64(pos))
	h.str(e.key.client)
	h.str(e.key.request)
	r := &e.result
	h.u64(uint64(r.Status))
	h.lease(r.LeaseID)
	h.u64(r.Token)
	h.i64(r.ExpiresAt)
	h.i64(r.TTLms)
	h.u64(r.Revision)
	h.u64(r.Seq)
	h.str(r.Holder.ClientID)
	h.u64(r.Holder.Token)
	h.i64(r.Holder.GrantedAt)
	h.i64(r.Holder.ExpiresAt)
	h.str(r.Message)
	return h.sum()
}

// Incremental updates. Each out must see the record exactly as its in did.

func (s *State) lockIn(lk *Lock)  { s.sum += lockHash(lk) }
func (s *State) lockOut(lk *Lock) { s.sum -= lockHash(lk) }

func (s *State) leaseIn(l *Lease)  { s.sum += leaseHash(l) }
func (s *State) leaseOut(l *Lease) { s.sum -= leaseHash(l) }

// addLease puts a new lease in the table.
func (s *State) addLease(l *Lease) {
	s.leases[l.ID] = l
	s.leaseIn(l)
}

// deleteLease takes a lease out of the table.
func (s *State) deleteLease(l *Lease) {
	s.leaseOut(l)
	delete(s.leases, l.ID)
}

// newLock puts a new, free lock in the table (it is granted or queued for
// in the same step).
func (s *State) newLock(name string) *Lock {
	lk := &Lock{Name: name}
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
	s.sum += waiterHash(lk.Name, prevSeq(q, len(q)), &w)
	lk.setQueue(append(q, w))
}

// queueReplace puts w in place of the i-th waiter (the one behind it now
// follows w's Seq).
func (s *State) queueReplace(lk *Lock, i int, w Waiter) {
	q := lk.Queue()
	old := q[i]
	s.sum -= waiterHash(lk.Name, prevSeq(q, i), &old)
	s.sum += waiterHash(lk.Name, prevSeq(q, i), &w)
	if i+1 < len(q) {
		s.sum -= waiterHash(lk.Name, old.Seq, &q[i+1])
		s.sum += waiterHash(lk.Name, w.Seq, &q[i+1])
	}
	q[i] = w
}

// queueRemove takes the i-th waiter out of a lock's queue.
func (s *State) queueRemove(lk *Lock, i int) {
	q := lk.Queue()
	prev := prevSeq(q, i)
	s.sum -= waiterHash(lk.Name, prev, &q[i])
	if i+1 < len(q) {
		s.sum -= waiterHash(lk.Name, q[i].Seq, &q[i+1])
		s.sum += waiterHash(lk.Name, prev, &q[i+1])
	}
	if i == 0 {
		lk.setQueue(q[1:])
	} else {
		lk.setQueue(append(q[:i], q[i+1:]...))
	}
}

func (s *State) setMember(m Member) {
	if old, ok := s.members[m.ID]; ok {
		s.sum -= memberHash(old)
	}
	s.members[m.ID] = m
	s.sum += memberHash(m)
}

// dedupOut and dedupIn bracket a change to the entry at pos.
func (s *State) dedupOut(pos int) { s.sum -= dedupHash(pos, s.dedupRing.at(pos)) }
func (s *State) dedupIn(pos int)  { s.sum += dedupHash(pos, s.dedupRing.at(pos)) }

// recordsSum hashes every record from scratch.
func (s *State) recordsSum() uint64 {
	var sum uint64
	s.locks.Ascend(func(lk *Lock) bool {
		sum += lockHash(lk)
		q := lk.Queue()
		for i := range q {
			sum += waiterHash(lk.Name, prevSeq(q, i), &q[i])
		}
		return true
	})
	for _, l := range s.leases {
		sum += leaseHash(l)
	}
	for _, m := range s.members {
		sum += memberHash(m)
	}
	for _, t := range s.aclTokens {
		sum += aclHash(t)
	}
	for i := 0; i < s.dedupRing.count; i++ {
		sum += dedupHash(i, s.dedupRing.at(i))
	}
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
	h.u64(uint64(s.dedupRing.head))
	h.u64(uint64(s.dedupRing.count))
	h.u64(uint64(len(s.tokenKeys)))
	for i := range s.tokenKeys {
		k := &s.tokenKeys[i]
		kh := newHasher(recTokenKey)
		kh.bytes(k.ID[:])
		kh.bytes(k.Public)
		kh.bytes(k.Seed[:])
		kh.i64(k.CreatedAt)
		kh.bool(k.Current)
		kh.u64(k.MaxToken)
		h.u64(kh.sum())
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
