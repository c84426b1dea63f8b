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
