// Package shard routes dlock's API over the shards of a sharded cluster: N
// Raft groups, each a full dlock group with its own service, split by key
// range over the top-level segment of a name (docs/architecture.md, Shards).
// The Router implements the interface the protocol packages consume, so
// HTTP, gRPC and WebSocket route alike.
package shard

import (
	"fmt"
	"hash/fnv"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
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
// (with the next unused id) and adds one, and so does each step of a move.
//
// Replicas[k] are the ids of the nodes that run range k's group, sorted
// (nil: every node of the initial cluster, as in maps from before replica
// sets); Leaving[k] is the one a move is taking off it ("" when none).
type Map struct {
	Bounds     []string
	IDs        []int
	Groups     []uint64
	Replicas   [][]string
	Leaving    []string
	Generation uint64
	// Removing are the nodes whose removal from the cluster began, oldest
	// first: no range may list one (the meta group refuses such a map), so
	// a move onto one is refused (BeginMove).
	Removing []string
	// Placement, on a map given by flags, asks for each range on that many
	// nodes (Place); 0 is every node.
	Placement int
	placedOn  []string // the nodes Place placed the ranges on
}

// RecordedNodes are the nodes a data dir's initial map was placed on
// (CheckDataDir; nil: none recorded, every range on every node).
func RecordedNodes(dir string) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(dir, mapFile))
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", filepath.Join(dir, mapFile), err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "nodes "); ok {
			return strings.Split(rest, ","), nil
		}
	}
	return nil, nil
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
	m.Replicas, m.Leaving = make([][]string, len(bounds)), make([]string, len(bounds))
	return m, nil
}

// Place puts each range of a new map on r of the nodes (ids), round-robin
// over them sorted: range k on the r nodes from k mod their number on. r 0
// or at least their number leaves every range on every node.
func (m Map) Place(nodes []string, r int) (Map, error) {
	if r <= 0 || r >= len(nodes) {
		return m, nil
	}
	if r > command.MaxReplicas {
		return Map{}, fmt.Errorf("%d replicas per shard; the limit is %d", r, command.MaxReplicas)
	}
	ids := slices.Sorted(slices.Values(nodes))
	out := m
	out.placedOn = ids
	out.Replicas = make([][]string, len(m.Bounds))
	for k := range m.Bounds {
		var set []string
		for i := range r {
			set = append(set, ids[(k+i)%len(ids)])
		}
		slices.Sort(set)
		out.Replicas[k] = set
	}
	return out, nil
}

// Hosts are the nodes that run range k's group: its replica set, or all
// (the initial cluster's ids) when it has none.
func (m Map) Hosts(k int, all []string) []string {
	if k < len(m.Replicas) && len(m.Replicas[k]) > 0 {
		return m.Replicas[k]
	}
	return slices.Sorted(slices.Values(all))
}

// Hosted reports whether node id runs range k's group.
func (m Map) Hosted(k int, id string, all []string) bool {
	return slices.Contains(m.Hosts(k, all), id)
}

// leaving is range k's leaving replica ("" when no move is in flight).
func (m Map) leaving(k int) string {
	if k < len(m.Leaving) {
		return m.Leaving[k]
	}
	return ""
}

// MoveError is a move the map refuses: Conflict when another move of the
// shard is in flight (or the move is done), else bad input.
type MoveError struct {
	Conflict bool
	Msg      string
}

func (e *MoveError) Error() string { return e.Msg }

// BeginMove is the next generation of the map with shard id's replica set
// grown by to and from marked leaving: the first step of moving the
// replica on from to to. nodes are the cluster's node ids, all the initial
// cluster's (for a range with no replica set). It refuses bad input.
func (m Map) BeginMove(id int, from, to string, nodes, all []string) (Map, error) {
	k := m.IndexOf(id)
	switch {
	case k < 0:
		return Map{}, &MoveError{Msg: fmt.Sprintf("no shard %d; the shards are %v (GET /api/v1/cluster)", id, m.IDs)}
	case from == "" || to == "":
		return Map{}, &MoveError{Msg: "a move needs from and to: the ids of the node giving up the replica and of the node taking it"}
	case from == to:
		return Map{}, &MoveError{Msg: fmt.Sprintf("from and to are both %q; name two nodes", from)}
	case !slices.Contains(nodes, to):
		return Map{}, &MoveError{Msg: fmt.Sprintf("no node %q in the cluster; the nodes are %v", to, nodes)}
	case slices.Contains(m.Removing, to):
		return Map{}, &MoveError{Conflict: true, Msg: fmt.Sprintf("node %q is being removed from the cluster (a removal of it began, and its member may already be gone); finish the removal (DELETE /api/v1/cluster/members/%s again, or dlock members remove), or add the node to the cluster again (dlock members add) before moving a replica onto it", to, to)}
	case m.leaving(k) != "":
		return Map{}, &MoveError{Conflict: true, Msg: fmt.Sprintf("shard %d is already moving its replica on %s; wait until that move is done (GET /api/v1/cluster)", id, m.leaving(k))}
	}
	hosts := m.Hosts(k, all)
	switch {
	case !slices.Contains(hosts, from):
		return Map{}, &MoveError{Msg: fmt.Sprintf("node %q is not a replica of shard %d; its replicas are %v (a move from it that was sent before is done)", from, id, hosts)}
	case slices.Contains(hosts, to):
		return Map{}, &MoveError{Conflict: true, Msg: fmt.Sprintf("node %q is already a replica of shard %d (its replicas are %v)", to, id, hosts)}
	case len(hosts) >= command.MaxReplicas:
		return Map{}, &MoveError{Msg: fmt.Sprintf("shard %d has %d replicas, the limit", id, len(hosts))}
	}
	out := m.clone()
	out.Generation++
	out.Replicas[k] = slices.Sorted(slices.Values(append(slices.Clone(hosts), to)))
	out.Leaving[k] = from
	return out, nil
}

// EndMove is the next generation of the map with range k's leaving
// replica gone: the last step of a move.
func (m Map) EndMove(k int) Map {
	out := m.clone()
	out.Generation++
	gone := out.Leaving[k]
	out.Replicas[k] = slices.DeleteFunc(slices.Clone(out.Replicas[k]), func(id string) bool { return id == gone })
	out.Leaving[k] = ""
	return out
}

// MoveTarget is the replica a move in flight on range k adds: the one of
// its replicas the group's voters (config) lack; "" when none does.
func (m Map) MoveTarget(k int, config []string) string {
	if m.leaving(k) == "" {
		return ""
	}
	for _, id := range m.Hosts(k, nil) {
		if !slices.Contains(config, id) {
			return id
		}
	}
	return ""
}

// LeavingReplica is range k's leaving replica ("" when no move is in flight).
func (m Map) LeavingReplica(k int) string { return m.leaving(k) }

func (m Map) clone() Map {
	out := Map{Bounds: slices.Clone(m.Bounds), IDs: slices.Clone(m.IDs), Groups: slices.Clone(m.Groups), Generation: m.Generation,
		Replicas: make([][]string, len(m.Bounds)), Leaving: make([]string, len(m.Bounds)), Removing: slices.Clone(m.Removing)}
	for k := range m.Bounds {
		if k < len(m.Replicas) {
			out.Replicas[k] = slices.Clone(m.Replicas[k])
		}
		out.Leaving[k] = m.leaving(k)
	}
	return out
}

// FromRanges is the map the meta group holds (command.SetShardMap).
func FromRanges(gen uint64, rs []command.ShardRange) Map {
	m := Map{Generation: gen}
	for _, r := range rs {
		m.Bounds = append(m.Bounds, r.Start)
		m.IDs = append(m.IDs, int(r.ID))
		m.Groups = append(m.Groups, r.Group)
		m.Replicas = append(m.Replicas, slices.Clone(r.Replicas))
		m.Leaving = append(m.Leaving, r.Leaving)
	}
	return m
}

// Ranges is the map as the meta group stores it.
func (m Map) Ranges() []command.ShardRange {
	out := make([]command.ShardRange, len(m.Bounds))
	for k := range m.Bounds {
		out[k] = command.ShardRange{Start: m.Bounds[k], ID: uint64(m.IDs[k]), Group: m.Groups[k], Leaving: m.leaving(k)}
		if k < len(m.Replicas) {
			out[k].Replicas = slices.Clone(m.Replicas[k])
		}
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
	// The split-off range runs on the nodes that ran its source: they
	// are the ones that applied the split.
	c := m.clone()
	out := Map{Generation: m.Generation + 1, Removing: c.Removing}
	out.Bounds = append(append(append([]string(nil), m.Bounds[:k+1]...), at), m.Bounds[k+1:]...)
	out.IDs = append(append(append([]int(nil), m.IDs[:k+1]...), next), m.IDs[k+1:]...)
	out.Groups = append(append(append([]uint64(nil), m.Groups[:k+1]...), child), m.Groups[k+1:]...)
	out.Replicas = append(append(append([][]string(nil), c.Replicas[:k+1]...), slices.Clone(c.Replicas[k])), c.Replicas[k+1:]...)
	out.Leaving = append(append(append([]string(nil), c.Leaving[:k+1]...), ""), c.Leaving[k+1:]...)
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
	if m.placedOn != nil {
		want += "nodes " + strings.Join(m.placedOn, ",") + "\n"
	}
	for k := range m.Replicas {
		// A placement (--shard-replicas) is part of the initial map; a dir
		// made without one reads as before.
		if len(m.Replicas[k]) > 0 {
			want += fmt.Sprintf("replicas %d %s\n", k, strings.Join(m.Replicas[k], ","))
		}
	}
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

// movedFile lists, one a line, the Raft groups moved off this data dir's
// node: their data is gone, and an initial range among them must never be
// bootstrapped again on a later start.
const movedFile = "MOVED"

// MovedGroups are the groups recorded with RecordMoved.
func MovedGroups(dir string) (map[uint64]bool, error) {
	b, err := os.ReadFile(filepath.Join(dir, movedFile))
	if os.IsNotExist(err) {
		return map[uint64]bool{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", filepath.Join(dir, movedFile), err)
	}
	out := map[uint64]bool{}
	for _, line := range strings.Fields(string(b)) {
		g, err := strconv.ParseUint(line, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: bad line %q", filepath.Join(dir, movedFile), line)
		}
		out[g] = true
	}
	return out, nil
}

// RecordMoved adds group g to the moved groups, durably, before its data
// is deleted.
func RecordMoved(dir string, g uint64) error {
	moved, err := MovedGroups(dir)
	if err != nil || moved[g] {
		return err
	}
	moved[g] = true
	var lines []string
	for _, x := range slices.Sorted(maps.Keys(moved)) {
		lines = append(lines, strconv.FormatUint(x, 10))
	}
	return writeSynced(filepath.Join(dir, movedFile), strings.Join(lines, "\n")+"\n")
}

// writeSynced replaces the file at path with data, durably.
func writeSynced(path, data string) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o640)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
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

// Explicit is the next generation of the map with every range that has no
// replica set given one: all, the initial cluster's nodes it ran on. ok is
// false when every range has one already (nothing to commit). A cluster
// that grows past its initial nodes needs this first: "no replica set"
// means the initial nodes, and a node that joins later must never be read
// as one of them.
func (m Map) Explicit(all []string) (out Map, ok bool, err error) {
	out = m.clone()
	for k := range out.Bounds {
		if len(out.Replicas[k]) > 0 {
			continue
		}
		if len(all) == 0 {
			return Map{}, false, fmt.Errorf("shard %d has no replica set, and this node does not know the initial cluster's nodes", m.IDs[k])
		}
		if len(all) > command.MaxReplicas {
			return Map{}, false, fmt.Errorf("shard %d runs on the %d initial nodes, more than the %d replicas a range may list; move replicas off some of them first", m.IDs[k], len(all), command.MaxReplicas)
		}
		out.Replicas[k] = slices.Sorted(slices.Values(all))
		ok = true
	}
	if !ok {
		return m, false, nil
	}
	out.Generation++
	return out, true, nil
}

// BeginRemoval is the next generation of the map with node id among the
// nodes being removed: the first step of removing it from the cluster.
// The caller has checked that no range lists it (Held); the meta group
// refuses the map otherwise. When the list is full, the oldest entries
// that are no longer members (members: the meta group's) make room: their
// removals finished long ago. ok is false when id is being removed
// already (nothing to commit).
func (m Map) BeginRemoval(id string, members []string) (out Map, ok bool, err error) {
	if slices.Contains(m.Removing, id) {
		return m, false, nil
	}
	out = m.clone()
	for len(out.Removing) >= command.MaxRemoving {
		i := slices.IndexFunc(out.Removing, func(x string) bool { return !slices.Contains(members, x) })
		if i < 0 {
			return Map{}, false, fmt.Errorf("%d removals are unfinished, the limit; finish one of them first (remove %s again)", len(out.Removing), out.Removing[0])
		}
		out.Removing = slices.Delete(out.Removing, i, i+1)
	}
	out.Removing = append(out.Removing, id)
	out.Generation++
	return out, true, nil
}

// EndRemoval is the next generation of the map with node id no longer
// being removed (it joins again); ok is false when it is not (nothing to
// commit).
func (m Map) EndRemoval(id string) (out Map, ok bool) {
	if !slices.Contains(m.Removing, id) {
		return m, false
	}
	out = m.clone()
	out.Removing = slices.DeleteFunc(out.Removing, func(x string) bool { return x == id })
	out.Generation++
	return out, true
}

// Held lists, in map order, the shards node id runs or is leaving (all:
// the initial cluster's nodes, for a range with no replica set).
func (m Map) Held(id string, all []string) []int {
	var out []int
	for k := range m.Bounds {
		if m.Hosted(k, id, all) || m.leaving(k) == id {
			out = append(out, m.IDs[k])
		}
	}
	return out
}

// startFile records how a sharded node first started: "initial" with the
// ids of the initial cluster, or "joined" (it joined a running cluster
// with --join). A joined node must never count itself among the initial
// nodes, which run every range that has no replica set; and a restart
// without --initial-cluster must still know which nodes those are, though
// the meta group's members have grown since.
const startFile = "START"

// ReadStart reads the start record (nothing recorded: both zero).
func ReadStart(dir string) (initial []string, joined bool, err error) {
	path := filepath.Join(dir, startFile)
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("read %s: %w", path, err)
	}
	line := strings.TrimSpace(string(b))
	if line == "joined" {
		return nil, true, nil
	}
	if rest, ok := strings.CutPrefix(line, "initial "); ok && rest != "" {
		return strings.Split(rest, ","), false, nil
	}
	return nil, false, fmt.Errorf("%s: unreadable start record %q", path, line)
}

// RecordStart writes the start record: the initial cluster's ids, or
// joined when initial is empty.
func RecordStart(dir string, initial []string) error {
	line := "joined\n"
	if len(initial) > 0 {
		line = "initial " + strings.Join(slices.Sorted(slices.Values(initial)), ",") + "\n"
	}
	path := filepath.Join(dir, startFile)
	if b, err := os.ReadFile(path); err == nil && string(b) == line {
		return nil
	}
	return writeSynced(path, line)
}

// Fresh reports whether dir has never been started as a sharded node.
func Fresh(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, mapFile))
	return os.IsNotExist(err)
}
