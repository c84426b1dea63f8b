package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
)

// rowJS is true once the Locks table has a row for name whose text has want.
func rowJS(name, want string) string {
	return fmt.Sprintf(`(() => { const r = document.querySelector('#locks tr[data-name=%q]'); return !!r && r.textContent.includes(%q); })()`, name, want)
}

func noRowJS(name string) string {
	return fmt.Sprintf(`document.querySelector('#locks tbody') !== null && !document.querySelector('#locks tr[data-name=%q]')`, name)
}

// One cluster, one browser, the operator's story in order: locks appear and
// go live, the queue shows in order and moves, the filter and paging keep
// the page bounded, elections and the cluster show, and when the node the
// page came from is killed the page carries on through another member
// without a reload.
func TestConsole(t *testing.T) {
	actx := browser(t)
	c := testcluster.New(t, 3)
	home := c.WaitLeader(within)
	api := c.URL(c.Follower())
	start := time.Now()
	p := newPage(t, actx, chromedp.Navigate(c.URL(home)+"/ui/"))
	p.waitJS("the Locks page lists and goes live", `document.querySelector('#summary')?.textContent.startsWith('No held') && document.getElementById('conn').dataset.state === 'live'`)
	t.Logf("empty Locks page live %s after navigation (browser start included)", time.Since(start).Round(time.Millisecond))
	// Marks this document: a reload would lose it.
	p.run("mark the page", js(`window.dlockTestMark = 1`))

	t.Run("holder appears and disappears live", func(t *testing.T) {
		p := p.on(t)
		start := time.Now()
		g := acquire(t, api, "deploy/app", "alice", "", 0)
		p.waitJS("alice's lock shows", rowJS("deploy/app", "alice"))
		t.Logf("acquire to row on the page: %s", time.Since(start).Round(time.Millisecond))
		row := p.texts(`#locks tr[data-name="deploy/app"] td`)
		if len(row) < 7 || row[2] != fmt.Sprint(g.FencingToken) || row[3] != "exclusive" || row[6] != "0" {
			t.Errorf("row %q: want token %d, mode exclusive, nobody waiting", row, g.FencingToken)
		}
		release(t, api, "deploy/app", "alice", g)
		p.waitJS("the released lock leaves the list", noRowJS("deploy/app"))
	})

	t.Run("queue in order, keyboard to the lock page, release moves it", func(t *testing.T) {
		p := p.on(t)
		alice := acquire(t, api, "deploy/app", "alice", "", 0)
		p.waitJS("alice holds", rowJS("deploy/app", "alice"))
		var wg sync.WaitGroup
		grants := map[string]grant{}
		errs := map[string]error{}
		var mu sync.Mutex
		wait := func(client string) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				g, err := tryAcquire(api, "deploy/app", client, "", 60000)
				mu.Lock()
				grants[client], errs[client] = g, err
				mu.Unlock()
			}()
		}
		defer wg.Wait()
		wait("bob")
		p.waitJS("bob waits", fmt.Sprintf(`document.querySelector('#locks tr[data-name=%q] td:last-child')?.textContent === '1'`, "deploy/app"))
		wait("carol")
		p.waitJS("carol waits too", fmt.Sprintf(`document.querySelector('#locks tr[data-name=%q] td:last-child')?.textContent === '2'`, "deploy/app"))

		p.shot("locks")
		// Keyboard only: "/" jumps to the filter, Tab walks on to the lock's
		// link, Enter opens its page.
		p.run("jump to the filter", js(`document.activeElement.blur()`), chromedp.KeyEvent("/"))
		p.waitJS("/ focuses the filter", `document.activeElement?.id === 'prefix'`)
		// DevTools' key events type the "/" even though the page cancels
		// its keydown (a real keyboard's does not); clear it.
		p.run("clear the filter", js(`document.getElementById('prefix').value = ''`))
		for i := 0; ; i++ {
			var at string
			_ = p.eval(`document.activeElement?.closest('tr')?.dataset.name || ''`, &at)
			if at == "deploy/app" {
				break
			}
			if i == 15 {
				t.Fatalf("15 Tabs from the filter did not reach the lock's link")
			}
			p.run("Tab", chromedp.KeyEvent(kb.Tab))
		}
		p.run("open the lock with Enter", chromedp.KeyEvent(kb.Enter))
		p.waitJS("the lock's page shows the queue", `document.querySelectorAll('#queue li').length === 2`)
		if q := p.texts(`#queue li .mono`); !slices.Equal(q, []string{"bob", "carol"}) {
			t.Fatalf("queue %q, want bob then carol", q)
		}
		p.shot("lock")
		var hash string
		_ = p.eval(`location.hash`, &hash)
		if hash != "#/lock/deploy%2Fapp" {
			t.Errorf("lock page at %q", hash)
		}

		release(t, api, "deploy/app", "alice", alice)
		p.waitJS("bob holds, carol is next", `[...document.querySelectorAll('#queue li .mono')].map(e => e.textContent).join() === 'carol' && document.getElementById('facts').textContent.includes('held by bob')`)
		p.waitJS("the live timeline shows the hand-off", `(() => { const t = document.getElementById('live').textContent; return t.includes('released') && t.includes('acquired') && t.includes('bob'); })()`)
		// answered waits for a waiter's acquire to come back granted.
		answered := func(client string) grant {
			t.Helper()
			var g grant
			var err error
			testutil.Eventually(t, within, client+"'s acquire answers", func() bool {
				mu.Lock()
				defer mu.Unlock()
				g, err = grants[client], errs[client]
				return g.LeaseID != "" || err != nil
			})
			if err != nil {
				t.Fatal(err)
			}
			return g
		}
		release(t, api, "deploy/app", "bob", answered("bob"))
		carol := answered("carol")
		release(t, api, "deploy/app", "carol", carol)
		p.waitJS("nobody holds or waits", `document.getElementById('facts').textContent.includes('free') && document.getElementById('queue').children.length === 0`)
		// The grant timeline and revoke need the server's grant history:
		// without it the page offers neither; with it the timeline shows the
		// three grants, each ended, and nothing is left to revoke.
		if call(t, "GET", api+"/api/v1/history/deploy/app", "", nil, nil) == 404 {
			var hidden bool
			_ = p.eval(`document.getElementById('revoke').hidden && document.getElementById('history').hidden`, &hidden)
			if !hidden {
				t.Errorf("revoke or history shown by a server without grant history")
			}
		} else {
			p.waitJS("the timeline shows the grants, each ended", `(() => {
				const h = document.getElementById('history');
				const t = h.textContent;
				return !h.hidden && ['alice', 'bob', 'carol'].every(c => t.includes(c)) && (t.match(/ended: released/g) || []).length >= 3 && document.getElementById('revoke').hidden;
			})()`)
		}
		p.run("back to Locks with g l", js(`document.activeElement.blur()`), chromedp.KeyEvent("g"), chromedp.KeyEvent("l"))
		p.waitJS("the Locks page is back", `location.hash === '#/locks' && !!document.querySelector('#locks')`)
	})

	t.Run("prefix filter", func(t *testing.T) {
		p := p.on(t)
		for _, n := range []string{"a/1", "a/2", "b/1"} {
			acquire(t, api, n, "worker-"+n[:1], "", 0)
		}
		p.waitJS("all three show", rowJS("b/1", "worker-b"))
		p.run("type a prefix after /", js(`document.activeElement.blur()`), chromedp.KeyEvent("/"))
		p.waitJS("/ focuses the filter", `document.activeElement?.id === 'prefix'`)
		p.run("type", js(`document.getElementById('prefix').value = ''`), chromedp.KeyEvent("a/"), chromedp.KeyEvent(kb.Enter))
		p.waitJS("only a/ locks are listed", `[...document.querySelectorAll('#locks tbody tr')].map(r => r.dataset.name).join() === 'a/1,a/2'`)
		var hash string
		_ = p.eval(`location.hash`, &hash)
		if hash != "#/locks?prefix=a%2F" {
			t.Errorf("filter kept at %q", hash)
		}
		acquire(t, api, "a/3", "worker-a", "", 0)
		acquire(t, api, "b/2", "worker-b", "", 0)
		p.waitJS("a new lock under the prefix shows live", rowJS("a/3", "worker-a"))
		if rows := p.texts(`#locks tbody tr`); len(rows) != 3 {
			t.Errorf("rows under a/: %d, want 3 (b/2 must stay out)", len(rows))
		}
	})

	t.Run("pages of locks stay bounded", func(t *testing.T) {
		p := p.on(t)
		// One session holds them all: one lease, many locks.
		var sess struct {
			SessionID string `json:"session_id"`
		}
		if code := call(t, "POST", api+"/api/v1/sessions", "", map[string]any{"client_id": "batch", "ttl_ms": 120000}, &sess); code != 201 {
			t.Fatalf("session: %d", code)
		}
		const n = 230
		for i := range n {
			if code := call(t, "POST", fmt.Sprintf("%s/api/v1/locks/page/%03d/acquire", api, i), "", map[string]any{"client_id": "batch", "session_id": sess.SessionID}, nil); code != 200 {
				t.Fatalf("acquire page/%03d: %d", i, code)
			}
		}
		p.run("filter page/", chromedp.Navigate(c.URL(home)+"/ui/#/locks?prefix=page%2F"))
		p.waitJS("the first page", `document.querySelectorAll('#locks tbody tr').length === 100 && !document.getElementById('next').disabled && document.getElementById('prev').disabled`)
		p.run("next page", js(`document.querySelector('#next').click()`))
		p.waitJS("the second page", `document.querySelector('#locks tbody tr')?.dataset.name === 'page/100' && document.querySelectorAll('#locks tbody tr').length === 100`)
		p.run("next page", js(`document.querySelector('#next').click()`))
		p.waitJS("the last page", `document.querySelector('#locks tbody tr')?.dataset.name === 'page/200' && document.querySelectorAll('#locks tbody tr').length === 30 && document.getElementById('next').disabled`)
		p.run("mark again", js(`window.dlockTestMark = 1`))
	})

	t.Run("elections", func(t *testing.T) {
		p := p.on(t)
		var r map[string]any
		if code := call(t, "POST", api+"/api/v1/elections/db/primary/campaign", "", map[string]any{"candidate_id": "pg-1", "value": "10.0.0.1:5432", "ttl_ms": 120000}, &r); code != 200 {
			t.Fatalf("campaign: %d %v", code, r)
		}
		p.run("open Elections", js(`document.querySelector('a[data-page="elections"]').click()`))
		p.waitJS("the election's leader and value", `(() => { const r = document.querySelector('#elections tr[data-name="db/primary"]'); return !!r && r.textContent.includes('pg-1') && r.textContent.includes('10.0.0.1:5432'); })()`)
		// A campaigner waits in line until this test hangs up on it.
		ctx, hangUp := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			defer close(done)
			body := strings.NewReader(`{"candidate_id":"pg-2","value":"10.0.0.2:5432","ttl_ms":120000,"wait_timeout_ms":60000}`)
			req, _ := http.NewRequestWithContext(ctx, "POST", api+"/api/v1/elections/db/primary/campaign", body)
			req.Header.Set("Content-Type", "application/json")
			if res, err := http.DefaultClient.Do(req); err == nil {
				res.Body.Close()
			}
		}()
		defer func() { hangUp(); <-done }()
		p.waitJS("a candidate waits", `document.querySelector('#elections tr[data-name="db/primary"] td:last-child')?.textContent === '1'`)
		p.shot("elections")
	})

	t.Run("cluster", func(t *testing.T) {
		p := p.on(t)
		p.run("open Cluster", js(`document.querySelector('a[data-page="cluster"]').click()`))
		// The leader is whichever node leads now: on a loaded machine it
		// may have moved since the cluster started.
		testutil.Eventually(t, within, "three members, the leader named", func() (bool, string) {
			var shown struct {
				Rows   int    `json:"rows"`
				Leader string `json:"leader"`
			}
			if err := p.eval(`({rows: document.querySelectorAll('#members tbody tr').length, leader: document.querySelector('[data-fact="Leader"]')?.textContent || ''})`, &shown); err != nil {
				return false, err.Error()
			}
			leader := c.WaitLeader(within)
			return shown.Rows == 3 && shown.Leader == leader, fmt.Sprintf("page shows %d members, leader %q; the cluster's leader is %s", shown.Rows, shown.Leader, leader)
		})
		p.waitJS("every member reachable", `[...document.querySelectorAll('#members tbody tr')].every(r => r.textContent.includes('reachable') && !r.textContent.includes('unreachable'))`)
		p.shot("cluster")
	})

	t.Run("node killed: the page carries on through another member", func(t *testing.T) {
		p := p.on(t)
		p.waitJS("the members are known", `document.documentElement.dataset.members === '3'`)
		killed, err := url.Parse(c.URL(home))
		if err != nil {
			t.Fatal(err)
		}
		// On a lock's page first: its stream resumes from the last revision
		// it delivered, and the page must not show that revision's events
		// twice.
		live := func(typ string) string {
			return fmt.Sprintf(`[...document.querySelectorAll('#live li strong')].filter(e => e.textContent === %q).length`, typ)
		}
		p.run("a lock's page", js(`location.hash = '#/lock/resume%2Fx'`))
		p.waitJS("its stream is live", `document.getElementById('conn').dataset.state === 'live' && !!document.getElementById('live')`)
		g := acquire(t, api, "resume/x", "frank", "", 0)
		p.waitJS("the grant shows live", live("acquired")+` === 1`)

		// Kill the node the page came from, and the leader with it if it
		// still leads.
		wasLeader := c.WaitLeader(within) == home
		c.Kill(home)
		survivor := c.URL(c.WaitLeader(within))
		release(t, survivor, "resume/x", "frank", g)
		p.waitJS("the release shows through another node, and the grant still once", fmt.Sprintf(`%s === 1 && %s === 1 && document.getElementById('conn').dataset.node !== %q`, live("released"), live("acquired"), killed.Host))
		p.run("to Cluster", js(`document.querySelector('a[data-page="cluster"]').click()`))
		if wasLeader {
			p.waitJS("the cluster page names a new leader", fmt.Sprintf(`(() => { const l = document.querySelector('[data-fact="Leader"]')?.textContent; return !!l && l !== %q && !l.startsWith('none'); })()`, home))
		}
		p.run("to Locks", js(`document.querySelector('a[data-page="locks"]').click()`))
		p.waitJS("live again, through another node", fmt.Sprintf(`document.getElementById('conn').dataset.state === 'live' && document.getElementById('conn').dataset.node !== %q`, killed.Host))
		acquire(t, survivor, "after/kill", "dave", "", 0)
		p.waitJS("a lock taken after the kill shows", rowJS("after/kill", "dave"))
		var mark int
		if err := p.eval(`window.dlockTestMark || 0`, &mark); err != nil || mark != 1 {
			t.Fatalf("the page was reloaded (mark %d, %v)", mark, err)
		}
	})
}

// A phone-sized screen: the page fits its width (no sideways scrolling), the
// table turns into one card per lock, and every page is in reach.
func TestConsolePhone(t *testing.T) {
	actx := browser(t)
	c := testcluster.New(t, 1)
	base := c.URL(c.WaitLeader(within))
	acquire(t, base, "a-rather-long/lock/name/for/a/small/screen/deploy-production-eu-west-1", "ci-runner-with-a-long-client-id-7f3a9", "", 0)
	p := newPage(t, actx, chromedp.EmulateViewport(375, 740, chromedp.EmulateMobile, chromedp.EmulateScale(2)), chromedp.Navigate(base+"/ui/"))
	p.waitJS("the lock shows", `document.querySelectorAll('#locks tbody tr').length === 1`)
	p.waitJS("nothing is wider than the screen", `document.documentElement.scrollWidth <= window.innerWidth`)
	p.shot("phone")
	var layout struct {
		Row   string `json:"row"`
		Head  int    `json:"head"`
		Nav   int    `json:"nav"`
		Label string `json:"label"`
	}
	if err := p.eval(`({row: getComputedStyle(document.querySelector('#locks tbody tr')).display,
		head: document.querySelector('#locks thead').getBoundingClientRect().height,
		nav: document.querySelectorAll('.top nav a').length,
		label: getComputedStyle(document.querySelector('#locks td[data-label="Holder"]'), '::before').content})`, &layout); err != nil {
		t.Fatal(err)
	}
	if layout.Row != "block" || layout.Head > 1 || layout.Nav != 3 || !strings.Contains(layout.Label, "Holder") {
		t.Errorf("phone layout %+v: want card rows with labels, no table head, all three pages in the menu", layout)
	}
	p.run("the lock's page on a phone", js(`document.querySelector('#locks a.mono').click()`))
	p.waitJS("it fits too", `!!document.getElementById('facts')?.textContent.includes('held by') && document.documentElement.scrollWidth <= window.innerWidth`)
}

// With ACLs on, the console asks for a token, sends it in the Authorization
// header (the watch stream too: it is read with fetch, not EventSource),
// keeps it out of every URL, and forgets it on sign-out.
func TestConsoleACLLogin(t *testing.T) {
	actx := browser(t)
	c := testcluster.NewWith(t, 1, testcluster.Options{ACL: true})
	id := c.WaitLeader(within)
	base := c.URL(id)
	tok, err := c.Server(id).Service.ACLBootstrap(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	p := newPage(t, actx, chromedp.Navigate(base+"/ui/"))
	p.waitJS("the sign-in form", `document.activeElement?.id === 'token'`)
	p.run("sign in", js(`document.getElementById("token").focus()`), chromedp.KeyEvent("not-a-token"), chromedp.KeyEvent(kb.Enter))
	p.waitJS("a bad token is refused", `!!document.getElementById('token') && document.querySelector('.login p').textContent.includes('not accepted')`)
	p.run("sign in again", js(`document.getElementById("token").value = ""`), js(`document.getElementById("token").focus()`), chromedp.KeyEvent(tok.SecretID), chromedp.KeyEvent(kb.Enter))
	p.waitJS("the Locks page, live", `document.querySelector('#summary')?.textContent.startsWith('No held') && document.getElementById('conn').dataset.state === 'live'`)
	acquire(t, base, "secured/job", "ops", tok.SecretID, 0)
	p.waitJS("a lock shows through the authenticated stream", rowJS("secured/job", "ops"))
	var href string
	_ = p.eval(`location.href`, &href)
	if strings.Contains(href, tok.SecretID) {
		t.Fatalf("the token is in the URL %q", href)
	}
	p.run("sign out", js(`document.getElementById('signout').click()`))
	var stored string
	_ = p.eval(`sessionStorage.getItem('dlock.acl-token') || ''`, &stored)
	if stored != "" {
		t.Errorf("token still stored after sign-out")
	}
	p.run("reload", chromedp.Reload())
	p.waitJS("signed out: asked again", `document.activeElement?.id === 'token'`)

	// A token that may read and watch only under secured/: the full list is
	// refused with a hint, the prefix it grants works, live.
	var scoped struct {
		SecretID string `json:"secret_id"`
	}
	if code := call(t, "POST", base+"/api/v1/acl/tokens", tok.SecretID, map[string]any{"rules": []map[string]any{{"prefix": "secured/", "permissions": []string{"read", "watch"}}}}, &scoped); code != 200 || scoped.SecretID == "" {
		t.Fatalf("scoped token: %d", code)
	}
	p.run("sign in with the scoped token", chromedp.KeyEvent(scoped.SecretID), chromedp.KeyEvent(kb.Enter))
	p.waitJS("the whole list is refused with a hint", `document.querySelector('main .error')?.textContent.includes('type a prefix it may read')`)
	p.run("type the prefix", js(`document.getElementById('prefix').focus()`), chromedp.KeyEvent("secured/"), chromedp.KeyEvent(kb.Enter))
	p.waitJS("the granted prefix lists", rowJS("secured/job", "ops"))
	acquire(t, base, "secured/next", "ops", tok.SecretID, 0)
	p.waitJS("and goes live", rowJS("secured/next", "ops")+` && document.getElementById('conn').dataset.state === 'live'`)
}

// With ACLs on, carrying on through another member means cross-origin
// requests with an Authorization header: each needs the member's CORS
// preflight, and the token must go along without being typed again.
func TestConsoleACLFailover(t *testing.T) {
	actx := browser(t)
	c := testcluster.NewWith(t, 3, testcluster.Options{ACL: true})
	home := c.WaitLeader(within)
	tok, err := c.Server(home).Service.ACLBootstrap(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	p := newPage(t, actx, chromedp.Navigate(c.URL(home)+"/ui/"))
	p.waitJS("the sign-in form", `document.activeElement?.id === 'token'`)
	p.run("sign in", chromedp.KeyEvent(tok.SecretID), chromedp.KeyEvent(kb.Enter))
	p.waitJS("live", `document.getElementById('conn').dataset.state === 'live'`)
	p.run("mark the page", js(`window.dlockTestMark = 1`))
	// The page learns the members before it needs them.
	p.waitJS("the members are known", `document.documentElement.dataset.members === '3'`)
	killed, _ := url.Parse(c.URL(home))
	c.Kill(home)
	survivor := c.URL(c.WaitLeader(within))
	acquire(t, survivor, "after/kill", "erin", tok.SecretID, 0)
	p.waitJS("the lock shows through another member, token and all", rowJS("after/kill", "erin")+fmt.Sprintf(` && document.getElementById('conn').dataset.node !== %q`, killed.Host))
	var mark int
	if err := p.eval(`window.dlockTestMark || 0`, &mark); err != nil || mark != 1 {
		t.Fatalf("the page was reloaded (mark %d, %v)", mark, err)
	}
	var signIn bool
	_ = p.eval(`!!document.getElementById('token')`, &signIn)
	if signIn {
		t.Fatal("the page asked for the token again")
	}
}
