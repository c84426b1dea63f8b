package state

import (
	"fmt"

	"github.com/google/btree"

	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/wire"
)

// The grant history: for every lock and election, the grants that ended
// recently (who, which token, when, how it ended), replicated like the rest
// of the state so every node answers alike and a post-mortem survives any
// node. A grant still held is not stored twice: History shows it from the
// lock itself. Retention is bounded per name, in all (entries and bytes,
// oldest first) and in age; the bounds live in the state
// (command.SetHistoryRetention), because Apply must not read a node's flags.

// EndCause says how a grant ended.
type EndCause uint8

// End causes. Append-only: they are kept in snapshots.
const (
	EndReleased EndCause = iota + 1
	EndExpired
	EndSessionDeleted
	EndRevoked
	EndTakenOver
	EndResigned
)

var endCauseNames = [...]string{"", "released", "expired", "session_deleted", "revoked", "taken_over", "resigned"}

func (c EndCause) String() string {
	if int(c) < len(endCauseNames) {
		return endCauseNames[c]
	}
	return "unknown"
}

// endCauseOf maps an event cause to the history's end cause.
func endCauseOf(cause string, election bool) EndCause {
	switch cause {
	case CauseExpired:
		return EndExpired
	case CauseSessionDeleted:
		return EndSessionDeleted
	case CauseTakeover:
		return EndTakenOver
	case CauseRevoked:
		return EndRevoked
	}
	if election {
		return EndResigned
	}
	return EndReleased // a release, or a cancelled acquire's grant given back
}

// GrantRecord is one grant of a lock. EndedAt is 0 (and Cause 0) for the
// grant that still holds it (History only).
type GrantRecord struct {
	Token     uint64
	ClientID  string
	Value     string
	Reason    string // a revoke's reason
	GrantedAt int64  // leader timestamps, for display
	EndedAt   int64
	// EndedClock is the lease clock when the grant ended: age retention is
	// judged on it, never on a wall clock.
	EndedClock int64
	// Seq orders the ends of grants across all names (State.histSeq).
	Seq         uint64
	TTLms       int32
	LockDelayMs int32
	Cause       EndCause
}

// recordOverhead is what a kept record is counted as in the byte budget
// beside its strings (name, client id, value, reason): what one costs in
// memory, measured (BenchmarkHeldMemoryWithHistory: 271 bytes per record
// with a 19-byte name and a 15-byte client id) — the record in its name's
// slice, the name's entry and its place in the age index. It is part of the
// replicated rules (which records the budget drops): changing it needs a new
// command version, like any rule.
const recordOverhead = 240

func recordBytes(name string, g *GrantRecord) int64 {
	return recordOverhead + int64(len(name)+len(g.ClientID)+len(g.Value)+len(g.Reason))
}

// HistoryRetention bounds the history.
type HistoryRetention struct {
	PerName    int64 // ended grants kept per name; 0 keeps none
	MaxEntries int64 // ended grants kept in all
	MaxBytes   int64 // their budget, counted by GrantRecord.bytes
	MaxAgeMs   int64 // on the lease clock, since the grant ended
}

// Retention defaults, and the largest values a SetHistoryRetention may set.
const (
	DefaultHistoryPerName    = 16
	DefaultHistoryMaxEntries = 1_000_000
	DefaultHistoryMaxBytes   = 64 << 20
	DefaultHistoryMaxAgeMs   = 24 * 3600 * 1000

	MaxHistoryPerName    = 1024
	MaxHistoryMaxEntries = 100_000_000
	MaxHistoryMaxBytes   = 64 << 30
	MaxHistoryMaxAgeMs   = 366 * 24 * 3600 * 1000
)

// DefaultHistoryRetention is what a new state starts with.
func DefaultHistoryRetention() HistoryRetention {
	return HistoryRetention{DefaultHistoryPerName, DefaultHistoryMaxEntries, DefaultHistoryMaxBytes, DefaultHistoryMaxAgeMs}
}

// Valid reports whether every bound is in range (an age of at least 1 s).
func (h HistoryRetention) Valid() bool {
	return h.PerName >= 0 && h.PerName <= MaxHistoryPerName &&
		h.MaxEntries >= 0 && h.MaxEntries <= MaxHistoryMaxEntries &&
		h.MaxBytes >= 0 && h.MaxBytes <= MaxHistoryMaxBytes &&
		h.MaxAgeMs >= 1000 && h.MaxAgeMs <= MaxHistoryMaxAgeMs
}

// lockHistory is one name's ended grants, oldest first.
type lockHistory struct {
	name string
	recs []GrantRecord
}

// histRef places one record in the age index (by Seq, oldest first).
type histRef struct {
	seq  uint64
	name string
}

type history struct {
	byName    *btree.BTreeG[*lockHistory]
	byAge     *btree.BTreeG[histRef]
	seq       uint64 // the last record's Seq
	count     int64
	bytes     int64
	retention HistoryRetention
}

func newHistory() history {
	return history{
		byName:    btree.NewG(32, func(a, b *lockHistory) bool { return a.name < b.name }),
		byAge:     btree.NewG(32, func(a, b histRef) bool { return a.seq < b.seq }),
		retention: DefaultHistoryRetention(),
	}
}

// recordEnd keeps the end of one grant of the lock (before unhold takes it
// away) and applies the bounds. One record per fencing token: a lock with
// several holders keeps each grant's end on its own.
func (s *State) recordEnd(lk *Lock, gr Grant, holder *Lease, cause EndCause, reason string) {
	if s.hist.retention.PerName == 0 {
		return
	}
	s.hist.seq++
	g := GrantRecord{Token: gr.Token, ClientID: holder.ClientID, Value: lk.Value(), Reason: reason,
		GrantedAt: gr.GrantedAt, EndedAt: s.ts, EndedClock: s.clock, Seq: s.hist.seq,
		TTLms: holder.TTLms, LockDelayMs: int32(lk.lockDelayMs()), Cause: cause}
	h, _ := s.hist.byName.Get(&lockHistory{name: lk.Name})
	if h == nil {
		h = &lockHistory{name: lk.Name}
		s.hist.byName.ReplaceOrInsert(h)
	}
	wasEmpty := s.hist.count == 0
	h.recs = append(h.recs, g)
	s.hist.byAge.ReplaceOrInsert(histRef{g.Seq, lk.Name})
	s.hist.count++
	s.hist.bytes += recordBytes(lk.Name, &g)
	s.sum += s.rh.grant(lk.Name, &g)
	for int64(len(h.recs)) > s.hist.retention.PerName {
		s.dropOldestOf(h)
	}
	s.enforceHistoryTotals()
	if wasEmpty {
		s.emitHistoryTimer()
	}
}

// dropOldestOf forgets a name's oldest record.
func (s *State) dropOldestOf(h *lockHistory) {
	g := &h.recs[0]
	s.sum -= s.rh.grant(h.name, g)
	s.hist.byAge.Delete(histRef{seq: g.Seq})
	s.hist.count--
	s.hist.bytes -= recordBytes(h.name, g)
	h.recs[0] = GrantRecord{} // let its strings go
	h.recs = h.recs[1:]
	if len(h.recs) == 0 {
		s.hist.byName.Delete(h)
	} else if cap(h.recs) > 2*len(h.recs)+4 {
		h.recs = append([]GrantRecord(nil), h.recs...)
	}
}

// dropOldest forgets the oldest record of all (Seq order is end order).
func (s *State) dropOldest() bool {
	ref, ok := s.hist.byAge.Min()
	if !ok {
		return false
	}
	h, _ := s.hist.byName.Get(&lockHistory{name: ref.name})
	s.dropOldestOf(h)
	return true
}

func (s *State) enforceHistoryTotals() {
	for s.hist.count > s.hist.retention.MaxEntries || s.hist.bytes > s.hist.retention.MaxBytes {
		if !s.dropOldest() {
			return
		}
	}
}

// oldestRecord is the record of all that ended first.
func (s *State) oldestRecord() (*GrantRecord, bool) {
	ref, ok := s.hist.byAge.Min()
	if !ok {
		return nil, false
	}
	h, _ := s.hist.byName.Get(&lockHistory{name: ref.name})
	return &h.recs[0], true
}

// emitHistoryTimer tells the leader when the oldest record is due to age
// out (EventHistoryTimer; none when the history is empty).
func (s *State) emitHistoryTimer() {
	if ms, ok := s.HistoryTimer(); ok {
		s.emit(Event{Type: EventHistoryTimer, RemainingMs: ms})
	}
}

// HistoryTimer is the lease-clock time until the oldest record is due to
// age out (it may be negative: due already), if any record is kept.
func (s *State) HistoryTimer() (int64, bool) {
	g, ok := s.oldestRecord()
	if !ok {
		return 0, false
	}
	return g.EndedClock + s.hist.retention.MaxAgeMs - s.clock, true
}

func (s *State) trimHistory() command.Result {
	cut := s.clock - s.hist.retention.MaxAgeMs
	n := 0
	for {
		g, ok := s.oldestRecord()
		if !ok || g.EndedClock > cut {
			break
		}
		s.dropOldest()
		n++
	}
	if n > 0 {
		s.changed = true
		s.emitHistoryTimer()
	}
	return command.Result{Status: command.StatusOK, Token: uint64(n)}
}

func (s *State) setHistoryRetention(b *command.SetHistoryRetention) command.Result {
	r := HistoryRetention{b.PerName, b.MaxEntries, b.MaxBytes, b.MaxAgeMs}
	if !r.Valid() {
		return invalid("history retention out of range")
	}
	if r == s.hist.retention {
		return command.Result{Status: command.StatusOK}
	}
	s.hist.retention = r
	s.changed = true
	var over []*lockHistory
	s.hist.byName.Ascend(func(h *lockHistory) bool {
		if int64(len(h.recs)) > r.PerName {
			over = append(over, h)
		}
		return true
	})
	for _, h := range over {
		for int64(len(h.recs)) > r.PerName {
			s.dropOldestOf(h)
		}
	}
	s.enforceHistoryTotals()
	s.emitHistoryTimer()
	return command.Result{Status: command.StatusOK}
}

// HistoryRetentionBounds are the bounds in force.
func (s *State) HistoryRetentionBounds() HistoryRetention { return s.hist.retention }

// HistoryStats are the history's totals.
func (s *State) HistoryStats() (entries, bytes int64) { return s.hist.count, s.hist.bytes }

// History returns up to limit grants of a lock-table key, newest first: the
// current ones (not ended), newest first, if the key is held, then the
// ended ones kept.
func (s *State) History(key string, limit int) []GrantRecord {
	var out []GrantRecord
	if lk, _ := s.locks.Get(&Lock{Name: key}); lk != nil && lk.Held() {
		gs := lk.Grants()
		for i := len(gs) - 1; i >= 0 && len(out) < limit; i-- {
			l := s.leases[gs[i].LeaseID]
			out = append(out, GrantRecord{Token: gs[i].Token, ClientID: l.ClientID, Value: lk.Value(),
				GrantedAt: gs[i].GrantedAt, TTLms: l.TTLms, LockDelayMs: int32(lk.lockDelayMs())})
		}
	}
	if h, _ := s.hist.byName.Get(&lockHistory{name: key}); h != nil {
		for i := len(h.recs) - 1; i >= 0 && len(out) < limit; i-- {
			out = append(out, h.recs[i])
		}
	}
	return out
}

// endedGrant finds the kept record of a name's grant by token.
func (s *State) endedGrant(key string, token uint64) (*GrantRecord, bool) {
	h, _ := s.hist.byName.Get(&lockHistory{name: key})
	if h == nil {
		return nil, false
	}
	for i := len(h.recs) - 1; i >= 0; i-- {
		if h.recs[i].Token == token {
			return &h.recs[i], true
		}
	}
	return nil, false
}

// writeGrantRecord is the record as snapshots and the digest hold it.
func writeGrantRecord(w *wire.Writer, g *GrantRecord) {
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

func readGrantRecord(r *wire.Reader) GrantRecord {
	var g GrantRecord
	g.Token = r.Uvarint()
	g.ClientID = r.String()
	g.Value = r.String()
	g.Reason = r.String()
	g.GrantedAt = r.Varint()
	g.EndedAt = r.Varint()
	g.EndedClock = r.Varint()
	g.Seq = r.Uvarint()
	g.TTLms = int32(r.Varint())
	g.LockDelayMs = int32(r.Varint())
	g.Cause = EndCause(r.Byte())
	return g
}

// writeHistory is the snapshot's history section (version 9).
func (s *State) writeHistory(w *wire.Writer, keep func(string) bool) {
	rt := s.hist.retention
	w.Varint(rt.PerName)
	w.Varint(rt.MaxEntries)
	w.Varint(rt.MaxBytes)
	w.Varint(rt.MaxAgeMs)
	w.Uvarint(s.hist.seq)
	n := s.hist.byName.Len()
	if keep != nil {
		n = 0
		s.hist.byName.Ascend(func(h *lockHistory) bool {
			if keep(h.name) {
				n++
			}
			return true
		})
	}
	w.Uvarint(uint64(n))
	s.hist.byName.Ascend(func(h *lockHistory) bool {
		if keep != nil && !keep(h.name) {
			return true
		}
		w.String(h.name)
		w.Uvarint(uint64(len(h.recs)))
		for i := range h.recs {
			writeGrantRecord(w, &h.recs[i])
		}
		return true
	})
}

// readHistory reads the history section, checking what Apply keeps true:
// names in order, records in Seq order within the bounds.
func (s *State) readHistory(r *wire.Reader, v byte) error {
	if v < 9 {
		return nil
	}
	rt := HistoryRetention{r.Varint(), r.Varint(), r.Varint(), r.Varint()}
	if r.Err() == nil && !rt.Valid() {
		return fmt.Errorf("history retention out of range")
	}
	s.hist.retention = rt
	s.hist.seq = r.Uvarint()
	prev := ""
	for n := r.Count(2); n > 0 && r.Err() == nil; n-- {
		h := &lockHistory{name: r.String()}
		if !command.ValidKey(h.name) || (s.hist.byName.Len() > 0 && h.name <= prev) {
			return fmt.Errorf("history name %q is invalid, repeated or out of order", h.name)
		}
		prev = h.name
		var last uint64
		for m := r.Count(20); m > 0 && r.Err() == nil; m-- {
			g := readGrantRecord(r)
			if r.Err() != nil {
				break
			}
			if g.Seq <= last || g.Seq > s.hist.seq || g.Cause < EndReleased || g.Cause > EndResigned ||
				g.Token == 0 || g.Token > s.lastToken || len(g.Value) > command.MaxValueLen || len(g.Reason) > command.MaxReasonLen {
				return fmt.Errorf("history of %q has an inconsistent record", h.name)
			}
			if _, dup := s.hist.byAge.Get(histRef{seq: g.Seq}); dup {
				return fmt.Errorf("history record %d is listed twice", g.Seq)
			}
			last = g.Seq
			h.recs = append(h.recs, g)
			s.hist.byAge.ReplaceOrInsert(histRef{g.Seq, h.name})
			s.hist.count++
			s.hist.bytes += recordBytes(h.name, &g)
		}
		if len(h.recs) == 0 || int64(len(h.recs)) > rt.PerName {
			return fmt.Errorf("history of %q has %d records (at most %d, at least 1)", h.name, len(h.recs), rt.PerName)
		}
		s.hist.byName.ReplaceOrInsert(h)
	}
	if s.hist.count > rt.MaxEntries || s.hist.bytes > rt.MaxBytes {
		return fmt.Errorf("history holds %d records, %d bytes: over its bounds", s.hist.count, s.hist.bytes)
	}
	return nil
}
