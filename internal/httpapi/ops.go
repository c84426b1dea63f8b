package httpapi

import (
	"net/http"
	"strconv"

	"github.com/dlock/dlock/internal/service"
)

// historyPrefix is GET /api/v1/history/{name}: a route of its own, since a
// GET under /locks/ names a lock whatever its last segment.
const historyPrefix = apiPrefix + "/history"

// actionRevoke is POST /api/v1/locks/{name}/revoke (and elections').
const actionRevoke = "revoke"

// history serves GET /api/v1/history/{name}?limit=N&kind=lock|election&stale.
func (a *api) history(w http.ResponseWriter, r *http.Request, rest string) {
	if !isGet(r) {
		a.methodNotAllowed(w, r, allowGet)
		return
	}
	q, aerr := parseQuery(r, "limit", "kind", "stale")
	if aerr != nil {
		a.writeError(w, r, aerr)
		return
	}
	req := service.HistoryRequest{}
	if req.Stale, aerr = parseStale(q); aerr != nil {
		a.writeError(w, r, aerr)
		return
	}
	switch k := q.Get("kind"); k {
	case "", "lock":
	case "election":
		req.Election = true
	default:
		a.writeError(w, r, badRequest("query parameter kind=%q must be lock or election", k))
		return
	}
	if s, ok := q["limit"]; ok {
		// The range is the service's to enforce; the syntax is checked here.
		n, err := strconv.ParseUint(s[0], 10, 31)
		if err != nil {
			a.writeError(w, r, badRequest("query parameter limit=%q must be a non-negative integer (at most %d)", s[0], service.MaxHistoryLimit))
			return
		}
		req.Limit = int(n)
	}
	if req.Name, aerr = lockName(rest); aerr != nil {
		a.writeError(w, r, aerr)
		return
	}
	resp, err := a.svc.History(r.Context(), req)
	if err == nil {
		staleHeaders(w, resp.Stale)
	}
	reply(a, w, r, http.StatusOK, resp, err)
}
