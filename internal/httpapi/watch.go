package httpapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/service"
)

// watch serves GET /api/v1/watch?prefix=P&from_revision=R as Server-Sent
// Events: one `id: <revision>` / `event: <type>` / `data: <json>` record per
// state change, a comment line as heartbeat, and a final `event: error` record
// when the stream is cut off (slow watcher, node shutting down).
func (a *api) watch(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		a.methodNotAllowed(w, r, allowStream)
		return
	}
	q, aerr := parseQuery(r, "prefix", "from_revision", "from_revisions")
	if aerr != nil {
		a.writeError(w, r, aerr)
		return
	}
	var req service.WatchRequest
	var err error
	if req.Prefix, err = command.ValidatePrefix(q.Get("prefix")); err != nil {
		a.writeError(w, r, badRequest("bad prefix: %v", err))
		return
	}
	if v, ok := q["from_revision"]; ok {
		if req.FromRevision, err = strconv.ParseUint(v[0], 10, 64); err != nil {
			a.writeError(w, r, badRequest("query parameter from_revision=%q must be a non-negative integer", v[0]))
			return
		}
	}
	if v, ok := q["from_revisions"]; ok {
		if req.FromRevisions, err = ParseRevisions(v[0]); err != nil {
			a.writeError(w, r, badRequest("query parameter from_revisions=%q: %v", v[0], err))
			return
		}
	}
	watcher, err := a.svc.Watch(r.Context(), req)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	defer watcher.Close()
	a.stream(w, r, watcher, watcher.Revision, func(e service.WatchEvent) (string, any) { return e.Type, e }, nil)
}

// startComment opens a stream: where it starts, so that a client whose
// stream breaks before its first event resumes there rather than at
// another node's now. A merged stream gives its per-shard place.
func startComment(watcher *service.Watcher, rev uint64) string {
	if len(watcher.Start) > 0 {
		parts := make([]string, len(watcher.Start))
		for i, s := range watcher.Start {
			parts[i] = fmt.Sprintf("%d:%d", s.Shard, s.Revision)
		}
		return "dlock watch from revisions " + strings.Join(parts, ",")
	}
	return fmt.Sprintf("dlock watch from revision %d", rev+1)
}

// observe streams an election's leader as SSE: the current view first, then a
// new view after each change (event `leader`; `leader` is null when there is
// none, so observers learn about vacancies too).
func (a *api) observe(w http.ResponseWriter, r *http.Request, name string, stale bool) {
	view, watcher, err := a.svc.Observe(r.Context(), name, stale)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	defer watcher.Close()
	v := *view
	a.stream(w, r, watcher, v.Revision, func(e service.WatchEvent) (string, any) { return "leader", nil }, &v)
}

// stream writes SSE records until the client leaves or the watcher ends. With
// view set it writes election views instead of raw events.
func (a *api) stream(w http.ResponseWriter, r *http.Request, watcher *service.Watcher, rev uint64,
	format func(service.WatchEvent) (string, any), view *service.ElectionView) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no") // tell nginx-style proxies not to buffer
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	a.streamDeadline(rc)
	fmt.Fprintf(w, ": %s\n\n", startComment(watcher, rev))
	if view != nil {
		writeRecord(w, view.Revision, "leader", view)
	}
	_ = rc.Flush()
	hb := time.NewTicker(a.heartbeat)
	defer hb.Stop()
	events := watcher.Events()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-hb.C:
			a.streamDeadline(rc)
			fmt.Fprint(w, ": heartbeat\n\n")
			if rc.Flush() != nil {
				return
			}
		case e, ok := <-events:
			a.streamDeadline(rc)
			// Drain what is already queued before one flush: fewer syscalls
			// under bursts, same order.
			for ok {
				ev := service.Event(e)
				if view != nil {
					*view = service.NextView(*view, e)
					writeRecord(w, ev.Revision, "leader", view)
				} else {
					typ, body := format(ev)
					if ev.Revisions != nil {
						writeRecordID(w, FormatRevisions(ev.Revisions), typ, body)
					} else {
						writeRecord(w, ev.Revision, typ, body)
					}
				}
				select {
				case e, ok = <-events:
					continue
				default:
				}
				break
			}
			if !ok {
				if err := watcher.Err(); err != nil {
					ae := apierror.From(err)
					writeRecord(w, 0, "error", errorEnvelope{Error: errorBody{Code: ae.Code, Message: ae.Message}})
				}
				_ = rc.Flush()
				return
			}
			if rc.Flush() != nil {
				return
			}
		}
	}
}

func writeRecord(w http.ResponseWriter, rev uint64, event string, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	if rev > 0 {
		fmt.Fprintf(w, "id: %d\n", rev)
	}
	fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, b)
}

func writeRecordID(w http.ResponseWriter, id string, event string, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	fmt.Fprintf(w, "id: %s\nevent: %s\ndata: %s\n\n", id, event, b)
}

// FormatRevisions writes a sharded stream's resume vector as its SSE id:
// "shard:revision" pairs in shard order, comma-separated.
func FormatRevisions(v map[string]uint64) string {
	ids := make([]int, 0, len(v))
	for k := range v {
		if n, err := strconv.Atoi(k); err == nil {
			ids = append(ids, n)
		}
	}
	slices.Sort(ids)
	var b strings.Builder
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%d:%d", id, v[strconv.Itoa(id)])
	}
	return b.String()
}

// maxShardsInVector bounds a hostile from_revisions.
const maxShardsInVector = 1024

// ParseRevisions reads from_revisions ("shard:revision,..."): per shard,
// the first revision wanted.
func ParseRevisions(s string) (map[int]uint64, error) {
	out := map[int]uint64{}
	for _, part := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(part, ":")
		if !ok {
			return nil, fmt.Errorf("want shard:revision pairs separated by commas, e.g. 0:12,1:40")
		}
		id, err := strconv.ParseUint(k, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("shard %q is not a shard id", k)
		}
		rev, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("revision %q is not a non-negative integer", v)
		}
		if _, dup := out[int(id)]; dup {
			return nil, fmt.Errorf("shard %d is given twice", id)
		}
		if len(out) >= maxShardsInVector {
			return nil, fmt.Errorf("more than %d shards", maxShardsInVector)
		}
		out[int(id)] = rev
	}
	return out, nil
}
