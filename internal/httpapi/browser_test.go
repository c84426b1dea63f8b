package httpapi

import (
	"strings"
	"testing"

	"github.com/dlock/dlock/internal/apierror"
)

// A web page must not be able to make its visitor's browser act on the API:
// a foreign Origin (or a cross-site Sec-Fetch-Site without one) is refused
// before anything is called, and so is a body not declared as JSON, which
// is what a cross-site form sends. Same-origin pages, member origins and
// clients without those headers pass.
func TestBrowserRequests(t *testing.T) {
	const acquire = "/api/v1/locks/a/acquire"
	const body = `{"client_id":"c1","ttl_ms":1000}`
	member := func(o string) bool { return o == "http://10.0.0.2:7070" }
	for _, tc := range []struct {
		name     string
		req      request
		status   int
		code     string
		called   bool
		noMember bool
	}{
		{name: "form-like POST from a foreign page", req: request{method: "POST", target: acquire, body: body,
			header: map[string]string{"Origin": "http://evil.example", "Content-Type": "text/plain"}}, status: 403, code: "permission_denied"},
		{name: "JSON POST from a foreign page", req: request{method: "POST", target: acquire, body: body,
			header: map[string]string{"Origin": "http://evil.example"}}, status: 403, code: "permission_denied"},
		{name: "POST without a body from a foreign page", req: request{method: "POST", target: "/api/v1/sessions/S1/keepalive",
			header: map[string]string{"Origin": "http://evil.example"}}, status: 403, code: "permission_denied"},
		{name: "event stream from a foreign page", req: request{method: "GET", target: "/api/v1/watch",
			header: map[string]string{"Origin": "https://evil.example"}}, status: 403, code: "permission_denied"},
		{name: "cross-site GET without Origin", req: request{method: "GET", target: "/api/v1/watch",
			header: map[string]string{"Sec-Fetch-Site": "cross-site"}}, status: 403, code: "permission_denied"},
		{name: "an image or script tag pointing here", req: request{method: "GET", target: "/api/v1/watch",
			header: map[string]string{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}}, status: 403, code: "permission_denied"},
		{name: "a link followed from another site", req: request{method: "GET", target: "/api/v1/locks/a",
			header: map[string]string{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}}, status: 200, called: true},
		{name: "a form POSTed from another site", req: request{method: "POST", target: "/api/v1/locks/a/acquire", body: body,
			header: map[string]string{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}}, status: 403, code: "permission_denied"},
		{name: "Origin null (sandboxed page)", req: request{method: "POST", target: acquire, body: body,
			header: map[string]string{"Origin": "null"}}, status: 403, code: "permission_denied"},
		{name: "a form POST without Origin is still not JSON", req: request{method: "POST", target: acquire, body: "client_id=c1",
			header: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}}, status: 415, code: "unsupported_media_type"},
		{name: "same-origin page", req: request{method: "POST", target: acquire, body: body,
			header: map[string]string{"Origin": "http://example.com", "Sec-Fetch-Site": "same-origin"}}, status: 200, called: true},
		{name: "another member's page", req: request{method: "POST", target: acquire, body: body,
			header: map[string]string{"Origin": "http://10.0.0.2:7070", "Sec-Fetch-Site": "cross-site"}}, status: 200, called: true},
		{name: "a member origin with no member list", req: request{method: "POST", target: acquire, body: body,
			header: map[string]string{"Origin": "http://10.0.0.2:7070"}}, status: 403, code: "permission_denied", noMember: true},
		{name: "user typed the URL", req: request{method: "GET", target: "/api/v1/locks/a",
			header: map[string]string{"Sec-Fetch-Site": "none"}}, status: 200, called: true},
		{name: "curl", req: request{method: "POST", target: acquire, body: body}, status: 200, called: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeService{}
			opts := Options{AllowOrigin: member}
			if tc.noMember {
				opts.AllowOrigin = nil
			}
			h, _ := newHandler(f, opts)
			rec := do(h, tc.req)
			if tc.code != "" {
				checkError(t, rec, tc.status, apierror.Code(tc.code))
			} else if rec.Code != tc.status {
				t.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
			if called := len(f.recorded()) > 0; called != tc.called {
				t.Fatalf("service called: %v, want %v", called, tc.called)
			}
		})
	}
}

// A page served by another member may read the answers: its preflight is
// approved and its requests carry Access-Control-Allow-Origin; a foreign
// page's preflight is refused, and the node's own page needs no CORS.
func TestMemberPagesGetCORS(t *testing.T) {
	member := func(o string) bool { return o == "http://10.0.0.2:7070" }
	f := &fakeService{}
	h, _ := newHandler(f, Options{AllowOrigin: member})

	pre := do(h, request{method: "OPTIONS", target: "/api/v1/locks/a/acquire", header: map[string]string{
		"Origin": "http://10.0.0.2:7070", "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization, content-type"}})
	if pre.Code != 204 || pre.Header().Get("Access-Control-Allow-Origin") != "http://10.0.0.2:7070" ||
		!strings.Contains(pre.Header().Get("Access-Control-Allow-Headers"), "Content-Type") || !strings.Contains(pre.Header().Get("Access-Control-Allow-Methods"), "POST") {
		t.Fatalf("member preflight: %d %v", pre.Code, pre.Header())
	}
	rec := do(h, request{method: "POST", target: "/api/v1/locks/a/acquire", body: `{"client_id":"c1","ttl_ms":1000}`,
		header: map[string]string{"Origin": "http://10.0.0.2:7070"}})
	if rec.Code != 200 || rec.Header().Get("Access-Control-Allow-Origin") != "http://10.0.0.2:7070" {
		t.Fatalf("member request: %d %v", rec.Code, rec.Header())
	}
	foreign := do(h, request{method: "OPTIONS", target: "/api/v1/locks/a/acquire", header: map[string]string{
		"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}})
	if foreign.Code != 403 || foreign.Header().Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("foreign preflight: %d %v", foreign.Code, foreign.Header())
	}
	own := do(h, request{method: "GET", target: "/api/v1/locks/a", header: map[string]string{"Origin": "http://example.com"}})
	if own.Code != 200 || own.Header().Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("same-origin request: %d %v", own.Code, own.Header())
	}
	if calls := f.recorded(); len(calls) != 2 {
		t.Fatalf("service calls %+v, want the member's acquire and the own page's read", calls)
	}
}
