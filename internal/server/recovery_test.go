package server_test

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/raftnode"
	"github.com/dlock/dlock/internal/testcluster"
)

// After losing quorum for good, the survivor is forced into a one-node
// configuration; it keeps every lock and fencing tokens keep increasing.
func TestQuorumLossRecovery(t *testing.T) {
	c := testcluster.New(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	code, a := acquire(t, c, leader, "survives", map[string]any{"client_id": "h", "ttl_ms": 120000})
	if code != 200 {
		t.Fatalf("acquire: %d", code)
	}
	// The grant was committed by a majority, which need not include n1: the
	// node an operator recovers from must be one that has it (docs/operations.md
	// says to pick the survivor with the highest applied index), so wait until n1 has applied it.
	waitFor(t, 10*time.Second, "n1 applied the grant", func() bool {
		v, err := staleLock(c, "n1", "survives")
		return err == nil && v.Held
	})
	for _, id := range c.IDs() {
		c.Kill(id)
	}
	// n2 and n3 are gone for good.
	if err := raftnode.Recover(c.DataDir("n1"), map[string]string{"n1": c.RaftAddr("n1")}); err != nil {
		t.Fatalf("recover: %v", err)
	}
	c.Start("n1")
	if l := c.WaitLeader(20 * time.Second); l != "n1" {
		t.Fatalf("leader %s", l)
	}
	v := getLock(t, c, "n1", "survives")
	if !v.Held || v.Holder.FencingToken != a.FencingToken {
		t.Fatalf("after recovery: %+v", v)
	}
	code, b := acquire(t, c, "n1", "after", map[string]any{"client_id": "x", "ttl_ms": 5000})
	if code != 200 || b.FencingToken <= a.FencingToken {
		t.Fatalf("token after recovery %d (code %d), want > %d", b.FencingToken, code, a.FencingToken)
	}
}

// A snapshot saved from one cluster seeds a brand-new cluster with the same
// locks and counters.
func TestSnapshotSaveAndRestoreIntoNewCluster(t *testing.T) {
	src := testcluster.New(t, 3)
	leader := src.WaitLeader(10 * time.Second)
	code, a := acquire(t, src, leader, "backup/me", map[string]any{"client_id": "h", "ttl_ms": 300000})
	if code != 200 {
		t.Fatalf("acquire: %d", code)
	}
	res, err := http.Get(src.URL(src.Follower()) + "/api/v1/cluster/snapshot")
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("snapshot save: %v %v", err, res)
	}
	snap, _ := io.ReadAll(res.Body)
	res.Body.Close()
	src.Stop()

	dst := testcluster.NewWith(t, 3, testcluster.Options{Prepare: func(id, dir string, peers map[string]string) {
		if err := raftnode.RestoreSnapshot(dir, "", snap, peers); err != nil {
			t.Fatalf("restore into %s: %v", id, err)
		}
	}})
	l := dst.WaitLeader(20 * time.Second)
	v := getLock(t, dst, l, "backup/me")
	if !v.Held || v.Holder.FencingToken != a.FencingToken {
		t.Fatalf("restored lock: %+v", v)
	}
	code, b := acquire(t, dst, l, "new", map[string]any{"client_id": "x", "ttl_ms": 5000})
	if code != 200 || b.FencingToken <= a.FencingToken {
		t.Fatalf("token in restored cluster %d (code %d), want > %d", b.FencingToken, code, a.FencingToken)
	}
	// Refuses a non-empty dir.
	if err := raftnode.RestoreSnapshot(dst.DataDir("n1"), "", snap, map[string]string{"n1": "x:1"}); err == nil {
		t.Fatalf("restore into a used data dir was accepted")
	}
}
