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
	// removing are the nodes whose removal from the cluster began
	// (command.SetShardMap.Removing): no range may list one.
	removing []string
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

// Removing are the nodes the meta group's map holds as being removed from
// the cluster, in the order their removal began.
func (s *State) Removing() []string { return slices.Clone(s.shard.removing) }

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

// setShardMap installs the next generation of the meta group's map. The
// generation compare-and-set orders every change of the map, and the
// removing check makes a removal and a move onto the same node exclusive:
// of a move onto a node and that node's removal, both proposed on the same
// generation, exactly one applies; the other is stale and, proposed again
// on the new map, refused.
func (s *State) setShardMap(e *command.Envelope, b *command.SetShardMap) command.Result {
	if b.Generation != s.shard.mapGen+1 {
		return command.Result{Status: command.StatusOK, Token: s.shard.mapGen, Message: "stale generation"}
	}
	removing := b.Removing
	if e.Version != 0 && e.Version < 11 {
		// Written by a node that knows nothing of removals: it keeps them.
		removing = s.shard.removing
	}
	if err := checkRanges(b.Ranges); err != nil {
		return invalid(err.Error())
	}
	if err := checkRemoving(b.Ranges, removing); err != nil {
		return invalid(err.Error())
	}
	s.shard.mapGen = b.Generation
	s.shard.ranges = append([]command.ShardRange(nil), b.Ranges...)
	s.shard.removing = slices.Clone(removing)
	s.changed = true
	return command.Result{Status: command.StatusOK, Token: b.Generation}
}

// checkRemoving checks the nodes being removed against the ranges: none
// may be a replica of any (a move's target or leaving replica included),
// and every range must name its replicas (one with none runs on every
// initial node, which this state cannot tell from a removed one).
func checkRemoving(rs []command.ShardRange, removing []string) error {
	if len(removing) == 0 {
		return nil
	}
	if len(removing) > command.MaxRemoving {
		return fmt.Errorf("%d nodes being removed; the limit is %d", len(removing), command.MaxRemoving)
	}
	for i, id := range removing {
		if id == "" || len(id) > command.MaxReplicaIDLen || slices.Contains(removing[:i], id) {
			return errors.New("the nodes being removed must be distinct node ids")
		}
	}
	for i, r := range rs {
		if len(r.Replicas) == 0 {
			return fmt.Errorf("shard range %d has no replica set while nodes are being removed", i)
		}
		for _, id := range r.Replicas {
			if slices.Contains(removing, id) {
				return fmt.Errorf("node %q is being removed from the cluster and cannot be a replica of shard %d (finish its removal, or add it to the cluster again, first)", id, r.ID)
			}
		}
	}
	return nil
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
	writeRemoving(w, sh)
}

// writeRemoving writes the removing nodes (version 13).
func writeRemoving(w *wire.Writer, sh *shardState) {
	w.Uvarint(uint64(len(sh.removing)))
	for _, id := range sh.removing {
		w.String(id)
	}
}

// readShard reads the shard section (snapshot version 11; replica sets
// since version 12, the removing nodes since version 13).
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
	if v >= 13 {
		k := r.Count(1)
		for ; k > 0 && r.Err() == nil; k-- {
			sh.removing = append(sh.removing, r.String())
		}
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
	if len(sh.removing) > 0 && sh.mapGen == 0 {
		return errors.New("nodes being removed without a shard map")
	}
	if err := checkRemoving(sh.ranges, sh.removing); err != nil {
		return err
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
	sh := s.shard
	sh.removing = nil
	writeShard(&w, &sh)
	// Without removals the section digests as format 12 wrote it (without
	// the count), so nodes on either side of an upgrade agree.
	w.Buf = w.Buf[:len(w.Buf)-1]
	if len(s.shard.removing) > 0 {
		writeRemoving(&w, &s.shard)
	}
	h.bytes(w.Buf)
}
