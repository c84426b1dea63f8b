package httpapi

import (
	"context"
	"net/http"
	"strings"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/service"
)

// aclPrefix is where tokens are managed (docs/security.md).
const aclPrefix = apiPrefix + "/acl"

// withBearer moves an "Authorization: Bearer <secret>" header, and the
// common name of a verified client certificate, into the request context,
// where the service checks them.
func withBearer(r *http.Request) *http.Request {
	if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && len(r.TLS.VerifiedChains[0]) > 0 {
		r = r.WithContext(service.WithCertIdentity(r.Context(), r.TLS.VerifiedChains[0][0].Subject.CommonName))
	}
	h := r.Header.Get("Authorization")
	scheme, secret, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return r
	}
	return r.WithContext(service.WithBearer(r.Context(), strings.TrimSpace(secret)))
}

func (a *api) aclRoutes(w http.ResponseWriter, r *http.Request, rest string) {
	if _, aerr := parseQuery(r); aerr != nil {
		a.writeError(w, r, aerr)
		return
	}
	switch {
	case rest == "/bootstrap":
		if r.Method != http.MethodPost {
			a.methodNotAllowed(w, r, allowPost)
			return
		}
		decodeAndCall(a, w, r, http.StatusOK, false, nil, func(ctx context.Context, _ struct{}) (*service.ACLTokenView, error) {
			return a.svc.ACLBootstrap(ctx)
		})
	case rest == "/tokens":
		switch {
		case isGet(r):
			resp, err := a.svc.ListACLTokens(r.Context())
			if err != nil {
				a.writeError(w, r, err)
				return
			}
			_ = writeJSON(w, http.StatusOK, resp)
		case r.Method == http.MethodPost:
			decodeAndCall(a, w, r, http.StatusOK, true, nil, a.svc.CreateACLToken)
		default:
			a.methodNotAllowed(w, r, "GET, HEAD, POST")
		}
	case strings.HasPrefix(rest, "/tokens/") && !strings.Contains(rest[len("/tokens/"):], "/"):
		if r.Method != http.MethodDelete {
			a.methodNotAllowed(w, r, "DELETE")
			return
		}
		if err := a.svc.DeleteACLToken(r.Context(), rest[len("/tokens/"):]); err != nil {
			a.writeError(w, r, err)
			return
		}
		_ = writeJSON(w, http.StatusOK, map[string]bool{"deleted": true})
	default:
		a.writeError(w, r, apierror.New(apierror.NotFound, "no ACL endpoint here; use %s/bootstrap, %s/tokens or %s/tokens/{accessor_id}", aclPrefix, aclPrefix, aclPrefix))
	}
}
