package e2e

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/testutil"
)

// lmHolder and lmView are GET /api/v1/locks/{name} with the lock model's
// fields, as a new user reads them.
type lmHolder struct {
	ClientID     string `json:"client_id"`
	FencingToken uint64 `json:"fencing_token"`
	Mode         string `json:"mode"`
	Subtree      bool   `json:"subtree"`
}

type lmView struct {
	Name    string     `json:"name"`
	Held    bool       `json:"held"`
	Holder  *lmHolder  `json:"holder"`
	Waiters int        `json:"waiters"`
	Limit   int        `json:"limit"`
	Mode    string     `json:"mode"`
	Subtree bool       `json:"subtree"`
	Holders []lmHolder `json:"holders"`
}

func getLM(t testing.TB, baseURL, name string) lmView {
	t.Helper()
	var v lmView
	mustCall(t, http.MethodGet, baseURL+"/api/v1/locks/"+name, nil, http.StatusOK, &v)
	return v
}

// holders is "client:token" for each holder, in grant order.
func (v lmView) holders() []string {
	var out []string
	for _, h := range v.Holders {
		out = append(out, h.ClientID+":"+itoa(int(h.FencingToken)))
	}
	return out
}

// lmCluster is a 3-node cluster in which each scenario kills the leader in
// the middle and brings it back before the next.
type lmCluster struct {
	*procCluster
	t *testing.T
}

// roles names the leader and the two followers as they are now.
func (c lmCluster) roles() (leader, f1, f2 string) {
	leader = c.waitLeader(10*time.Second*slow, c.ids()...)
	fs := c.others(leader)
	return leader, fs[0], fs[1]
}

// killLeader SIGKILLs the leader and waits for a new one among the others.
func (c lmCluster) killLeader(leader string) string {
	c.t.Helper()
	c.kill(leader)
	nl := c.waitLeader(10*time.Second*slow, c.others(leader)...)
	if nl == leader {
		c.t.Fatalf("the killed node %s is still named leader", leader)
	}
	return nl
}

// restart brings a killed node back and waits until it serves again.
func (c lmCluster) restart(id string) {
	c.t.Helper()
	c.start(id, false)
	c.waitReady(10*time.Second*slow, id)
}

// waitView polls a lock on one node until ok says it looks right.
func (c lmCluster) waitView(node, name, what string, ok func(lmView) bool) lmView {
	c.t.Helper()
	var v lmView
	testutil.Eventually(c.t, 10*time.Second*slow, what, func() (bool, string) {
		v = getLM(c.t, c.url(node), name)
		return ok(v), "holders " + join(v.holders()) + ", waiters " + itoa(v.Waiters)
	})
	return v
}

func join(s []string) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += " "
		}
		out += x
	}
	return out
}

func acquireBody(client string, extra map[string]any) map[string]any {
	b := map[string]any{"client_id": client, "ttl_ms": 60000}
	for k, v := range extra {
		b[k] = v
	}
	return b
}

func release(t testing.TB, baseURL, name, client string, a acquireAnswer) {
	t.Helper()
	mustCall(t, http.MethodPost, baseURL+"/api/v1/locks/"+name+"/release",
		map[string]any{"client_id": client, "fencing_token": a.FencingToken, "lease_id": a.LeaseID}, http.StatusOK, nil)
}

// TestLockModelDoneWhen is the "done when", as a new user runs it
// with curl against three real dlock processes, with the leader killed in
// the middle of each scenario: a limit-3 lock with a fourth client waiting;
// two shared holders, a writer waiting and a reader behind it; and billing
// as a subtree waiting for billing/job-A and then keeping billing/job-B out.
// Every holder and every place in line survives each kill.
func TestLockModelDoneWhen(t *testing.T) {
	c := lmCluster{startCluster(t, 3), t}

	t.Run("semaphore", func(t *testing.T) {
		leader, f1, f2 := c.roles()
		sem := map[string]any{"limit": 3}
		var as []acquireAnswer
		for i, client := range []string{"c1", "c2", "c3"} {
			via := []string{leader, f1, f2}[i]
			r := mustCall(t, http.MethodPost, c.url(via)+"/api/v1/locks/deploy/acquire", acquireBody(client, sem), http.StatusOK, nil)
			as = append(as, checkGrant(t, client+" acquire", r))
		}
		// A fourth without waiting is refused; with a wait it queues.
		var held acquireAnswer
		mustCall(t, http.MethodPost, c.url(f1)+"/api/v1/locks/deploy/acquire", acquireBody("c4", sem), http.StatusConflict, &held)
		if held.Error == nil || held.Error.Code != "lock_held" {
			t.Fatalf("the fourth holder: %+v", held)
		}
		var mismatch struct {
			Error *apiError `json:"error"`
			Limit int       `json:"limit"`
		}
		mustCall(t, http.MethodPost, c.url(f1)+"/api/v1/locks/deploy/acquire", acquireBody("c5", map[string]any{"limit": 2}), http.StatusConflict, &mismatch)
		if mismatch.Error == nil || mismatch.Error.Code != "limit_mismatch" || mismatch.Limit != 3 {
			t.Fatalf("a different limit: %+v", mismatch)
		}
		w4 := startCall(http.MethodPost, c.url(f1)+"/api/v1/locks/deploy/acquire",
			acquireBody("c4", map[string]any{"limit": 3, "wait_timeout_ms": 60000}), 70*time.Second)
		before := c.waitView(f2, "deploy", "c4 queued behind three holders", func(v lmView) bool { return v.Waiters == 1 && len(v.Holders) == 3 })
		if before.Limit != 3 || before.Mode != "exclusive" {
			t.Fatalf("GET deploy: %+v", before)
		}
		w4.notYet(t, "c4 while three hold", 300*time.Millisecond)

		nl := c.killLeader(leader)
		for _, id := range c.others(leader) {
			v := getLM(t, c.url(id), "deploy")
			if !slices.Equal(v.holders(), before.holders()) || v.Waiters != 1 || v.Limit != 3 {
				t.Fatalf("after the kill, on %s: %+v, want holders %v and one waiter", id, v, before.holders())
			}
		}
		w4.notYet(t, "c4 after the failover", 100*time.Millisecond)
		release(t, c.url(c.others(leader, nl)[0]), "deploy", "c2", as[1])
		a4 := checkGrant(t, "c4 after c2's release", w4.result(t, "c4's wait", 10*time.Second).r)
		for _, a := range as {
			if a4.FencingToken <= a.FencingToken {
				t.Fatalf("c4's token %d is not above %d", a4.FencingToken, a.FencingToken)
			}
		}
		v := getLM(t, c.url(nl), "deploy")
		want := []string{"c1:" + itoa(int(as[0].FencingToken)), "c3:" + itoa(int(as[2].FencingToken)), "c4:" + itoa(int(a4.FencingToken))}
		if !slices.Equal(v.holders(), want) || v.Waiters != 0 {
			t.Fatalf("after the hand-off: %v, want %v", v.holders(), want)
		}
		c.restart(leader)
	})

	t.Run("shared", func(t *testing.T) {
		leader, f1, f2 := c.roles()
		shared := map[string]any{"mode": "shared"}
		r1 := checkGrant(t, "reader 1", mustCall(t, http.MethodPost, c.url(f1)+"/api/v1/locks/config/acquire", acquireBody("r1", shared), http.StatusOK, nil))
		r2 := checkGrant(t, "reader 2", mustCall(t, http.MethodPost, c.url(f2)+"/api/v1/locks/config/acquire", acquireBody("r2", shared), http.StatusOK, nil))
		w := startCall(http.MethodPost, c.url(f1)+"/api/v1/locks/config/acquire",
			acquireBody("writer", map[string]any{"wait_timeout_ms": 60000}), 70*time.Second)
		c.waitView(f2, "config", "the writer queued behind two readers", func(v lmView) bool { return v.Waiters == 1 && len(v.Holders) == 2 && v.Mode == "shared" })
		// A reader arriving after the queued writer waits behind it, though
		// it would fit the readers.
		r3 := startCall(http.MethodPost, c.url(f2)+"/api/v1/locks/config/acquire",
			acquireBody("r3", map[string]any{"mode": "shared", "wait_timeout_ms": 60000}), 70*time.Second)
		before := c.waitView(f1, "config", "the late reader queued behind the writer", func(v lmView) bool { return v.Waiters == 2 })
		w.notYet(t, "the writer while two readers hold", 200*time.Millisecond)
		r3.notYet(t, "the late reader behind the writer", 100*time.Millisecond)

		nl := c.killLeader(leader)
		for _, id := range c.others(leader) {
			v := getLM(t, c.url(id), "config")
			if !slices.Equal(v.holders(), before.holders()) || v.Waiters != 2 || v.Mode != "shared" {
				t.Fatalf("after the kill, on %s: %+v", id, v)
			}
		}
		release(t, c.url(nl), "config", "r1", r1)
		w.notYet(t, "the writer while one reader holds", 200*time.Millisecond)
		release(t, c.url(f1), "config", "r2", r2)
		aw := checkGrant(t, "the writer", w.result(t, "the writer's wait", 10*time.Second).r)
		r3.notYet(t, "the late reader while the writer holds", 200*time.Millisecond)
		v := getLM(t, c.url(nl), "config")
		if v.Mode != "exclusive" || len(v.Holders) != 1 || v.Holders[0].ClientID != "writer" || v.Waiters != 1 {
			t.Fatalf("the writer holds: %+v", v)
		}
		release(t, c.url(f2), "config", "writer", aw)
		a3 := checkGrant(t, "the late reader", r3.result(t, "the late reader's wait", 10*time.Second).r)
		if a3.FencingToken <= aw.FencingToken {
			t.Fatalf("tokens: reader %d after writer %d", a3.FencingToken, aw.FencingToken)
		}
		c.restart(leader)
	})

	t.Run("subtree", func(t *testing.T) {
		leader, f1, f2 := c.roles()
		ja := checkGrant(t, "job-A", mustCall(t, http.MethodPost, c.url(f1)+"/api/v1/locks/billing/job-A/acquire", acquireBody("job-a", nil), http.StatusOK, nil))
		var refused acquireAnswer
		mustCall(t, http.MethodPost, c.url(f2)+"/api/v1/locks/billing/acquire", acquireBody("sweeper", map[string]any{"subtree": true}), http.StatusConflict, &refused)
		if refused.Holder == nil || refused.Holder.ClientID != "job-a" {
			t.Fatalf("billing refused without naming job-A's holder: %+v", refused)
		}
		sw := startCall(http.MethodPost, c.url(f1)+"/api/v1/locks/billing/acquire",
			acquireBody("sweeper", map[string]any{"subtree": true, "wait_timeout_ms": 60000}), 70*time.Second)
		c.waitView(f2, "billing", "billing queued for job-A", func(v lmView) bool { return v.Waiters == 1 && !v.Held })
		// Behind the subtree waiter, a new job inside the subtree waits too.
		jb := startCall(http.MethodPost, c.url(f2)+"/api/v1/locks/billing/job-B/acquire",
			acquireBody("job-b", map[string]any{"wait_timeout_ms": 60000}), 70*time.Second)
		c.waitView(f1, "billing/job-B", "job-B queued behind billing", func(v lmView) bool { return v.Waiters == 1 && !v.Held })

		nl := c.killLeader(leader)
		for _, id := range c.others(leader) {
			a, b, j := getLM(t, c.url(id), "billing/job-A"), getLM(t, c.url(id), "billing"), getLM(t, c.url(id), "billing/job-B")
			if !a.Held || a.Holder.FencingToken != ja.FencingToken || b.Held || b.Waiters != 1 || j.Held || j.Waiters != 1 {
				t.Fatalf("after the kill, on %s: job-A %+v, billing %+v, job-B %+v", id, a, b, j)
			}
		}
		sw.notYet(t, "billing while job-A holds", 100*time.Millisecond)
		release(t, c.url(nl), "billing/job-A", "job-a", ja)
		as := checkGrant(t, "billing", sw.result(t, "billing's wait", 10*time.Second).r)
		jb.notYet(t, "job-B while billing holds the subtree", 300*time.Millisecond)
		v := getLM(t, c.url(nl), "billing")
		if !v.Subtree || len(v.Holders) != 1 || !v.Holders[0].Subtree || v.Holders[0].ClientID != "sweeper" {
			t.Fatalf("GET billing: %+v", v)
		}
		release(t, c.url(c.others(leader, nl)[0]), "billing", "sweeper", as)
		ab := checkGrant(t, "job-B", jb.result(t, "job-B's wait", 10*time.Second).r)
		if ab.FencingToken <= as.FencingToken || as.FencingToken <= ja.FencingToken {
			t.Fatalf("tokens out of order: job-A %d, billing %d, job-B %d", ja.FencingToken, as.FencingToken, ab.FencingToken)
		}
		c.restart(leader)
	})
}
