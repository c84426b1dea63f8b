package shard_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/shard"
)

// staleRouter is a router over a copy of fresh's current map and services
// (real, running ones) that no later map reaches until the test calls its
// Update: a node's router as it is while it replays the meta group after a
// restart, or while it is cut off from it.
func staleRouter(fresh *shard.Router) *shard.Router {
	return shard.NewRouter(fresh.Map(), fresh.Services())
}

// TestListThroughAStaleMapMissesNoName lists every lock through a router
// whose map predates a split: the names moved to the split-off shard are
// in no page of that map's shards. The list must not be answered short:
// without the newer map it is a retryable 503, and once the map arrives
// every name is listed. The same holds for a prefix inside the split-off
// range (one shard of the old map) and for elections. The shards' split
// lists stay out of the merged and the HTTP answers.
func TestListThroughAStaleMapMissesNoName(t *testing.T) {
	c, _ := sharded(t, 3)
	ids := c.IDs()
	node := c.Server(ids[0])
	fresh := node.Router()
	names := []string{"alpha", "mike", "romeo", "sierra", "zulu"}
	for _, n := range names {
		var a service.AcquireResponse
		if code := post(t, c, c.URL(ids[0])+"/api/v1/locks/"+n+"/acquire", map[string]any{"client_id": "ls", "ttl_ms": 120000, "request_id": "ls-" + n}, &a); code != 200 || !a.Acquired {
			t.Fatalf("acquire %s: %d %+v", n, code, a)
		}
	}
	var cv service.CampaignResponse
	if code := post(t, c, c.URL(ids[0])+"/api/v1/elections/romeo-e/campaign", map[string]any{"candidate_id": "ls", "ttl_ms": 120000, "value": "v", "request_id": "ls-e"}, &cv); code != 200 {
		t.Fatalf("campaign romeo-e: %d %+v", code, cv)
	}
	stale := staleRouter(fresh)

	splitAtQ(t, c, ids[0])
	if k := stale.Map().Lookup("romeo"); stale.Map().IDs[k] == 4 {
		t.Fatal("the stale map already has the split")
	}

	listed := func(l *service.ListResponse) string {
		var got []string
		for _, v := range l.Locks {
			got = append(got, v.Name)
		}
		return strings.Join(got, ",")
	}
	want503 := func(what string, err error) {
		t.Helper()
		var ae *apierror.Error
		if !errors.As(err, &ae) || ae.Code != apierror.Unavailable || ae.RetryAfter <= 0 {
			t.Fatalf("%s through a stale map: %v, want a retryable unavailable", what, err)
		}
	}
	// Without the newer map: a retryable 503, never a short list.
	for _, prefix := range []string{"", "r"} {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		l, err := stale.ListLocks(ctx, service.ListRequest{Prefix: prefix})
		cancel()
		if err == nil {
			t.Fatalf("a list of %q through a map without shard 4 answered ok with %q", prefix, listed(l))
		}
		want503(fmt.Sprintf("list of %q", prefix), err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	el, err := stale.ListElections(ctx, service.ListRequest{})
	cancel()
	if err == nil {
		t.Fatalf("an election list through a map without shard 4 answered ok with %+v", el.Elections)
	}
	want503("election list", err)

	// The newer map arrives while the list waits (or before it starts).
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go stale.Update(fresh.Map(), fresh.Services())
	l, err := stale.ListLocks(ctx, service.ListRequest{})
	if err != nil {
		t.Fatalf("list once the map arrived: %v", err)
	}
	if got := listed(l); got != strings.Join(names, ",") {
		t.Fatalf("list once the map arrived: %q, want %q", got, strings.Join(names, ","))
	}
	if l.SplitGroups != nil {
		t.Fatalf("the merged list carries the shards' split lists: %v", l.SplitGroups)
	}
	if l, err = stale.ListLocks(ctx, service.ListRequest{Prefix: "r"}); err != nil || listed(l) != "romeo" || l.SplitGroups != nil {
		t.Fatalf("list of r once the map arrived: %+v %v", l, err)
	}
	if el, err = stale.ListElections(ctx, service.ListRequest{}); err != nil || len(el.Elections) != 1 || el.Elections[0].Name != "romeo-e" || el.SplitGroups != nil {
		t.Fatalf("election list once the map arrived: %+v %v", el, err)
	}

	// Over HTTP, through every node (some forward a shard's page): the
	// answer has every name and no split list.
	for _, id := range ids {
		var raw json.RawMessage
		if code := do(t, c, "GET", c.URL(id)+"/api/v1/locks?prefix=", nil, &raw); code != 200 {
			t.Fatalf("list over HTTP on %s: %d %s", id, code, raw)
		}
		if strings.Contains(string(raw), "split") {
			t.Fatalf("the HTTP list answer shows the internal split list: %s", raw)
		}
		for _, n := range names {
			if !strings.Contains(string(raw), `"`+n+`"`) {
				t.Fatalf("the HTTP list on %s misses %s: %s", id, n, raw)
			}
		}
	}
}
