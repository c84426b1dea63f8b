package state

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/wire"
)

// snapshotMagic starts every snapshot; the byte after it is the format version.
var snapshotMagic = []byte("DLSNAP")

// snapshotVersion 2 added lock and waiter values (elections), version 3 the
// token-signing keys, version 4 the ACL tokens, version 5 waiters' request
// ids and no more lease creation times, version 6 each retired token key's
// bound (TokenKey.MaxToken) and the lease clock (State.clock, each lease's
// RenewedClock, each wait's ClockDeadline), version 7 members' versions,
// version 8 the lock model (each lock's limit, mode and every holder, each
// waiter's mode and place in line, and the refusals' new result fields in
// the dedup table), version 9 the grant history, lock-delays (each lock's
// and waiter's LockDelayMs, a delay in force) and holders' values on plain
// locks, version 10 the grants each session lost (lost.go), version 11 the
// shard section (shard.go: the range a shard owns, its splits, the meta
// group's map), version 12 each map range's replica set, version 13 the
// map's removing nodes; older snapshots are still read.
const snapshotVersion = 13

// Snapshot encodes the whole state. The encoding is canonical (every collection
// in sorted or log order), so two replicas that applied the same log produce
// byte-identical snapshots. Lease lock/wait sets are not stored: they are
// derived from the lock table on restore.
func (s *State) Snapshot() []byte { return s.snapshot(nil, s.shard) }

// snapshot encodes the state, or with keep only the names keep accepts
// (and the leases, history and lost grants that belong to them; sessions,
// members, keys, ACLs and the dedup table whole), with sh as its shard
// section: a split carves both halves this way (shard.go).
func (s *State) snapshot(keep func(key string) bool, sh shardState) []byte {
	w := &wire.Writer{Buf: make([]byte, 0, 64+s.locks.Len()*64+len(s.leases)*64+s.dedupRing.count*48)}
	w.Fixed(snapshotMagic)
	w.Byte(snapshotVersion)
	w.Uvarint(s.index)
	w.Varint(s.ts)
	w.Uvarint(s.revision)
	w.Uvarint(s.lastToken)
	w.Varint(s.clock)

	members := s.Members()
	w.Uvarint(uint64(len(members)))
	for _, m := range members {
		writeMember(w, m)
	}

	// Sorted by a copy of each id's order beside its lease: the sort reads
	// no scattered lease, and no map lookup follows it.
	type sortedLease struct {
		o leaseOrder
		l *Lease
	}
	leases := make([]sortedLease, 0, len(s.leases))
	for id, l := range s.leases {
		if keep == nil || leaseKept(l, keep) {
			leases = append(leases, sortedLease{orderOf(id), l})
		}
	}
	slices.SortFunc(leases, func(a, b sortedLease) int { return a.o.compare(b.o) })
	w.Uvarint(uint64(len(leases)))
	for _, sl := range leases {
		writeLease(w, sl.l)
	}

	nlocks := s.locks.Len()
	if keep != nil {
		nlocks = 0
		s.locks.Ascend(func(lk *Lock) bool {
			if keep(lk.Name) {
				nlocks++
			}
			return true
		})
	}
	w.Uvarint(uint64(nlocks))
	s.locks.Ascend(func(lk *Lock) bool {
		if keep != nil && !keep(lk.Name) {
			return true
		}
		writeLockHead(w, lk)
		q := lk.Queue()
		w.Uvarint(uint64(len(q)))
		for i := range q {
			writeWaiter(w, &q[i])
		}
		return true
	})

	w.Uvarint(uint64(s.dedupRing.count))
	s.dedupRing.each(func(e *dedupEntry) { writeDedupEntry(w, e) })
	s.writeTokenKeys(w)
	s.writeACL(w)
	s.writeHistory(w, keep)
	s.writeLost(w, keep) // version 10
	writeShard(w, &sh)   // version 11
	return w.Buf
}

// The records of a snapshot, one writer each; the digest (digest.go) hashes
// the same bytes, so whatever a snapshot holds, the digest covers.

func writeMember(w *wire.Writer, m Member) {
	w.String(m.ID)
	w.String(m.RaftAddr)
	w.String(m.APIAddr)
	w.String(m.Version) // version 7
}

// writeLease writes a lease's fields (its name set is derived from the locks).
func writeLease(w *wire.Writer, l *Lease) {
	w.Fixed(l.ID[:])
	w.String(l.ClientID)
	w.Varint(int64(l.TTLms))
	w.Bool(l.Session)
	w.Bool(l.Active)
	w.Uvarint(l.Gen)
	w.Varint(l.RenewedAt)
	w.Varint(l.RenewedClock)
}

// writeLockHead writes a lock's own fields (its first holder among them);
// its other holders and the queue follow.
func writeLockHead(w *wire.Writer, lk *Lock) {
	w.String(lk.Name)
	w.Fixed(lk.Holder[:])
	w.Uvarint(lk.Token)
	w.Varint(lk.GrantedAt)
	w.Uvarint(lk.GrantSeq)
	w.String(lk.Value())
	// version 8
	w.Uvarint(uint64(lk.Limit()))
	w.Bool(lk.Shared())
	first := lk.grantAt(0)
	w.Bool(lk.Held() && first.Subtree)
	n := lk.NumHolders()
	w.Uvarint(uint64(max(n-1, 0)))
	for i := 1; i < n; i++ {
		g := lk.grantAt(i)
		w.Fixed(g.LeaseID[:])
		w.Uvarint(g.Token)
		w.Varint(g.GrantedAt)
		w.Uvarint(g.GrantSeq)
		w.Bool(g.Subtree)
	}
	// version 9
	var x lockExtra
	if lk.extra != nil {
		x = *lk.extra
	}
	w.Varint(x.delayMs)
	w.Uvarint(x.delayToken)
	w.Varint(x.delayUntil)
	w.Varint(x.delayClock)
}

func writeWaiter(w *wire.Writer, q *Waiter) {
	w.Fixed(q.LeaseID[:])
	w.String(q.ClientID)
	w.Uvarint(q.Seq)
	w.Varint(q.EnqueuedAt)
	w.Varint(q.Deadline)
	w.Varint(q.ClockDeadline)
	w.String(q.Value)
	w.String(q.RequestID)
	// version 8
	w.Uvarint(q.Place)
	w.Bool(q.Shared)
	w.Bool(q.Subtree)
	w.Varint(q.LockDelayMs) // version 9
}

func writeDedupEntry(w *wire.Writer, e *dedupEntry) {
	w.String(e.key.client)
	w.String(e.key.request)
	command.EncodeResult(w, &e.result)
	command.EncodeResultExt(w, &e.result) // version 8
}

func sortLeaseIDs(ids []command.LeaseID) { slices.SortFunc(ids, compareLeaseIDs) }

// compareLeaseIDs orders lease ids as bytes.Compare does: the snapshot's
// order of leases and lost grants.
func compareLeaseIDs(a, b command.LeaseID) int { return orderOf(a).compare(orderOf(b)) }

// leaseOrder is a lease id as two big-endian words, which compare in the
// ids' byte order at a fraction of bytes.Compare's cost: sorting the leases
// was a third of a large state's snapshot.
type leaseOrder struct{ hi, lo uint64 }

func orderOf(id command.LeaseID) leaseOrder {
	return leaseOrder{binary.BigEndian.Uint64(id[:8]), binary.BigEndian.Uint64(id[8:])}
}

func (a leaseOrder) compare(b leaseOrder) int {
	if c := cmp.Compare(a.hi, b.hi); c != 0 {
		return c
	}
	return cmp.Compare(a.lo, b.lo)
}

// Restore decodes a snapshot into a fresh state, checking every cross-reference
// so a corrupt snapshot is refused rather than half-loaded.
func Restore(b []byte) (*State, error) {
	if !bytes.HasPrefix(b, snapshotMagic) {
		return nil, errors.New("restore snapshot: not a dlock snapshot (bad magic)")
	}
	r := wire.NewReader(b[len(snapshotMagic):])
	v := r.Byte()
	if v < 1 || v > snapshotVersion {
		return nil, fmt.Errorf("restore snapshot: format version %d not supported by this build (upgrade this node)", v)
	}
	s := New()
	// The sections in their order; each reader knows the layouts of every
	// version that had its section.
	sections := []func(*wire.Reader, byte) error{
		s.readHeader, s.readMembers, s.readLeases, s.readLocks, s.readDedup,
		func(r *wire.Reader, v byte) error { // token-signing keys, since version 3
			if v < 3 {
				return nil
			}
			return s.readTokenKeys(r, v)
		},
		s.readACLSection,
		s.readHistory,
		s.readLost,
		s.readShard,
	}
	for _, read := range sections {
		if err := read(r, v); err != nil {
			return nil, fmt.Errorf("restore snapshot: %w", err)
		}
		if err := r.Err(); err != nil {
			return nil, fmt.Errorf("restore snapshot: %w", err)
		}
	}
	if r.Len() != 0 {
		return nil, fmt.Errorf("restore snapshot: %d trailing bytes", r.Len())
	}
	if err := s.checkImplicitLeases(); err != nil {
		return nil, fmt.Errorf("restore snapshot: %w", err)
	}
	// The restore above went around the digest's hooks (remember aside).
	s.sum = s.recordsSum()
	return s, nil
}

// readHeader reads the counters (the lease clock since version 6).
func (s *State) readHeader(r *wire.Reader, v byte) error {
	s.index = r.Uvarint()
	s.ts = r.Varint()
	s.revision = r.Uvarint()
	s.lastToken = r.Uvarint()
	if v >= 6 {
		s.clock = r.Varint()
	}
	return nil
}

func (s *State) readMembers(r *wire.Reader, v byte) error {
	for n := r.Count(3); n > 0 && r.Err() == nil; n-- {
		m := Member{ID: r.String(), RaftAddr: r.String(), APIAddr: r.String()}
		if v >= 7 {
			m.Version = r.String()
		}
		s.members[m.ID] = m
	}
	return nil
}

// readLeases reads the leases, in id order.
func (s *State) readLeases(r *wire.Reader, v byte) error {
	var prevID command.LeaseID
	// 22 bytes is the smallest lease: an empty client id and small numbers.
	for n := r.Count(22); n > 0 && r.Err() == nil; n-- {
		l, err := s.readLease(r, v)
		if err != nil {
			return err
		}
		if l.ID.IsZero() || (len(s.leases) > 0 && bytes.Compare(prevID[:], l.ID[:]) >= 0) {
			return errors.New("lease ids are zero, repeated or out of order")
		}
		prevID = l.ID
		s.leases[l.ID] = l
	}
	return nil
}

func (s *State) readLease(r *wire.Reader, v byte) (*Lease, error) {
	l := &Lease{}
	r.Fixed(l.ID[:])
	l.ClientID = r.String()
	ttl := r.Varint()
	if r.Err() == nil && !validTTL(ttl) {
		return nil, fmt.Errorf("a lease has ttl %d ms, outside %d..%d", ttl, command.MinTTLms, command.MaxTTLms)
	}
	l.TTLms = int32(ttl)
	l.Session = r.Bool()
	l.Active = r.Bool()
	l.Gen = r.Uvarint()
	l.RenewedAt = r.Varint()
	if v < 5 {
		r.Varint() // the lease's creation time, which nothing read: dropped in v5
	}
	if v >= 6 {
		// Before version 6 no lease clock was kept: a lease then counts its
		// whole TTL again from here (RenewedClock 0 = the clock, 0), which
		// may lengthen it, never shorten it.
		l.RenewedClock = r.Varint()
		if l.RenewedClock < 0 || l.RenewedClock > s.clock {
			return nil, errors.New("a lease was renewed at a lease-clock time after the snapshot's")
		}
	}
	return l, nil
}

// readLocks reads the locks, in name order, each with its holders and its
// queue, ties them to their leases and rebuilds the derived indexes.
func (s *State) readLocks(r *wire.Reader, v byte) error {
	prevName := ""
	tokens := map[uint64]bool{}
	for n := r.Count(20); n > 0 && r.Err() == nil; n-- {
		lk := &Lock{Name: r.String()}
		if !command.ValidKey(lk.Name) || (s.locks.Len() > 0 && lk.Name <= prevName) {
			return fmt.Errorf("lock name %q is invalid, repeated or out of order", lk.Name)
		}
		prevName = lk.Name
		var first Grant
		r.Fixed(first.LeaseID[:])
		first.Token = r.Uvarint()
		first.GrantedAt = r.Varint()
		first.GrantSeq = r.Uvarint()
		value := ""
		if v >= 2 {
			value = r.String()
		}
		limit, shared := uint64(1), false
		grants := []Grant{first}
		if v >= 8 {
			limit = r.Uvarint()
			shared = r.Bool()
			grants[0].Subtree = r.Bool()
			for m := r.Count(20); m > 0 && r.Err() == nil; m-- {
				var g Grant
				r.Fixed(g.LeaseID[:])
				g.Token, g.GrantedAt, g.GrantSeq, g.Subtree = r.Uvarint(), r.Varint(), r.Uvarint(), r.Bool()
				grants = append(grants, g)
			}
		}
		var delayMs, delayUntil, delayClock int64
		var delayToken uint64
		if v >= 9 {
			delayMs, delayToken, delayUntil, delayClock = r.Varint(), r.Uvarint(), r.Varint(), r.Varint()
		}
		if r.Err() != nil {
			return nil
		}
		held := !first.LeaseID.IsZero()
		_, election := command.SplitKey(lk.Name)
		switch {
		case limit < 1 || limit > command.MaxLimit || (shared && limit != 1):
			return fmt.Errorf("lock %q has limit %d (shared %v)", lk.Name, limit, shared)
		case election && (limit != 1 || shared):
			return fmt.Errorf("election %q has a limit or a mode", lk.Name)
		case !held && (len(grants) > 1 || shared || grants[0].Subtree || value != "" || first.Token != 0 || first.GrantSeq != 0 || first.GrantedAt != 0):
			return fmt.Errorf("lock %q has no first holder but holder fields", lk.Name)
		case !shared && uint64(len(grants)) > limit:
			return fmt.Errorf("lock %q has %d exclusive holders, over its limit %d", lk.Name, len(grants), limit)
		case len(value) > command.MaxValueLen:
			return fmt.Errorf("lock %q has an oversized value", lk.Name)
		}
		if limit > 1 {
			lk.ext().limit = int32(limit)
		}
		if held {
			for _, g := range grants {
				l := s.leases[g.LeaseID]
				if l == nil {
					return fmt.Errorf("lock %q is held by an unknown lease", lk.Name)
				}
				if g.Token == 0 || g.Token > s.lastToken || tokens[g.Token] {
					return fmt.Errorf("lock %q has token %d (last granted %d), zero or reused", lk.Name, g.Token, s.lastToken)
				}
				if l.Locks().Has(lk.Name) || (election && g.Subtree) {
					return fmt.Errorf("a lease holds lock %q twice, or an election as a subtree", lk.Name)
				}
				tokens[g.Token] = true
				l.Locks().Set(lk.Name, 0)
				s.addGrant(lk, g, shared)
			}
		}
		lk.setValue(value)
		lk.setDelayMs(delayMs)
		lk.setDelay(delayToken, delayUntil, delayClock)
		if delayMs < 0 || delayMs > command.MaxLockDelayMs || delayToken > s.lastToken ||
			(delayToken == 0 && (delayUntil != 0 || delayClock != 0)) || (held && delayToken != 0) || (!held && delayMs != 0) ||
			(delayMs != 0 && (limit != 1 || shared || len(grants) > 1 || grants[0].Subtree)) {
			return fmt.Errorf("lock %q has an inconsistent lock-delay", lk.Name)
		}
		var prevPlace uint64
		for q := r.Count(20); q > 0 && r.Err() == nil; q-- {
			wt := readWaiter(r, v)
			if v < 8 {
				// Before version 8 a waiter's place is its acquire's; a
				// takeover kept its place with a later acquire, so the
				// queue's order wins where they disagree.
				wt.Place = max(placeOfSeq(wt.Seq), prevPlace)
			} else if wt.Place <= prevPlace && r.Err() == nil {
				return fmt.Errorf("lock %q has a queue out of line order", lk.Name)
			}
			prevPlace = wt.Place
			l := s.leases[wt.LeaseID]
			if l == nil || l.ClientID != wt.ClientID || lk.grantIndex(wt.LeaseID) >= 0 || wt.Seq == 0 || len(wt.Value) > command.MaxValueLen ||
				(election && (wt.Shared || wt.Subtree)) || wt.LockDelayMs < 0 || wt.LockDelayMs > command.MaxLockDelayMs {
				return fmt.Errorf("lock %q has a waiter with an unknown or inconsistent lease", lk.Name)
			}
			if l.Waits().Has(lk.Name) {
				return fmt.Errorf("a lease waits twice for lock %q", lk.Name)
			}
			l.Waits().Set(lk.Name, wt.Seq)
			lk.setQueue(append(lk.Queue(), wt))
			s.waitIndex(lk.Name, &wt, true)
		}
		if !held && r.Err() == nil && (v < 8 || len(lk.Queue()) == 0) && !lk.delayed() {
			// A lock is in the table only while held, waited for or in a
			// lock-delay; and
			// before version 8 a free lock's queue would have been
			// handed the lock.
			return fmt.Errorf("lock %q is free but listed", lk.Name)
		}
		if r.Err() == nil {
			s.locks.ReplaceOrInsert(lk)
		}
	}
	return nil
}

// placeOfSeq is placeOf for a command named only by its Seq (its index is
// the Seq's low 48 bits).
func placeOfSeq(seq uint64) uint64 { return placeOf(seq&(1<<48-1), seq) }

func readWaiter(r *wire.Reader, v byte) Waiter {
	var wt Waiter
	r.Fixed(wt.LeaseID[:])
	wt.ClientID = r.String()
	wt.Seq = r.Uvarint()
	wt.EnqueuedAt = r.Varint()
	wt.Deadline = r.Varint()
	if v >= 6 {
		wt.ClockDeadline = r.Varint()
	} else {
		// Before version 6 the lease clock was 0 for every entry, so a
		// wait's clock deadline is its whole wait, as replaying the log
		// would make it.
		wt.ClockDeadline = wt.Deadline - wt.EnqueuedAt
	}
	if v >= 2 {
		wt.Value = r.String()
	}
	if v >= 5 {
		wt.RequestID = r.String()
	}
	if v >= 8 {
		wt.Place = r.Uvarint()
		wt.Shared = r.Bool()
		wt.Subtree = r.Bool()
	}
	if v >= 9 {
		wt.LockDelayMs = r.Varint()
	}
	return wt
}

func (s *State) readDedup(r *wire.Reader, v byte) error {
	n := r.Count(4)
	if n > DedupCapacity {
		return fmt.Errorf("%d dedup entries exceed capacity %d", n, DedupCapacity)
	}
	for ; n > 0 && r.Err() == nil; n-- {
		key := dedupKey{client: r.String(), request: r.String()}
		if _, dup := s.dedup[key]; dup {
			return errors.New("repeated dedup entry")
		}
		res := command.DecodeResult(r)
		if v >= 8 {
			command.DecodeResultExt(r, &res)
		}
		s.remember(key, res)
	}
	return nil
}

// readACLSection reads the ACL tokens, since version 4. The section ends the
// snapshot, so a version 4 snapshot that does not end right after the
// current token layout has the first one (version 4 was written with both).
func (s *State) readACLSection(r *wire.Reader, v byte) error {
	if v < 4 {
		return nil
	}
	saved := *r
	err := s.readACL(r, false)
	if v == 4 && (err != nil || r.Err() != nil || r.Len() != 0) {
		*r = saved
		s.aclTokens, s.aclBySecret, s.aclByCN = map[[16]byte]*ACLToken{}, map[[32]byte][16]byte{}, map[string][16]byte{}
		err = s.readACL(r, true)
	}
	return err
}

// checkImplicitLeases: an implicit lease exists for exactly one lock, held
// or waited for.
func (s *State) checkImplicitLeases() error {
	for _, l := range s.leases {
		if !l.Session && l.Locks().Len()+l.Waits().Len() != 1 {
			return fmt.Errorf("implicit lease of client %q holds or waits for %d locks", l.ClientID, l.Locks().Len()+l.Waits().Len())
		}
	}
	return nil
}
