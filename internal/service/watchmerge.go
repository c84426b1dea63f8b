package service

import (
	"sync"

	"github.com/dlock/dlock/internal/watch"
)

// merged is a stream over several shards' watchers: each part's events
// keep their order, the parts interleave as they come, and every event
// carries the resume vector as it stands after it.
type merged struct {
	parts []*Watcher
	out   chan watch.Event
	done  chan struct{} // closed when the stream ends
	stop  chan struct{} // closed by close
	once  sync.Once
	wg    sync.WaitGroup

	mu  sync.Mutex
	err error
}

type tagged struct {
	part int
	e    watch.Event
	ok   bool
}

// MergeWatchers merges the shards' watchers into one stream. shards[i] is
// parts[i]'s shard id and last[i] the revision it has delivered up to
// (its stream continues with last[i]+1). The stream ends when any part
// ends, with that part's error; Close closes every part.
func MergeWatchers(parts []*Watcher, shards []int, last []uint64) *Watcher {
	m := &merged{parts: parts, out: make(chan watch.Event, 64), done: make(chan struct{}), stop: make(chan struct{})}
	in := make(chan tagged)
	for i, p := range parts {
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			ch := p.Events()
			for {
				e, ok := <-ch
				select {
				case in <- tagged{part: i, e: e, ok: ok}:
				case <-m.stop:
					return
				}
				if !ok {
					return
				}
			}
		}()
	}
	vec := make([]watch.ShardRevision, len(parts))
	for i := range parts {
		vec[i] = watch.ShardRevision{Shard: shards[i], Revision: last[i]}
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer close(m.out)
		defer close(m.done)
		for {
			var t tagged
			select {
			case t = <-in:
			case <-m.stop:
				return
			}
			if !t.ok {
				m.mu.Lock()
				m.err = parts[t.part].Err()
				m.mu.Unlock()
				return
			}
			vec[t.part].Revision = t.e.Revision
			t.e.Shard = shards[t.part]
			t.e.Vector = append([]watch.ShardRevision(nil), vec...)
			select {
			case m.out <- t.e:
			case <-m.stop:
				return
			}
		}
	}()
	var rev uint64
	for _, l := range last {
		rev = max(rev, l)
	}
	return &Watcher{m: m, Revision: rev}
}

func (m *merged) close() {
	m.once.Do(func() {
		close(m.stop)
		for _, p := range m.parts {
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
