package server_test

import (
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/dlock/dlock/fence"
	"github.com/dlock/dlock/internal/raftnode"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
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
	testutil.Eventually(t, 10*time.Second, "n1 applied the grant", func() bool {
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
	snap := saveSnapshot(t, src, src.Follower())
	src.Stop()

	dst := testcluster.NewWith(t, 3, testcluster.Options{Prepare: func(id, dir string, peers map[string]string) {
		if _, err := raftnode.RestoreSnapshotOn(testcluster.Engine(), dir, "", snap, peers); err != nil {
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
	if _, err := raftnode.RestoreSnapshot(dst.DataDir("n1"), "", snap, map[string]string{"n1": "x:1"}); err == nil {
		t.Fatalf("restore into a used data dir was accepted")
	}
}

// A cluster moves to the other replication engine by a snapshot saved on
// it and restored into new data dirs of that engine (docs/operations.md):
// its locks, holders and token counters come across, and the new dirs
// record their engine.
func TestSnapshotMovesAClusterToTheOtherEngine(t *testing.T) {
	if testcluster.Engine() != raftnode.DefaultEngine {
		t.Skip("names both engines itself: the default-engine pass runs it")
	}
	for _, move := range [][2]raftnode.EngineKind{
		{raftnode.EngineHashicorp, raftnode.EngineEtcd},
		{raftnode.EngineEtcd, raftnode.EngineHashicorp},
	} {
		from, to := move[0], move[1]
		t.Run(string(from)+"-to-"+string(to), func(t *testing.T) {
			src := testcluster.NewWith(t, 3, testcluster.Options{Engine: from})
			leader := src.WaitLeader(10 * time.Second)
			code, a := acquire(t, src, leader, "move/me", map[string]any{"client_id": "h", "ttl_ms": 300000})
			if code != 200 {
				t.Fatalf("acquire: %d", code)
			}
			snap := saveSnapshot(t, src, leader)
			src.Stop()

			dst := testcluster.NewWith(t, 3, testcluster.Options{Engine: to, Prepare: func(id, dir string, peers map[string]string) {
				if _, err := raftnode.RestoreSnapshotOn(to, dir, "", snap, peers); err != nil {
					t.Fatalf("restore into %s: %v", id, err)
				}
			}})
			l := dst.WaitLeader(20 * time.Second)
			for _, id := range dst.IDs() {
				if k, err := raftnode.DataDirEngine(dst.DataDir(id)); err != nil || k != to {
					t.Fatalf("%s's data dir runs %q (%v), want %q", id, k, err, to)
				}
			}
			v := getLock(t, dst, l, "move/me")
			if !v.Held || v.Holder.FencingToken != a.FencingToken {
				t.Fatalf("moved lock: %+v, want held at token %d", v, a.FencingToken)
			}
			code, b := acquire(t, dst, l, "move/new", map[string]any{"client_id": "x", "ttl_ms": 5000})
			if code != 200 || b.FencingToken <= a.FencingToken {
				t.Fatalf("token after the move %d (code %d), want > %d", b.FencingToken, code, a.FencingToken)
			}
		})
	}
}

// saveSnapshot downloads a snapshot from node, as `dlock snapshot save` does.
func saveSnapshot(t *testing.T, c *testcluster.Cluster, node string) []byte {
	t.Helper()
	res, err := http.Get(c.URL(node) + "/api/v1/cluster/snapshot")
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("snapshot save: %v %v", err, res)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("snapshot save: %v", err)
	}
	return b
}

// proofKeyID is the id of the key that signed a token proof (its first 8
// bytes, fence.SignProof).
func proofKeyID(t *testing.T, proof string) string {
	t.Helper()
	raw, err := base64.RawURLEncoding.DecodeString(proof)
	if err != nil || len(raw) < 8 {
		t.Fatalf("bad proof %q: %v", proof, err)
	}
	return fence.KeyID(raw[:8]).String()
}

// A cluster restored from a snapshot signs with a key of its own. The old
// cluster, still running after the backup (as it may be, by mistake or
// until it is retired), and the restored one both grant the next token of
// the same counter; before, both signed it with the same key, so a fence
// checker accepted both. Now each cluster's key set refuses the other's
// new grant, and the restored cluster's still verifies the grants the
// snapshot carried.
func TestRestoredClusterSignsWithANewKey(t *testing.T) {
	src := testcluster.New(t, 3)
	leader := src.WaitLeader(10 * time.Second)
	code, a := acquire(t, src, leader, "backup/held", map[string]any{"client_id": "h", "ttl_ms": 300000})
	if code != 200 || a.TokenProof == "" {
		t.Fatalf("acquire: %d %+v", code, a)
	}
	oldKeys, _ := keySet(t, src, leader)
	snap := saveSnapshot(t, src, leader)

	// The old cluster goes on granting after the backup.
	code, o := acquire(t, src, leader, "fenced/x", map[string]any{"client_id": "old", "ttl_ms": 60000})
	if code != 200 {
		t.Fatalf("acquire on the old cluster: %d", code)
	}

	var retired raftnode.Restored
	dst := testcluster.NewWith(t, 3, testcluster.Options{Prepare: func(id, dir string, peers map[string]string) {
		info, err := raftnode.RestoreSnapshotOn(testcluster.Engine(), dir, "", snap, peers)
		if err != nil {
			t.Fatalf("restore into %s: %v", id, err)
		}
		retired = info
	}})
	l := dst.WaitLeader(20 * time.Second)
	code, n := acquire(t, dst, l, "fenced/x", map[string]any{"client_id": "new", "ttl_ms": 60000})
	if code != 200 || n.TokenProof == "" {
		t.Fatalf("acquire on the restored cluster: %d %+v", code, n)
	}
	if got, old := proofKeyID(t, n.TokenProof), proofKeyID(t, a.TokenProof); got == old {
		t.Fatalf("the restored cluster signs with the old cluster's key %s", old)
	}
	if !retired.RetiredKeyOK || fence.KeyID(retired.RetiredKey.ID).String() != proofKeyID(t, a.TokenProof) || retired.RetiredKey.MaxToken != a.FencingToken {
		t.Fatalf("restore reported %+v, want the old key retired at token %d", retired, a.FencingToken)
	}
	// A checker that trusts the old cluster's keys refuses the new grant.
	if err := oldKeys.Verify("fenced/x", n.FencingToken, "new", n.LeaseRef, n.TokenProof); !errors.Is(err, fence.ErrUnknownKey) {
		t.Fatalf("the old cluster's keys accept the restored cluster's grant: %v", err)
	}
	// The restored cluster publishes a new current key and the old one
	// retired: it verifies what the snapshot carried, not what the old
	// cluster signed after it.
	newKeys, doc := keySet(t, dst, l)
	if len(doc.Keys) != 2 || !doc.Keys[0].Current || doc.Keys[1].Current || doc.Keys[1].ID != proofKeyID(t, a.TokenProof) {
		t.Fatalf("restored cluster's keys: %+v", doc)
	}
	if err := newKeys.Verify("fenced/x", n.FencingToken, "new", n.LeaseRef, n.TokenProof); err != nil {
		t.Fatalf("the restored cluster's grant does not verify with its keys: %v", err)
	}
	if err := newKeys.Verify("backup/held", a.FencingToken, "h", a.LeaseRef, a.TokenProof); err != nil {
		t.Fatalf("a grant carried by the snapshot no longer verifies: %v", err)
	}
	if err := newKeys.Verify("fenced/x", o.FencingToken, "old", o.LeaseRef, o.TokenProof); !errors.Is(err, fence.ErrTokenAboveKeyBound) {
		t.Fatalf("the restored cluster's keys accept a grant the old cluster made after the backup: %v", err)
	}
}
