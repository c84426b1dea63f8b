package state

import "sort"

// NameSet is a set of lock names, each with a number (a wait's sequence; 0
// for a held lock). It is what a lease holds and waits for. An implicit lease
// has exactly one name in all and most sessions have few, so the first name
// lives inline and a map is made only when a second one comes: a million
// held locks then cost no map each (two maps per lease were the largest item
// of a held lock's memory, docs/benchmarks.md).
type NameSet struct {
	name string // the inline name; "" when none (lock names are never empty)
	seq  uint64
	more map[string]uint64 // once made, every name lives here
}

// Len is the number of names.
func (n *NameSet) Len() int {
	if n.more != nil {
		return len(n.more)
	}
	if n.name != "" {
		return 1
	}
	return 0
}

// Get returns a name's number, if the name is in the set.
func (n *NameSet) Get(name string) (uint64, bool) {
	if n.more != nil {
		seq, ok := n.more[name]
		return seq, ok
	}
	if name != "" && n.name == name {
		return n.seq, true
	}
	return 0, false
}

// Has reports whether the name is in the set.
func (n *NameSet) Has(name string) bool {
	_, ok := n.Get(name)
	return ok
}

// Set adds a name or changes its number.
func (n *NameSet) Set(name string, seq uint64) {
	switch {
	case n.more != nil:
		n.more[name] = seq
	case n.name == "" || n.name == name:
		n.name, n.seq = name, seq
	default:
		n.more = map[string]uint64{n.name: n.seq, name: seq}
		n.name, n.seq = "", 0
	}
}

// Delete removes a name.
func (n *NameSet) Delete(name string) {
	if n.more != nil {
		delete(n.more, name)
		return
	}
	if name != "" && n.name == name {
		n.name, n.seq = "", 0
	}
}

// Sorted returns the names in order, so replicas that walk them act alike.
func (n *NameSet) Sorted() []string {
	if n.more == nil {
		if n.name != "" {
			return []string{n.name}
		}
		return nil
	}
	out := make([]string, 0, len(n.more))
	for name := range n.more {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// LeaseNames is one kind of a lease's names: the locks it holds (number 0 in
// the set) or the ones it waits for (the wait's sequence, never 0).
type LeaseNames struct {
	set  *NameSet
	held bool
}

func (v LeaseNames) kind(seq uint64) bool { return (seq == 0) == v.held }

// Get returns a name's number if the name is of this kind.
func (v LeaseNames) Get(name string) (uint64, bool) {
	seq, ok := v.set.Get(name)
	if !ok || !v.kind(seq) {
		return 0, false
	}
	return seq, true
}

// Has reports whether the name is of this kind.
func (v LeaseNames) Has(name string) bool {
	_, ok := v.Get(name)
	return ok
}

// Set adds a name of this kind (a held lock's number is always 0).
func (v LeaseNames) Set(name string, seq uint64) {
	if v.held {
		seq = 0
	}
	v.set.Set(name, seq)
}

// Delete removes a name if it is of this kind.
func (v LeaseNames) Delete(name string) {
	if v.Has(name) {
		v.set.Delete(name)
	}
}

// Sorted returns the names of this kind in order.
func (v LeaseNames) Sorted() []string {
	all := v.set.Sorted()
	out := all[:0]
	for _, name := range all {
		if v.Has(name) {
			out = append(out, name)
		}
	}
	return out
}

// Len is the number of names of this kind.
func (v LeaseNames) Len() int {
	if v.set.more == nil {
		if v.set.name != "" && v.kind(v.set.seq) {
			return 1
		}
		return 0
	}
	n := 0
	for _, seq := range v.set.more {
		if v.kind(seq) {
			n++
		}
	}
	return n
}
