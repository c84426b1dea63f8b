package shard_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	dlockv1 "github.com/dlock/dlock/api/dlock/v1"
	"github.com/dlock/dlock/internal/server"
	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/shard"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
)

// placed4 runs the default 4 ranges on 3 of 4 nodes each and waits until
// every shard has a leader; away is a shard n1 does not run.
func placed4(t testing.TB, opts testcluster.Options) (c *testcluster.Cluster, m shard.Map, away int) {
	t.Helper()
	m0, err := shard.NewMap(shard.DefaultBounds(4))
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{"n1", "n2", "n3", "n4"}
	if m, err = m0.Place(ids, 3); err != nil {
		t.Fatal(err)
	}
	opts.Shards = &m
	c = testcluster.NewWith(t, 4, opts)
	away = -1
	for k := range m.N() {
		if !m.Hosted(k, "n1", ids) {
			away = k
		}
	}
	if away < 0 {
		t.Fatalf("every shard runs on n1: %v", m.Replicas)
	}
	testutil.Eventually(t, 60*time.Second, "every shard has a leader", func() error {
		for k := range m.N() {
			led := false
			for _, n := range c.Running() {
				if g := c.Server(n).ShardGroup(k); g != nil && g.IsLeader() {
					led = true
				}
			}
			if !led {
				return fmt.Errorf("shard %d has no leader", k)
			}
		}
		return nil
	})
	return c, m, away
}

// grant acquires and releases name as client via node, retrying 503s with
// the same request ids (a shard electing a leader), and answers the token.
func grant(t *testing.T, c *testcluster.Cluster, node, name, client string) uint64 {
	t.Helper()
	var a service.AcquireResponse
	if code := post(t, c, c.URL(node)+"/api/v1/locks/"+name+"/acquire", map[string]any{"client_id": client, "ttl_ms": 60000, "request_id": "a-" + client}, &a); code != 200 || !a.Acquired {
		t.Fatalf("acquire %s as %s via %s: %d %+v", name, client, node, code, a)
	}
	if code := post(t, c, c.URL(node)+"/api/v1/locks/"+name+"/release", map[string]any{"client_id": client, "fencing_token": a.FencingToken, "lease_id": a.LeaseID, "request_id": "r-" + client}, nil); code != 200 {
		t.Fatalf("release %s as %s via %s: %d", name, client, node, code)
	}
	return a.FencingToken
}

// grants reads the stream until it has seen want's acquisitions of name,
// and fails on one seen twice, out of order, or an error record.
func grants(t *testing.T, ch <-chan sse, name string, want []string) (lastID string) {
	t.Helper()
	var got []string
	next(t, ch, func(r sse) bool {
		if r.typ == "error" {
			t.Fatalf("the watch ended with an error record: %+v", r.ev)
		}
		lastID = r.id
		if r.ev.Name == name && r.ev.Type == "acquired" {
			got = append(got, r.ev.ClientID)
			if !slices.Equal(got, want[:min(len(got), len(want))]) || len(got) > len(want) {
				t.Fatalf("grants of %s seen %v, want %v (each once, in order)", name, got, want)
			}
		}
		return len(got) == len(want)
	})
	return lastID
}

// A watch through a node that runs none of a shard's replicas is relayed
// from a replica: a watch of that shard's names and a merged watch over
// every shard both see every grant once and in order, resume from the
// last event's id, and go on without a gap when the replica serving the
// relay is killed mid-stream (the relay fails over to another replica).
func TestWatchForwarded(t *testing.T) {
	c, m, away := placed4(t, testcluster.Options{})
	ids := c.IDs()
	hosts := m.Hosts(away, ids)
	name := shardName(t, m, away) + "/seq"
	local := shardName(t, m, (away+1)%m.N()) + "/seq"
	for _, n := range ids {
		// Quick heartbeats: a silent replica is passed over within seconds.
		c.Server(n).Router().SetStreamLimits(shard.StreamLimits{Heartbeat: 500 * time.Millisecond})
	}

	one := watch(t, c, c.URL("n1")+"/api/v1/watch?prefix="+url.QueryEscape(shardName(t, m, away)+"/"))
	all := watch(t, c, c.URL("n1")+"/api/v1/watch")
	if out, _ := c.Server("n1").Router().StreamCounts(); out != 2 {
		t.Fatalf("n1 relays %d streams, want 2 (one per watch of shard %d)", out, away)
	}
	var want, wantLocal []string
	for i := range 6 {
		client := fmt.Sprintf("w%d", i)
		want = append(want, client)
		grant(t, c, hosts[i%len(hosts)], name, client)
		wantLocal = append(wantLocal, "l"+client)
		grant(t, c, "n1", local, "l"+client)
	}
	grants(t, one, name, want)
	grants(t, all, name, want)

	// Resume the one-shard watch from an event's id: only what follows.
	resumeFrom := ""
	{
		ctx, cancel := context.WithCancel(context.Background())
		first := watchCtx(t, ctx, c.URL("n1")+"/api/v1/watch?prefix="+url.QueryEscape(shardName(t, m, away)+"/"))
		grant(t, c, hosts[0], name, "r0")
		resumeFrom = grants(t, first, name, []string{"r0"})
		cancel()
	}
	grant(t, c, hosts[1], name, "r1")
	resumed := watch(t, c, c.URL("n1")+"/api/v1/watch?prefix="+url.QueryEscape(shardName(t, m, away)+"/")+"&from_revisions="+url.QueryEscape(bumpVector(t, resumeFrom)))
	grants(t, resumed, name, []string{"r1"})
	want = append(want, "r0", "r1")

	// Kill the replica that serves n1's relays, mid-stream.
	var serving string
	testutil.Eventually(t, 10*time.Second, "a replica serves n1's relays", func() error {
		for _, n := range hosts {
			if _, in := c.Server(n).Router().StreamCounts(); in > 0 {
				serving = n
				return nil
			}
		}
		return fmt.Errorf("no replica of shard %d serves a stream", away)
	})
	c.Kill(serving)
	var live []string
	for _, n := range hosts {
		if n != serving {
			live = append(live, n)
		}
	}
	for i := range 6 {
		client := fmt.Sprintf("k%d", i)
		want = append(want, client)
		grant(t, c, live[i%len(live)], name, client)
	}
	// The streams go on from where they were: the rest of the sequence,
	// each grant once, no error.
	grants(t, one, name, want[6:])
	grants(t, all, name, want[6:])
	if f := c.Server("n1").Router().StreamFailovers(); f < 2 {
		t.Fatalf("n1's relays failed over %d times, want at least 2 (both streams lost their replica)", f)
	}
}

// shardName is a top-level name segment in range k of m.
func shardName(t testing.TB, m shard.Map, k int) string {
	t.Helper()
	for _, n := range []string{"alpha", "golf", "hotel", "mike", "oscar", "tango", "zebra"} {
		if m.Lookup(n) == k {
			return n
		}
	}
	t.Fatalf("no test name in shard %d", k)
	return ""
}

// The relayed streams are bounded per node: beyond the limit a watch of a
// shard the node does not run is refused with 429 rate_limited, and a
// closed one frees its slot on both nodes. A shutdown ends the relays.
func TestWatchForwardedBounded(t *testing.T) {
	c, m, away := placed4(t, testcluster.Options{WatchHistory: 16, Limits: server.Limits{Service: service.Limits{MaxWatchersPerConn: 2}}})
	c.Server("n1").Router().SetStreamLimits(shard.StreamLimits{MaxOut: 1})
	u := c.URL("n1") + "/api/v1/watch?prefix=" + url.QueryEscape(shardName(t, m, away)+"/")
	ctx, cancel := context.WithCancel(context.Background())
	watchCtx(t, ctx, u)
	get := func() (int, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		return res.StatusCode, res.Header.Get("Retry-After")
	}
	if code, ra := get(); code != http.StatusTooManyRequests || ra == "" {
		t.Fatalf("a second relayed watch beyond the limit: %d (Retry-After %q), want 429 with Retry-After", code, ra)
	}
	// A watch of a shard n1 runs is no relay and is not counted.
	local := watch(t, c, c.URL("n1")+"/api/v1/watch?prefix="+url.QueryEscape(shardName(t, m, (away+1)%m.N())+"/"))
	_ = local
	cancel()
	testutil.Eventually(t, 10*time.Second, "the closed relay frees its slot", func() error {
		if out, _ := c.Server("n1").Router().StreamCounts(); out != 0 {
			return fmt.Errorf("n1 still relays %d streams", out)
		}
		for _, n := range m.Hosts(away, c.IDs()) {
			if _, in := c.Server(n).Router().StreamCounts(); in != 0 {
				return fmt.Errorf("%s still serves %d streams", n, in)
			}
		}
		return nil
	})
	one := watch(t, c, u)
	grant(t, c, m.Hosts(away, c.IDs())[0], shardName(t, m, away)+"/b", "b0")
	grants(t, one, shardName(t, m, away)+"/b", []string{"b0"})

	// A relay counts against the node's per-connection watcher limit like
	// a local watch: two gRPC watches on one connection, not a third.
	cc, err := grpc.NewClient(c.GRPCAddr("n1"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c.Server("n1").Router().SetStreamLimits(shard.StreamLimits{MaxOut: 8})
	gctx, gcancel := context.WithTimeout(context.Background(), 60*time.Second)
	var watches []dlockv1.WatchService_WatchClient
	for i := range 3 {
		w, err := dlockv1.NewWatchServiceClient(cc).Watch(gctx, &dlockv1.WatchRequest{Prefix: shardName(t, m, away) + "/"})
		if err != nil {
			t.Fatal(err)
		}
		watches = append(watches, w)
		if i < 2 {
			testutil.Eventually(t, 10*time.Second, "the relayed gRPC watch is open", func() error {
				if out, _ := c.Server("n1").Router().StreamCounts(); out != 2+i {
					return fmt.Errorf("n1 relays %d streams", out)
				}
				return nil
			})
		}
	}
	if _, err := watches[2].Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a third relayed gRPC watch on one connection: %v, want ResourceExhausted", err)
	}
	gcancel()

	// A resume from a revision the replicas no longer keep is answered
	// compacted (410), as through a replica.
	c.Server("n1").Router().SetStreamLimits(shard.StreamLimits{MaxOut: 4})
	for i := range 12 {
		grant(t, c, m.Hosts(away, c.IDs())[1], shardName(t, m, away)+"/c", fmt.Sprintf("c%d", i))
	}
	ctx3, cancel3 := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel3()
	req, _ := http.NewRequestWithContext(ctx3, http.MethodGet, fmt.Sprintf("%s&from_revisions=%d:1", u, m.IDs[away]), nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusGone {
		t.Fatalf("a relayed watch from a compacted revision: %d, want 410", res.StatusCode)
	}

	// The nodes shut down: the relayed watch ends with an error record
	// (unavailable: resumable elsewhere), and shutting down does not wait
	// for the watch's client to go away.
	c.Stop()
	var last sse
	for r := range one {
		last = r
	}
	if last.typ != "error" {
		t.Fatalf("the relayed watch ended without an error record at shutdown: %+v", last)
	}
}

// Through the node without the shard's replica, a gRPC watch and an
// observe are relayed too, and a merged watch follows a split of the
// relayed shard: the new shard (also on other nodes) joins the stream and
// every grant on either side of the split is seen once.
func TestWatchForwardedGRPCObserveSplit(t *testing.T) {
	c, m, away := placed4(t, testcluster.Options{})
	ids := c.IDs()
	hosts := m.Hosts(away, ids)
	start, end := m.Range(away)
	if start != "g" || end != "n" {
		t.Fatalf("shard %d is [%q, %q), the test wants [g, n)", away, start, end)
	}
	cc, err := grpc.NewClient(c.GRPCAddr("n1"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	gw, err := dlockv1.NewWatchServiceClient(cc).Watch(ctx, &dlockv1.WatchRequest{Prefix: "hotel/"})
	if err != nil {
		t.Fatal(err)
	}
	obs, err := dlockv1.NewElectionServiceClient(cc).Observe(ctx, &dlockv1.ObserveRequest{Name: "golf/leader"})
	if err != nil {
		t.Fatal(err)
	}
	if first, err := obs.Recv(); err != nil || first.Election.GetLeader() != nil {
		t.Fatalf("the first observed view of golf/leader: %v %v", first, err)
	}
	all := watch(t, c, c.URL("n1")+"/api/v1/watch")

	if code := post(t, c, c.URL(hosts[0])+"/api/v1/elections/golf/leader/campaign", map[string]any{"candidate_id": "cand", "value": "v1", "ttl_ms": 60000, "request_id": "camp"}, nil); code != 200 {
		t.Fatalf("campaign: %d", code)
	}
	if v, err := obs.Recv(); err != nil || v.Election.GetLeader().GetCandidateId() != "cand" {
		t.Fatalf("the observed view after the campaign: %v %v", v, err)
	}
	grant(t, c, hosts[1], "hotel/g", "g0")
	beforeSplit := grants(t, all, "hotel/g", []string{"g0"})
	if r, err := gw.Recv(); err != nil || r.Event.GetName() != "hotel/g" || r.Event.GetType() != "acquired" || r.Event.GetClientId() != "g0" {
		t.Fatalf("gRPC watch through n1: %v %v", r, err)
	}

	// Split the relayed shard at h: hotel/ moves to a new shard on the
	// same replicas, none of them n1.
	var ci service.ClusterInfo
	if code := post(t, c, c.URL("n2")+"/api/v1/cluster/shards/split", map[string]any{"at": "h"}, &ci); code != 200 {
		t.Fatalf("split at h: %d", code)
	}
	testutil.Eventually(t, 30*time.Second, "n1 routes by the new map", func() error {
		nm := c.Server("n1").Router().Map()
		if nm.N() != 5 || nm.Lookup("hotel/x") == nm.Lookup("golf/x") {
			return fmt.Errorf("n1's map has %d shards", nm.N())
		}
		if k := nm.Lookup("hotel/x"); nm.Hosted(k, "n1", ids) {
			return fmt.Errorf("the new shard runs on n1: %v", nm.Hosts(k, ids))
		}
		return nil
	})
	var want, wantG []string
	for i := range 4 {
		want = append(want, fmt.Sprintf("h%d", i))
		grant(t, c, hosts[i%len(hosts)], "hotel/split", want[i])
		wantG = append(wantG, fmt.Sprintf("s%d", i))
		grant(t, c, "n1", "golf/split", wantG[i])
	}
	// The merged stream has both sides of the split, each grant once and
	// in order, with the new shard in its revision vector.
	got := map[string][]string{}
	next(t, all, func(r sse) bool {
		if r.typ == "error" {
			t.Fatalf("the merged watch ended: %+v", r.ev)
		}
		if r.ev.Type == "acquired" && (r.ev.Name == "hotel/split" || r.ev.Name == "golf/split") {
			got[r.ev.Name] = append(got[r.ev.Name], r.ev.ClientID)
			if r.ev.Name == "hotel/split" && len(r.ev.Revisions) != 5 {
				t.Fatalf("a grant of the new shard with the revision vector %v", r.ev.Revisions)
			}
		}
		return len(got["hotel/split"]) >= len(want) && len(got["golf/split"]) >= len(wantG)
	})
	if !slices.Equal(got["hotel/split"], want) || !slices.Equal(got["golf/split"], wantG) {
		t.Fatalf("grants seen %v, want hotel/split %v and golf/split %v", got, want, wantG)
	}
	// Resumed from before the split, through n1, from a vector naming only
	// the old shards: the new shard joins at the split (n1 learns where
	// from a replica of the relayed shard), and every grant comes once.
	resumed := watch(t, c, c.URL("n1")+"/api/v1/watch?from_revisions="+url.QueryEscape(bumpVector(t, beforeSplit)))
	grants(t, resumed, "hotel/split", want)

	// The gRPC watch of hotel/ (now all on the new shard) goes on.
	for _, id := range want {
		for {
			r, err := gw.Recv()
			if err != nil {
				t.Fatalf("gRPC watch after the split: %v", err)
			}
			if r.Event.GetType() == "acquired" {
				if r.Event.GetClientId() != id {
					t.Fatalf("gRPC watch after the split: grant to %s, want %s", r.Event.GetClientId(), id)
				}
				break
			}
		}
	}
}
