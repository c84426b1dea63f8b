package httpapi

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/dlock/dlock/internal/apierror"
)

// Browser requests. A web page can make its visitor's browser send requests
// to any address the visitor reaches — a cluster on localhost or the office
// network — and a "simple" cross-origin request (a form POST, text/plain)
// is sent without asking the server first. So the API refuses a request
// whose Origin (or Sec-Fetch-Site, for requests that carry no Origin) shows
// a foreign site, and a body not declared as JSON, which no such simple
// request can declare. Clients other than browsers send neither header and
// are unaffected.

// CheckOrigin refuses a cross-origin browser request: one whose Origin is
// neither this server's own (its Host) nor accepted by allow (nil: none is),
// or whose Sec-Fetch-Site says another site sent it without an Origin. A
// request without both headers is not from a browser page and passes.
func CheckOrigin(r *http.Request, allow func(origin string) bool) *apierror.Error {
	origin := r.Header.Get("Origin")
	if origin == "" {
		switch r.Header.Get("Sec-Fetch-Site") {
		case "cross-site", "same-site":
			return apierror.New(apierror.PermissionDenied,
				"cross-origin request refused: browser pages may call this API only from the node's own origin or another member's API address")
		}
		return nil
	}
	if u, err := url.Parse(origin); err == nil && u.Host != "" && strings.EqualFold(u.Host, r.Host) {
		return nil
	}
	if allow != nil && allow(origin) {
		return nil
	}
	return apierror.New(apierror.PermissionDenied,
		"cross-origin request from %q refused: browser pages may call this API only from the node's own origin or another member's API address (clients other than browsers send no Origin header)", truncate(origin, 200))
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// hasBody reports whether a request carries a body (a declared length, or
// a chunked one). A request without one needs no Content-Type.
func hasBody(r *http.Request) bool {
	return r.ContentLength > 0 || (r.ContentLength < 0 && r.Body != nil && r.Body != http.NoBody)
}

// browserChecks runs before routing: the origin rule, then the JSON rule for
// every request that has a body, whatever the endpoint does with it.
func (a *api) browserChecks(r *http.Request) *apierror.Error {
	if aerr := CheckOrigin(r, a.allowOrigin); aerr != nil {
		return aerr
	}
	if hasBody(r) {
		return checkContentType(r.Header.Get("Content-Type"))
	}
	return nil
}
