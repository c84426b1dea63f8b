//go:build unix

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/proc"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
)

// cliEnv is a built dlock binary and a cluster for it to talk to.
type cliEnv struct {
	bin       string
	tc        *testcluster.Cluster
	endpoints string
}

func newCLIEnv(t *testing.T, bin string) *cliEnv {
	tc := testcluster.New(t, 3)
	var eps []string
	for _, id := range tc.IDs() {
		eps = append(eps, tc.URL(id))
	}
	return &cliEnv{bin: bin, tc: tc, endpoints: strings.Join(eps, ",")}
}

// command returns `dlock args...` pointed at the cluster.
func (e *cliEnv) command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, e.bin, args...)
	// A -race binary otherwise sleeps 1 s at exit.
	cmd.Env = append(os.Environ(), "DLOCK_ENDPOINTS="+e.endpoints, "GORACE=atexit_sleep_ms=0")
	return cmd
}

// run runs dlock to completion and returns its output and exit code.
func (e *cliEnv) run(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := e.command(ctx, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("dlock %v: %v", args, err)
	}
	return out.String(), errOut.String(), cmd.ProcessState.ExitCode()
}

func buildDlock(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "dlock")
	start := time.Now()
	if err := proc.Build("github.com/dlock/dlock/cmd/dlock", bin, raceEnabled); err != nil {
		t.Fatal(err)
	}
	t.Logf("built dlock (race=%v) in %s", raceEnabled, time.Since(start).Round(time.Millisecond))
	return bin
}

// TestCLI runs the client commands as a user would, against real clusters.
func TestCLI(t *testing.T) {
	bin := buildDlock(t)
	e := newCLIEnv(t, bin)
	t.Run("LockSerialisesCommands", func(t *testing.T) { testLockSerialises(t, e) })
	t.Run("LockEnvAndExitCodes", func(t *testing.T) { testLockExitCodes(t, e) })
	t.Run("LockForwardsSignals", func(t *testing.T) { testLockSignals(t, e) })
	t.Run("LowLevelCommands", func(t *testing.T) { testLowLevel(t, e) })
	t.Run("LockModel", func(t *testing.T) { testLockModelCommands(t, e) })
	t.Run("ElectRunsOnlyWhileLeader", func(t *testing.T) { testElect(t, e) })
	t.Run("OperatorRevokes", func(t *testing.T) { testOperatorRevokes(t, e) })
	t.Run("Watch", func(t *testing.T) { testWatchCommand(t, e) })
	t.Run("MembersChanges", func(t *testing.T) { testMembersChanges(t, e) })
	t.Run("NewUserManners", func(t *testing.T) { testNewUserManners(t, e) })
	t.Run("ServeFromEnvironment", func(t *testing.T) { testServeFromEnvironment(t, e) })
	// Last: it stops its own cluster.
	t.Run("LockLostStopsCommand", func(t *testing.T) { testLockLost(t, newCLIEnv(t, bin)) })
}

// testLockSerialises runs two contending `dlock lock` commands that write
// to one file: the second starts only after the first ended.
func testLockSerialises(t *testing.T, e *cliEnv) {
	runContending(t, e, "lock", "ci/deploy")
}

// runContending runs two `dlock lock|elect NAME -- CMD` at once, whose
// commands write to one file, and checks that the second command started
// only after the first ended.
func runContending(t *testing.T, e *cliEnv, verb, name string, flags ...string) {
	out, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var cmds []*exec.Cmd
	for range 2 {
		args := append(append([]string{verb, name}, flags...), "--", "sh", "-c", "echo start $$ $DLOCK_FENCING_TOKEN; sleep 0.3; echo end $$")
		cmd := e.command(ctx, args...)
		cmd.Stdout, cmd.Stderr = out, os.Stderr // one shared file offset: lines land in the order written
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	for _, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("dlock %s: %v", verb, err)
		}
	}
	data, err := os.ReadFile(out.Name())
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	bad := func() { t.Fatalf("want start/end of one command, then start/end of the other; got:\n%s", data) }
	if len(lines) != 4 {
		bad()
	}
	var s1, s2 []string
	s1, s2 = strings.Fields(lines[0]), strings.Fields(lines[2])
	if len(s1) != 3 || len(s2) != 3 || s1[0] != "start" || s2[0] != "start" ||
		lines[1] != "end "+s1[1] || lines[3] != "end "+s2[1] || s1[1] == s2[1] {
		bad()
	}
	if s1[2] == s2[2] || s1[2] == "" {
		t.Fatalf("both commands ran with fencing token %s", s1[2])
	}
}

func testLockExitCodes(t *testing.T, e *cliEnv) {
	out, _, code := e.run(t, "lock", "cli/env", "--", "sh", "-c", `echo "$DLOCK_NAME $DLOCK_FENCING_TOKEN"; exit 7`)
	if code != 7 || !strings.HasPrefix(out, "cli/env ") {
		t.Fatalf("exit %d, output %q; want the command's exit code 7 and DLOCK_NAME in its environment", code, out)
	}
	if _, err := strconv.ParseUint(strings.TrimSpace(strings.TrimPrefix(out, "cli/env ")), 10, 64); err != nil {
		t.Fatalf("DLOCK_FENCING_TOKEN in %q: %v", out, err)
	}
	// Without "--", the command starts at the first word after NAME that is
	// no flag of dlock's; its own flags stay its own.
	if out, _, code := e.run(t, "lock", "cli/env", "--ttl", "20s", "sh", "-c", `echo "$DLOCK_NAME"; exit 6`, "--ttl"); code != 6 || out != "cli/env\n" {
		t.Fatalf("lock without --: exit %d, output %q; want the command's exit code 6", code, out)
	}
	if _, _, code := e.run(t, "lock", "cli/env", "--", "sh", "-c", "kill -TERM $$"); code != 128+15 {
		t.Fatalf("command killed by SIGTERM: exit %d, want 143", code)
	}

	// Held by someone else: --no-wait and --wait give up with 3.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	holder := e.command(ctx, "lock", "cli/held", "--", "sh", "-c", "echo holding; sleep 30")
	stdout, _ := holder.StdoutPipe()
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { holder.Process.Signal(syscall.SIGTERM); holder.Wait() }()
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "holding\n" {
		t.Fatalf("holder: %q %v", line, err)
	}
	if _, errOut, code := e.run(t, "lock", "cli/held", "--no-wait", "--", "true"); code != 3 || !strings.Contains(errOut, "held by") {
		t.Fatalf("--no-wait on a held lock: exit %d, stderr %q; want 3 and the holder", code, errOut)
	}
	if _, _, code := e.run(t, "lock", "cli/held", "--wait", "300ms", "--", "true"); code != 3 {
		t.Fatalf("--wait 300ms on a held lock: exit %d, want 3", code)
	}
	if _, _, code := e.run(t, "lock", "cli/held"); code != 2 {
		t.Fatalf("lock without a command: exit %d, want 2", code)
	}
	if _, _, code := e.run(t, "lock", "cli/held", "--ttl", "100ms", "--", "true"); code != 1 {
		t.Fatalf("lock with a bad TTL: exit %d, want 1", code)
	}
}

// testLockSignals: SIGINT to dlock goes to the command's group; the lock is
// released when the command exits.
func testLockSignals(t *testing.T, e *cliEnv) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := e.command(ctx, "lock", "cli/int", "--", "sh", "-c", `trap 'echo got INT; exit 5' INT; echo ready; while :; do sleep 0.1; done`)
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(stdout)
	if line, err := rd.ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("command: %q %v", line, err)
	}
	cmd.Process.Signal(syscall.SIGINT)
	rest, _ := rd.ReadString(0)
	cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != 5 || rest != "got INT\n" {
		t.Fatalf("after SIGINT: exit %d, output %q; want the command's trap to run and its code 5", code, rest)
	}
	if out, _, _ := e.run(t, "status", "cli/int", "-o", "json"); !strings.Contains(out, `"held": false`) {
		t.Fatalf("lock still held after the command exited: %s", out)
	}
}

func testLowLevel(t *testing.T, e *cliEnv) {
	out, errOut, code := e.run(t, "acquire", "cli/low", "--ttl", "20s", "--client-id", "script-1", "-o", "json")
	if code != 0 {
		t.Fatalf("acquire: exit %d: %s", code, errOut)
	}
	var g struct {
		FencingToken uint64 `json:"fencing_token"`
		LeaseID      string `json:"lease_id"`
		ClientID     string `json:"client_id"`
	}
	if err := json.Unmarshal([]byte(out), &g); err != nil || g.FencingToken == 0 || len(g.LeaseID) != 32 || g.ClientID != "script-1" {
		t.Fatalf("acquire -o json: %q (%v)", out, err)
	}
	tok := strconv.FormatUint(g.FencingToken, 10)
	out, _, code = e.run(t, "status", "cli/low")
	if code != 0 || !strings.Contains(out, "held by script-1") || !strings.Contains(out, tok) {
		t.Fatalf("status: exit %d: %s", code, out)
	}
	if _, errOut, code := e.run(t, "acquire", "cli/low", "--ttl", "20s"); code != 3 || !strings.Contains(errOut, "script-1") {
		t.Fatalf("acquire of a held lock: exit %d, %s", code, errOut)
	}
	if _, _, code := e.run(t, "renew", "cli/low", "--token", tok, "--lease-id", g.LeaseID, "--client-id", "script-1", "--ttl", "30s"); code != 0 {
		t.Fatalf("renew: exit %d", code)
	}
	// The holder's own client id takes nothing without --takeover, and
	// --takeover needs a client id chosen on purpose.
	if _, errOut, code := e.run(t, "acquire", "cli/low", "--ttl", "20s", "--client-id", "script-1"); code != 3 || !strings.Contains(errOut, "script-1") {
		t.Fatalf("acquire by the holder's client id without --takeover: exit %d, %s", code, errOut)
	}
	if _, errOut, code := e.run(t, "acquire", "cli/low", "--ttl", "20s", "--takeover"); code != 2 || !strings.Contains(errOut, "--client-id") {
		t.Fatalf("--takeover without --client-id: exit %d, %s", code, errOut)
	}
	out, errOut, code = e.run(t, "acquire", "cli/takeover", "--ttl", "20s", "--client-id", "script-2", "-o", "json")
	var t1, t2 struct {
		FencingToken uint64 `json:"fencing_token"`
		LeaseID      string `json:"lease_id"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &t1) != nil {
		t.Fatalf("acquire cli/takeover: exit %d: %s", code, errOut)
	}
	out, errOut, code = e.run(t, "acquire", "cli/takeover", "--ttl", "20s", "--client-id", "script-2", "--takeover", "-o", "json")
	if code != 0 || json.Unmarshal([]byte(out), &t2) != nil || t2.FencingToken <= t1.FencingToken || t2.LeaseID == t1.LeaseID {
		t.Fatalf("acquire --takeover: exit %d: %s %s", code, out, errOut)
	}
	if _, _, code := e.run(t, "renew", "cli/takeover", "--token", strconv.FormatUint(t1.FencingToken, 10), "--lease-id", t1.LeaseID, "--client-id", "script-2"); code != 4 {
		t.Fatalf("renew of the lease taken over: exit %d, want 4", code)
	}
	if _, _, code := e.run(t, "release", "cli/takeover", "--token", strconv.FormatUint(t2.FencingToken, 10), "--lease-id", t2.LeaseID, "--client-id", "script-2"); code != 0 {
		t.Fatalf("release after the takeover: exit %d", code)
	}
	if _, _, code := e.run(t, "release", "cli/low", "--token", tok, "--lease-id", g.LeaseID); code != 4 {
		t.Fatalf("release under another client id: exit %d, want 4 (not the holder)", code)
	}
	out, _, code = e.run(t, "list", "cli/")
	if code != 0 || !strings.Contains(out, "cli/low") || !strings.Contains(out, "script-1") {
		t.Fatalf("list: exit %d: %s", code, out)
	}
	if _, _, code := e.run(t, "release", "cli/low", "--token", tok, "--lease-id", g.LeaseID, "--client-id", "script-1"); code != 0 {
		t.Fatalf("release: exit %d", code)
	}
	if _, _, code := e.run(t, "release", "cli/low", "--token", tok, "--lease-id", g.LeaseID, "--client-id", "script-1"); code != 4 {
		t.Fatalf("second release: exit %d, want 4", code)
	}
	if _, _, code := e.run(t, "release", "cli/low"); code != 2 {
		t.Fatalf("release without --token: exit %d, want 2", code)
	}
	out, _, code = e.run(t, "members", "-o", "json")
	var ci struct {
		LeaderID string `json:"leader_id"`
		Members  []struct {
			ID string `json:"id"`
		} `json:"members"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &ci) != nil || len(ci.Members) != 3 || ci.LeaderID == "" {
		t.Fatalf("members -o json: exit %d: %s", code, out)
	}
	if out, _, code := e.run(t, "members"); code != 0 || !strings.Contains(out, "leader "+ci.LeaderID) {
		t.Fatalf("members: exit %d: %s", code, out)
	}
}

// testLockLost stops every node while two commands hold locks and one leads
// an election: each command's whole process group is terminated (one ignores
// SIGTERM and is killed after the grace period) and dlock exits 4.
func testLockLost(t *testing.T, e *cliEnv) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	scripts := []struct{ verb, name, script string }{
		{"lock", "cli/lost/term", `sleep 100 & echo $!; wait`},
		{"lock", "cli/lost/ignore", `trap '' TERM; sleep 100 & echo $!; wait`},
		{"elect", "cli/lost/elect", `sleep 100 & echo $!; wait`},
	}
	type held struct {
		cmd        *exec.Cmd
		grandchild int
		stderr     *bytes.Buffer
		want       string
	}
	var all []held
	for _, sc := range scripts {
		name, script := sc.name, sc.script
		cmd := e.command(ctx, sc.verb, name, "--ttl", "2s", "--grace", "1s", "--", "sh", "-c", script)
		stdout, _ := cmd.StdoutPipe()
		var errOut bytes.Buffer
		cmd.Stderr = &errOut
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(stdout).ReadString('\n')
		pid, perr := strconv.Atoi(strings.TrimSpace(line))
		if err != nil || perr != nil {
			t.Fatalf("%s: want the grandchild's pid, got %q %v", name, line, err)
		}
		want := "lost lock"
		if sc.verb == "elect" {
			want = "lost leadership"
		}
		all = append(all, held{cmd, pid, &errOut, want})
		defer syscall.Kill(pid, syscall.SIGKILL)
	}
	for _, id := range e.tc.Running() {
		e.tc.Kill(id)
	}
	for _, h := range all {
		err := h.cmd.Wait()
		if code := h.cmd.ProcessState.ExitCode(); code != cliExitLost || !strings.Contains(h.stderr.String(), h.want) {
			t.Fatalf("dlock %v after it was lost: exit %d (%v), stderr %q; want 4 and %q", h.cmd.Args[1:3], code, err, h.stderr, h.want)
		}
		testutil.Eventually(t, 5*time.Second, fmt.Sprintf("grandchild %d to end after the lock was lost", h.grandchild),
			func() bool { return processGone(h.grandchild) })
	}
}

// processGone reports whether pid no longer runs (a zombie waiting to be
// reaped by init counts as gone).
func processGone(pid int) bool {
	if errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
		return true
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return os.IsNotExist(err)
	}
	// The state follows the parenthesised command name.
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && s[i+2] == 'Z'
}

// testNewUserManners checks what a newcomer trips over first: help that
// works everywhere, usage errors that say what is wrong, commands that give
// up on an unreachable cluster, and a CLI whose acquire and release agree on
// who the client is.
func testNewUserManners(t *testing.T, e *cliEnv) {
	t.Run("HelpEverywhere", func(t *testing.T) {
		for _, args := range [][]string{
			{"--help"}, {"help"}, {"help", "lock"}, {"serve", "-h"}, {"dev", "--help"}, {"recover", "-h"},
			{"snapshot", "-h"}, {"snapshot", "--help"}, {"snapshot", "save", "-h"}, {"snapshot", "restore", "--help"},
			{"debug", "-h"}, {"debug", "log", "--help"}, {"acl", "-h"}, {"acl", "--help"}, {"acl", "token", "--help"},
			{"acl", "token", "create", "-h"}, {"lock", "--help"}, {"elect", "-h"}, {"acquire", "-h"}, {"release", "-h"},
			{"renew", "-h"}, {"status", "-h"}, {"list", "-h"}, {"watch", "-h"}, {"members", "-h"}, {"bench", "-h"},
			{"datastore", "-h"}, {"demo", "-h"},
		} {
			out, errOut, code := e.run(t, args...)
			if code != 0 || !strings.Contains(out, "Usage") || errOut != "" {
				t.Errorf("dlock %s: exit %d, stdout %d bytes, stderr %q; want usage on stdout and exit 0",
					strings.Join(args, " "), code, len(out), errOut)
			}
		}
	})
	t.Run("UsageErrorsSayWhatIsWrong", func(t *testing.T) {
		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"serve"}, "--id and --data-dir are required"},
			{[]string{"snapshot", "restore", "x.snap"}, "--data-dir and --initial-cluster are required"},
			{[]string{"acl", "frob"}, `unknown acl command "frob"`},
			{[]string{"acquire", "x", "--ttl", "30"}, "30s"},
		} {
			_, errOut, code := e.run(t, c.args...)
			first, _, _ := strings.Cut(errOut, "\n")
			if code != 2 || !strings.Contains(first, c.want) || strings.Count(errOut, "\n") > 3 {
				t.Errorf("dlock %s: exit %d, stderr %q; want exit 2 and the error (%q) first, in a few lines",
					strings.Join(c.args, " "), code, errOut, c.want)
			}
		}
	})
	t.Run("UnreachableClusterGivesUp", func(t *testing.T) {
		dead := "http://" + testcluster.FreePort(t)
		for _, args := range [][]string{
			{"lock", "deploy", "--endpoints", dead, "--timeout", "2s", "--", "echo", "ran"},
			{"lock", "deploy", "--endpoints", dead, "--timeout", "2s", "--no-wait", "--", "echo", "ran"},
			{"elect", "sched", "--endpoints", dead, "--timeout", "2s", "--", "echo", "ran"},
			{"acquire", "deploy", "--endpoints", dead, "--timeout", "2s", "--wait", "1m"},
		} {
			// e.run gives up after 60 s: a command that hangs fails here.
			out, errOut, code := e.run(t, args...)
			if code != 1 || strings.Contains(out, "ran") || !strings.Contains(errOut, "no node answered") {
				t.Errorf("dlock %s: exit %d, stdout %q, stderr %q; want exit 1 saying no node answered",
					strings.Join(args, " "), code, out, errOut)
			}
		}
	})
	t.Run("AcquireThenReleaseWithoutClientID", func(t *testing.T) {
		out, errOut, code := e.run(t, "acquire", "cli/stable", "-o", "json")
		var g struct {
			FencingToken uint64 `json:"fencing_token"`
			LeaseID      string `json:"lease_id"`
		}
		if code != 0 || json.Unmarshal([]byte(out), &g) != nil {
			t.Fatalf("acquire: exit %d, %s%s", code, out, errOut)
		}
		tok := strconv.FormatUint(g.FencingToken, 10)
		// Another run under the same default id is an ordinary acquirer.
		if _, _, code := e.run(t, "acquire", "cli/stable"); code != 3 {
			t.Errorf("second acquire under the default client id: exit %d, want 3 (held)", code)
		}
		if _, errOut, code := e.run(t, "release", "cli/stable", "--token", tok, "--lease-id", g.LeaseID); code != 0 {
			t.Fatalf("release by a later run without --client-id: exit %d, %s", code, errOut)
		}
		_, errOut, code = e.run(t, "release", "cli/stable", "--token", tok, "--lease-id", g.LeaseID, "--client-id", "someone-else")
		if code != 4 || !strings.Contains(errOut, `client id "someone-else"`) {
			t.Errorf("release under another client id: exit %d, stderr %q; want 4 naming the client id", code, errOut)
		}
	})
	t.Run("JSONErrorsAndOneHolderLine", func(t *testing.T) {
		out, _, code := e.run(t, "acquire", "cli/json", "--client-id", "holder-1", "-o", "json")
		if code != 0 {
			t.Fatalf("acquire: exit %d, %s", code, out)
		}
		out, errOut, code := e.run(t, "acquire", "cli/json", "--client-id", "other", "-o", "json")
		var body struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if code != 3 || json.Unmarshal([]byte(out), &body) != nil || body.Error.Code != "lock_held" {
			t.Errorf("acquire of a held lock with -o json: exit %d, stdout %q, stderr %q; want exit 3 and a JSON lock_held error", code, out, errOut)
		}
		_, errOut, _ = e.run(t, "acquire", "cli/json", "--client-id", "other")
		if n := strings.Count(errOut, "holder-1"); n != 1 {
			t.Errorf("acquire of a held lock names the holder %d times, want once: %q", n, errOut)
		}
		start := time.Now()
		if _, _, code := e.run(t, "lock", "cli/json", "--wait", "2s", "--", "true"); code != 3 {
			t.Errorf("lock --wait 2s on a held lock: exit %d, want 3", code)
		}
		// A bound, not a speed: --wait 2s must not give up before 2 s.
		if d := time.Since(start); d < 2*time.Second {
			t.Errorf("lock --wait 2s gave up after %s", d)
		}
	})
	t.Run("SnapshotSave", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "backup.snap")
		// DLOCK_ENDPOINTS (set by e.command) names the test cluster.
		if out, errOut, code := e.run(t, "snapshot", "save", file); code != 0 {
			t.Fatalf("snapshot save: exit %d, %s%s", code, out, errOut)
		}
		before, _ := os.ReadFile(file)
		if _, errOut, code := e.run(t, "snapshot", "save", file); code == 0 || !strings.Contains(errOut, "already exists") {
			t.Errorf("snapshot save over an existing file: exit %d, %q; want a refusal", code, errOut)
		}
		if after, _ := os.ReadFile(file); len(before) == 0 || string(after) != string(before) {
			t.Errorf("the refused save changed the file")
		}
		if _, errOut, code := e.run(t, "snapshot", "save", file, "--force", "--endpoints", e.endpoints); code != 0 {
			t.Errorf("snapshot save --force --endpoints: exit %d, %s", code, errOut)
		}
	})
}

// testServeFromEnvironment starts a one-node cluster configured by DLOCK_*
// variables alone, as a container or a systemd unit with an environment
// file does, and checks that it tells systemd (NOTIFY_SOCKET) it is ready
// once it can serve.
func testServeFromEnvironment(t *testing.T, e *cliEnv) {
	dir := t.TempDir()
	sockPath := filepath.Join(dir, "notify.sock")
	sock, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sockPath, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer sock.Close()
	api, raftAddr := testcluster.FreePort(t), testcluster.FreePort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.bin, "serve")
	cmd.Env = append(os.Environ(), "GORACE=atexit_sleep_ms=0", "NOTIFY_SOCKET="+sockPath,
		"DLOCK_ID=solo", "DLOCK_DATA_DIR="+filepath.Join(dir, "data"), "DLOCK_API_ADDR="+api,
		"DLOCK_RAFT_ADDR="+raftAddr, "DLOCK_INITIAL_CLUSTER=solo="+raftAddr, "DLOCK_LOG_FORMAT=json")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() }()
	sock.SetReadDeadline(time.Now().Add(30 * time.Second))
	buf := make([]byte, 256)
	n, err := sock.Read(buf)
	if err != nil || string(buf[:n]) != "READY=1" {
		t.Fatalf("notify socket: %q %v; stderr:\n%s", buf[:n], err, stderr.String())
	}
	res, err := http.Get("http://" + api + "/readyz")
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("/readyz after READY=1: %v %v", res, err)
	}
	res.Body.Close()
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
	for _, line := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("with DLOCK_LOG_FORMAT=json, a log line is not JSON: %q", line)
		}
	}
	out, _, code := e.run(t, "version")
	if code != 0 || !strings.HasPrefix(out, "dlock ") || !strings.Contains(out, " commit ") {
		t.Errorf("dlock version: exit %d, %q", code, out)
	}
}

// testOperatorRevokes is the operator's story with the CLI: dlock history
// shows the holder of a lock held by `dlock lock` (with its value), dlock
// revoke frees it, the held command is signalled and dlock exits 4, and the
// history then says revoked with the reason.
func testOperatorRevokes(t *testing.T, e *cliEnv) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	holder := e.command(ctx, "lock", "ops/batch", "--ttl", "3s", "--value", "nightly batch on host-1", "--grace", "5s", "--",
		"sh", "-c", `trap 'echo got TERM; exit 9' TERM; echo ready; while :; do sleep 0.1; done`)
	stdout, _ := holder.StdoutPipe()
	var holderErr bytes.Buffer
	holder.Stderr = &holderErr
	// The command runs in its own process group and keeps the pipes open
	// if the test fails before it ends: Wait must not wait for it for ever.
	holder.WaitDelay = 10 * time.Second
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { holder.Process.Kill(); holder.Wait() }()
	rd := bufio.NewReader(stdout)
	if line, err := rd.ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("holder: %q %v", line, err)
	}
	out, errOut, code := e.run(t, "history", "ops/batch", "-o", "json")
	var h struct {
		Name   string `json:"name"`
		Grants []struct {
			FencingToken uint64 `json:"fencing_token"`
			ClientID     string `json:"client_id"`
			Value        string `json:"value"`
			EndCause     string `json:"end_cause"`
			Reason       string `json:"reason"`
		} `json:"grants"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &h) != nil || len(h.Grants) != 1 || h.Grants[0].EndCause != "" || h.Grants[0].Value != "nightly batch on host-1" {
		t.Fatalf("history of the held lock: exit %d %s %s", code, out, errOut)
	}
	tok := strconv.FormatUint(h.Grants[0].FencingToken, 10)
	if _, errOut, code := e.run(t, "revoke", "ops/batch"); code != 2 || !strings.Contains(errOut, "--reason") {
		t.Fatalf("revoke without --reason: exit %d, %s", code, errOut)
	}
	if out, errOut, code := e.run(t, "revoke", "ops/batch", "--token", tok, "--reason", "stuck"); code != 0 || out != "revoked ops/batch fencing_token "+tok+"\n" {
		t.Fatalf("revoke: exit %d, %q %s", code, out, errOut)
	}
	rest, _ := rd.ReadString(0)
	holder.Wait()
	if code := holder.ProcessState.ExitCode(); code != 4 || rest != "got TERM\n" || !strings.Contains(holderErr.String(), "revoked") {
		t.Fatalf("the revoked dlock lock: exit %d, command output %q, stderr %q; want SIGTERM to the command and exit 4", code, rest, holderErr.String())
	}
	out, _, code = e.run(t, "history", "ops/batch")
	if code != 0 || !strings.Contains(out, "revoked") || !strings.Contains(out, "stuck") || !strings.Contains(out, tok) {
		t.Fatalf("history after the revoke: exit %d\n%s", code, out)
	}
	if _, errOut, code := e.run(t, "revoke", "ops/batch", "--token", tok, "--reason", "again"); code == 0 || !strings.Contains(errOut, "not_found") {
		t.Fatalf("revoke of an ended grant: exit %d, %s", code, errOut)
	}

	// An election: dlock revoke --election ends the leader's seat, and
	// dlock elect signals its command and exits 4.
	leader := e.command(ctx, "elect", "ops/leader", "--ttl", "3s", "--grace", "5s", "--",
		"sh", "-c", `trap 'echo got TERM; exit 9' TERM; echo leading; while :; do sleep 0.1; done`)
	lout, _ := leader.StdoutPipe()
	var leaderErr bytes.Buffer
	leader.Stderr = &leaderErr
	leader.WaitDelay = 10 * time.Second
	if err := leader.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { leader.Process.Kill(); leader.Wait() }()
	lrd := bufio.NewReader(lout)
	if line, err := lrd.ReadString('\n'); err != nil || line != "leading\n" {
		t.Fatalf("leader: %q %v", line, err)
	}
	if _, errOut, code := e.run(t, "revoke", "ops/leader", "--reason", "drill"); code == 0 || !strings.Contains(errOut, "not_found") {
		t.Fatalf("revoke of the lock ops/leader (nobody holds it; the election is apart): exit %d, %s", code, errOut)
	}
	out, errOut, code = e.run(t, "revoke", "ops/leader", "--election", "--reason", "drill", "-o", "json")
	var rv struct {
		Revoked bool     `json:"revoked"`
		Tokens  []uint64 `json:"fencing_tokens"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &rv) != nil || !rv.Revoked || len(rv.Tokens) != 1 {
		t.Fatalf("revoke --election: exit %d, %q %s", code, out, errOut)
	}
	rest, _ = lrd.ReadString(0)
	leader.Wait()
	if code := leader.ProcessState.ExitCode(); code != 4 || rest != "got TERM\n" {
		t.Fatalf("the revoked dlock elect: exit %d, command output %q, stderr %q; want SIGTERM to the command and exit 4", code, rest, leaderErr.String())
	}
	out, _, code = e.run(t, "history", "ops/leader", "--election")
	if code != 0 || !strings.Contains(out, "revoked") || !strings.Contains(out, "drill") || !strings.Contains(out, strconv.FormatUint(rv.Tokens[0], 10)) {
		t.Fatalf("election history after the revoke: exit %d\n%s", code, out)
	}
}

// testLockModelCommands: --limit, --shared and --subtree on dlock acquire and
// dlock lock, and dlock status listing every holder.
func testLockModelCommands(t *testing.T, e *cliEnv) {
	for i := range 2 {
		if _, errOut, code := e.run(t, "acquire", "cli/sem", "--limit", "2", "--client-id", "sem-"+strconv.Itoa(i)); code != 0 {
			t.Fatalf("acquire %d of limit 2: exit %d: %s", i, code, errOut)
		}
	}
	if _, errOut, code := e.run(t, "acquire", "cli/sem", "--limit", "2"); code != 3 {
		t.Fatalf("a third place of limit 2: exit %d: %s", code, errOut)
	}
	if _, errOut, code := e.run(t, "acquire", "cli/sem"); code != 1 || !strings.Contains(errOut, "limit_mismatch") {
		t.Fatalf("a mutex acquire of a counting lock: exit %d: %s", code, errOut)
	}
	out, _, code := e.run(t, "status", "cli/sem")
	if code != 0 || !strings.Contains(out, "held by 2 (exclusive, limit 2)") || !strings.Contains(out, "sem-0") || !strings.Contains(out, "sem-1") {
		t.Fatalf("status of a counting lock: exit %d:\n%s", code, out)
	}
	// A shared holder lets a shared dlock lock run at once.
	if _, errOut, code := e.run(t, "acquire", "cli/rw", "--shared", "--client-id", "reader"); code != 0 {
		t.Fatalf("shared acquire: exit %d: %s", code, errOut)
	}
	out, errOut, code := e.run(t, "lock", "cli/rw", "--shared", "--no-wait", "--", "sh", "-c", "echo token $DLOCK_FENCING_TOKEN")
	if code != 0 || !strings.Contains(out, "token ") {
		t.Fatalf("dlock lock --shared beside a reader: exit %d: %s %s", code, out, errOut)
	}
	if _, _, code := e.run(t, "lock", "cli/rw", "--no-wait", "--", "true"); code != 3 {
		t.Fatalf("dlock lock (exclusive) beside a reader: exit %d", code)
	}
	// A subtree lock waits for a holder inside it.
	if _, errOut, code := e.run(t, "acquire", "cli/tree/job-a", "--client-id", "job-a"); code != 0 {
		t.Fatalf("acquire inside the subtree: exit %d: %s", code, errOut)
	}
	if _, errOut, code := e.run(t, "lock", "cli/tree", "--subtree", "--no-wait", "--", "true"); code != 3 || !strings.Contains(errOut, "job-a") {
		t.Fatalf("dlock lock --subtree over a holder inside: exit %d: %s", code, errOut)
	}
	if _, errOut, code := e.run(t, "lock", "cli/x", "--shared", "--limit", "2", "--", "true"); code != 2 || !strings.Contains(errOut, "--limit 1") {
		t.Fatalf("--shared with --limit 2: exit %d: %s", code, errOut)
	}
}
