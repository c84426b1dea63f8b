package console_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/raftnode"
	"github.com/dlock/dlock/internal/state"
	"github.com/dlock/dlock/internal/testcluster"
)

const heldLocks = 100_000

// seedSnapshot is a state with heldLocks locks held by one session (the
// longest TTL, 10 minutes), built by applying the commands a leader would
// log, to restore into a fresh node: far faster than 100,000 acquires
// through Raft.
func seedSnapshot(t *testing.T) []byte {
	t.Helper()
	st := state.New()
	ts := time.Now().UnixMilli()
	var idx uint64
	apply := func(b command.Body) command.Result {
		idx++
		ts++
		r := st.Apply(idx, &command.Envelope{TS: ts, Clock: int64(idx), ClientID: "bulk", Body: b})
		st.TakeEvents()
		return r
	}
	sess := command.LeaseID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	if r := apply(&command.CreateSession{LeaseID: sess, TTLms: command.MaxTTLms}); r.Status != command.StatusOK {
		t.Fatalf("seed session: %+v", r)
	}
	for i := range heldLocks {
		if r := apply(&command.Acquire{Name: fmt.Sprintf("bulk/%06d", i), LeaseID: sess, Session: true}); r.Status != command.StatusOK {
			t.Fatalf("seed lock %d: %+v", i, r)
		}
	}
	return st.Snapshot()
}

// 100,000 held locks: the page shows one page of them (a bounded number of
// rows, whatever the total), stays live, and the filter narrows on the
// server.
func TestConsoleHundredThousandLocks(t *testing.T) {
	actx := browser(t)
	snap := seedSnapshot(t)
	c := testcluster.NewWith(t, 1, testcluster.Options{Prepare: func(id, dir string, peers map[string]string) {
		if _, err := raftnode.RestoreSnapshotOn(testcluster.Engine(), dir, "", snap, peers); err != nil {
			t.Fatalf("restore into %s: %v", id, err)
		}
	}})
	base := c.URL(c.WaitLeader(within))
	var list struct {
		More bool `json:"more"`
	}
	if code := call(t, "GET", base+"/api/v1/locks?prefix=bulk/&after=bulk/099998", "", nil, &list); code != 200 {
		t.Fatalf("the seeded locks are not there: %d", code)
	}

	start := time.Now()
	p := newPage(t, actx, chromedp.Navigate(base+"/ui/"))
	p.waitJS("the first page of 100,000", `document.querySelectorAll('#locks tbody tr').length === 100 && !document.getElementById('next').disabled && document.getElementById('conn').dataset.state === 'live'`)
	t.Logf("first page of %d held locks live %s after navigation (browser start included)", heldLocks, time.Since(start).Round(time.Millisecond))
	acquire(t, base, "a/new", "newcomer", "", 0)
	p.waitJS("a new lock at the top shows live, the page still bounded", `document.querySelector('#locks tbody tr')?.dataset.name === 'a/new' && document.querySelectorAll('#locks tbody tr').length === 100`)
	var rows int
	if err := p.eval(`document.querySelectorAll('tr').length`, &rows); err != nil || rows > 101 {
		t.Fatalf("the document has %d table rows (%v); one page is 100 and a header", rows, err)
	}
	p.run("filter on the server", js(`document.getElementById('prefix').value = 'bulk/09999'`), js(`document.querySelector('form[role=search]').requestSubmit()`))
	p.waitJS("ten locks under bulk/09999", `[...document.querySelectorAll('#locks tbody tr')].map(r => r.dataset.name).join() === 'bulk/099990,bulk/099991,bulk/099992,bulk/099993,bulk/099994,bulk/099995,bulk/099996,bulk/099997,bulk/099998,bulk/099999' && document.getElementById('next').disabled`)
}
