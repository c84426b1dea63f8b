package service

import (
	"context"
	"slices"
	"sort"
	"sync"

	"github.com/dlock/dlock/internal/watch"
)

// merged is a stream over several shards' watchers: each part's events
// keep their order, the parts interleave as they come, and every event
// carries the resume vector as it stands after it. A part's split event
// (watch.KindSplit) adds the new shard's stream where the part's revisions
// hand over to it, so the stream follows the map as ranges split.
type merged struct {
	out    chan watch.Event
	done   chan struct{} // closed when the stream ends
	stop   chan struct{} // closed by close
	cancel context.CancelFunc
	ctx    context.Context
	in     chan tagged
	follow FollowSplit
	once   sync.Once
	wg     sync.WaitGroup

	mu    sync.Mutex
	parts []*Watcher
	err   error
}

type tagged struct {
	part int
	e    watch.Event
	ok   bool
}

// FollowSplit opens the stream of the shard split off at a split event: the
// Raft group it lives in (watch.Event.Token of a KindSplit event) from the
// revision after the split's (its revisions continue from there). It answers
// the new shard's id and watcher, or skip when its range does not meet the
// stream's prefix. It may wait (bounded) for this node to learn the new map.
type FollowSplit func(ctx context.Context, group, rev uint64) (id int, w *Watcher, skip bool, err error)

// MergeWatchers merges the shards' watchers into one stream. shards[i] is
// parts[i]'s shard id and last[i] the revision it has delivered up to
// (its stream continues with last[i]+1). The parts must stream their
// split events (WatchRequest.FollowSplits); follow adds each new shard
// (nil: split events are dropped). The stream ends when any part ends,
// with that part's error; Close closes every part.
func MergeWatchers(parts []*Watcher, shards []int, last []uint64, follow FollowSplit) *Watcher {
	ctx, cancel := context.WithCancel(context.Background())
	m := &merged{out: make(chan watch.Event, 64), done: make(chan struct{}), stop: make(chan struct{}),
		in: make(chan tagged), ctx: ctx, cancel: cancel, follow: follow}
	vec := make([]watch.ShardRevision, 0, len(parts))
	ids := make([]int, 0, len(parts))
	for i, p := range parts {
		m.add(p)
		ids = append(ids, shards[i])
		vec = append(vec, watch.ShardRevision{Shard: shards[i], Revision: last[i]})
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer close(m.out)
		defer close(m.done)
		for {
			var t tagged
			select {
			case t = <-m.in:
			case <-m.stop:
				return
			}
			if !t.ok {
				m.fail(m.part(t.part).Err())
				return
			}
			if t.e.Kind == watch.KindSplit {
				if m.follow == nil {
					continue
				}
				id, w, skip, err := m.follow(ctx, t.e.Token, t.e.Revision)
				if err != nil {
					m.fail(err)
					return
				}
				if skip {
					continue
				}
				if slices.Contains(ids, id) {
					// Resumed with the new shard's own revision as well:
					// its stream is there already.
					w.Close()
					continue
				}
				if !m.add(w) {
					return
				}
				ids = append(ids, id)
				vec = append(vec, watch.ShardRevision{Shard: id, Revision: t.e.Revision})
				sort.Slice(vec, func(a, b int) bool { return vec[a].Shard < vec[b].Shard })
				continue
			}
			for k := range vec {
				if vec[k].Shard == ids[t.part] {
					vec[k].Revision = t.e.Revision
				}
			}
			t.e.Shard = ids[t.part]
			t.e.Vector = append([]watch.ShardRevision(nil), vec...)
			select {
			case m.out <- t.e:
			case <-m.stop:
				return
			}
		}
	}()
	var rev uint64
	start := make([]watch.ShardRevision, len(last))
	for i, l := range last {
		rev = max(rev, l)
		start[i] = watch.ShardRevision{Shard: shards[i], Revision: l + 1}
	}
	sort.Slice(start, func(a, b int) bool { return start[a].Shard < start[b].Shard })
	return &Watcher{m: m, Revision: rev, Start: start}
}

// add starts feeding part p into the merge; false (p closed) once the
// stream is closing.
func (m *merged) add(p *Watcher) bool {
	m.mu.Lock()
	select {
	case <-m.stop:
		m.mu.Unlock()
		p.Close()
		return false
	default:
	}
	i := len(m.parts)
	m.parts = append(m.parts, p)
	m.wg.Add(1)
	m.mu.Unlock()
	go func() {
		defer m.wg.Done()
		ch := p.Events()
		for {
			e, ok := <-ch
			select {
			case m.in <- tagged{part: i, e: e, ok: ok}:
			case <-m.stop:
				return
			}
			if !ok {
				return
			}
		}
	}()
	return true
}

func (m *merged) part(i int) *Watcher {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.parts[i]
}

func (m *merged) fail(err error) {
	m.mu.Lock()
	m.err = err
	m.mu.Unlock()
}

func (m *merged) close() {
	m.once.Do(func() {
		m.cancel()
		m.mu.Lock()
		close(m.stop)
		parts := append([]*Watcher(nil), m.parts...)
		m.mu.Unlock()
		for _, p := range parts {
			p.Close()
		}
	})
	m.wg.Wait()
}

func (m *merged) error() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}
