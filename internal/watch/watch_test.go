package watch

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/state"
	"github.com/dlock/dlock/internal/testutil"
)

func ev(rev uint64, typ state.EventType, name string) state.Event {
	return state.Event{Revision: rev, Type: typ, Name: name, ClientID: "c", LeaseID: command.LeaseID{9}}
}

func TestBacklogLiveAndFilter(t *testing.T) {
	h := NewHub(100, 10)
	// Internal events (timers, lease and wait bookkeeping) carry lease ids and
	// are never shown to watchers; some name a lock the filter matches.
	h.Applied(1, []state.Event{ev(1, state.EventAcquired, "a/x"), ev(1, state.EventLeaseTimer, ""), ev(1, state.EventWaitTimer, "a/x")})
	h.Applied(2, []state.Event{ev(2, state.EventAcquired, "b/y")})
	sub, cur, err := h.Subscribe(Filter{Prefix: "a/"}, 1)
	if err != nil || cur != 2 {
		t.Fatalf("subscribe: %v %d", err, cur)
	}
	h.Applied(3, []state.Event{ev(3, state.EventReleased, "a/x"), ev(3, state.EventWaitGone, "a/x"), ev(3, state.EventLeaseGone, ""), ev(3, state.EventAcquired, command.ElectionKey("a/e"))})
	var got []Event
	for len(got) < 3 {
		got = append(got, recv(t, sub))
	}
	if got[0].Revision != 1 || got[1].Type != "released" || got[2].Kind != "election" || got[2].Type != "elected" || got[2].Name != "a/e" {
		t.Fatalf("events: %+v", got)
	}
	// Internal events never reach watchers, not even an unfiltered one.
	settle(t, sub)
	select {
	case e := <-sub.Events():
		t.Fatalf("extra event %+v", e)
	default:
	}
	all, _, err := h.Subscribe(Filter{}, 1)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	settle(t, all)
	for len(all.Events()) > 0 {
		types = append(types, (<-all.Events()).Type)
	}
	if want := []string{"acquired", "acquired", "released", "elected"}; !slices.Equal(types, want) {
		t.Fatalf("unfiltered backlog types %v, want %v (internal events must not be shown)", types, want)
	}
}

// A watcher may fall behind by as much as the history keeps; once the oldest
// event it has not read leaves the history it is cut off, after the events it
// was handed (no gap), instead of being shown a gap.
func TestSlowWatcherIsCutOffNotSkipped(t *testing.T) {
	h := NewHub(4, 2)
	sub, _, _ := h.Subscribe(Filter{}, 0)
	defer sub.Close()
	select {
	case <-sub.Done():
		t.Fatal("Done closed on a live subscription")
	default:
	}
	for i := uint64(1); i <= 4; i++ {
		h.Applied(i, []state.Event{ev(i, state.EventAcquired, "x")})
	}
	settle(t, sub)
	select {
	case <-sub.Done():
		t.Fatalf("cut off while all it had not read was still kept: %v", sub.Err())
	default:
	}
	h.Applied(5, []state.Event{ev(5, state.EventAcquired, "x")})
	// Done says it ended before its queued events are read: a sender stuck
	// on a client that reads nothing learns it without reading them.
	select {
	case <-sub.Done():
	case <-time.After(10 * time.Second): // hang guard only
		t.Fatal("Done not closed on a watcher cut off")
	}
	var revs []uint64
	for e := range sub.Events() {
		revs = append(revs, e.Revision)
	}
	if !slices.Equal(revs, []uint64{1, 2}) || !errors.Is(sub.Err(), ErrSlow) {
		t.Fatalf("got revisions %v, err %v; want 1 2 (what was handed over) then ErrSlow", revs, sub.Err())
	}
}

// A reader that keeps up is never cut off, however many events pass through
// a history smaller than them.
func TestReaderThatKeepsUpIsNeverCutOff(t *testing.T) {
	h := NewHub(4, 2)
	sub, _, _ := h.Subscribe(Filter{}, 0)
	defer sub.Close()
	for i := uint64(1); i <= 50; i++ {
		h.Applied(i, []state.Event{ev(i, state.EventAcquired, "x"), ev(i, state.EventReleased, "x")})
		for _, typ := range []string{"acquired", "released"} {
			if e := recv(t, sub); e.Revision != i || e.Type != typ {
				t.Fatalf("got %+v; want %s at revision %d", e, typ, i)
			}
		}
	}
}

// recv takes the next event, failing if none comes or the stream ends.
func recv(t *testing.T, sub *Subscription) Event {
	t.Helper()
	select {
	case e, ok := <-sub.Events():
		if !ok {
			t.Fatalf("the stream ended: %v", sub.Err())
		}
		return e
	case <-time.After(10 * time.Second): // hang guard only
		t.Fatal("no event")
	}
	return Event{}
}

// settle waits until the subscription's goroutine has handed over, or is
// holding for a full channel, everything the hub has: what the channel
// holds then is all it will get until the next append.
func settle(t *testing.T, s *Subscription) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, "the subscription to catch up with the hub", func() bool {
		s.hub.mu.Lock()
		defer s.hub.mu.Unlock()
		return s.holding || s.cursor >= s.hub.next || s.ended && s.cursor >= s.endSeq
	})
}

func TestCompactionAndRestore(t *testing.T) {
	h := NewHub(3, 10)
	for i := uint64(1); i <= 5; i++ {
		h.Applied(i, []state.Event{ev(i, state.EventAcquired, "x")})
	}
	_, _, err := h.Subscribe(Filter{}, 2)
	var ce *CompactedError
	if !errors.As(err, &ce) || ce.Current != 5 || ce.Oldest != 3 {
		t.Fatalf("want compacted (oldest 3, current 5), got %v", err)
	}
	sub, _, err := h.Subscribe(Filter{}, 3)
	if err != nil {
		t.Fatalf("revision 3 is kept: %v", err)
	}
	h.Restored(state.New())
	for range sub.Events() {
	}
	if !errors.Is(sub.Err(), ErrReset) {
		t.Fatalf("restore must cut watchers off, got %v", sub.Err())
	}
	if _, _, err := h.Subscribe(Filter{}, 1); err != nil {
		t.Fatalf("after restore to revision 0, revision 1 is the future: %v", err)
	}
}

// Filter.Kind picks one kind and Filter.Name one exact name (not a prefix),
// alone or with each other and with Prefix, the same way for the backlog and
// for live events.
func TestFilterKindAndName(t *testing.T) {
	el := command.ElectionKey
	// Revisions 1-5 and 6-10 are two halves; the split mode subscribes between them.
	entries := [][]state.Event{
		{ev(1, state.EventAcquired, "a")},
		{ev(2, state.EventAcquired, "ab")},
		{ev(3, state.EventAcquired, "a/x")},
		{ev(4, state.EventAcquired, el("a")), ev(4, state.EventWaitTimer, "a"), ev(4, state.EventWaitTimer, el("a"))},
		{ev(5, state.EventAcquired, el("ab")), ev(5, state.EventSessionCreated, "")},
		{ev(6, state.EventProclaimed, el("a")), ev(6, state.EventQueued, "ab")},
		{ev(7, state.EventReleased, "a"), ev(7, state.EventAcquired, "a"), ev(7, state.EventWaitGone, "a")},
		{ev(8, state.EventReleased, el("a")), ev(8, state.EventAcquired, el("a"))},
		{ev(9, state.EventExpired, el("a/x")), ev(9, state.EventSessionExpired, "")},
		{ev(10, state.EventDequeued, "ab"), ev(10, state.EventLeaseGone, "")},
	}
	all := []string{
		"1 acquired lock a", "2 acquired lock ab", "3 acquired lock a/x",
		"4 elected election a", "5 elected election ab", "5 session_created session ",
		"6 proclaimed election a", "6 queued lock ab", "7 released lock a", "7 acquired lock a",
		"8 resigned election a", "8 elected election a", "9 expired election a/x",
		"9 session_expired session ", "10 dequeued lock ab",
	}
	cases := []struct {
		f    Filter
		want []string
	}{
		{Filter{}, all},
		{Filter{Kind: "lock"}, []string{"1 acquired lock a", "2 acquired lock ab", "3 acquired lock a/x", "6 queued lock ab", "7 released lock a", "7 acquired lock a", "10 dequeued lock ab"}},
		{Filter{Kind: "election"}, []string{"4 elected election a", "5 elected election ab", "6 proclaimed election a", "8 resigned election a", "8 elected election a", "9 expired election a/x"}},
		{Filter{Kind: "session"}, []string{"5 session_created session ", "9 session_expired session "}},
		{Filter{Kind: "nope"}, nil},
		// A name alone matches that exact name of every kind, never a longer one.
		{Filter{Name: "a"}, []string{"1 acquired lock a", "4 elected election a", "6 proclaimed election a", "7 released lock a", "7 acquired lock a", "8 resigned election a", "8 elected election a"}},
		{Filter{Name: "ab"}, []string{"2 acquired lock ab", "5 elected election ab", "6 queued lock ab", "10 dequeued lock ab"}},
		{Filter{Name: "a/"}, nil},
		// Watchers see election names, never the lock-table key.
		{Filter{Name: el("a")}, nil},
		{Filter{Kind: "lock", Name: "a"}, []string{"1 acquired lock a", "7 released lock a", "7 acquired lock a"}},
		{Filter{Kind: "lock", Name: "a/x"}, []string{"3 acquired lock a/x"}},
		// What Observe asks for: one election, not one that shares its prefix.
		{Filter{Kind: "election", Name: "a"}, []string{"4 elected election a", "6 proclaimed election a", "8 resigned election a", "8 elected election a"}},
		{Filter{Kind: "election", Name: "ab"}, []string{"5 elected election ab"}},
		{Filter{Kind: "election", Name: "a/x"}, []string{"9 expired election a/x"}},
		{Filter{Kind: "session", Name: "a"}, nil},
		// With a prefix, both must hold.
		{Filter{Prefix: "a/", Kind: "lock"}, []string{"3 acquired lock a/x"}},
		{Filter{Prefix: "a/", Kind: "election"}, []string{"9 expired election a/x"}},
		{Filter{Prefix: "a", Name: "ab"}, []string{"2 acquired lock ab", "5 elected election ab", "6 queued lock ab", "10 dequeued lock ab"}},
		{Filter{Prefix: "a/", Name: "a"}, nil},
		{Filter{Prefix: "b", Kind: "lock"}, nil},
	}
	apply := func(h *Hub, es [][]state.Event) {
		for _, e := range es {
			h.Applied(e[0].Revision, e)
		}
	}
	drain := func(t *testing.T, sub *Subscription) []string {
		settle(t, sub)
		var got []string
		for {
			select {
			case e := <-sub.Events():
				got = append(got, fmt.Sprintf("%d %s %s %s", e.Revision, e.Type, e.Kind, e.Name))
			default:
				return got
			}
		}
	}
	modes := []struct {
		name string
		run  func(t *testing.T, f Filter) []string
	}{
		{"backlog", func(t *testing.T, f Filter) []string {
			h := NewHub(100, 100)
			apply(h, entries)
			sub, _, err := h.Subscribe(f, 1)
			if err != nil {
				t.Fatal(err)
			}
			return drain(t, sub)
		}},
		{"live", func(t *testing.T, f Filter) []string {
			h := NewHub(100, 100)
			sub, _, err := h.Subscribe(f, 0)
			if err != nil {
				t.Fatal(err)
			}
			apply(h, entries)
			return drain(t, sub)
		}},
		{"backlog then live", func(t *testing.T, f Filter) []string {
			h := NewHub(100, 100)
			apply(h, entries[:5])
			sub, _, err := h.Subscribe(f, 1)
			if err != nil {
				t.Fatal(err)
			}
			apply(h, entries[5:])
			return drain(t, sub)
		}},
	}
	for _, c := range cases {
		for _, m := range modes {
			t.Run(fmt.Sprintf("%+v/%s", c.f, m.name), func(t *testing.T) {
				if got := m.run(t, c.f); !slices.Equal(got, c.want) {
					t.Fatalf("filter %+v, %s: got\n%q\nwant\n%q", c.f, m.name, got, c.want)
				}
			})
		}
	}
}

// A shard's split event reaches only subscriptions that ask for splits,
// whatever their prefix, and says whether a subscription from a revision
// would start after it; an evicted one is behind only a from the history
// still covers (an older from is compacted instead).
func TestSplitEvents(t *testing.T) {
	h := NewHub(4, 10)
	h.Applied(1, []state.Event{ev(1, state.EventAcquired, "a/x")})
	h.Applied(2, []state.Event{{Revision: 2, Type: state.EventSplit, Name: "q", Token: 77, Carved: []byte("carved")}})
	h.Applied(3, []state.Event{ev(3, state.EventAcquired, "a/y")})
	plain, _, err := h.Subscribe(Filter{Prefix: "a/"}, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	splits, _, err := h.Subscribe(Filter{Prefix: "zz/", Splits: true}, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer splits.Close()
	if a, b := recv(t, plain), recv(t, plain); a.Revision != 1 || b.Revision != 3 {
		t.Fatalf("a plain subscription got %+v, %+v", a, b)
	}
	if e := recv(t, splits); e.Kind != KindSplit || e.Revision != 2 || e.Name != "q" || e.Token != 77 {
		t.Fatalf("the split event: %+v", e)
	}
	if rev, ok := h.SplitRevision(77); !ok || rev != 2 {
		t.Fatalf("SplitRevision: %d %v", rev, ok)
	}
	for from, want := range map[uint64]bool{0: true, 1: false, 2: false, 3: true, 4: true} {
		if got := h.SplitBehind(77, from); got != want {
			t.Errorf("SplitBehind(77, %d) = %v, want %v", from, got, want)
		}
	}
	// Evict it: a from the history covers starts after it; an older one
	// is compacted, not behind.
	for i := uint64(4); i <= 8; i++ {
		h.Applied(i, []state.Event{ev(i, state.EventAcquired, "a/z")})
	}
	if _, ok := h.SplitRevision(77); ok {
		t.Fatal("the evicted split event is still found")
	}
	if h.SplitBehind(77, 2) || !h.SplitBehind(77, 8) {
		t.Fatalf("after eviction: SplitBehind(2) %v, SplitBehind(8) %v (history from %d)", h.SplitBehind(77, 2), h.SplitBehind(77, 8), h.first)
	}
}
