//go:build unix

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/raftnode"
	"github.com/dlock/dlock/internal/server"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
)

// testElect: two `dlock elect` at once run their commands one after the
// other; each resigns when its command exits.
func testElect(t *testing.T, e *cliEnv) {
	runContending(t, e, "elect", "ci/leader", "--ttl", "5s")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var v struct {
		Leader      *struct{} `json:"leader"`
		Campaigners int       `json:"campaigners"`
	}
	if code, err := e.tc.Do(ctx, http.MethodGet, e.tc.URL(e.tc.Running()[0])+"/api/v1/elections/ci/leader", nil, &v); err != nil || code != 200 {
		t.Fatalf("GET election: %d %v", code, err)
	}
	if v.Leader != nil || v.Campaigners != 0 {
		t.Fatalf("after both commands exited: %+v; want a vacant seat (both resigned)", v)
	}

	out, _, code := e.run(t, "elect", "ci/env", "--value", "me", "--", "sh", "-c", `echo "$DLOCK_NAME $DLOCK_LEADER_VALUE $DLOCK_FENCING_TOKEN"; exit 7`)
	if f := strings.Fields(out); code != 7 || len(f) != 3 || f[0] != "ci/env" || f[1] != "me" {
		t.Fatalf("exit %d, output %q; want the command's exit code 7 and its environment", code, out)
	}

	// A leader is in office: --wait gives up with 3.
	holder := e.command(ctx, "elect", "ci/held", "--", "sh", "-c", "echo leading; sleep 30")
	stdout, _ := holder.StdoutPipe()
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { holder.Process.Signal(syscall.SIGTERM); holder.Wait() }()
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "leading\n" {
		t.Fatalf("holder: %q %v", line, err)
	}
	if _, errOut, code := e.run(t, "elect", "ci/held", "--wait", "300ms", "--", "true"); code != 3 || !strings.Contains(errOut, "is led by") {
		t.Fatalf("elect --wait 300ms while another leads: exit %d, stderr %q; want 3 and the leader", code, errOut)
	}
	if _, _, code := e.run(t, "elect", "ci/held"); code != 2 {
		t.Fatalf("elect without a command: exit %d, want 2", code)
	}
}

// testWatchCommand: list -o json gives a revision; watch from it + 1 prints
// the later changes, in JSON lines and in human form, until interrupted.
func testWatchCommand(t *testing.T, e *cliEnv) {
	out, _, code := e.run(t, "list", "cli/w/", "-o", "json")
	var list struct {
		Revision uint64 `json:"revision"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || list.Revision == 0 {
		t.Fatalf("list -o json: exit %d: %s", code, out)
	}
	from := strconv.FormatUint(list.Revision+1, 10)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var watches []*exec.Cmd
	defer func() { // before cancel, which would kill them
		for _, cmd := range watches {
			cmd.Process.Signal(syscall.SIGINT)
			if err := cmd.Wait(); err != nil {
				t.Errorf("dlock %v after SIGINT: %v; want exit 0", cmd.Args[1:], err)
			}
		}
	}()
	start := func(args ...string) *bufio.Reader {
		cmd := e.command(ctx, args...)
		stdout, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		watches = append(watches, cmd)
		return bufio.NewReader(stdout)
	}
	jsonOut := start("watch", "cli/w/", "--from-revision", from, "-o", "json")
	humanOut := start("watch", "cli/w/", "--from-revision", from)

	out, _, code = e.run(t, "acquire", "cli/w/x", "--ttl", "20s", "--client-id", "wx", "-o", "json")
	var g struct {
		FencingToken uint64 `json:"fencing_token"`
		LeaseID      string `json:"lease_id"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &g) != nil {
		t.Fatalf("acquire: exit %d: %s", code, out)
	}
	tok := strconv.FormatUint(g.FencingToken, 10)
	if _, _, code := e.run(t, "release", "cli/w/x", "--token", tok, "--lease-id", g.LeaseID, "--client-id", "wx"); code != 0 {
		t.Fatalf("release: exit %d", code)
	}

	var revs []uint64
	for _, typ := range []string{"acquired", "released"} {
		line, err := jsonOut.ReadString('\n')
		var ev struct {
			Revision     uint64 `json:"revision"`
			Type         string `json:"type"`
			Kind         string `json:"kind"`
			Name         string `json:"name"`
			ClientID     string `json:"client_id"`
			FencingToken uint64 `json:"fencing_token"`
		}
		if err != nil || json.Unmarshal([]byte(line), &ev) != nil || ev.Type != typ || ev.Kind != "lock" || ev.Name != "cli/w/x" ||
			ev.ClientID != "wx" || ev.FencingToken != g.FencingToken || ev.Revision <= list.Revision {
			t.Fatalf("watch -o json: %q %v; want %s of cli/w/x by wx", line, err, typ)
		}
		revs = append(revs, ev.Revision)
	}
	for i, typ := range []string{"acquired", "released"} {
		line, err := humanOut.ReadString('\n')
		if want := fmt.Sprintf("%d lock cli/w/x %s client=wx token=%s", revs[i], typ, tok); err != nil || !strings.HasPrefix(line, want) {
			t.Fatalf("watch: %q %v; want a line starting %q", line, err, want)
		}
	}

	if _, errOut, code := e.run(t, "watch", "--endpoints", "http://127.0.0.1:1", "--timeout", "300ms"); code != 1 {
		t.Fatalf("watch of an unreachable cluster: exit %d, %s; want 1", code, errOut)
	}
	if _, _, code := e.run(t, "watch", "a/", "b/"); code != 2 {
		t.Fatalf("watch with two prefixes: exit %d, want 2", code)
	}
}

type membersJSON struct {
	LeaderID string `json:"leader_id"`
	Members  []struct {
		ID       string `json:"id"`
		Suffrage string `json:"suffrage"`
	} `json:"members"`
}

func (m membersJSON) ids() []string {
	var ids []string
	for _, x := range m.Members {
		ids = append(ids, x.ID)
	}
	slices.Sort(ids)
	return ids
}

// testMembersChanges hands the leadership on, adds a node and removes it.
func testMembersChanges(t *testing.T, e *cliEnv) {
	members := func() membersJSON {
		t.Helper()
		out, errOut, code := e.run(t, "members", "-o", "json")
		var m membersJSON
		if code != 0 || json.Unmarshal([]byte(out), &m) != nil {
			t.Fatalf("members -o json: exit %d: %s %s", code, out, errOut)
		}
		return m
	}
	eventuallyMembers := func(what string, cond func(membersJSON) bool) {
		t.Helper()
		testutil.Eventually(t, 15*time.Second, "members: "+what, func() (bool, string) {
			m := members()
			return cond(m), fmt.Sprintf("%+v", m)
		})
	}

	before := members()
	to := ""
	for _, m := range before.Members {
		if m.ID != before.LeaderID {
			to = m.ID
		}
	}
	out, errOut, code := e.run(t, "members", "transfer-leadership", to)
	if code != 0 || strings.TrimSpace(out) != "leader is now "+to {
		t.Fatalf("transfer-leadership %s: exit %d: %s %s", to, code, out, errOut)
	}
	eventuallyMembers("leader "+to, func(m membersJSON) bool { return m.LeaderID == to })
	out, errOut, code = e.run(t, "members", "transfer-leadership")
	if next := strings.TrimPrefix(strings.TrimSpace(out), "leader is now "); code != 0 || next == to || next == out {
		t.Fatalf("transfer-leadership: exit %d: %s %s; want another leader than %s", code, out, errOut, to)
	}

	// A fresh node, started without a cluster, waits to be added.
	raftAddr, apiAddr := testcluster.FreePort(t), testcluster.FreePort(t)
	quiet := slog.New(slog.DiscardHandler)
	s, err := server.Start(server.Config{Raft: raftnode.Config{ID: "n9", DataDir: t.TempDir(), RaftAddr: raftAddr, RaftLogLevel: "off", Logger: quiet},
		APIAddr: apiAddr, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Kill()
	if out, errOut, code := e.run(t, "members", "add", "n9", raftAddr); code != 0 || !strings.Contains(out, "added n9") {
		t.Fatalf("members add: exit %d: %s %s", code, out, errOut)
	}
	eventuallyMembers("n9", func(m membersJSON) bool { return slices.Contains(m.ids(), "n9") })
	if out, errOut, code := e.run(t, "members", "remove", "n9"); code != 0 || strings.TrimSpace(out) != "removed n9" {
		t.Fatalf("members remove: exit %d: %s %s", code, out, errOut)
	}
	eventuallyMembers("the first three only", func(m membersJSON) bool { return slices.Equal(m.ids(), before.ids()) })

	if _, errOut, code := e.run(t, "members", "remove", "nope"); code != 1 || !strings.Contains(errOut, "nope") {
		t.Fatalf("remove of an unknown member: exit %d, %s; want 1", code, errOut)
	}
	if _, _, code := e.run(t, "members", "remove"); code != 2 {
		t.Fatalf("remove without an id: exit %d, want 2", code)
	}
	if _, _, code := e.run(t, "members", "frobnicate"); code != 2 {
		t.Fatalf("unknown subcommand: exit %d, want 2", code)
	}
}
