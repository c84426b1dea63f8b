package service

import (
	"sync"
)

// watchSlots counts the open watch and observe streams of this node, in
// total and per client connection, for --max-watchers and
// --max-watchers-per-conn. Each stream holds a slot from its start until its
// protocol handler closes it; a stream the hub cut off (a slow reader) keeps
// its slot until then, since its handler still holds the connection.
type watchSlots struct {
	maxTotal, maxPerConn int // 0: no limit

	mu     sync.Mutex
	total  int
	byConn map[string]int // only connections that hold a slot
}

func newWatchSlots(maxTotal, maxPerConn int) *watchSlots {
	return &watchSlots{maxTotal: maxTotal, maxPerConn: maxPerConn, byConn: map[string]int{}}
}

// take reserves a slot for a stream on conn ("" when the caller has no
// connection, e.g. an in-process caller: only the node total applies). It
// returns the release func, or which limit refused it.
func (w *watchSlots) take(conn string) (release func(), refused string, n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.maxTotal > 0 && w.total >= w.maxTotal {
		return nil, limitWatchers, w.total
	}
	if conn != "" && w.maxPerConn > 0 && w.byConn[conn] >= w.maxPerConn {
		return nil, limitWatchersPerConn, w.byConn[conn]
	}
	w.total++
	if conn != "" {
		w.byConn[conn]++
	}
	var once sync.Once
	return func() { once.Do(func() { w.put(conn) }) }, "", 0
}

func (w *watchSlots) put(conn string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.total--
	if conn == "" {
		return
	}
	if w.byConn[conn]--; w.byConn[conn] <= 0 {
		delete(w.byConn, conn)
	}
}
