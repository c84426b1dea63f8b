package shard_test

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/shard"
)

// TestRemoval: a node being removed is listed once, carried by every
// later map (moves, splits), refused as a move's target, and taken off
// the list by EndRemoval.
func TestRemoval(t *testing.T) {
	m0, err := shard.NewMap(shard.DefaultBounds(2))
	if err != nil {
		t.Fatal(err)
	}
	nodes := []string{"n1", "n2", "n3", "x"}
	m, err := m0.Place([]string{"n1", "n2", "n3"}, 2)
	if err != nil {
		t.Fatal(err)
	}
	r, ok, err := m.BeginRemoval("x", nodes)
	if err != nil || !ok || r.Generation != m.Generation+1 || !reflect.DeepEqual(r.Removing, []string{"x"}) {
		t.Fatalf("begin removal: %v %v %+v", ok, err, r)
	}
	if again, ok, err := r.BeginRemoval("x", nodes); err != nil || ok || again.Generation != r.Generation {
		t.Fatalf("a second begin is not a no-op: %v %v", ok, err)
	}
	_, err = r.BeginMove(0, "n1", "x", nodes, nil)
	var me *shard.MoveError
	if !errors.As(err, &me) || !me.Conflict || !strings.Contains(me.Msg, "being removed") {
		t.Fatalf("a move onto a node being removed: %v", err)
	}
	// Every other change keeps the list.
	mv, err := r.BeginMove(0, "n1", "n3", nodes, nil)
	if err != nil || !reflect.DeepEqual(mv.Removing, []string{"x"}) {
		t.Fatalf("move: %v %v", err, mv.Removing)
	}
	if end := mv.EndMove(0); !reflect.DeepEqual(end.Removing, []string{"x"}) {
		t.Fatalf("end move dropped removing: %v", end.Removing)
	}
	sp, err := r.Split(r.Groups[1], "t", shard.ChildGroup(r.Groups[1], "t"))
	if err != nil || !reflect.DeepEqual(sp.Removing, []string{"x"}) {
		t.Fatalf("split: %v %v", err, sp.Removing)
	}
	// The meta group's own check agrees with the map (same ranges).
	for _, mm := range []shard.Map{r, mv, sp} {
		for _, rg := range mm.Ranges() {
			if slices.Contains(rg.Replicas, "x") {
				t.Fatalf("a range lists x: %+v", rg)
			}
		}
	}
	back, ok := r.EndRemoval("x")
	if !ok || len(back.Removing) != 0 || back.Generation != r.Generation+1 {
		t.Fatalf("end removal: %v %+v", ok, back)
	}
	if _, ok := back.EndRemoval("x"); ok {
		t.Fatal("ending a removal not begun changed the map")
	}
	if _, err := back.BeginMove(0, "n1", "x", nodes, nil); err != nil {
		t.Fatalf("a move onto a node added again: %v", err)
	}
}

// TestRemovalListBounded: a full list drops its oldest entries that are no
// longer members; with every entry still a member it refuses.
func TestRemovalListBounded(t *testing.T) {
	m0, _ := shard.NewMap(shard.DefaultBounds(1))
	m, _ := m0.Place([]string{"n1", "n2"}, 1)
	var members []string
	for i := range command.MaxRemoving {
		id := fmt.Sprintf("r%02d", i)
		members = append(members, id)
		next, ok, err := m.BeginRemoval(id, members)
		if err != nil || !ok {
			t.Fatal(err)
		}
		m = next
	}
	if _, _, err := m.BeginRemoval("new", append(members, "new")); err == nil {
		t.Fatal("a full list of unfinished removals took one more")
	}
	// r00 and r01 are gone from the cluster: the oldest of them makes room.
	next, ok, err := m.BeginRemoval("new", append(members[2:], "new"))
	if err != nil || !ok || len(next.Removing) != command.MaxRemoving || next.Removing[0] != "r01" || next.Removing[len(next.Removing)-1] != "new" {
		t.Fatalf("%v %v %v", ok, err, next.Removing)
	}
}
