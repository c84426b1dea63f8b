package httpapi

import (
	"net/http"

	"github.com/dlock/dlock/api/openapi"
	"github.com/dlock/dlock/internal/apierror"
)

// openAPIPath serves the API's OpenAPI 3.1 description (api/openapi).
const openAPIPath = apiPrefix + "/openapi.json"

// openAPI answers the document. It needs no token even under ACLs: it says
// what the API is, nothing about the cluster's state.
func (a *api) openAPI(w http.ResponseWriter, r *http.Request) {
	if !isGet(r) {
		a.methodNotAllowed(w, r, allowGet)
		return
	}
	if _, aerr := parseQuery(r); aerr != nil {
		a.writeError(w, r, aerr)
		return
	}
	doc, err := openapi.JSON()
	if err != nil {
		a.writeError(w, r, apierror.Wrap(apierror.Internal, err, "the OpenAPI document"))
		return
	}
	h := w.Header()
	h["Content-Type"] = jsonContentType
	h["X-Content-Type-Options"] = noSniff
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(doc)
	}
}
