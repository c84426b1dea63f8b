// Package shard routes dlock's API over the shards of a sharded cluster: N
// Raft groups, each a full dlock group with its own service, split by key
// range over the top-level segment of a name (docs/architecture.md, Shards).
// The Router implements the interface the protocol packages consume, so
// HTTP, gRPC and WebSocket route alike.
package shard

import (
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"strings"

	"github.com/dlock/dlock/internal/command"
)

// MaxShards bounds --shards: each shard is a Raft group with its own
// goroutines, heartbeats and memory on every node.
const MaxShards = 64

// Map is the shard map: range k holds the names whose top-level segment s
// has Bounds[k] <= s < Bounds[k+1] (byte order; Bounds[0] is "", the last
// range is open), in Raft group Groups[k], shown as shard IDs[k].
// Generation counts its changes (1: as created); a split inserts a range
// (with the next unused id) and adds one.
type Map struct {
	Bounds     []string
	IDs        []int
	Groups     []uint64
	Generation uint64
}

// DefaultBounds splits the lower-case letters evenly into n ranges (names
// below "a" — digits, upper case — fall in shard 0).
func DefaultBounds(n int) []string {
	b := []string{""}
	for k := 1; k < n; k++ {
		b = append(b, string(rune('a'+26*k/n)))
	}
	return b
}

// NewMap checks bounds (the first "", then strictly rising, each a valid
// top-level segment) and returns generation 1 of the map.
func NewMap(bounds []string) (Map, error) {
	if len(bounds) == 0 || bounds[0] != "" {
		return Map{}, fmt.Errorf("a shard map starts with the empty bound")
	}
	if len(bounds) > MaxShards {
		return Map{}, fmt.Errorf("%d shards; the limit is %d", len(bounds), MaxShards)
	}
	for i := 1; i < len(bounds); i++ {
		b := bounds[i]
		if n, err := command.NormalizeName(b); err != nil || n != b || strings.Contains(b, "/") {
			return Map{}, fmt.Errorf("shard bound %q must be one name segment ([A-Za-z0-9._:-]+)", b)
		}
		if b <= bounds[i-1] {
			return Map{}, fmt.Errorf("shard bounds must rise: %q is not above %q", b, bounds[i-1])
		}
	}
	m := Map{Bounds: append([]string(nil), bounds...), Generation: 1}
	for k := range bounds {
		m.IDs = append(m.IDs, k)
		m.Groups = append(m.Groups, m.initialGroup(k))
	}
	return m, nil
}

// FromRanges is the map the meta group holds (command.SetShardMap).
func FromRanges(gen uint64, rs []command.ShardRange) Map {
	m := Map{Generation: gen}
	for _, r := range rs {
		m.Bounds = append(m.Bounds, r.Start)
		m.IDs = append(m.IDs, int(r.ID))
		m.Groups = append(m.Groups, r.Group)
	}
	return m
}

// Ranges is the map as the meta group stores it.
func (m Map) Ranges() []command.ShardRange {
	out := make([]command.ShardRange, len(m.Bounds))
	for k := range m.Bounds {
		out[k] = command.ShardRange{Start: m.Bounds[k], ID: uint64(m.IDs[k]), Group: m.Groups[k]}
	}
	return out
}

// IndexOf is the range of shard id, or -1.
func (m Map) IndexOf(id int) int {
	for k, x := range m.IDs {
		if x == id {
			return k
		}
	}
	return -1
}

// IndexOfGroup is the range in Raft group g, or -1.
func (m Map) IndexOfGroup(g uint64) int {
	for k, x := range m.Groups {
		if x == g {
			return k
		}
	}
	return -1
}

// CheckSplitPoint checks a split point given by an operator against the
// map: one name segment strictly inside some range (not one of the
// bounds). It returns that range.
func (m Map) CheckSplitPoint(at string) (int, error) {
	if n, err := command.NormalizeName(at); err != nil || n != at || at == "" || strings.Contains(at, "/") {
		return -1, fmt.Errorf("split point %q must be one name segment ([A-Za-z0-9._:-]+, no \"/\"): ranges split between top-level segments", at)
	}
	k := m.Lookup(at)
	if m.Bounds[k] == at {
		return -1, fmt.Errorf("%q is already where shard %d begins; pick a point inside a range", at, m.IDs[k])
	}
	if len(m.Bounds) >= MaxRanges {
		return -1, fmt.Errorf("the map has %d ranges, the limit", len(m.Bounds))
	}
	return k, nil
}

// MaxRanges bounds the map's ranges, splits included (state.MaxShardRanges).
const MaxRanges = 256

// Split is the next generation of the map: range k (the one holding at)
// ends at at, and a new range from at, with the next unused shard id, lives
// in Raft group child. The source must be group src, or the map is not the
// one the split was made on.
func (m Map) Split(src uint64, at string, child uint64) (Map, error) {
	k, err := m.CheckSplitPoint(at)
	if err != nil {
		return Map{}, err
	}
	if m.Groups[k] != src {
		return Map{}, fmt.Errorf("%q lies in group %d, not the split's source %d", at, m.Groups[k], src)
	}
	next := 0
	for _, id := range m.IDs {
		next = max(next, id+1)
	}
	out := Map{Generation: m.Generation + 1}
	out.Bounds = append(append(append([]string(nil), m.Bounds[:k+1]...), at), m.Bounds[k+1:]...)
	out.IDs = append(append(append([]int(nil), m.IDs[:k+1]...), next), m.IDs[k+1:]...)
	out.Groups = append(append(append([]uint64(nil), m.Groups[:k+1]...), child), m.Groups[k+1:]...)
	return out, nil
}

// ChildGroup is the Raft group id of the range split off group src at at:
// every node that proposes or follows the split derives the same one.
func ChildGroup(src uint64, at string) uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "dlock shard split\x00%d\x00%s", src, at)
	return groupID(h.Sum64())
}

// MetaGroup is the Raft group id of the meta group, which holds the map.
func (m Map) MetaGroup() uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "dlock shard meta\x00%d\x00%s", m.Generation, strings.Join(m.Bounds, "\x00"))
	return groupID(h.Sum64())
}

func groupID(h uint64) uint64 {
	g := h >> 1
	if g < 2 {
		g += 2
	}
	return g
}

// ParseBounds reads --shard-bounds: the bounds after the empty first one,
// comma-separated ("g,n,t" makes 4 shards).
func ParseBounds(s string) (Map, error) {
	return NewMap(append([]string{""}, strings.Split(s, ",")...))
}

// N is the number of shards.
func (m Map) N() int { return len(m.Bounds) }

// Range is shard k's range: [start, end), end "" for the open last one.
func (m Map) Range(k int) (start, end string) {
	if k+1 < len(m.Bounds) {
		return m.Bounds[k], m.Bounds[k+1]
	}
	return m.Bounds[k], ""
}

// top is a name's top-level segment (a leading "/" is not significant).
func top(name string) string { return command.TopSegment(name) }

// Lookup is the shard of a name (or of an election's name).
func (m Map) Lookup(name string) int {
	s := top(name)
	k := 0
	for i := 1; i < len(m.Bounds); i++ {
		if s >= m.Bounds[i] {
			k = i
		}
	}
	return k
}

// Overlap lists, in order, the shards that can hold a name starting with
// prefix: one when the prefix names a whole top-level segment (it has a
// "/"), else those whose range meets the segments starting with it.
func (m Map) Overlap(prefix string) []int {
	prefix = strings.TrimPrefix(prefix, "/")
	if strings.Contains(prefix, "/") {
		return []int{m.Lookup(prefix)}
	}
	var out []int
	for k := range m.Bounds {
		start, end := m.Range(k)
		// Segments with the prefix are [prefix, prefix+0xff...): they meet
		// [start, end) unless they all lie below start or at/above end.
		if prefix < start && !strings.HasPrefix(start, prefix) {
			continue
		}
		if end != "" && prefix >= end {
			continue
		}
		out = append(out, k)
	}
	return out
}

// Group is range k's Raft group id.
func (m Map) Group(k int) uint64 {
	if k < len(m.Groups) {
		return m.Groups[k]
	}
	return m.initialGroup(k)
}

// initialGroup is shard k's Raft group id: a hash of the whole map and k. Nodes
// started with different maps (a mistyped --shard-bounds on one of them)
// would route one name to different shards, and two shards could each
// grant it; with the map in the group id their groups are different Raft
// groups, so the odd node's never reach a quorum and it serves nothing
// instead of a second holder. Ids 0 and 1 are never used (1 is a one-group
// node's group).
func (m Map) initialGroup(k int) uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "dlock shard map\x00%d\x00%s\x00%d", m.Generation, strings.Join(m.Bounds, "\x00"), k)
	return groupID(h.Sum64())
}

// mapFile records a data dir's shard map, one bound a line after the
// generation: a node never routes by another map than its data dir's.
const mapFile = "SHARDS"

// CheckDataDir records the initial map m in a new data dir and refuses a
// dir made with another one (later ranges come from the meta group).
func CheckDataDir(dir string, m Map) error {
	want := fmt.Sprintf("generation %d\n%s\n", m.Generation, strings.Join(m.Bounds[1:], "\n"))
	path := filepath.Join(dir, mapFile)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		if string(b) != want {
			return fmt.Errorf("data dir %s was created with another shard map (%s: %q); start with the same --shards/--shard-bounds as its first start (ranges change online with dlock shards split, never by flags)", dir, path, strings.TrimSpace(string(b)))
		}
		return nil
	case os.IsNotExist(err):
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
		if entries, _ := os.ReadDir(filepath.Join(dir, "raftlog")); len(entries) > 0 {
			return fmt.Errorf("data dir %s holds a one-group cluster; starting it with shards is not built yet (keep --shards 1)", dir)
		}
		return os.WriteFile(path, []byte(want), 0o640)
	default:
		return fmt.Errorf("read %s: %w", path, err)
	}
}

// CheckOneGroup refuses to open a sharded data dir as one group: the
// default group is not among a sharded dir's groups, so the node would
// start an empty cluster beside the real one.
func CheckOneGroup(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, mapFile))
	switch {
	case err == nil:
		return fmt.Errorf("data dir %s belongs to a sharded cluster (%s: %q); start it with the same --shards/--shard-bounds as its first start", dir, mapFile, strings.TrimSpace(string(b)))
	case os.IsNotExist(err):
		return nil
	default:
		return fmt.Errorf("read %s: %w", filepath.Join(dir, mapFile), err)
	}
}
