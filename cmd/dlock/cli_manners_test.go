//go:build unix

package main

import (
	"bytes"
	"context"
	"encoding/json"
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

	"github.com/dlock/dlock/internal/testcluster"
)

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
