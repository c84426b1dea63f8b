package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dproc "github.com/dlock/dlock/internal/proc"
	"github.com/dlock/dlock/internal/testutil"
)

type shardsInfo struct {
	Shards []struct {
		ID       int    `json:"id"`
		LeaderID string `json:"leader_id"`
		Term     uint64 `json:"term"`
	} `json:"shards"`
}

func shardLeaders(t testing.TB, baseURL string) []string {
	r, err := call(http.MethodGet, baseURL+"/api/v1/cluster", nil)
	if err != nil || r.Status != http.StatusOK {
		return nil
	}
	var ci shardsInfo
	if r.decode(&ci) != nil {
		return nil
	}
	var out []string
	for _, s := range ci.Shards {
		out = append(out, s.LeaderID)
	}
	return out
}

// grantLog follows a watch over everything and records every grant.
type grantLog struct {
	mu     sync.Mutex
	grants []string // "shard/revision name"
}

func (g *grantLog) follow(ctx context.Context, t *testing.T, url string) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Errorf("watch %s: %v", url, err)
		return
	}
	go func() {
		defer res.Body.Close()
		sc := bufio.NewScanner(res.Body)
		for sc.Scan() {
			line, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok {
				continue
			}
			var ev struct {
				Type, Name string
				Revision   uint64
				Shard      *int
			}
			if json.Unmarshal([]byte(line), &ev) != nil || ev.Type != "acquired" || ev.Shard == nil {
				continue
			}
			g.mu.Lock()
			g.grants = append(g.grants, fmt.Sprintf("%d/%d %s", *ev.Shard, ev.Revision, ev.Name))
			g.mu.Unlock()
		}
	}()
}

func (g *grantLog) names() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []string
	for _, s := range g.grants {
		out = append(out, s[strings.IndexByte(s, ' ')+1:])
	}
	return out
}

// TestShardedKillNodeProcess is the operator story on real processes: a
// 3-process 4-shard cluster spreads its shard leaders over the nodes; locks
// in every range list in name order and a watch over everything sees each
// grant once; kill -9 of the node that leads two shards: both fail over and
// keep their holders (same tokens) and waiters, who get the locks next.
func TestShardedKillNodeProcess(t *testing.T) {
	c := startClusterWith(t, 3, "--shards", "4", "--raft-engine", "etcd")
	testutil.Eventually(t, 30*time.Second*slow, "shard leaders spread over the three nodes", func() (bool, string) {
		l := shardLeaders(t, c.url("n2"))
		return slices.Equal(l, []string{"n1", "n2", "n3", "n1"}), fmt.Sprint(l)
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var log grantLog
	log.follow(ctx, t, c.url("n2")+"/api/v1/watch")

	names := []string{"tango/job", "golf", "alpha/job", "november/x"} // shards 3, 1, 0, 2
	held := map[string]acquireAnswer{}
	for _, name := range names {
		r := mustCall(t, http.MethodPost, c.url("n3")+"/api/v1/locks/"+name+"/acquire",
			map[string]any{"client_id": "holder", "ttl_ms": 60000}, http.StatusOK, nil)
		held[name] = checkGrant(t, "holder acquire "+name, r)
	}
	var waits []*pending
	for _, name := range names {
		waits = append(waits, startCall(http.MethodPost, c.url("n2")+"/api/v1/locks/"+name+"/acquire",
			map[string]any{"client_id": "waiter", "ttl_ms": 60000, "wait_timeout_ms": 90000}, 100*time.Second))
	}
	for _, name := range names {
		testutil.Eventually(t, 10*time.Second*slow, "waiter queued on "+name, func() (bool, string) {
			v := getLock(t, c.url("n3"), name)
			return v.Waiters == 1, fmt.Sprint(v)
		})
	}
	var list struct {
		Locks []struct{ Name string } `json:"locks"`
	}
	mustCall(t, http.MethodGet, c.url("n2")+"/api/v1/locks?prefix=", nil, http.StatusOK, &list)
	var listed []string
	for _, l := range list.Locks {
		listed = append(listed, l.Name)
	}
	want := slices.Clone(names)
	slices.Sort(want)
	if !slices.Equal(listed, want) {
		t.Fatalf("list = %v, want %v", listed, want)
	}

	// kill -9 n1, which leads shards 0 and 3.
	c.kill("n1")
	testutil.Eventually(t, 20*time.Second*slow, "shards 0 and 3 fail over", func() (bool, string) {
		l := shardLeaders(t, c.url("n2"))
		if len(l) != 4 {
			return false, fmt.Sprint(l)
		}
		for _, id := range l {
			if id == "" || id == "n1" {
				return false, fmt.Sprint(l)
			}
		}
		return true, ""
	})
	for _, name := range names {
		for _, id := range []string{"n2", "n3"} {
			checkHeld(t, "after the kill, on "+id, getLock(t, c.url(id), name), "holder", held[name].FencingToken, 1)
		}
	}
	for i, name := range names {
		mustCall(t, http.MethodPost, c.url("n3")+"/api/v1/locks/"+name+"/release",
			map[string]any{"client_id": "holder", "fencing_token": held[name].FencingToken, "lease_id": held[name].LeaseID}, http.StatusOK, nil)
		res := waits[i].result(t, "the waiter on "+name, 20*time.Second)
		a := checkGrant(t, "waiter acquire "+name, res.r)
		if a.FencingToken <= held[name].FencingToken {
			t.Fatalf("%s: the waiter's token %d is not above the holder's %d", name, a.FencingToken, held[name].FencingToken)
		}
	}
	// Every grant, once each: the holders' and the waiters'.
	testutil.Eventually(t, 10*time.Second*slow, "the watch saw all 8 grants", func() (bool, string) {
		return len(log.names()) >= 8, fmt.Sprint(log.names())
	})
	got := log.names()
	slices.Sort(got)
	var wantGrants []string
	for _, n := range want {
		wantGrants = append(wantGrants, n, n)
	}
	if !slices.Equal(got, wantGrants) {
		t.Fatalf("the watch saw grants %v, want each name twice: %v", got, wantGrants)
	}
}

// TestDevShards runs `dlock dev --shards 4` as an operator would: every
// shard gets a leader, spread over the three nodes; locks in every range
// list in name order through any node; Ctrl-C stops it cleanly.
func TestDevShards(t *testing.T) {
	bin := dlockBinary(t)
	dir := t.TempDir()
	base := pickBasePort(t, 0, 1, 2, 10, 11, 12, 20, 21, 22)
	logPath := filepath.Join(dir, "dev.log")
	p := launch(t, "dlock dev --shards 4", logPath, nil, bin, "dev", "--shards", "4", "--base-port", itoa(base), "--log-level", "warn")
	t.Cleanup(func() {
		if took, killed := p.stop(syscall.SIGTERM); killed {
			t.Errorf("dlock dev did not exit within %s of SIGTERM at clean-up; SIGKILLed it", took)
		}
		checkRaces(t, "dlock dev", logPath)
		if t.Failed() {
			t.Logf("--- tail of dlock dev's output:\n%s", dproc.LogTail(logPath, 60))
		}
	})
	n1, n3 := fmt.Sprintf("http://127.0.0.1:%d", base), fmt.Sprintf("http://127.0.0.1:%d", base+20)
	testutil.Eventually(t, 30*time.Second*slow, "every shard ready and the leaders spread", func() (bool, string) {
		if p.Exited() {
			t.Fatalf("dlock dev exited early: %v", p.WaitErr())
		}
		l := shardLeaders(t, n1)
		return slices.Equal(l, []string{"n1", "n2", "n3", "n1"}), fmt.Sprint(l)
	})
	names := []string{"zebra", "alpha/a", "mike/m", "oscar"}
	for _, name := range names {
		checkGrant(t, "acquire "+name, mustCall(t, http.MethodPost, n3+"/api/v1/locks/"+name+"/acquire",
			map[string]any{"client_id": "me", "ttl_ms": 30000}, http.StatusOK, nil))
	}
	var list struct {
		Locks []struct{ Name string } `json:"locks"`
	}
	mustCall(t, http.MethodGet, n1+"/api/v1/locks", nil, http.StatusOK, &list)
	var listed []string
	for _, l := range list.Locks {
		listed = append(listed, l.Name)
	}
	if want := []string{"alpha/a", "mike/m", "oscar", "zebra"}; !slices.Equal(listed, want) {
		t.Fatalf("list = %v, want %v", listed, want)
	}
	if _, killed := p.stop(syscall.SIGINT); killed {
		t.Fatalf("dlock dev --shards 4 did not exit within %s of SIGINT", stopTimeout)
	}
	if code := p.ExitCode(); code != 0 {
		t.Fatalf("dlock dev --shards 4 exited with %v after SIGINT, want 0", p.WaitErr())
	}
	if b, err := os.ReadFile(logPath); err == nil && strings.Contains(string(b), "level=ERROR") {
		t.Errorf("a clean Ctrl-C of dlock dev --shards 4 logged an ERROR:\n%s", dproc.LogTail(logPath, 30))
	}
}

// A sharded node refuses what it cannot do yet, and a data dir keeps its map.
func TestServeShardsRefusals(t *testing.T) {
	bin := dlockBinary(t)
	dir := t.TempDir()
	base := pickBasePort(t, 0, 1)
	api, raft := fmt.Sprintf("127.0.0.1:%d", base), fmt.Sprintf("127.0.0.1:%d", base+1)
	run := func(args ...string) (string, int) {
		p := launch(t, "dlock serve", filepath.Join(dir, "serve.log"), nil, bin, append([]string{"serve", "--id", "n1", "--data-dir", filepath.Join(dir, "d"),
			"--api-addr", api, "--raft-addr", raft, "--initial-cluster", "n1=" + raft, "--log-level", "warn"}, args...)...)
		if !p.WaitExit(30 * time.Second * slow) {
			p.kill(t)
			t.Fatalf("dlock serve %v did not exit", args)
		}
		return dproc.LogTail(filepath.Join(dir, "serve.log"), 5), p.ExitCode()
	}
	if out, code := run("--shards", "4", "--raft-engine", "hashicorp"); code == 0 || !strings.Contains(out, "etcd") {
		t.Fatalf("--shards with hashicorp: exit %d, output %s", code, out)
	}
	if out, code := run("--shards", "4", "--shard-bounds", "g,n"); code == 0 || !strings.Contains(out, "--shard-bounds gives 3") {
		t.Fatalf("--shards 4 with 3 bounds: exit %d, output %s", code, out)
	}
	// A data dir keeps its map: made with 4 shards, it refuses 2 and 1.
	p := launch(t, "dlock serve", filepath.Join(dir, "serve.log"), nil, bin, "serve", "--id", "n1", "--data-dir", filepath.Join(dir, "d"),
		"--api-addr", api, "--raft-addr", raft, "--initial-cluster", "n1="+raft, "--log-level", "warn", "--shards", "4")
	testutil.Eventually(t, 30*time.Second*slow, "the 4-shard node ready", func() (bool, string) {
		r, err := call(http.MethodGet, "http://"+api+"/readyz", nil)
		return err == nil && r.Status == http.StatusOK, fmt.Sprint(err)
	})
	if _, killed := p.stop(syscall.SIGTERM); killed {
		t.Fatal("dlock serve --shards 4 did not stop")
	}
	if out, code := run("--shards", "2"); code == 0 || !strings.Contains(out, "another shard map") {
		t.Fatalf("restart with --shards 2: exit %d, output %s", code, out)
	}
	if out, code := run(); code == 0 || !strings.Contains(out, "belongs to a sharded cluster") {
		t.Fatalf("restart without --shards: exit %d, output %s", code, out)
	}
}
