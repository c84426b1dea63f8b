package state

import (
	"reflect"
	"slices"
	"sort"
	"testing"
	"unsafe"
)

func TestNameSet(t *testing.T) {
	var n NameSet
	check := func(step string, want map[string]uint64) {
		t.Helper()
		if n.Len() != len(want) {
			t.Fatalf("%s: Len %d, want %d", step, n.Len(), len(want))
		}
		var names []string
		for name, seq := range want {
			if got, ok := n.Get(name); !ok || got != seq {
				t.Fatalf("%s: Get(%q) = %d %v, want %d", step, name, got, ok, seq)
			}
			names = append(names, name)
		}
		if _, ok := n.Get("absent"); ok || n.Has("absent") {
			t.Fatalf("%s: found a name never set", step)
		}
		sort.Strings(names)
		if sorted := n.Sorted(); !slices.Equal(sorted, names) {
			t.Fatalf("%s: Sorted %v, want %v (the names of %v in order)", step, sorted, names, want)
		}
	}
	check("empty", map[string]uint64{})
	n.Delete("x") // deleting from an empty set is a no-op
	n.Set("b", 2)
	check("one inline", map[string]uint64{"b": 2})
	if n.more != nil {
		t.Fatal("a single name made a map")
	}
	n.Set("b", 3)
	check("renumbered inline", map[string]uint64{"b": 3})
	n.Delete("zzz")
	check("delete of another name", map[string]uint64{"b": 3})
	n.Set("a", 1)
	check("two: moved to a map", map[string]uint64{"a": 1, "b": 3})
	n.Set("c", 0)
	n.Delete("b")
	check("map after delete", map[string]uint64{"a": 1, "c": 0})
	n.Delete("a")
	n.Delete("c")
	check("map emptied", map[string]uint64{})
	n.Set("d", 4)
	check("map reused", map[string]uint64{"d": 4})

	var m NameSet
	m.Set("only", 9)
	m.Delete("only")
	check2 := NameSet{}
	if !reflect.DeepEqual(m, check2) {
		t.Fatalf("inline set after its only delete = %+v, want empty", m)
	}
}

// A held lock costs one Lease and one Lock; with a million of them every
// word counts (docs/benchmarks.md). A field added here should be a decision.
func TestHeldLockStructsStaySmall(t *testing.T) {
	if size := unsafe.Sizeof(Lease{}); size > 96 {
		t.Errorf("Lease is %d bytes; it was 96 (a size class of Go's allocator)", size)
	}
	if size := unsafe.Sizeof(Lock{}); size > 64 {
		t.Errorf("Lock is %d bytes; it was 64", size)
	}
}

// A lease keeps what it holds and what it waits for in one NameSet: the two
// views must never see each other's names, inline or in a map (a session).
func TestLeaseNamesViews(t *testing.T) {
	var l Lease
	held, waits := l.Locks(), l.Waits()
	held.Set("a", 99) // a held lock's number is always 0
	if seq, ok := held.Get("a"); !ok || seq != 0 || waits.Has("a") || held.Len() != 1 || waits.Len() != 0 {
		t.Fatalf("one held lock inline: held %d %v, waits has it %v, lens %d/%d", seq, ok, waits.Has("a"), held.Len(), waits.Len())
	}
	waits.Set("b", 7)
	waits.Set("c", 8)
	held.Set("d", 0)
	if got := held.Sorted(); len(got) != 2 || got[0] != "a" || got[1] != "d" {
		t.Fatalf("held %v, want [a d]", got)
	}
	if got := waits.Sorted(); len(got) != 2 || got[0] != "b" || got[1] != "c" {
		t.Fatalf("waits %v, want [b c]", got)
	}
	if seq, ok := waits.Get("c"); !ok || seq != 8 || held.Has("c") {
		t.Fatalf("wait c: %d %v, held has it %v", seq, ok, held.Has("c"))
	}
	held.Delete("b")  // not held: nothing happens
	waits.Delete("a") // not waited for: nothing happens
	if !waits.Has("b") || !held.Has("a") {
		t.Fatal("a view deleted a name of the other kind")
	}
	waits.Delete("b")
	held.Delete("a")
	if held.Len() != 1 || waits.Len() != 1 || !held.Has("d") || !waits.Has("c") {
		t.Fatalf("after deletes: held %v, waits %v", held.Sorted(), waits.Sorted())
	}
}
