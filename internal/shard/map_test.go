package shard

import (
	"slices"
	"testing"
)

func TestMapLookupAndOverlap(t *testing.T) {
	m, err := NewMap(DefaultBounds(4))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"", "g", "n", "t"}; !slices.Equal(m.Bounds, want) {
		t.Fatalf("default bounds %q, want %q", m.Bounds, want)
	}
	for name, want := range map[string]int{
		"alpha": 0, "/alpha/x": 0, "Zulu/q": 0, "9": 0, "f": 0, "fzz/g": 0,
		"g": 1, "golf/x": 1, "mike": 1, "n": 2, "november/a/b": 2, "t": 3, "tango": 3, "zz/zz": 3,
	} {
		if got := m.Lookup(name); got != want {
			t.Errorf("Lookup(%q) = %d, want %d", name, got, want)
		}
	}
	for prefix, want := range map[string][]int{
		"": {0, 1, 2, 3}, "a": {0}, "g": {1}, "go": {1}, "golf/": {1}, "golf/zzz": {1},
		"tango/": {3}, "z": {3}, "A": {0},
	} {
		if got := m.Overlap(prefix); !slices.Equal(got, want) {
			t.Errorf("Overlap(%q) = %v, want %v", prefix, got, want)
		}
	}
	// A prefix that is a prefix of a bound reaches both sides of it.
	m2, _ := ParseBounds("gamma,golf")
	if got := m2.Overlap("g"); !slices.Equal(got, []int{0, 1, 2}) {
		t.Errorf("Overlap(g) over gamma,golf = %v, want [0 1 2]", got)
	}
	if got := m2.Overlap("gz"); !slices.Equal(got, []int{2}) {
		t.Errorf("Overlap(gz) = %v, want [2]", got)
	}
	for _, bad := range []string{"b,a", "a,a", "a/b", "a,", "a b"} {
		if _, err := ParseBounds(bad); err == nil {
			t.Errorf("ParseBounds(%q) accepted", bad)
		}
	}
}

func TestPreferredSpreadsShards(t *testing.T) {
	voters := []string{"n3", "n1", "n2"}
	var got []string
	for k := 0; k < 4; k++ {
		got = append(got, Preferred(k, voters))
	}
	if want := []string{"n1", "n2", "n3", "n1"}; !slices.Equal(got, want) {
		t.Fatalf("preferred leaders %v, want %v", got, want)
	}
}

func TestGroupIDsNameTheMap(t *testing.T) {
	a, _ := ParseBounds("g,n,t")
	b, _ := ParseBounds("h,n,t")
	seen := map[uint64]bool{}
	for k := 0; k < 4; k++ {
		for _, g := range []uint64{a.Group(k), b.Group(k)} {
			if g < 2 || seen[g] {
				t.Fatalf("group id %d reused or reserved", g)
			}
			seen[g] = true
		}
	}
	if c, _ := ParseBounds("g,n,t"); c.Group(2) != a.Group(2) {
		t.Fatal("the same map gives different group ids")
	}
}
