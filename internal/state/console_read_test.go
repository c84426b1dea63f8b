package state

import (
	"fmt"
	"slices"
	"testing"

	"github.com/dlock/dlock/internal/command"
)

// The wait queue a reader sees is in the queue's order, names no lease, and is
// cut at MaxQueueView while Waiters keeps the full count.
func TestGetLockQueue(t *testing.T) {
	h := newHarness(t)
	mustStatus(t, h.acquire("holder", "q", lid(1), ttl, 0), command.StatusOK)
	for i := range MaxQueueView + 5 {
		mustStatus(t, h.acquire(fmt.Sprintf("w%03d", i), "q", lid(100+i), ttl, 60_000), command.StatusQueued)
	}
	li, queue := h.s.GetLock("q"), h.s.LockQueue("q")
	if li.Waiters != MaxQueueView+5 || len(queue) != MaxQueueView {
		t.Fatalf("waiters %d, queue %d", li.Waiters, len(queue))
	}
	for i, w := range queue {
		if want := fmt.Sprintf("w%03d", i); w.ClientID != want || w.EnqueuedAt == 0 || w.Deadline <= w.EnqueuedAt {
			t.Fatalf("queue[%d] = %+v, want client %s with times", i, w, want)
		}
	}
	if got := h.s.LockQueue("nothing"); len(got) != 0 {
		t.Fatalf("absent lock's queue %+v", got)
	}
}

func TestListElections(t *testing.T) {
	h := newHarness(t)
	for i, n := range []string{"a/1", "a/2", "ab", "b/1"} {
		mustStatus(t, h.do("c"+n, &command.Acquire{Name: command.ElectionKey(n), LeaseID: lid(i + 1), TTLms: ttl, Value: "v" + n}), command.StatusOK)
	}
	mustStatus(t, h.do("w", &command.Acquire{Name: command.ElectionKey("a/2"), LeaseID: lid(20), TTLms: ttl, WaitMs: 60_000}), command.StatusQueued)
	// Locks with the same names are not elections.
	mustStatus(t, h.acquire("x", "a/1", lid(30), ttl, 0), command.StatusOK)
	mustStatus(t, h.acquire("x", "zz", lid(31), ttl, 0), command.StatusOK)
	names := func(l []ElectionInfo) []string {
		var out []string
		for _, x := range l {
			out = append(out, x.Name)
		}
		return out
	}
	cases := []struct {
		prefix, after string
		limit         int
		want          []string
		more          bool
	}{
		{"", "", 10, []string{"a/1", "a/2", "ab", "b/1"}, false},
		{"a/", "", 10, []string{"a/1", "a/2"}, false},
		{"a", "", 2, []string{"a/1", "a/2"}, true},
		{"a", "a/2", 2, []string{"ab"}, false},
		{"", "ab", 10, []string{"b/1"}, false},
		{"c", "", 10, nil, false},
		{"", "zzz", 10, nil, false},
	}
	for _, tc := range cases {
		got, more := h.s.ListElections(tc.prefix, tc.after, tc.limit)
		if !slices.Equal(names(got), tc.want) || more != tc.more {
			t.Errorf("ListElections(%q,%q,%d) = %v,%v; want %v,%v", tc.prefix, tc.after, tc.limit, names(got), more, tc.want, tc.more)
		}
	}
	got, _ := h.s.ListElections("a/2", "", 1)
	if len(got) != 1 || got[0].Campaigners != 1 || got[0].CandidateID != "ca/2" || got[0].Value != "va/2" {
		t.Fatalf("list entry %+v", got)
	}
	if locks, _ := h.s.ListLocks("", "", 10); len(locks) != 2 {
		t.Fatalf("elections leak into the lock list: %+v", locks)
	}
}
