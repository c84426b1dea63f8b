package deploy

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/proc"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
)

// podman runs podman with the options this machine needs: runc, since crun
// refuses hosts whose cgroups are in hybrid mode, and limits no higher than
// the test's own, since a sandbox without CAP_SYS_RESOURCE cannot raise them.
func podman(t *testing.T, ctx context.Context, args ...string) (string, error) {
	t.Helper()
	bin := need(t, "podman", "podman runc")
	if _, err := exec.LookPath("runc"); err == nil {
		args = append([]string{"--runtime", "runc"}, args...)
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// The image builds offline (FROM scratch, the binary built here), runs as a
// non-root user, and three containers started from it with DLOCK_*
// variables alone form a cluster that grants a lock once and refuses it to
// a second client; the image's health check passes on a ready node.
func TestContainerCluster(t *testing.T) {
	need(t, "podman", "podman runc")
	root := repoRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// The build context: deploy/container's files and a static binary.
	bctx := t.TempDir()
	for _, f := range []string{"passwd", "group"} {
		b, err := os.ReadFile(filepath.Join(root, "deploy", "container", f))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(bctx, f), b, 0o644)
	}
	os.MkdirAll(filepath.Join(bctx, "data"), 0o755)
	if err := proc.Build("github.com/dlock/dlock/cmd/dlock", filepath.Join(bctx, "dlock"), false, "CGO_ENABLED=0"); err != nil {
		t.Fatalf("static build: %v", err)
	}
	tag := "localhost/dlock-test:" + strings.ToLower(rand.Text()[:10])
	if out, err := podman(t, ctx, "build", "--format", "docker", "-q", "-t", tag, "-f", filepath.Join(root, "deploy", "Dockerfile"), bctx); err != nil {
		t.Fatalf("podman build: %v\n%s", err, out)
	}
	t.Cleanup(func() { podman(t, context.Background(), "rmi", "-f", tag) })
	out, err := podman(t, ctx, "image", "inspect", "--format", "{{.Config.User}} {{json .Config.Healthcheck}}", tag)
	if err != nil || !strings.HasPrefix(out, "65532:65532 ") || !strings.Contains(out, "health") {
		t.Fatalf("image user and health check: %q %v", out, err)
	}

	ids := []string{"n1", "n2", "n3"}
	api, raftAddr := map[string]string{}, map[string]string{}
	var initial []string
	for _, id := range ids {
		api[id], raftAddr[id] = testcluster.FreePort(t), testcluster.FreePort(t)
		initial = append(initial, id+"="+raftAddr[id])
	}
	suffix := strings.ToLower(rand.Text()[:8])
	for _, id := range ids {
		name := "dlock-test-" + suffix + "-" + id
		out, err := podman(t, ctx, "run", "-d", "--name", name, "--network", "host",
			"--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096",
			"-e", "DLOCK_ID="+id, "-e", "DLOCK_API_ADDR="+api[id], "-e", "DLOCK_RAFT_ADDR="+raftAddr[id],
			"-e", "DLOCK_GRPC_ADDR=", "-e", "DLOCK_INITIAL_CLUSTER="+strings.Join(initial, ","),
			"-e", "DLOCK_HEALTH_URL=http://"+api[id]+"/readyz", tag)
		if err != nil {
			t.Fatalf("podman run %s: %v\n%s", id, err, out)
		}
		t.Cleanup(func() {
			if t.Failed() {
				logs, _ := podman(t, context.Background(), "logs", name)
				t.Logf("logs of %s:\n%s", name, logs)
			}
			podman(t, context.Background(), "rm", "-f", "-t", "5", name)
		})
	}
	hc := &http.Client{Timeout: 2 * time.Second}
	for _, id := range ids {
		testutil.Eventually(t, 60*time.Second, id+" ready", func() (bool, string) {
			res, err := hc.Get("http://" + api[id] + "/readyz")
			if err != nil {
				return false, err.Error()
			}
			res.Body.Close()
			return res.StatusCode == 200, res.Status
		})
	}
	acquire := func(node, client string) (int, map[string]any) {
		body := fmt.Sprintf(`{"client_id":%q,"ttl_ms":30000}`, client)
		res, err := hc.Post("http://"+api[node]+"/api/v1/locks/deploy/container/acquire", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var v map[string]any
		json.NewDecoder(res.Body).Decode(&v)
		return res.StatusCode, v
	}
	if code, v := acquire("n1", "alice"); code != 200 || v["fencing_token"] == nil {
		t.Fatalf("acquire through n1: %d %v", code, v)
	}
	if code, v := acquire("n3", "bob"); code != 409 {
		t.Fatalf("second acquire through n3: %d %v, want 409 lock_held", code, v)
	}
	if out, err := podman(t, ctx, "healthcheck", "run", "dlock-test-"+suffix+"-n2"); err != nil {
		t.Fatalf("health check of a ready node: %v\n%s", err, out)
	}
}
