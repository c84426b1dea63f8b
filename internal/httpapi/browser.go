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

// checkOrigin refuses a cross-origin browser request: one whose Origin is
// neither this server's own (its Host) nor accepted by allow (nil: none is),
// or whose Sec-Fetch-Site says another site sent it without an Origin. A
// request without both headers is not from a browser page and passes.
// member reports a foreign origin that allow accepted: its page needs CORS
// headers to read the answer (corsHeaders).
func checkOrigin(r *http.Request, allow func(origin string) bool) (member bool, _ *apierror.Error) {
	origin := r.Header.Get("Origin")
	if origin == "" {
		if r.Header.Get("Sec-Fetch-Mode") == "navigate" && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
			// Someone followed a link: the answer is shown to them, not to
			// the page that linked here, and a GET changes nothing.
			return false, nil
		}
		switch r.Header.Get("Sec-Fetch-Site") {
		case "cross-site", "same-site":
			return false, apierror.New(apierror.PermissionDenied,
				"cross-origin request refused: browser pages may call this API only from the node's own origin or another member's API address")
		}
		return false, nil
	}
	if u, err := url.Parse(origin); err == nil && u.Host != "" && strings.EqualFold(u.Host, r.Host) {
		return false, nil
	}
	if allow != nil && allow(origin) {
		return true, nil
	}
	return false, apierror.New(apierror.PermissionDenied,
		"cross-origin request from %q refused: browser pages may call this API only from the node's own origin or another member's API address (clients other than browsers send no Origin header)", truncate(origin, 200))
}

// CheckBrowserHost refuses a request from a browser page (one with Origin
// or Sec-Fetch-Site) that reached this node under a host name trust does
// not accept: after DNS rebinding, an attacker's page on rebind.example
// talks to this node as its own origin, and its requests carry that name in
// Host (and Origin). A user's own navigation (Sec-Fetch-Site: none, no
// Origin) passes: it is not a page acting on its own. Clients other than
// browsers send neither header.
func CheckBrowserHost(r *http.Request, trust func(hostport string) bool) *apierror.Error {
	if trust == nil || trust(r.Host) {
		return nil
	}
	site := r.Header.Get("Sec-Fetch-Site")
	if r.Header.Get("Origin") == "" && (site == "" || site == "none") {
		return nil
	}
	return apierror.New(apierror.PermissionDenied,
		"browser request to this node under the name %q refused: a page may reach it by IP address, localhost or a member's API address; add the name to dlock serve --browser-hosts if it is yours (a reverse proxy's)", truncate(r.Host, 200))
}

// corsHeaders lets a page served by another member read this node's
// answers, and answers its preflight (reported by preflight: nothing more
// to do). Credentials are not allowed: a page sends its token in
// Authorization itself, and no cookie means anything here.
func corsHeaders(w http.ResponseWriter, r *http.Request) (preflight bool) {
	h := w.Header()
	h.Set("Access-Control-Allow-Origin", r.Header.Get("Origin"))
	h.Add("Vary", "Origin")
	h.Set("Access-Control-Expose-Headers", "X-Request-Id, Retry-After, X-Dlock-Known-Leader, X-Dlock-Last-Contact")
	if r.Method != http.MethodOptions || r.Header.Get("Access-Control-Request-Method") == "" {
		return false
	}
	h.Set("Access-Control-Allow-Methods", "GET, HEAD, POST, DELETE")
	h.Set("Access-Control-Allow-Headers", "Authorization, Content-Type, X-Request-Id")
	h.Set("Access-Control-Max-Age", "600")
	w.WriteHeader(http.StatusNoContent)
	return true
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
// every request that has a body, whatever the endpoint does with it. It
// reports false when it has answered the request itself.
func (a *api) browserChecks(w http.ResponseWriter, r *http.Request) bool {
	if aerr := CheckBrowserHost(r, a.trustHost); aerr != nil {
		a.writeError(w, r, aerr)
		return false
	}
	member, aerr := checkOrigin(r, a.allowOrigin)
	if aerr == nil && member && corsHeaders(w, r) {
		return false
	}
	if aerr == nil && hasBody(r) {
		aerr = checkContentType(r.Header.Get("Content-Type"))
	}
	if aerr != nil {
		a.writeError(w, r, aerr)
		return false
	}
	return true
}
