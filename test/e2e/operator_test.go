//go:build unix

package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/loopback"
	"github.com/dlock/dlock/internal/testutil"
)

// writerEvent is one line `dlock demo-writer` prints.
type writerEvent struct {
	Event string `json:"event"`
	Grant *struct {
		ClientID     string `json:"client_id"`
		Lock         string `json:"lock"`
		FencingToken uint64 `json:"fencing_token"`
		LeaseRef     string `json:"lease_ref"`
		TokenProof   string `json:"token_proof"`
	} `json:"grant"`
	Answer *struct {
		Status       int       `json:"status"`
		Accepted     bool      `json:"accepted"`
		HighestToken uint64    `json:"highest_token"`
		Error        *apiError `json:"error"`
	} `json:"answer"`
	Error string `json:"error"`
}

type grantRecord struct {
	FencingToken uint64 `json:"fencing_token"`
	ClientID     string `json:"client_id"`
	EndCause     string `json:"end_cause"`
	Reason       string `json:"reason"`
}

type historyAnswer struct {
	Name   string        `json:"name"`
	Grants []grantRecord `json:"grants"`
}

// TestOperatorRevokesAStuckHolder is the operator story, as an
// operator would live it, with real processes: a client takes
// billing/batch-job (and another, billing/session-job under a session) and
// its process is paused (SIGSTOP); `dlock history`
// shows its grant; `dlock revoke --reason stuck` hands the lock to the
// waiter at once with a higher token; the resumed client's write is refused
// by the fenced data store and its client learns lock_lost at its next
// renewal; the history shows revoked with the reason on every node, also
// after every node restarts. Then lock-delay: a holder with lock_delay_ms
// 5000 killed with SIGKILL lets the next waiter in only after its lease's
// TTL and the 5 s have passed.
func TestOperatorRevokesAStuckHolder(t *testing.T) {
	c := startCluster(t, 3)
	dir := t.TempDir()
	eps := c.endpointsFlag(c.ids()...)
	storeAddr, err := loopback.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	store := launch(t, "datastore", filepath.Join(dir, "datastore.log"), nil, c.bin,
		"datastore", "--addr", storeAddr, "--data-dir", filepath.Join(dir, "store"), "--cluster", c.url("n1"), "--log-level", "warn")
	t.Cleanup(func() { store.stop(syscall.SIGTERM) })
	storeURL := "http://" + storeAddr
	testutil.Eventually(t, 20*time.Second*slow, "the data store serves", func() bool {
		r, err := call(http.MethodGet, storeURL+"/healthz", nil)
		return err == nil && r.Status == 200
	})

	// The story twice: a holder with a lease of its own (whose renew
	// answers lock_lost), and one holding its lock under a session (whose
	// keepalive lists the grant as lost).
	const name = "billing/batch-job"
	checks := []func(id string) (bool, string){
		revokeStuckHolder(t, c, storeURL, name, "batch-1", "batch-2", false),
		revokeStuckHolder(t, c, storeURL, "billing/session-job", "batch-s", "batch-3", true),
	}
	for _, id := range c.ids() {
		c.kill(id)
	}
	for _, id := range c.ids() {
		c.start(id, false)
	}
	c.waitReady(20*time.Second*slow, c.ids()...)
	for _, id := range c.ids() {
		for _, revokedOn := range checks {
			testutil.Eventually(t, 20*time.Second*slow, "after a full restart, the history on "+id+" says revoked", func() (bool, string) { return revokedOn(id) })
		}
	}

	// Lock-delay: a holder with lock_delay_ms 5000 dies (SIGKILL); the
	// next waiter gets the lock only after the lease's TTL and 5 s more.
	const ttl, delay = 3 * time.Second, 5 * time.Second
	holder := launch(t, "delayed-holder", filepath.Join(dir, "holder.log"), nil, c.bin, "lock", "jobs/delayed", "--endpoints", eps,
		"--ttl", ttl.String(), "--lock-delay", delay.String(), "--", "sleep", "120")
	testutil.Eventually(t, 30*time.Second*slow, "the delayed holder holds jobs/delayed", func() bool {
		v, err := tryGetLock(c.url(c.ids()[0]), "jobs/delayed")
		return err == nil && v.Held
	})
	next2 := startCall(http.MethodPost, c.url(c.ids()[1])+"/api/v1/locks/jobs/delayed/acquire",
		map[string]any{"client_id": "next", "ttl_ms": 30000, "wait_timeout_ms": 60000}, 90*time.Second)
	testutil.Eventually(t, 10*time.Second*slow, "the next waiter is in line", func() bool {
		v, err := tryGetLock(c.url(c.ids()[0]), "jobs/delayed")
		return err == nil && v.Waiters == 1
	})
	holder.kill(t)
	killedAt := time.Now()
	r2 := next2.result(t, "the waiter after the holder's SIGKILL", 60*time.Second)
	took := time.Since(killedAt)
	if r2.err != nil || r2.r.Status != 200 {
		t.Fatalf("the waiter: %v %v", r2.err, r2.r)
	}
	// The holder renewed every TTL/3, so its lease had at least 2/3 of the
	// TTL left when it died; the delay adds 5 s after that.
	if took < delay+ttl*2/3 {
		t.Fatalf("the waiter got the lock %s after the SIGKILL, before the lease's TTL and the 5 s lock-delay had passed", took)
	}
	t.Logf("the waiter got jobs/delayed %s after the holder's SIGKILL (TTL %s, lock-delay %s)", took.Round(time.Millisecond), ttl, delay)
}

// revokeStuckHolder is the operator story for one lock: holderID (a
// dlock demo-writer process, holding name under a session or a lease of its
// own) is frozen; dlock history shows it, dlock revoke hands the lock to
// waiterID at once with a higher token, the resumed holder's write is
// refused by the fenced store and its client learns lock_lost. It returns
// a check that the history on a node says revoked, which it has seen on
// every node.
func revokeStuckHolder(t *testing.T, c *procCluster, storeURL, name, holderID, waiterID string, session bool) (revokedOn func(id string) (bool, string)) {
	t.Helper()
	eps := c.endpointsFlag(c.ids()...)
	// The holder: its own process, which takes the lock, reports the grant
	// and writes when told to.
	args := []string{"demo-writer", "--endpoints", eps, "--client-id", holderID, "--lock", name,
		"--ttl", "20s", "--datastore", storeURL, "--data", "late write from the paused " + holderID, "--report-lease", "--max-wait", "2m"}
	if session {
		args = append(args, "--session")
	}
	writer := exec.Command(c.bin, args...)
	stdin, _ := writer.StdinPipe()
	stdout, _ := writer.StdoutPipe()
	writer.WaitDelay = 10 * time.Second
	if err := writer.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		writer.Process.Signal(syscall.SIGCONT)
		writer.Process.Kill()
		writer.Wait()
	})
	events := make(chan writerEvent, 8)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var ev writerEvent
			if json.Unmarshal(sc.Bytes(), &ev) == nil {
				events <- ev
			}
		}
	}()
	next := func(want string) writerEvent {
		t.Helper()
		select {
		case ev, ok := <-events:
			if !ok || ev.Event != want {
				t.Fatalf("the writer reported %+v (open %v), want %q", ev, ok, want)
			}
			return ev
		case <-time.After(60 * time.Second * slow):
			t.Fatalf("the writer did not report %q", want)
		}
		return writerEvent{}
	}
	g1 := next("granted").Grant
	if err := writer.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s (pid %d) holds %s with token %d (session %v) and is frozen (SIGSTOP)", holderID, writer.Process.Pid, name, g1.FencingToken, session)

	// A waiter, through another node.
	leader := c.waitLeader(10*time.Second*slow, c.ids()...)
	waiter := startCall(http.MethodPost, c.url(c.others(leader)[0])+"/api/v1/locks/"+name+"/acquire",
		map[string]any{"client_id": waiterID, "ttl_ms": 30000, "wait_timeout_ms": 60000}, 90*time.Second)

	// The operator looks, then acts.
	out := c.cli("history", name, "--endpoints", eps, "-o", "json")
	var h historyAnswer
	if err := json.Unmarshal([]byte(out), &h); err != nil || len(h.Grants) == 0 || h.Grants[0].FencingToken != g1.FencingToken ||
		h.Grants[0].ClientID != holderID || h.Grants[0].EndCause != "" {
		t.Fatalf("dlock history before the revoke: %v\n%s", err, out)
	}
	waiter.notYet(t, waiterID+" while "+holderID+" holds the lock", 200*time.Millisecond)
	revokedAt := time.Now()
	out = c.cli("revoke", name, "--reason", "stuck", "--endpoints", eps)
	if want := fmt.Sprintf("revoked %s fencing_token %d\n", name, g1.FencingToken); out != want {
		t.Fatalf("dlock revoke printed %q, want %q", out, want)
	}
	res := waiter.result(t, waiterID+" after the revoke", 20*time.Second)
	var a2 acquireAnswer
	if res.err != nil || res.r.Status != 200 || res.r.decode(&a2) != nil || a2.FencingToken <= g1.FencingToken {
		t.Fatalf("%s after the revoke: %v %v", waiterID, res.err, res.r)
	}
	t.Logf("%s got the lock %s after the revoke, token %d", waiterID, time.Since(revokedAt).Round(time.Millisecond), a2.FencingToken)

	// batch-2 writes with its token (the store learns it), then batch-1
	// wakes up and writes with its old one: refused.
	proofOf := func() (proof, ref string) {
		t.Helper()
		// batch-2's grant proof is in its acquire answer.
		var full struct {
			TokenProof string `json:"token_proof"`
			LeaseRef   string `json:"lease_ref"`
		}
		if err := json.Unmarshal(res.r.Body, &full); err != nil {
			t.Fatal(err)
		}
		return full.TokenProof, full.LeaseRef
	}
	proof, ref := proofOf()
	w2 := mustCall(t, http.MethodPost, storeURL+"/write", map[string]any{"client_id": waiterID, "lock": name, "fencing_token": a2.FencingToken,
		"token_proof": proof, "lease_ref": ref, "data": waiterID + "'s write"}, 200, nil)
	t.Logf("%s's write: %s", waiterID, w2)
	if err := writer.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	late := next("wrote").Answer
	if late.Accepted || late.Status != 409 || late.Error == nil || late.Error.Code != "stale_token" || late.HighestToken != a2.FencingToken {
		t.Fatalf("the resumed %s's write: %+v; want 409 stale_token with highest token %d", holderID, late, a2.FencingToken)
	}
	lease := next("lease")
	// Its client learns it at its next renewal — under a session, at the
	// session's next keepalive, which lists the grant as lost.
	if !strings.Contains(lease.Error, "lock_lost") || !strings.Contains(lease.Error, "revoked") {
		t.Fatalf("%s's lease ended with %q; want lock_lost (revoked)", holderID, lease.Error)
	}
	t.Logf("%s's late write: 409 stale_token; its client: %s", holderID, lease.Error)

	revokedOn = func(id string) (bool, string) {
		r, err := call(http.MethodGet, c.url(id)+"/api/v1/history/"+name+"?stale=true", nil)
		if err != nil {
			return false, err.Error()
		}
		var h historyAnswer
		if r.decode(&h) != nil {
			return false, r.String()
		}
		for _, g := range h.Grants {
			if g.FencingToken == g1.FencingToken {
				return g.EndCause == "revoked" && g.Reason == "stuck" && g.ClientID == holderID, r.String()
			}
		}
		return false, r.String()
	}
	for _, id := range c.ids() {
		testutil.Eventually(t, 20*time.Second*slow, "the history on "+id+" says revoked", func() (bool, string) { return revokedOn(id) })
	}
	return revokedOn
}

// tryGetLock reads a lock without failing the test (for polling).
func tryGetLock(baseURL, name string) (lockView, error) {
	r, err := call(http.MethodGet, baseURL+"/api/v1/locks/"+name, nil)
	if err != nil {
		return lockView{}, err
	}
	var v lockView
	if r.Status != 200 {
		return v, fmt.Errorf("GET %s: %s", name, r)
	}
	return v, r.decode(&v)
}
