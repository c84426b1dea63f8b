package deploy

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/server"
	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/testcluster"
)

func TestPromtoolRules(t *testing.T) {
	promtool := need(t, "promtool", "prometheus")
	dir := filepath.Join(repoRoot(t), "deploy", "monitoring")
	for _, args := range [][]string{{"check", "rules", "alerts.yml"}, {"test", "rules", "alerts_test.yml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

var metricName = regexp.MustCompile(`\bdlock_[a-z_]+\b`)

// Every dlock_* series that an alert or a dashboard panel queries must be one
// a running node exports: a renamed metric would otherwise leave an alert
// that never fires.
func TestMonitoringNamesRealMetrics(t *testing.T) {
	root := repoRoot(t)
	want := map[string][]string{}
	for _, f := range []string{"alerts.yml", "dashboard.json"} {
		b, err := os.ReadFile(filepath.Join(root, "deploy", "monitoring", f))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range metricName.FindAllString(string(b), -1) {
			want[m] = append(want[m], f)
		}
	}
	if len(want) < 10 {
		t.Fatalf("found only %d metric names in the monitoring pack", len(want))
	}
	// One node, with a rate limit low enough to refuse a burst, so every
	// labelled series has a sample.
	c := testcluster.NewWith(t, 1, testcluster.Options{Limits: server.Limits{Service: service.Limits{Rate: 1, Burst: 1}}})
	id := c.WaitLeader(10 * time.Second)
	ctx := context.Background()
	for i := range 5 {
		c.Do(ctx, http.MethodPost, c.URL(id)+"/api/v1/locks/mon/x/acquire", map[string]any{"client_id": "mon", "ttl_ms": 5000, "request_id": string(rune('a' + i))}, nil)
	}
	res, err := http.Get(c.URL(id) + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	have := map[string]bool{}
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "dlock_") {
			have[metricName.FindString(line)] = true
		}
	}
	var missing []string
	for m, files := range want {
		if !have[m] {
			missing = append(missing, m+" ("+strings.Join(files, ", ")+")")
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Fatalf("the monitoring pack names metrics a node does not export: %s", strings.Join(missing, "; "))
	}
}

// systemd-analyze verify exits 0 even for directives it ignores, so any line
// it prints about the unit is a failure.
func TestSystemdUnitVerifies(t *testing.T) {
	sa := need(t, "systemd-analyze", "systemd")
	unit, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "systemd", "dlock.service"))
	if err != nil {
		t.Fatal(err)
	}
	// verify checks that ExecStart's binary exists: point it at one that does.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "dlock.service")
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(string(unit), "/usr/local/bin/dlock", self)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(sa, "verify", path).CombinedOutput()
	if err != nil || strings.Contains(string(out), "dlock.service") {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
	for _, want := range []string{"Type=notify", "User=dlock", "EnvironmentFile=", "LimitNOFILE=", "NoNewPrivileges=yes"} {
		if !strings.Contains(string(unit), want) {
			t.Errorf("unit lacks %s", want)
		}
	}
}
