package server_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
)

// Every node reports its newest state checkpoint on GET /cluster, and nodes
// that applied the same log report the same whole-state digest for it.
func TestNodesReportTheSameCheckpointDigest(t *testing.T) {
	c := testcluster.New(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	info := func(node string) service.ClusterInfo {
		var ci service.ClusterInfo
		code, err := c.Do(context.Background(), http.MethodGet, c.URL(node)+"/api/v1/cluster", nil, &ci)
		if err != nil || code != 200 {
			t.Fatalf("GET /cluster on %s: %d %v", node, code, err)
		}
		return ci
	}
	// Enough writes for a checkpoint (every 256 indexes), on distinct locks
	// and clients so the state is not trivial.
	for i := 0; info(leader).CheckpointIndex == 0; i++ {
		if i > 2000 {
			t.Fatal("no checkpoint after 2,000 writes")
		}
		if code, _ := acquire(t, c, leader, fmt.Sprintf("cp/%d", i%50), map[string]any{"client_id": fmt.Sprintf("c%d", i%7), "ttl_ms": 60000}); code != 200 && code != 409 {
			t.Fatalf("acquire: %d", code)
		}
	}
	want := info(leader)
	testutil.Eventually(t, 10*time.Second, "every node at the leader's checkpoint", func() bool {
		for _, id := range c.IDs() {
			if info(id).CheckpointIndex < want.CheckpointIndex {
				return false
			}
		}
		return true
	})
	want = info(leader)
	for _, id := range c.IDs() {
		got := info(id)
		if got.CheckpointIndex == want.CheckpointIndex && got.CheckpointDigest != want.CheckpointDigest {
			t.Fatalf("%s: checkpoint %d digest %s, leader %s", id, got.CheckpointIndex, got.CheckpointDigest, want.CheckpointDigest)
		}
		if len(got.CheckpointDigest) != 16 {
			t.Fatalf("%s: digest %q", id, got.CheckpointDigest)
		}
	}
}
