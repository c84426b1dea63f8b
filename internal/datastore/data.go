package datastore

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
)

// DefaultListLimit and MaxListLimit bound GET /data.
const (
	DefaultListLimit = 1000
	MaxListLimit     = 10000
)

func (s *Server) handleData(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", "use GET /data[?lock=NAME&limit=N]")
		return
	}
	lock, limit, err := parseDataQuery(r.URL.RawQuery)
	if err != nil {
		writeError(w, http.StatusBadRequest, codeInvalid, err.Error())
		return
	}
	recs, truncated, err := s.records.list(lock, limit)
	if err != nil {
		s.log.Error("reading records failed", "error", err)
		writeError(w, http.StatusInternalServerError, "internal", "could not read the records: "+err.Error())
		return
	}
	writeJSON(w, http.StatusOK, dataReply{Records: recs, Truncated: truncated})
}

// parseDataQuery refuses unknown or repeated parameters: a misspelt
// "?lok=" silently listing everything would hide the mistake.
func parseDataQuery(raw string) (lock string, limit int, err error) {
	q, err := url.ParseQuery(raw)
	if err != nil {
		return "", 0, fmt.Errorf("query string is malformed: %w", err)
	}
	for k, v := range q {
		if k != "lock" && k != "limit" {
			return "", 0, fmt.Errorf("unknown query parameter %q; GET /data accepts lock and limit", k)
		}
		if len(v) > 1 {
			return "", 0, fmt.Errorf("query parameter %q is given more than once", k)
		}
	}
	if v, ok := q["lock"]; ok {
		if lock, err = normalizeLock(v[0]); err != nil {
			return "", 0, fmt.Errorf("lock: %w", err)
		}
	}
	limit = DefaultListLimit
	if v, ok := q["limit"]; ok {
		n, err := strconv.Atoi(v[0])
		if err != nil || n < 1 || n > MaxListLimit {
			return "", 0, fmt.Errorf("limit=%q must be a whole number from 1 to %d", v[0], MaxListLimit)
		}
		limit = n
	}
	return lock, limit, nil
}
