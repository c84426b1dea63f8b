package httpapi

import (
	"net/http"
	"testing"
)

// The console is mounted under /ui/ only when given; "/" and "/ui" lead to
// it, other paths stay the API's, and a foreign page still cannot read it.
func TestConsoleMount(t *testing.T) {
	served := 0
	con := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served++; w.WriteHeader(299) })
	h, _ := newHandler(&fakeService{}, Options{Console: con})
	cases := []struct {
		method, target string
		header         map[string]string
		status         int
		location       string
	}{
		{"GET", "/", nil, http.StatusFound, "/ui/"},
		{"GET", "/ui", nil, http.StatusFound, "/ui/"},
		{"POST", "/ui", nil, http.StatusMethodNotAllowed, ""},
		{"GET", "/ui/", nil, 299, ""},
		{"GET", "/ui/pages/locks.js", nil, 299, ""},
		{"GET", "/uix", nil, http.StatusNotFound, ""},
		{"GET", "/ui/app.js", map[string]string{"Sec-Fetch-Site": "cross-site"}, http.StatusForbidden, ""},
		{"GET", "/ui/", map[string]string{"Origin": "http://evil.example"}, http.StatusForbidden, ""},
	}
	for _, c := range cases {
		before := served
		rec := do(h, request{method: c.method, target: c.target, header: c.header})
		if rec.Code != c.status || rec.Header().Get("Location") != c.location {
			t.Errorf("%s %s: %d Location %q, want %d %q", c.method, c.target, rec.Code, rec.Header().Get("Location"), c.status, c.location)
		}
		if (c.status == 299) != (served > before) {
			t.Errorf("%s %s: console called %v", c.method, c.target, served > before)
		}
	}
	off, _ := newHandler(&fakeService{}, Options{})
	for _, p := range []string{"/", "/ui", "/ui/"} {
		if rec := do(off, request{method: "GET", target: p}); rec.Code != http.StatusNotFound {
			t.Errorf("without the console GET %s answered %d, want 404", p, rec.Code)
		}
	}
}
