package shard

import (
	"slices"
	"testing"
	"time"
)

// A node without a shard starts at its own point in the replica set, then
// sticks to the replica that answered, and tries one that did not accept a
// call last until its penalty ends.
func TestForwardReplicaOrder(t *testing.T) {
	f := newFwdReplicas()
	hosts := []string{"n2", "n3", "n4"}
	now := time.Unix(1000, 0)
	base := f.order(7, hosts, "n1", now)
	if len(base) != 3 || !slices.Equal(slices.Sorted(slices.Values(base)), hosts) {
		t.Fatalf("order %v, want every replica once", base)
	}
	if got := f.order(7, append(hosts, "n1"), "n1", now); slices.Contains(got, "n1") {
		t.Fatalf("order %v includes this node", got)
	}

	// Sticky: the replica that answered goes first, the rest keep their order.
	f.answered(7, base[2])
	if got, want := f.order(7, hosts, "n1", now), []string{base[2], base[0], base[1]}; !slices.Equal(got, want) {
		t.Fatalf("after %s answered: %v, want %v", base[2], got, want)
	}
	if got := f.order(8, hosts, "n1", now); !slices.Equal(got, base) {
		t.Fatalf("another group's order %v, want %v", got, base)
	}

	// Benched: last for every group, and no longer sticky.
	f.bench(7, base[2], now)
	if got, want := f.order(7, hosts, "n1", now), []string{base[0], base[1], base[2]}; !slices.Equal(got, want) {
		t.Fatalf("after %s was benched: %v, want %v", base[2], got, want)
	}
	f.bench(8, base[0], now.Add(time.Second))
	if got, want := f.order(8, hosts, "n1", now.Add(2*time.Second)), []string{base[1], base[0], base[2]}; !slices.Equal(got, want) {
		t.Fatalf("two benched: %v, want %v (in the order they would be tried)", got, want)
	}
	// The penalty ends.
	if got := f.order(7, hosts, "n1", now.Add(benchPenalty+time.Second)); !slices.Equal(got, base) {
		t.Fatalf("after the penalty: %v, want %v", got, base)
	}
	if f.failovers != 2 {
		t.Fatalf("failovers %d, want 2", f.failovers)
	}
	// Expired penalties are dropped as others are added.
	f.bench(7, base[1], now.Add(time.Hour))
	if len(f.benched) != 1 {
		t.Fatalf("benched %v, want only %s", f.benched, base[1])
	}

	// Bounded: the sticky choices start afresh past maxSticky groups.
	for g := range uint64(maxSticky + 10) {
		f.answered(100+g, "n3")
	}
	if len(f.sticky) > maxSticky {
		t.Fatalf("%d sticky choices kept, want at most %d", len(f.sticky), maxSticky)
	}
}

func TestForwardAcceptBound(t *testing.T) {
	for _, c := range []struct{ election, want time.Duration }{
		{0, 750 * time.Millisecond}, // the default election timeout, 150 ms
		{50 * time.Millisecond, 500 * time.Millisecond},
		{300 * time.Millisecond, 1500 * time.Millisecond},
		{time.Second, 2 * time.Second},
	} {
		if got := ForwardAccept(c.election); got != c.want {
			t.Errorf("ForwardAccept(%s) = %s, want %s", c.election, got, c.want)
		}
	}
}
