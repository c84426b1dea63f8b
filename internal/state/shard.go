package state

import (
	"errors"
	"fmt"
	"slices"

	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/wire"
)

// shardState is what a state knows of shards: the range of top-level name
// segments it owns once a split has given it one (a state that never took
// part in a split owns every name), the splits it was the source of, and,
// in the meta group's state, the shard map.
type shardState struct {
	ranged bool
	// from and to bound the owned range: from <= top < to ("" to: open).
	from, to string
	splits   []SplitRecord
	mapGen   uint64
	ranges   []command.ShardRange
}

// SplitRecord is one split a shard was the source of: the names at and
// above At went to Raft group Group at log index Index.
type SplitRecord struct {
	At    string
	Group uint64
	Index uint64
	// To is the end of the range the new group got ("" open).
	To string
}

// MaxSplits bounds the splits one shard remembers (and so its snapshot).
const MaxSplits = 64

// Owns reports whether the state owns a lock-table key (or a name): always,
// until a split gave it a range.
func (s *State) Owns(key string) bool { return s.shard.owns(key) }

func (sh *shardState) owns(key string) bool {
	if !sh.ranged {
		return true
	}
	t := command.TopSegment(key)
	return t >= sh.from && (sh.to == "" || t < sh.to)
}

// Range is the range the state owns (ranged false: every name).
func (s *State) Range() (from, to string, ranged bool) {
	return s.shard.from, s.shard.to, s.shard.ranged
}

// Splits are the splits this state was the source of, oldest first.
func (s *State) Splits() []SplitRecord { return append([]SplitRecord(nil), s.shard.splits...) }

// ShardMap is the meta group's shard map (generation 0: none committed).
func (s *State) ShardMap() (generation uint64, ranges []command.ShardRange) {
	return s.shard.mapGen, append([]command.ShardRange(nil), s.shard.ranges...)
}

// keyOf is the name a command acts on, for the wrong-shard check: the
// commands a client sends for one name. Commands the leader proposes on
// its own (expiries, cancels, lock-delay ends) find nothing for a name
// that moved and change nothing.
func keyOf(b command.Body) (string, bool) {
	switch b := b.(type) {
	case *command.Acquire:
		return b.Name, true
	case *command.Release:
		return b.Name, true
	case *command.Renew:
		return b.Name, true
	case *command.Revoke:
		return b.Name, true
	case *command.Proclaim:
		return b.Name, true
	}
	return "", false
}

// wrongShard reports whether the command names a key this state does not
// own. It is checked before the dedup table: a request answered here before
// its name moved is answered by the new shard, whose table has the entry.
func (s *State) wrongShard(e *command.Envelope) bool {
	if !s.shard.ranged {
		return false
	}
	k, ok := keyOf(e.Body)
	return ok && !s.shard.owns(k)
}

// split carves the names at and above b.At out of this state into a new
// one for group b.Group, deterministically: both halves are this state's
// own snapshot, filtered by name (snapshot), and restored. The new state
// keeps every session (same id), every dedup entry, the counters (tokens
// and revisions go on rising), the keys and ACLs; the moved locks take
// their holders, queues in order, lock-delays, implicit leases, history
// and lost grants with them. The carved state is handed out in an
// EventSplit; this state then owns [from, At) only.
func (s *State) split(index uint64, b *command.Split, from, to string) command.Result {
	for _, r := range s.shard.splits {
		if r.Group == b.Group {
			return command.Result{Status: command.StatusOK, Token: r.Group, Message: "already split"}
		}
	}
	if n, err := command.NormalizeName(b.At); err != nil || n != b.At || b.At == "" || containsSlash(b.At) {
		return invalid("split point must be one name segment ([A-Za-z0-9._:-]+)")
	}
	if b.Group < 2 {
		return invalid("split group id must be at least 2")
	}
	if s.shard.ranged && (from != s.shard.from || to != s.shard.to) {
		return invalid("the split names another range than this shard's")
	}
	if b.At <= from || (to != "" && b.At >= to) {
		return invalid("split point is not strictly inside the shard's range")
	}
	if len(s.shard.splits) >= MaxSplits {
		return invalid("this shard was split too often; split the shards split off it instead")
	}
	high := func(key string) bool { t := command.TopSegment(key); return t >= b.At }
	low := func(key string) bool { return !high(key) }
	childSh := shardState{ranged: true, from: b.At, to: to}
	child, err := Restore(s.snapshot(high, childSh))
	if err != nil {
		return invalid("carving the split-off state failed: " + err.Error())
	}
	lowSh := s.shard
	lowSh.ranged, lowSh.from, lowSh.to = true, from, b.At
	lowSh.splits = append(append([]SplitRecord(nil), s.shard.splits...), SplitRecord{At: b.At, Group: b.Group, Index: index, To: to})
	rest, err := Restore(s.snapshot(low, lowSh))
	if err != nil {
		return invalid("carving the kept state failed: " + err.Error())
	}
	// Tell this node's waiting requests and timers that the moved waits
	// and implicit leases are gone from here.
	var gone []Event
	s.locks.Ascend(func(lk *Lock) bool {
		if !high(lk.Name) {
			return true
		}
		for _, w := range lk.Queue() {
			gone = append(gone, Event{Type: EventWaitGone, Name: lk.Name, LeaseID: w.LeaseID, Seq: w.Seq})
		}
		return true
	})
	var leases []command.LeaseID
	for id, l := range s.leases {
		if !l.Session && !leaseKept(l, low) {
			leases = append(leases, id)
		}
	}
	sortLeaseIDs(leases)
	for _, id := range leases {
		gone = append(gone, Event{Type: EventLeaseGone, LeaseID: id})
	}
	events := s.events
	*s = *rest
	s.events = events
	for _, e := range gone {
		s.emit(e)
	}
	s.changed = true
	// The carved state stands at this entry, one revision on, like this one.
	child.revision = s.revision + 1
	child.sum = child.recordsSum()
	s.emit(Event{Type: EventSplit, Name: b.At, Token: b.Group, Carved: child.Snapshot()})
	return command.Result{Status: command.StatusOK, Token: b.Group}
}

func containsSlash(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == '/' {
			return true
		}
	}
	return false
}

// leaseKept reports whether an implicit lease holds or waits for a name
// keep accepts (sessions are kept whole by the caller).
func leaseKept(l *Lease, keep func(string) bool) bool {
	if l.Session {
		return true
	}
	for _, n := range l.Locks().Sorted() {
		if keep(n) {
			return true
		}
	}
	for _, n := range l.Waits().Sorted() {
		if keep(n) {
			return true
		}
	}
	return false
}

// setShardMap installs the next generation of the meta group's map.
func (s *State) setShardMap(b *command.SetShardMap) command.Result {
	if b.Generation != s.shard.mapGen+1 {
		return command.Result{Status: command.StatusOK, Token: s.shard.mapGen, Message: "stale generation"}
	}
	if err := checkRanges(b.Ranges); err != nil {
		return invalid(err.Error())
	}
	s.shard.mapGen = b.Generation
	s.shard.ranges = append([]command.ShardRange(nil), b.Ranges...)
	s.changed = true
	return command.Result{Status: command.StatusOK, Token: b.Generation}
}

// MaxShardRanges bounds the shard map.
const MaxShardRanges = 256

func checkRanges(rs []command.ShardRange) error {
	if len(rs) == 0 || rs[0].Start != "" || len(rs) > MaxShardRanges {
		return errors.New("a shard map has 1 to 256 ranges, the first starting at \"\"")
	}
	ids, groups := map[uint64]bool{}, map[uint64]bool{}
	for i, r := range rs {
		if i > 0 {
			if n, err := command.NormalizeName(r.Start); err != nil || n != r.Start || containsSlash(r.Start) || r.Start <= rs[i-1].Start {
				return fmt.Errorf("shard range %d starts at %q: not one name segment above the previous range's start", i, r.Start)
			}
		}
		if r.Group < 2 || ids[r.ID] || groups[r.Group] {
			return fmt.Errorf("shard range %d has a repeated id or group", i)
		}
		if len(r.Replicas) > command.MaxReplicas {
			return fmt.Errorf("shard range %d has %d replicas; the limit is %d", i, len(r.Replicas), command.MaxReplicas)
		}
		for j, id := range r.Replicas {
			if id == "" || len(id) > command.MaxReplicaIDLen || (j > 0 && id <= r.Replicas[j-1]) {
				return fmt.Errorf("shard range %d's replicas must be distinct node ids in order", i)
			}
		}
		if r.Leaving != "" && !slices.Contains(r.Replicas, r.Leaving) {
			return fmt.Errorf("shard range %d's leaving replica %q is not one of its replicas", i, r.Leaving)
		}
		ids[r.ID], groups[r.Group] = true, true
	}
	return nil
}

func writeShard(w *wire.Writer, sh *shardState) {
	w.Bool(sh.ranged)
	w.String(sh.from)
	w.String(sh.to)
	w.Uvarint(uint64(len(sh.splits)))
	for _, r := range sh.splits {
		w.String(r.At)
		w.Uvarint(r.Group)
		w.Uvarint(r.Index)
		w.String(r.To)
	}
	w.Uvarint(sh.mapGen)
	w.Uvarint(uint64(len(sh.ranges)))
	for _, r := range sh.ranges {
		w.String(r.Start)
		w.Uvarint(r.ID)
		w.Uvarint(r.Group)
		w.Uvarint(uint64(len(r.Replicas))) // version 12
		for _, id := range r.Replicas {
			w.String(id)
		}
		w.String(r.Leaving)
	}
}

// readShard reads the shard section (snapshot version 11; replica sets
// since version 12).
func (s *State) readShard(r *wire.Reader, v byte) error {
	if v < 11 {
		return nil
	}
	sh := shardState{ranged: r.Bool(), from: r.String(), to: r.String()}
	n := r.Count(4)
	if n > MaxSplits {
		return fmt.Errorf("%d splits recorded, over %d", n, MaxSplits)
	}
	for ; n > 0 && r.Err() == nil; n-- {
		sh.splits = append(sh.splits, SplitRecord{At: r.String(), Group: r.Uvarint(), Index: r.Uvarint(), To: r.String()})
	}
	sh.mapGen = r.Uvarint()
	m := r.Count(3)
	for ; m > 0 && r.Err() == nil; m-- {
		sr := command.ShardRange{Start: r.String(), ID: r.Uvarint(), Group: r.Uvarint()}
		if v >= 12 {
			k := r.Count(1)
			for ; k > 0 && r.Err() == nil; k-- {
				sr.Replicas = append(sr.Replicas, r.String())
			}
			sr.Leaving = r.String()
		}
		sh.ranges = append(sh.ranges, sr)
	}
	if r.Err() != nil {
		return nil
	}
	if !sh.ranged && (sh.from != "" || sh.to != "") {
		return errors.New("a shard range without a range")
	}
	if sh.ranged && sh.to != "" && sh.to <= sh.from {
		return errors.New("a shard range that ends before it starts")
	}
	if (sh.mapGen == 0) != (len(sh.ranges) == 0) {
		return errors.New("a shard map without ranges, or ranges without a generation")
	}
	if len(sh.ranges) > 0 {
		if err := checkRanges(sh.ranges); err != nil {
			return err
		}
	}
	var stray string
	s.locks.Ascend(func(lk *Lock) bool {
		if !sh.owns(lk.Name) {
			stray = lk.Name
			return false
		}
		return true
	})
	if stray != "" {
		return fmt.Errorf("lock %q lies outside the shard's range", stray)
	}
	s.shard = sh
	return nil
}

// shardDigest hashes the shard section into the digest.
func (s *State) shardDigest(h *hasher) {
	if sh := &s.shard; !sh.ranged && len(sh.splits) == 0 && sh.mapGen == 0 {
		return // a state that never took part in a split digests as before
	}
	var w wire.Writer
	writeShard(&w, &s.shard)
	h.bytes(w.Buf)
}
