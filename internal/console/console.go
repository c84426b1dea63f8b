// Package console serves dlock's built-in web console: static files embedded
// in the binary (plain ES modules, no build step, so the embedded files are
// the sources), with headers that keep the pages from running anything but
// their own scripts. The pages read the HTTP API from the browser; this
// package serves no data.
package console

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"sort"
	"strings"
)

// Prefix is the URL path the console is served under.
const Prefix = "/ui/"

//go:embed assets
var embedded embed.FS

// Assets is the console's file tree (the assets directory), for the check
// that what is embedded is what the source tree holds.
func Assets() fs.FS {
	sub, err := fs.Sub(embedded, "assets")
	if err != nil {
		panic(err) // the embed directive guarantees the directory
	}
	return sub
}

// Options tunes the handler.
type Options struct {
	// MemberOrigins lists the API origins ("http://host:port") of the
	// cluster's other members. They go into the page's Content-Security-
	// Policy connect-src, so a page can carry on through another member when
	// its own node goes away (the API's CORS rules already admit members).
	// nil: the page may talk to its own origin only.
	MemberOrigins func(scheme string) []string
}

type file struct {
	body  []byte
	ctype string
	etag  string
}

type handler struct {
	files map[string]file
	opts  Options
}

// Handler serves the console under Prefix. Files are read from the binary
// once; a path that is not a file gets the index page's 404 (the pages route
// with the URL fragment, so only real files are ever asked for).
func Handler(opts Options) http.Handler {
	h := &handler{files: map[string]file{}, opts: opts}
	err := fs.WalkDir(Assets(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(Assets(), p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		ctype := mime.TypeByExtension(path.Ext(p))
		if strings.HasSuffix(p, ".js") {
			// Module scripts need a JavaScript type whatever the host's
			// mime tables say.
			ctype = "text/javascript; charset=utf-8"
		}
		h.files[p] = file{body: b, ctype: ctype, etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
		return nil
	})
	if err != nil {
		panic(err)
	}
	return h
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "the console is read with GET", http.StatusMethodNotAllowed)
		return
	}
	h.securityHeaders(w, r)
	p := strings.TrimPrefix(r.URL.Path, Prefix)
	if p == "" {
		p = "index.html"
	}
	f, ok := h.files[p]
	if !ok {
		http.Error(w, "no such console file; open "+Prefix, http.StatusNotFound)
		return
	}
	hd := w.Header()
	hd.Set("Content-Type", f.ctype)
	hd.Set("ETag", f.etag)
	// Revalidate every time: a node upgraded in place must not leave a
	// browser running the old build's modules against the new API.
	hd.Set("Cache-Control", "no-cache")
	if match := r.Header.Get("If-None-Match"); match != "" && match == f.etag {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodGet {
		_, _ = w.Write(f.body)
	}
}

// securityHeaders: only the console's own files may run or style the page
// (no inline script, no eval), it may not be framed, and it may fetch only
// from its own node and the cluster's other members.
func (h *handler) securityHeaders(w http.ResponseWriter, r *http.Request) {
	connect := []string{"'self'"}
	if h.opts.MemberOrigins != nil {
		scheme := "http"
		if r.TLS != nil {
			scheme = "https"
		}
		others := h.opts.MemberOrigins(scheme)
		sort.Strings(others)
		for _, o := range others {
			if safeSource(o) {
				connect = append(connect, o)
			}
		}
	}
	hd := w.Header()
	hd.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
		"connect-src "+strings.Join(connect, " ")+"; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("Cross-Origin-Opener-Policy", "same-origin")
	hd.Set("Cross-Origin-Resource-Policy", "same-origin")
}

// safeSource keeps a member address that could break out of the policy (a
// space, a semicolon, a quote) out of it: addresses come from the
// replicated member list, which a member writes about itself.
func safeSource(o string) bool {
	if !strings.HasPrefix(o, "http://") && !strings.HasPrefix(o, "https://") {
		return false
	}
	for i := 0; i < len(o); i++ {
		c := o[i]
		if c <= ' ' || c >= 0x7f || c == ';' || c == ',' || c == '\'' || c == '"' {
			return false
		}
	}
	return true
}
