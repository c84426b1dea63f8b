// Package console_test drives the web console in a real headless Chromium
// (through the DevTools protocol, with chromedp) against real clusters.
// It skips when no Chromium is installed, unless DLOCK_UI_TESTS=require.
package console_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/dlock/dlock/internal/testutil"
)

// within bounds every wait for the page: generous, since the machines are
// shared; what is asserted is that the page gets there, not how fast.
const within = 20 * time.Second

func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("DLOCK_UI_TESTS") == "require" {
		t.Fatal("DLOCK_UI_TESTS=require but no Chromium is installed (Debian: apt-get install chromium)")
	}
	t.Skip("no Chromium installed (Debian: apt-get install chromium); DLOCK_UI_TESTS=require makes this a failure")
	return ""
}

// browser starts one headless Chromium for the test; tabs come from tab.
func browser(t *testing.T) context.Context {
	t.Helper()
	path := chromium(t)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox, // CI runs as root
		chromedp.DisableGPU,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	)
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancel)
	return actx
}

// page is one browser tab; it fails the test on any script error, any
// console error (a Content-Security-Policy violation is one) and any request
// to somewhere other than the cluster.
type page struct {
	t   *testing.T
	ctx context.Context
	log *errLog
}

type errLog struct {
	mu   sync.Mutex
	errs []string
}

// on is the page seen from a subtest, so its waits fail that subtest.
func (p *page) on(t *testing.T) *page { return &page{t: t, ctx: p.ctx, log: p.log} }

func newPage(t *testing.T, actx context.Context, actions ...chromedp.Action[chromedp.Void]) *page {
	t.Helper()
	p := &page{t: t, log: &errLog{}}
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithListener(func(ev any) {
		switch e := ev.(type) {
		case *runtime.EventExceptionThrown:
			d := e.ExceptionDetails
			msg := d.Text
			if d.Exception != nil {
				msg += " " + d.Exception.Description
			}
			p.note(fmt.Sprintf("exception at %s:%d: %s", d.URL, d.LineNumber+1, msg))
		case *log.EventEntryAdded:
			// Failed fetches to a killed node are expected; anything else
			// logged as an error (CSP refusals above all) is not.
			if e.Entry.Level == log.EntryLevelError && e.Entry.Source != log.EntrySourceNetwork {
				p.note("console: " + e.Entry.Text)
			}
		case *network.EventRequestWillBeSent:
			// Everything the page loads or calls is the cluster's (tests
			// run it on 127.0.0.1): no CDN, no fonts, nothing elsewhere.
			if u := e.Request.URL; !strings.HasPrefix(u, "http://127.0.0.1:") && !strings.HasPrefix(u, "data:") {
				p.note("request outside the cluster: " + u)
			}
		case *runtime.EventConsoleAPICalled:
			if e.Type == runtime.ConsoleAPICalledTypeError {
				var parts []string
				for _, a := range e.Args {
					parts = append(parts, a.Description)
				}
				p.note("console.error: " + strings.Join(parts, " "))
			}
		}
	}))
	t.Cleanup(cancel)
	p.ctx = ctx
	if err := chromedp.Do(ctx, actions...); err != nil {
		t.Fatalf("start the browser: %v", err)
	}
	t.Cleanup(func() {
		p.log.mu.Lock()
		defer p.log.mu.Unlock()
		for _, e := range p.log.errs {
			t.Errorf("page error: %s", e)
		}
	})
	return p
}

func (p *page) note(s string) {
	p.log.mu.Lock()
	p.log.errs = append(p.log.errs, s)
	p.log.mu.Unlock()
}

func (p *page) run(what string, actions ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, within)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		p.t.Fatalf("%s: %v", what, err)
	}
}

// js runs a statement in the page, for its effect.
func js(stmt string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := chromedp.Evaluate[any]("void ("+stmt+")")(ctx, t)
		if errors.Is(err, chromedp.ErrJSUndefined) {
			err = nil
		}
		return err
	})
}

// eval runs a JavaScript expression and decodes its value into out.
func (p *page) eval(expr string, out any) error {
	ctx, cancel := context.WithTimeout(p.ctx, 5*time.Second)
	defer cancel()
	raw, err := chromedp.Run(ctx, chromedp.Evaluate[json.RawMessage]("JSON.stringify(("+expr+"))"))
	if err != nil {
		return err
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return err
	}
	return json.Unmarshal([]byte(s), out)
}

// waitJS waits until the expression is true; it reports the page's
// connection line and the expression's last failure if it never is.
func (p *page) waitJS(what, js string) {
	p.t.Helper()
	testutil.Eventually(p.t, within, what, func() (bool, string) {
		var ok bool
		if err := p.eval(js, &ok); err != nil {
			return false, err.Error()
		}
		var conn string
		_ = p.eval(`document.getElementById('conn').textContent`, &conn)
		return ok, "connection line: " + conn
	})
}

// strings of a selector's elements' text.
func (p *page) texts(sel string) []string {
	p.t.Helper()
	var out []string
	if err := p.eval(fmt.Sprintf(`[...document.querySelectorAll(%q)].map(e => e.textContent.trim())`, sel), &out); err != nil {
		p.t.Fatalf("read %s: %v", sel, err)
	}
	return out
}

// shot saves a screenshot of the page as <name>.png in the directory
// DLOCK_UI_SCREENSHOTS names (docs/console.md's pictures come from here);
// without it, nothing.
func (p *page) shot(name string) {
	p.t.Helper()
	dir := os.Getenv("DLOCK_UI_SCREENSHOTS")
	if dir == "" {
		return
	}
	ctx, cancel := context.WithTimeout(p.ctx, within)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		p.t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		p.t.Fatal(err)
	}
}

// call sends one JSON request as curl would; token, if set, goes in
// Authorization.
func call(t *testing.T, method, url, token string, body any, out any) int {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		t.Errorf("%s %s: %v", method, url, err)
		return 0
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("%s %s: %v", method, url, err)
		return 0
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if out != nil {
		_ = json.Unmarshal(b, out)
	}
	return res.StatusCode
}

type grant struct {
	Acquired     bool   `json:"acquired"`
	FencingToken uint64 `json:"fencing_token"`
	LeaseID      string `json:"lease_id"`
}

func acquire(t *testing.T, base, name, client, token string, waitMs int64) grant {
	t.Helper()
	g, err := tryAcquire(base, name, client, token, waitMs)
	if err != nil {
		t.Error(err)
	}
	return g
}

// tryAcquire is acquire for goroutines, which must not fail the test
// themselves.
func tryAcquire(base, name, client, token string, waitMs int64) (grant, error) {
	var g grant
	body := map[string]any{"client_id": client, "ttl_ms": 120000}
	if waitMs > 0 {
		body["wait_timeout_ms"] = waitMs
	}
	b, _ := json.Marshal(body)
	req, err := http.NewRequest("POST", base+"/api/v1/locks/"+name+"/acquire", bytes.NewReader(b))
	if err != nil {
		return g, err
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := (&http.Client{Timeout: 90 * time.Second}).Do(req)
	if err != nil {
		return g, fmt.Errorf("acquire %s as %s: %w", name, client, err)
	}
	defer res.Body.Close()
	rb, _ := io.ReadAll(res.Body)
	if err := json.Unmarshal(rb, &g); err != nil || res.StatusCode != 200 || !g.Acquired {
		return g, fmt.Errorf("acquire %s as %s: %d %s", name, client, res.StatusCode, rb)
	}
	return g, nil
}

func release(t *testing.T, base, name, client string, g grant) {
	t.Helper()
	if code := call(t, "POST", base+"/api/v1/locks/"+name+"/release", "", map[string]any{"client_id": client, "fencing_token": g.FencingToken, "lease_id": g.LeaseID}, nil); code != 200 {
		t.Errorf("release %s: %d", name, code)
	}
}
