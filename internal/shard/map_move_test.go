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
