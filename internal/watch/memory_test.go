package watch

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/state"
	"github.com/dlock/dlock/internal/testutil"
)

// SubscriptionBudget is what one subscription may add to a node's memory
// (heap and goroutine stack) whatever revision it starts from: its hand-off
// channel (DefaultBuffer event headers), the one event its goroutine holds,
// and that goroutine. docs/api.md states it.
const SubscriptionBudget = 16 << 10

// Watches opened from the oldest kept revision, which never read, share the
// history instead of each copying it: 300 of them after 6,000 events with
// 1 KiB values grow the heap and stacks by less than SubscriptionBudget each
// (about 1.4 MiB in all, against 256 MiB allowed by the issue). Each used to
// get a channel of its backlog plus 1,024 events: 300 × 7,024 × 120 bytes =
// 241 MiB here, ~24 GB for the default 10,000 watchers of a full history.
func TestOldRevisionWatchersShareTheHistory(t *testing.T) {
	const events, watchers = 6000, 300
	h := NewHub(DefaultHistory, DefaultBuffer)
	for i := uint64(1); i <= events; i++ {
		// A fresh value per event, as a real history has.
		v := fmt.Sprintf("%04d", i) + strings.Repeat("v", 1020)
		h.Applied(i, []state.Event{{Revision: i, Type: state.EventProclaimed, Name: command.ElectionKey(fmt.Sprintf("e/%d", i%50)), ClientID: "c", Value: v}})
	}
	before := inUse()
	subs := make([]*Subscription, watchers)
	for i := range subs {
		sub, _, err := h.Subscribe(Filter{}, 1)
		if err != nil {
			t.Fatal(err)
		}
		subs[i] = sub
	}
	defer func() {
		for _, s := range subs {
			s.Close()
		}
	}()
	// Every goroutine has filled its channel and holds the next event: all
	// that a reader that never reads ever costs.
	for _, s := range subs {
		waitHolding(t, s)
	}
	grown := int64(inUse()) - int64(before)
	t.Logf("%d watchers from revision 1 of %d events: heap and stacks grew %.2f MiB (%d bytes each)", watchers, events, float64(grown)/(1<<20), grown/watchers)
	if grown >= 256<<20 {
		t.Fatalf("%d watchers grew the heap by %d MiB; the issue allows less than 256 MiB", watchers, grown>>20)
	}
	if grown > watchers*SubscriptionBudget {
		t.Fatalf("%d watchers grew the heap by %d bytes, %d each; the budget is %d each", watchers, grown, grown/watchers, SubscriptionBudget)
	}
	// They still read the whole history, in order, when they do read.
	for i := uint64(1); i <= events; i++ {
		if e := recv(t, subs[0]); e.Revision != i || !strings.HasPrefix(e.Value, fmt.Sprintf("%04d", i)) {
			t.Fatalf("event %d: got revision %d value %.8q", i, e.Revision, e.Value)
		}
	}
}

// inUse is the heap and goroutine stacks in use after a full collection.
func inUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse + m.StackInuse
}

func waitHolding(t *testing.T, s *Subscription) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, "a subscription to fill its channel", func() bool {
		s.hub.mu.Lock()
		defer s.hub.mu.Unlock()
		return s.holding
	})
}
