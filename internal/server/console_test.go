package server_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
)

// What the console reads beyond the older API: a lock's queue in order
// through any node, and elections listed a page at a time.
func TestQueueAndElectionListing(t *testing.T) {
	c := testcluster.New(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	follower := c.Follower()
	if code, _ := acquire(t, c, leader, "q/job", map[string]any{"client_id": "holder", "ttl_ms": 60000}); code != 200 {
		t.Fatalf("acquire: %d", code)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	waiters := make(chan int, 3)
	for i, client := range []string{"w1", "w2", "w3"} {
		go func() {
			code, _ := c.Do(ctx, http.MethodPost, c.URL(leader)+"/api/v1/locks/q/job/acquire", map[string]any{"client_id": client, "ttl_ms": 60000, "wait_timeout_ms": 60000}, nil)
			waiters <- code
		}()
		testutil.Eventually(t, 10*time.Second, fmt.Sprintf("%s waits", client), func() bool { return getLock(t, c, leader, "q/job").Waiters == i+1 })
	}
	v := getLock(t, c, follower, "q/job")
	var got []string
	for _, w := range v.Queue {
		got = append(got, w.ClientID)
		if w.EnqueuedAt.IsZero() || !w.WaitDeadline.After(w.EnqueuedAt) {
			t.Errorf("waiter %+v lacks its times", w)
		}
	}
	if strings.Join(got, ",") != "w1,w2,w3" || v.Waiters != 3 {
		t.Fatalf("queue through a follower %v (waiters %d), want w1,w2,w3", got, v.Waiters)
	}
	var list service.ListResponse
	if code, err := c.Do(ctx, http.MethodGet, c.URL(follower)+"/api/v1/locks?prefix=q/", nil, &list); err != nil || code != 200 || len(list.Locks) != 1 || list.Locks[0].Queue != nil {
		t.Fatalf("list: %d %v %+v (the list carries counts, not queues)", code, err, list)
	}
	cancel()
	for range 3 {
		<-waiters
	}

	for _, n := range []string{"db/a", "db/b", "db/c", "other"} {
		if code, err := c.Do(context.Background(), http.MethodPost, c.URL(leader)+"/api/v1/elections/"+n+"/campaign",
			map[string]any{"candidate_id": "c-" + n, "value": "v-" + n, "ttl_ms": 60000}, nil); err != nil || code != 200 {
			t.Fatalf("campaign %s: %d %v", n, code, err)
		}
	}
	var page service.ElectionListResponse
	if code, err := c.Do(context.Background(), http.MethodGet, c.URL(follower)+"/api/v1/elections?prefix=db/&limit=2", nil, &page); err != nil || code != 200 {
		t.Fatalf("list elections: %d %v", code, err)
	}
	if len(page.Elections) != 2 || !page.More || page.Elections[0].Name != "db/a" || page.Elections[1].Leader == nil || page.Elections[1].Leader.Value != "v-db/b" {
		t.Fatalf("first page %+v", page)
	}
	if code, err := c.Do(context.Background(), http.MethodGet, c.URL(follower)+"/api/v1/elections?prefix=db/&limit=2&after=db/b", nil, &page); err != nil || code != 200 {
		t.Fatalf("list elections: %d %v", code, err)
	}
	if len(page.Elections) != 1 || page.More || page.Elections[0].Name != "db/c" {
		t.Fatalf("second page %+v", page)
	}
	var locks service.ListResponse
	if code, _ := c.Do(context.Background(), http.MethodGet, c.URL(leader)+"/api/v1/locks?prefix=db/", nil, &locks); code != 200 || len(locks.Locks) != 0 {
		t.Fatalf("elections in the lock list: %+v", locks)
	}
	// The console is on by default and serves its page with its policy.
	res, err := http.Get(c.URL(follower) + "/ui/")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 || !strings.Contains(res.Header.Get("Content-Security-Policy"), c.URL(leader)) {
		t.Fatalf("console: %d, CSP %q should name the other members", res.StatusCode, res.Header.Get("Content-Security-Policy"))
	}
}
