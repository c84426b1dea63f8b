package console

import (
	"bytes"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
)

// What the binary serves must be exactly the assets directory: go:embed
// silently leaves out files whose names start with "." or "_", so a file
// added under such a name would be in the tree and missing from the binary.
func TestEmbeddedMatchesSources(t *testing.T) {
	onDisk := map[string][]byte{}
	src := os.DirFS("assets")
	if err := fs.WalkDir(src, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(src, p)
		onDisk[p] = b
		return err
	}); err != nil {
		t.Fatal(err)
	}
	embeddedFiles := 0
	if err := fs.WalkDir(Assets(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		embeddedFiles++
		b, _ := fs.ReadFile(Assets(), p)
		want, ok := onDisk[p]
		switch {
		case !ok:
			t.Errorf("%s is embedded but not in assets/", p)
		case !bytes.Equal(b, want):
			t.Errorf("%s differs between the binary and assets/", p)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if embeddedFiles != len(onDisk) {
		t.Errorf("assets/ has %d files, the binary %d (a name starting with . or _ is not embedded)", len(onDisk), embeddedFiles)
	}
	for _, must := range []string{"index.html", "app.js", "style.css"} {
		if _, ok := onDisk[must]; !ok {
			t.Errorf("assets/%s is missing", must)
		}
	}
}

// The pages fetch nothing from elsewhere and run no inline code, so the
// Content-Security-Policy can forbid both.
func TestAssetsAreSelfContained(t *testing.T) {
	external := regexp.MustCompile(`(?i)(src|href)\s*=\s*["']?(https?:)?//|@import|url\(\s*["']?(https?:)?//|fonts\.googleapis|cdn\.`)
	inlineScript := regexp.MustCompile(`(?is)<script(?:[^>]*)>\s*[^<\s]`)
	handlerAttr := regexp.MustCompile(`(?i)<[^>]+\son[a-z]+\s*=`)
	_ = fs.WalkDir(Assets(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, _ := fs.ReadFile(Assets(), p)
		if m := external.Find(b); m != nil {
			t.Errorf("%s refers to another site: %q", p, m)
		}
		if strings.HasSuffix(p, ".html") {
			if inlineScript.Match(b) {
				t.Errorf("%s has an inline script", p)
			}
			if m := handlerAttr.Find(b); m != nil {
				t.Errorf("%s has an inline event handler: %q", p, m)
			}
			if bytes.Contains(b, []byte("style=")) {
				t.Errorf("%s has an inline style", p)
			}
		}
		if bytes.Contains(b, []byte("innerHTML")) || bytes.Contains(b, []byte("eval(")) {
			t.Errorf("%s builds markup from strings (innerHTML/eval): server data must go in as text", p)
		}
		return nil
	})
}

func TestHandler(t *testing.T) {
	h := Handler(Options{MemberOrigins: func(scheme string) []string {
		return []string{scheme + "://127.0.0.1:7001", scheme + "://evil; script-src *", scheme + "://127.0.0.1:7002"}
	}})
	get := func(method, path string, hdr map[string]string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, path, nil)
		for k, v := range hdr {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	w := get("GET", "/ui/", nil)
	if w.Code != 200 || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/html") || !strings.Contains(w.Body.String(), `src="app.js"`) {
		t.Fatalf("index: %d %q", w.Code, w.Header().Get("Content-Type"))
	}
	csp := w.Header().Get("Content-Security-Policy")
	for _, want := range []string{"default-src 'none'", "script-src 'self';", "frame-ancestors 'none'", "connect-src 'self' http://127.0.0.1:7001 http://127.0.0.1:7002;", "base-uri 'none'"} {
		if !strings.Contains(csp, want) {
			t.Errorf("CSP %q lacks %q", csp, want)
		}
	}
	if strings.Contains(csp, "evil") || strings.Contains(csp, "unsafe") {
		t.Errorf("CSP %q lets in a bad source", csp)
	}
	for k, v := range map[string]string{"X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"} {
		if got := w.Header().Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	js := get("GET", "/ui/pages/locks.js", nil)
	if js.Code != 200 || js.Header().Get("Content-Type") != "text/javascript; charset=utf-8" {
		t.Fatalf("module: %d %q", js.Code, js.Header().Get("Content-Type"))
	}
	if nm := get("GET", "/ui/app.js", map[string]string{"If-None-Match": get("GET", "/ui/app.js", nil).Header().Get("ETag")}); nm.Code != http.StatusNotModified {
		t.Errorf("revalidation answered %d, want 304", nm.Code)
	}
	if head := get("HEAD", "/ui/style.css", nil); head.Code != 200 || head.Body.Len() != 0 {
		t.Errorf("HEAD: %d with %d bytes", head.Code, head.Body.Len())
	}
	if post := get("POST", "/ui/", nil); post.Code != http.StatusMethodNotAllowed || post.Header().Get("Allow") != "GET, HEAD" {
		t.Errorf("POST answered %d Allow %q", post.Code, post.Header().Get("Allow"))
	}
	for _, p := range []string{"/ui/nothing.js", "/ui/../console.go", "/ui/pages/", "/ui/.hidden"} {
		if w := get("GET", p, nil); w.Code != http.StatusNotFound {
			t.Errorf("GET %s answered %d, want 404", p, w.Code)
		}
	}
	https := httptest.NewRequest("GET", "https://x/ui/", nil)
	hw := httptest.NewRecorder()
	h.ServeHTTP(hw, https)
	if !strings.Contains(hw.Header().Get("Content-Security-Policy"), "https://127.0.0.1:7001") {
		t.Errorf("TLS page's CSP names no https members: %q", hw.Header().Get("Content-Security-Policy"))
	}
}
