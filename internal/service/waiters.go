package service

import (
	"sync"

	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/state"
)

// waitRegistry wakes waiting acquires when something happens to their lease.
// It is an fsm.Observer: it only signals (never blocks); the waiter re-reads the
// state to learn what happened.
type waitRegistry struct {
	mu sync.Mutex
	m  map[command.LeaseID]map[chan struct{}]struct{}
}

func newWaitRegistry() *waitRegistry {
	return &waitRegistry{m: map[command.LeaseID]map[chan struct{}]struct{}{}}
}

func (w *waitRegistry) add(id command.LeaseID) chan struct{} {
	ch := make(chan struct{}, 1)
	w.mu.Lock()
	defer w.mu.Unlock()
	set := w.m[id]
	if set == nil {
		set = map[chan struct{}]struct{}{}
		w.m[id] = set
	}
	set[ch] = struct{}{}
	return ch
}

func (w *waitRegistry) remove(id command.LeaseID, ch chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if set := w.m[id]; set != nil {
		delete(set, ch)
		if len(set) == 0 {
			delete(w.m, id)
		}
	}
}

func signal(set map[chan struct{}]struct{}) {
	for ch := range set {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Applied implements fsm.Observer.
func (w *waitRegistry) Applied(_ uint64, events []state.Event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.m) == 0 {
		return
	}
	for i := range events {
		switch events[i].Type {
		case state.EventAcquired, state.EventDequeued, state.EventWaitGone, state.EventLeaseGone:
			if set := w.m[events[i].LeaseID]; set != nil {
				signal(set)
			}
		}
	}
}

// Restored implements fsm.Observer: everything may have changed.
func (w *waitRegistry) Restored(*state.State) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, set := range w.m {
		signal(set)
	}
}
