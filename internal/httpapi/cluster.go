package httpapi

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/dlock/dlock/fence"
	"github.com/dlock/dlock/internal/apierror"
)

const clusterPrefix = apiPrefix + "/cluster"

// clusterRoutes serves /api/v1/cluster, /cluster/members[/{id}],
// /cluster/snapshot, /cluster/token-key[/rotate],
// /cluster/leadership-transfer and /cluster/shards/split.
func (a *api) clusterRoutes(w http.ResponseWriter, r *http.Request, rest string) {
	switch {
	case rest == "":
		a.cluster(w, r)
	case rest == "/members":
		if !a.plainPost(w, r) {
			return
		}
		decodeAndCall(a, w, r, http.StatusOK, true, nil, a.svc.AddMember)
	case rest == "/snapshot":
		if !isGet(r) {
			a.methodNotAllowed(w, r, allowGet)
			return
		}
		if _, aerr := parseQuery(r); aerr != nil {
			a.writeError(w, r, aerr)
			return
		}
		b, rev, err := a.svc.Snapshot(r.Context())
		if err != nil {
			a.writeError(w, r, err)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("X-Dlock-Revision", strconv.FormatUint(rev, 10))
		w.WriteHeader(http.StatusOK)
		a.writeChunked(w, b)
	case rest == "/token-key":
		a.keyDoc(w, r, isGet(r), allowGet, a.svc.TokenKeys)
	case rest == "/token-key/rotate":
		// The body is optional: none (or {}) rotates, keeping the retired
		// keys; {"revoke_retired":true} drops them as well.
		if !a.plainPost(w, r) {
			return
		}
		decodeAndCall(a, w, r, http.StatusOK, false, nil, a.svc.RotateTokenKey)
	case rest == "/shards/split":
		if !a.plainPost(w, r) {
			return
		}
		decodeAndCall(a, w, r, http.StatusOK, true, nil, a.svc.SplitShard)
	case rest == "/shards/move":
		if !a.plainPost(w, r) {
			return
		}
		decodeAndCall(a, w, r, http.StatusOK, true, nil, a.svc.MoveShard)
	case rest == "/leadership-transfer":
		if !a.plainPost(w, r) {
			return
		}
		decodeAndCall(a, w, r, http.StatusOK, false, nil, a.svc.TransferLeadership)
	default:
		id, ok := cutMember(rest)
		if !ok {
			a.notFound(w, r)
			return
		}
		if r.Method != http.MethodDelete {
			a.methodNotAllowed(w, r, allowDelete)
			return
		}
		if _, aerr := parseQuery(r); aerr != nil {
			a.writeError(w, r, aerr)
			return
		}
		raw, err := url.PathUnescape(id)
		if err != nil || raw == "" {
			a.writeError(w, r, apierror.New(apierror.InvalidArgument, "member id in the path is empty or badly escaped"))
			return
		}
		info, err := a.svc.RemoveMember(r.Context(), raw)
		reply(a, w, r, http.StatusOK, info, err)
	}
}

func cutMember(rest string) (string, bool) {
	const p = "/members/"
	if len(rest) <= len(p) || rest[:len(p)] != p {
		return "", false
	}
	id := rest[len(p):]
	for i := 0; i < len(id); i++ {
		if id[i] == '/' {
			return "", false
		}
	}
	return id, true
}

// keyDoc answers GET /cluster/token-key: no body, no query, the key-set
// document (fence.KeySetDocument) as JSON.
func (a *api) keyDoc(w http.ResponseWriter, r *http.Request, methodOK bool, allow string, call func(context.Context) (*fence.KeySetDocument, error)) {
	if !methodOK {
		a.methodNotAllowed(w, r, allow)
		return
	}
	if _, aerr := parseQuery(r); aerr != nil {
		a.writeError(w, r, aerr)
		return
	}
	doc, err := call(r.Context())
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	_ = writeJSON(w, http.StatusOK, doc)
}
