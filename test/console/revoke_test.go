package console_test

import (
	"fmt"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/dlock/dlock/internal/testcluster"
)

// Revoke from a lock's page: the button asks for a reason, the grant ends,
// the next in line gets the lock and the timeline shows why. It needs the
// server's grant history and revoke route; on a server without them the
// page offers neither (TestConsole checks that) and this test skips.
func TestConsoleRevoke(t *testing.T) {
	actx := browser(t)
	c := testcluster.New(t, 1)
	base := c.URL(c.WaitLeader(within))
	g := acquire(t, base, "deploy/stuck", "stuck-worker", "", 0)
	if code := call(t, "GET", base+"/api/v1/history/deploy/stuck?limit=5", "", nil, nil); code == 404 {
		t.Skip("this server keeps no grant history and cannot revoke (GET /api/v1/history answers 404)")
	}
	p := newPage(t, actx, chromedp.Navigate(base+"/ui/#/lock/deploy%2Fstuck"))
	p.waitJS("the revoke button", `!document.getElementById('revoke').hidden`)
	p.run("open the dialog", js(`document.getElementById('revoke').click()`))
	p.waitJS("the dialog asks for a reason", `document.querySelector('dialog[open]') !== null && document.activeElement?.id === 'revoke-reason'`)
	p.run("confirm without a reason", js(`document.getElementById('revoke-confirm').click()`))
	p.waitJS("nothing revoked without a reason", `document.querySelector('dialog[open]') !== null && document.getElementById('facts').textContent.includes('stuck-worker')`)
	p.run("give a reason", chromedp.KeyEvent("deploy hung for 2h; paged ops"))
	p.shot("revoke-dialog")
	p.run("confirm", js(`document.getElementById('revoke-confirm').click()`))
	p.waitJS("revoked", fmt.Sprintf(`document.querySelector('dialog[open]') === null && document.getElementById('revoke-status').textContent.includes('Revoked token %d') && document.getElementById('facts').textContent.includes('free')`, g.FencingToken))
	p.waitJS("the timeline shows the ended grant", fmt.Sprintf(`(() => { const h = document.getElementById('history').textContent; return h.includes('token %d') && h.includes('ended'); })()`, g.FencingToken))
	p.shot("revoke")
}
