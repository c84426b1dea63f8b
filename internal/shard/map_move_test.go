package shard_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/dlock/dlock/internal/shard"
)

func TestPlaceAndMove(t *testing.T) {
	m0, err := shard.NewMap(shard.DefaultBounds(4))
	if err != nil {
		t.Fatal(err)
	}
	nodes := []string{"n3", "n1", "n5", "n2", "n4"}
	if same, _ := m0.Place(nodes, 0); !reflect.DeepEqual(same, m0) {
		t.Fatal("placing on 0 replicas changed the map")
	}
	if same, _ := m0.Place(nodes, 5); !reflect.DeepEqual(same, m0) {
		t.Fatal("placing on every node changed the map")
	}
	m, err := m0.Place(nodes, 3)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{{"n1", "n2", "n3"}, {"n2", "n3", "n4"}, {"n3", "n4", "n5"}, {"n1", "n4", "n5"}}
	if !reflect.DeepEqual(m.Replicas, want) {
		t.Fatalf("placed %v, want %v", m.Replicas, want)
	}
	if !reflect.DeepEqual(m0.Hosts(2, nodes), []string{"n1", "n2", "n3", "n4", "n5"}) || !m.Hosted(3, "n1", nodes) || m.Hosted(3, "n2", nodes) {
		t.Fatal("hosts")
	}
	// The map as the meta group stores it comes back the same.
	if back := shard.FromRanges(m.Generation, m.Ranges()); !reflect.DeepEqual(back.Replicas, m.Replicas) || !reflect.DeepEqual(back.Groups, m.Groups) || back.Generation != m.Generation {
		t.Fatalf("round trip %+v, want %+v", back, m)
	}
	for _, bad := range []struct {
		id        int
		from, to  string
		conflict  bool
		substring string
	}{
		{9, "n1", "n4", false, "no shard 9"},
		{0, "n4", "n5", false, "not a replica"},
		{0, "n1", "n9", false, "no node"},
		{0, "n1", "n1", false, "both"},
		{0, "", "n4", false, "needs from and to"},
		{0, "n1", "n2", true, "already a replica"},
	} {
		_, err := m.BeginMove(bad.id, bad.from, bad.to, nodes, nodes)
		var me *shard.MoveError
		if !errors.As(err, &me) || me.Conflict != bad.conflict || !strings.Contains(me.Msg, bad.substring) {
			t.Fatalf("move %d %s→%s: %v, want conflict %v %q", bad.id, bad.from, bad.to, err, bad.conflict, bad.substring)
		}
	}
	mid, err := m.BeginMove(0, "n1", "n4", nodes, nodes)
	if err != nil {
		t.Fatal(err)
	}
	if mid.Generation != m.Generation+1 || !reflect.DeepEqual(mid.Replicas[0], []string{"n1", "n2", "n3", "n4"}) || mid.LeavingReplica(0) != "n1" {
		t.Fatalf("mid-move %+v", mid)
	}
	if !reflect.DeepEqual(m.Replicas[0], []string{"n1", "n2", "n3"}) {
		t.Fatal("BeginMove changed its receiver")
	}
	if _, err := mid.BeginMove(0, "n2", "n5", nodes, nodes); err == nil || !err.(*shard.MoveError).Conflict {
		t.Fatalf("a second move of a moving shard: %v", err)
	}
	if got := mid.MoveTarget(0, []string{"n1", "n2", "n3"}); got != "n4" {
		t.Fatalf("move target %q", got)
	}
	// A split of another range copies its replicas to the new one.
	sp, err := mid.Split(mid.Groups[2], "p", 77)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(sp.Replicas[3], sp.Replicas[2]) || sp.LeavingReplica(3) != "" || sp.LeavingReplica(0) != "n1" {
		t.Fatalf("split map %+v", sp)
	}
	end := mid.EndMove(0)
	if end.Generation != mid.Generation+1 || !reflect.DeepEqual(end.Replicas[0], []string{"n2", "n3", "n4"}) || end.LeavingReplica(0) != "" {
		t.Fatalf("after the move %+v", end)
	}
}

func TestDataDirPlacementAndMovedGroups(t *testing.T) {
	dir := t.TempDir()
	m0, _ := shard.NewMap(shard.DefaultBounds(2))
	m, _ := m0.Place([]string{"a", "b", "c"}, 2)
	if err := shard.CheckDataDir(dir, m); err != nil {
		t.Fatal(err)
	}
	if err := shard.CheckDataDir(dir, m0); err == nil {
		t.Fatal("a dir placed on 2 replicas opened without a placement")
	}
	if err := shard.CheckDataDir(dir, m); err != nil {
		t.Fatal(err)
	}
	if got, err := shard.RecordedNodes(dir); err != nil || !reflect.DeepEqual(got, []string{"a", "b", "c"}) {
		t.Fatalf("recorded nodes %v %v", got, err)
	}
	if got, err := shard.MovedGroups(dir); err != nil || len(got) != 0 {
		t.Fatalf("moved groups of a new dir: %v %v", got, err)
	}
	for _, g := range []uint64{9, 4, 9} {
		if err := shard.RecordMoved(dir, g); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := shard.MovedGroups(dir); err != nil || !reflect.DeepEqual(got, map[uint64]bool{4: true, 9: true}) {
		t.Fatalf("moved groups %v %v", got, err)
	}
}

// Explicit writes out the initial nodes as the replica set of every range
// that has none, once; Held names the shards a node runs or is leaving.
func TestExplicitAndHeld(t *testing.T) {
	m0, err := shard.NewMap(shard.DefaultBounds(3))
	if err != nil {
		t.Fatal(err)
	}
	all := []string{"n3", "n1", "n2"}
	if got := m0.Held("n4", all); len(got) != 0 {
		t.Fatalf("n4 holds %v of a map without replica sets", got)
	}
	if got := m0.Held("n1", all); !reflect.DeepEqual(got, []int{0, 1, 2}) {
		t.Fatalf("n1 holds %v", got)
	}
	moved, err := m0.BeginMove(1, "n2", "n4", []string{"n1", "n2", "n3", "n4"}, all)
	if err != nil {
		t.Fatal(err)
	}
	e, ok, err := moved.Explicit(all)
	if err != nil || !ok {
		t.Fatalf("explicit: %v %v", ok, err)
	}
	if e.Generation != moved.Generation+1 {
		t.Fatalf("generation %d after %d", e.Generation, moved.Generation)
	}
	want := [][]string{{"n1", "n2", "n3"}, {"n1", "n2", "n3", "n4"}, {"n1", "n2", "n3"}}
	if !reflect.DeepEqual(e.Replicas, want) || e.LeavingReplica(1) != "n2" {
		t.Fatalf("explicit replicas %v leaving %q, want %v leaving n2", e.Replicas, e.LeavingReplica(1), want)
	}
	// Once explicit, the initial nodes no longer matter: a node that is
	// not among them is none of their replicas, and nothing more changes.
	if again, ok, err := e.Explicit(nil); err != nil || ok || again.Generation != e.Generation {
		t.Fatalf("explicit again: %v %v gen %d", ok, err, again.Generation)
	}
	if got := e.Held("n4", nil); !reflect.DeepEqual(got, []int{1}) {
		t.Fatalf("n4 holds %v", got)
	}
	if got := e.Held("n2", nil); !reflect.DeepEqual(got, []int{0, 1, 2}) {
		t.Fatalf("n2 (leaving shard 1) holds %v", got)
	}
	if got := e.EndMove(1).Held("n2", nil); !reflect.DeepEqual(got, []int{0, 2}) {
		t.Fatalf("n2 after the move holds %v", got)
	}
	if _, _, err := m0.Explicit(nil); err == nil {
		t.Fatal("a map without replica sets made explicit without the initial nodes")
	}
	var many []string
	for i := range 17 {
		many = append(many, "x"+strings.Repeat("y", i))
	}
	if _, _, err := m0.Explicit(many); err == nil || !strings.Contains(err.Error(), "16") {
		t.Fatalf("17 initial nodes: %v", err)
	}
}

// The start record keeps a node's first start: the initial nodes, or
// joined.
func TestStartRecord(t *testing.T) {
	dir := t.TempDir()
	if ids, joined, err := shard.ReadStart(dir); err != nil || ids != nil || joined {
		t.Fatalf("empty dir: %v %v %v", ids, joined, err)
	}
	if !shard.Fresh(dir) {
		t.Fatal("an empty dir is not fresh")
	}
	if err := shard.RecordStart(dir, []string{"n2", "n1", "n3"}); err != nil {
		t.Fatal(err)
	}
	if ids, joined, err := shard.ReadStart(dir); err != nil || !reflect.DeepEqual(ids, []string{"n1", "n2", "n3"}) || joined {
		t.Fatalf("initial: %v %v %v", ids, joined, err)
	}
	j := t.TempDir()
	if err := shard.RecordStart(j, nil); err != nil {
		t.Fatal(err)
	}
	if ids, joined, err := shard.ReadStart(j); err != nil || ids != nil || !joined {
		t.Fatalf("joined: %v %v %v", ids, joined, err)
	}
	m, _ := shard.NewMap(shard.DefaultBounds(2))
	if err := shard.CheckDataDir(j, m); err != nil || shard.Fresh(j) {
		t.Fatalf("after the map is recorded: %v, fresh %v", err, shard.Fresh(j))
	}
}
