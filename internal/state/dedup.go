package state

import "github.com/dlock/dlock/internal/command"

// DedupCapacity bounds the dedup table; the oldest entries are forgotten first.
// It is a constant of the replicated state: changing it changes snapshots.
const DedupCapacity = 100_000

type dedupKey struct{ client, request string }

type dedupEntry struct {
	key    dedupKey
	result command.Result
}

// dedupChunk is how many entries a dedupRing allocates at a time.
const dedupChunk = 1024

// dedupRing holds the dedup table's entries in insertion order, up to
// DedupCapacity, in chunks allocated as it fills. Entries never move: a
// position stays valid until its entry is overwritten: growing one flat
// slice to DedupCapacity entries (18 MB) by append would copy the whole
// table about twenty times while a fresh cluster's table fills.
type dedupRing struct {
	chunks [][]dedupEntry
	head   int // position of the oldest entry once full (0 until then)
	count  int
}

func (r *dedupRing) at(pos int) *dedupEntry {
	return &r.chunks[pos/dedupChunk][pos%dedupChunk]
}

// push stores e as the newest entry and returns its position; when the ring
// is full it overwrites the oldest, whose key it returns (evicted true).
func (r *dedupRing) push(e dedupEntry) (pos int, old dedupKey, evicted bool) {
	if r.count == DedupCapacity {
		pos = r.head
		slot := r.at(pos)
		old = slot.key
		*slot = e
		r.head = (r.head + 1) % DedupCapacity
		return pos, old, true
	}
	pos = r.count
	if pos%dedupChunk == 0 {
		r.chunks = append(r.chunks, make([]dedupEntry, min(dedupChunk, DedupCapacity-pos)))
	}
	*r.at(pos) = e
	r.count++
	return pos, dedupKey{}, false
}

// prev is the entry remembered just before the one at pos, nil for the
// oldest.
func (r *dedupRing) prev(pos int) *dedupEntry {
	if pos == r.head {
		return nil
	}
	return r.at((pos - 1 + DedupCapacity) % DedupCapacity)
}

// each visits the entries oldest first.
func (r *dedupRing) each(fn func(*dedupEntry)) {
	for i := 0; i < r.count; i++ {
		fn(r.at((r.head + i) % DedupCapacity))
	}
}

// remember stores a result in the bounded FIFO dedup table.
func (s *State) remember(key dedupKey, res command.Result) {
	if s.dedupRing.count == DedupCapacity {
		s.dedupEvictOldest()
	}
	pos, old, evicted := s.dedupRing.push(dedupEntry{key: key, result: res})
	if evicted {
		delete(s.dedup, old)
	}
	s.dedup[key] = pos
	s.dedupIn(pos)
}

// Lookup returns the remembered result of (client, request), if any.
func (s *State) Lookup(clientID, requestID string) (command.Result, bool) {
	pos, ok := s.dedup[dedupKey{clientID, requestID}]
	if !ok {
		return command.Result{}, false
	}
	return s.dedupRing.at(pos).result, true
}
