package e2e

import (
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dproc "github.com/dlock/dlock/internal/proc"
	"github.com/dlock/dlock/internal/testutil"
)

var leaseIDRe = regexp.MustCompile(`^[0-9a-f]{32}$`)

func checkGrant(t testing.TB, who string, r *response) acquireAnswer {
	t.Helper()
	var a acquireAnswer
	if err := r.decode(&a); err != nil {
		t.Fatalf("%s: %v", who, err)
	}
	if r.Status != http.StatusOK || !a.Acquired || a.FencingToken == 0 || !leaseIDRe.MatchString(a.LeaseID) {
		t.Fatalf("%s: want 200 {acquired:true, fencing_token, lease_id}, got %s", who, r)
	}
	return a
}

func checkHeld(t testing.TB, where string, v lockView, client string, token uint64, waiters int) {
	t.Helper()
	if !v.Held || v.Holder == nil || v.Holder.ClientID != client || v.Holder.FencingToken != token || v.Waiters != waiters {
		t.Fatalf("%s: want %q held by %s with token %d and %d waiter(s), got %+v (holder %+v)",
			where, v.Name, client, token, waiters, v, v.Holder)
	}
}

// TestKillLeaderProcess is the "done when" story, as a new user would run it
// with curl: a lock held and a client waiting through a follower survive a
// SIGKILL of the leader; the release hands the lock to the waiter with a
// higher token; the killed node comes back from its data dir and catches up;
// and a lock nobody renews expires by itself.
func TestKillLeaderProcess(t *testing.T) {
	c := startCluster(t, 3)
	leader := c.waitLeader(5*time.Second, c.ids()...)
	followers := c.others(leader)
	t.Logf("leader %s, followers %v", leader, followers)

	// client1 takes the lock (through whichever node the user happens to use).
	r := mustCall(t, http.MethodPost, c.url("n1")+"/api/v1/locks/demo/acquire",
		map[string]any{"client_id": "client1", "ttl_ms": 60000}, http.StatusOK, nil)
	a1 := checkGrant(t, "client1 acquire", r)

	// client2 waits for it through a follower.
	w2 := startCall(http.MethodPost, c.url(followers[0])+"/api/v1/locks/demo/acquire",
		map[string]any{"client_id": "client2", "ttl_ms": 60000, "wait_timeout_ms": 60000}, 70*time.Second)
	testutil.Eventually(t, 5*time.Second, "client2 queued behind client1", func() (bool, string) {
		v := getLock(t, c.url(followers[1]), "demo")
		return v.Waiters == 1, "waiters " + itoa(v.Waiters)
	})
	checkHeld(t, "before the kill", getLock(t, c.url(followers[1]), "demo"), "client1", a1.FencingToken, 1)
	w2.notYet(t, "client2's blocking acquire while client1 holds", 300*time.Millisecond)

	// kill -9 the leader.
	killedAt := time.Now()
	c.kill(leader)
	newLeader := c.waitLeader(10*time.Second, followers...)
	t.Logf("%s elected %s after the kill", newLeader, time.Since(killedAt).Round(time.Millisecond))
	if newLeader == leader {
		t.Fatalf("the killed node %s is still named leader", leader)
	}

	// The lock and the queue survived, with the same token.
	for _, id := range followers {
		checkHeld(t, "after the kill, on "+id, getLock(t, c.url(id), "demo"), "client1", a1.FencingToken, 1)
	}
	w2.notYet(t, "client2's blocking acquire after the failover", 100*time.Millisecond)

	// client1 releases through a survivor (a follower if there is one, so the
	// release is forwarded to the new leader); client2 gets the lock.
	via := c.others(leader, newLeader)[0]
	mustCall(t, http.MethodPost, c.url(via)+"/api/v1/locks/demo/release",
		map[string]any{"client_id": "client1", "fencing_token": a1.FencingToken, "lease_id": a1.LeaseID, "request_id": "client1-release-1"},
		http.StatusOK, nil)
	res := w2.result(t, "client2's blocking acquire after client1's release", 10*time.Second)
	a2 := checkGrant(t, "client2 acquire", res.r)
	if a2.FencingToken <= a1.FencingToken {
		t.Fatalf("client2's token %d is not greater than client1's %d", a2.FencingToken, a1.FencingToken)
	}
	if a2.LeaseID == a1.LeaseID {
		t.Fatalf("client2 got client1's lease id")
	}
	checkHeld(t, "after the hand-off", getLock(t, c.url(newLeader), "demo"), "client2", a2.FencingToken, 0)

	// The killed node restarts from its data dir (no --initial-cluster this
	// time) and catches up: a stale read on it shows client2 holding.
	c.start(leader, false)
	testutil.Eventually(t, 10*time.Second*slow, "restarted "+leader+" catches up", func() (bool, string) {
		r, err := call(http.MethodGet, c.url(leader)+"/api/v1/locks/demo?stale=true", nil)
		if err != nil {
			return false, err.Error()
		}
		var v lockView
		if r.Status != http.StatusOK || r.decode(&v) != nil {
			return false, r.String()
		}
		return v.Held && v.Holder != nil && v.Holder.ClientID == "client2" && v.Holder.FencingToken == a2.FencingToken && v.Waiters == 0, r.String()
	})
	c.waitReady(10*time.Second*slow, leader)
	if l := c.waitLeader(5*time.Second, c.ids()...); l != newLeader {
		t.Logf("leadership moved from %s to %s after the restart", newLeader, l)
	}

	// A lock nobody renews expires by itself, and the next waiter gets it.
	sent := time.Now()
	r = mustCall(t, http.MethodPost, c.url(newLeader)+"/api/v1/locks/ttl/acquire",
		map[string]any{"client_id": "shortlived", "ttl_ms": 1000}, http.StatusOK, nil)
	at := checkGrant(t, "shortlived acquire", r)
	if at.FencingToken <= a2.FencingToken {
		t.Fatalf("token %d after client2's %d", at.FencingToken, a2.FencingToken)
	}
	wt := startCall(http.MethodPost, c.url(leader)+"/api/v1/locks/ttl/acquire",
		map[string]any{"client_id": "patient", "ttl_ms": 10000, "wait_timeout_ms": 10000}, 15*time.Second)
	res = wt.result(t, "the waiter for the unrenewed lock", 12*time.Second)
	got := checkGrant(t, "patient acquire", res.r)
	el := time.Since(sent)
	t.Logf("the waiter got the 1 s lock %s after it was acquired", el.Round(time.Millisecond))
	if el < 500*time.Millisecond {
		t.Fatalf("the waiter got the lock %s after a 1 s TTL grant: it expired too early", el)
	}
	if el > 10*time.Second {
		t.Fatalf("the waiter got the lock only %s after a 1 s TTL grant", el)
	}
	if got.FencingToken <= at.FencingToken {
		t.Fatalf("the waiter's token %d is not greater than the expired holder's %d", got.FencingToken, at.FencingToken)
	}
	checkHeld(t, "after expiry", getLock(t, c.url(newLeader), "ttl"), "patient", got.FencingToken, 0)
}

// TestGracefulShutdownAndFullRestart stops the whole cluster with SIGTERM and
// starts it again from its data dirs: locks, tokens and sessions survive.
func TestGracefulShutdownAndFullRestart(t *testing.T) {
	c := startCluster(t, 3)
	leader := c.waitLeader(5*time.Second, c.ids()...)
	follower := c.others(leader)[0]

	r := mustCall(t, http.MethodPost, c.url(follower)+"/api/v1/locks/keep/ttl/acquire",
		map[string]any{"client_id": "holder", "ttl_ms": 120000}, http.StatusOK, nil)
	a := checkGrant(t, "ttl acquire", r)
	var sess sessionAnswer
	mustCall(t, http.MethodPost, c.url(leader)+"/api/v1/sessions",
		map[string]any{"client_id": "s", "ttl_ms": 120000}, http.StatusCreated, &sess)
	if !leaseIDRe.MatchString(sess.SessionID) {
		t.Fatalf("session id %q", sess.SessionID)
	}
	r = mustCall(t, http.MethodPost, c.url(follower)+"/api/v1/locks/keep/session/acquire",
		map[string]any{"client_id": "s", "session_id": sess.SessionID}, http.StatusOK, nil)
	sa := checkGrant(t, "session acquire", r)

	// SIGTERM all three at once, as `systemctl stop` on every host would.
	var wg sync.WaitGroup
	for _, nd := range c.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			took, killed := nd.p.stop(syscall.SIGTERM)
			switch {
			case killed:
				t.Errorf("%s did not exit within %s of SIGTERM", nd.id, stopTimeout)
			case nd.p.ExitCode() != 0:
				t.Errorf("%s exited with %v after SIGTERM, want exit status 0", nd.id, nd.p.WaitErr())
			default:
				t.Logf("%s exited 0, %s after SIGTERM", nd.id, took.Round(time.Millisecond))
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	// Start all three again from their data dirs, passing --initial-cluster
	// again, as an unchanged unit file would: it must be ignored.
	for _, id := range c.ids() {
		c.start(id, true)
	}
	c.waitReady(10*time.Second*slow, c.ids()...)
	leader = c.waitLeader(5*time.Second, c.ids()...)
	follower = c.others(leader)[0]

	for _, id := range c.ids() {
		checkHeld(t, "keep/ttl after the restart, on "+id, getLock(t, c.url(id), "keep/ttl"), "holder", a.FencingToken, 0)
		checkHeld(t, "keep/session after the restart, on "+id, getLock(t, c.url(id), "keep/session"), "s", sa.FencingToken, 0)
	}
	var ka sessionAnswer
	mustCall(t, http.MethodPost, c.url(follower)+"/api/v1/sessions/"+sess.SessionID+"/keepalive", nil, http.StatusOK, &ka)
	if ka.ExpiresAt.IsZero() {
		t.Fatalf("keepalive answered no expires_at")
	}
	r = mustCall(t, http.MethodPost, c.url(follower)+"/api/v1/locks/keep/third/acquire",
		map[string]any{"client_id": "third", "ttl_ms": 30000}, http.StatusOK, nil)
	a3 := checkGrant(t, "third acquire", r)
	if a3.FencingToken <= a.FencingToken || a3.FencingToken <= sa.FencingToken {
		t.Fatalf("token after the restart %d is not greater than the earlier %d and %d", a3.FencingToken, a.FencingToken, sa.FencingToken)
	}
}

var endpointRe = regexp.MustCompile(`^\s*(n\d+)\s+http://(\S+)\s+\(raft (\S+)\)`)

// TestDevCommand runs `dlock dev` the way the README tells a new user to.
func TestDevCommand(t *testing.T) {
	bin := dlockBinary(t)
	dir := t.TempDir()
	base := pickBasePort(t, 0, 1, 10, 11, 20, 21)
	logPath := filepath.Join(dir, "dev.log")

	stdoutR, stdoutW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	logF, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	p := launch(t, "dlock dev", logPath, stdoutW, bin, "dev", "--base-port", itoa(base), "--log-level", "warn")
	stdoutW.Close() // the child has it; EOF comes when the child exits
	out := readLines(stdoutR, logF)
	t.Cleanup(func() {
		if took, killed := p.stop(syscall.SIGTERM); killed {
			t.Errorf("dlock dev did not exit within %s of SIGTERM at clean-up; SIGKILLed it", took)
		}
		<-out.done
		logF.Close()
		checkRaces(t, "dlock dev", logPath)
		if t.Failed() {
			t.Logf("--- tail of dlock dev's output (%s):\n%s", logPath, dproc.LogTail(logPath, 60))
		}
	})

	// Read the banner up to "Press Ctrl-C".
	testutil.Eventually(t, 15*time.Second*slow, "dlock dev to print its endpoints", func() (bool, string) {
		if p.Exited() {
			t.Fatalf("dlock dev exited early: %v", p.WaitErr())
		}
		lines := out.snapshot()
		for _, l := range lines {
			if strings.Contains(l, "Ctrl-C") {
				return true, ""
			}
		}
		return false, strings.Join(lines, "\n")
	})
	endpoints := map[string]string{}
	var dataDir string
	for _, l := range out.snapshot() {
		if m := endpointRe.FindStringSubmatch(l); m != nil {
			endpoints[m[1]] = m[2]
		}
		if _, d, ok := strings.Cut(l, "data in "); ok {
			dataDir = strings.TrimSpace(d)
		}
	}
	want := map[string]string{"n1": "127.0.0.1:" + itoa(base), "n2": "127.0.0.1:" + itoa(base+10), "n3": "127.0.0.1:" + itoa(base+20)}
	for id, addr := range want {
		if endpoints[id] != addr {
			t.Fatalf("dlock dev printed %v, want %s at %s:\n%s", endpoints, id, addr, strings.Join(out.snapshot(), "\n"))
		}
	}
	n1, n3 := "http://"+endpoints["n1"], "http://"+endpoints["n3"]

	for _, u := range []string{n1, n3} {
		testutil.Eventually(t, 10*time.Second*slow, u+" ready", func() (bool, string) {
			r, err := call(http.MethodGet, u+"/readyz", nil)
			if err != nil {
				return false, err.Error()
			}
			return r.Status == http.StatusOK, r.String()
		})
	}
	r := mustCall(t, http.MethodPost, n1+"/api/v1/locks/demo/acquire",
		map[string]any{"client_id": "me", "ttl_ms": 30000}, http.StatusOK, nil)
	a := checkGrant(t, "acquire on n1", r)
	checkHeld(t, "GET on n3", getLock(t, n3, "demo"), "me", a.FencingToken, 0)

	took, killed := p.stop(syscall.SIGINT)
	if killed {
		t.Fatalf("dlock dev did not exit within %s of SIGINT", stopTimeout)
	}
	if code := p.ExitCode(); code != 0 {
		t.Fatalf("dlock dev exited with %v after SIGINT, want exit status 0", p.WaitErr())
	}
	t.Logf("dlock dev exited 0, %s after SIGINT", took.Round(time.Millisecond))
	// A clean Ctrl-C is not an error: nothing it logs may say so.
	if b, err := os.ReadFile(p.LogPath); err == nil && strings.Contains(string(b), "level=ERROR") {
		t.Errorf("a clean Ctrl-C of dlock dev logged an ERROR:\n%s", dproc.LogTail(p.LogPath, 30))
	}
	// The banner names the data dir; without it the clean-up below could
	// not be checked at all.
	if dataDir == "" {
		t.Fatalf("dlock dev did not say where its data is (no \"data in DIR\" line):\n%s", strings.Join(out.snapshot(), "\n"))
	}
	if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
		t.Errorf("dlock dev left its temporary data dir %s behind (stat: %v)", dataDir, err)
	}
}
