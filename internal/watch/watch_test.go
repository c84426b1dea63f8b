package watch

import (
	"errors"
	"slices"
	"testing"

	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/state"
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
		got = append(got, <-sub.Events())
	}
	if got[0].Revision != 1 || got[1].Type != "released" || got[2].Kind != "election" || got[2].Type != "elected" || got[2].Name != "a/e" {
		t.Fatalf("events: %+v", got)
	}
	// Internal events never reach watchers, not even an unfiltered one.
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
	for len(all.Events()) > 0 {
		types = append(types, (<-all.Events()).Type)
	}
	if want := []string{"acquired", "acquired", "released", "elected"}; !slices.Equal(types, want) {
		t.Fatalf("unfiltered backlog types %v, want %v (internal events must not be shown)", types, want)
	}
}

func TestSlowWatcherIsCutOffNotSkipped(t *testing.T) {
	h := NewHub(100, 2)
	sub, _, _ := h.Subscribe(Filter{}, 0)
	for i := uint64(1); i <= 5; i++ {
		h.Applied(i, []state.Event{ev(i, state.EventAcquired, "x")})
	}
	n := 0
	for range sub.Events() {
		n++
	}
	if n != 2 || !errors.Is(sub.Err(), ErrSlow) {
		t.Fatalf("got %d events, err %v; want 2 then ErrSlow", n, sub.Err())
	}
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
