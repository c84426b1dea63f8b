package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dlock/dlock/client"
	dproc "github.com/dlock/dlock/internal/proc"
	"github.com/dlock/dlock/internal/testutil"
	"github.com/dlock/dlock/internal/tlsconfig"
)

// TestTLSProcesses runs three `dlock serve` processes with TLS on the API
// (client certificates required) and mutual TLS between nodes, and uses them
// over https and through the CLI's --cacert/--cert/--key and DLOCK_* env.
func TestTLSProcesses(t *testing.T) {
	bin := dlockBinary(t)
	dir := t.TempDir()
	f, err := tlsconfig.GenerateDev(filepath.Join(dir, "tls"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	base := pickBasePort(t, 0, 1, 10, 11, 20, 21)
	var initial, urls []string
	for i := range 3 {
		initial = append(initial, fmt.Sprintf("n%d=127.0.0.1:%d", i+1, base+10*i+1))
		urls = append(urls, fmt.Sprintf("https://127.0.0.1:%d", base+10*i))
	}
	tlsArgs := []string{"--tls-cert", f.NodeCert, "--tls-key", f.NodeKey, "--tls-ca", f.CA, "--tls-client-auth", "require",
		"--peer-cert", f.NodeCert, "--peer-key", f.NodeKey, "--peer-ca", f.CA}
	var procs []*proc
	var logs []string
	for i := range 3 {
		id := fmt.Sprintf("n%d", i+1)
		logPath := filepath.Join(dir, id+".log")
		args := append([]string{"serve", "--id", id, "--data-dir", filepath.Join(dir, id),
			"--api-addr", fmt.Sprintf("127.0.0.1:%d", base+10*i), "--raft-addr", fmt.Sprintf("127.0.0.1:%d", base+10*i+1),
			"--initial-cluster", strings.Join(initial, ","), "--log-level", "warn"}, tlsArgs...)
		procs = append(procs, launch(t, id, logPath, nil, bin, args...))
		logs = append(logs, logPath)
	}
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, p := range procs {
			wg.Add(1)
			go func() { defer wg.Done(); p.stop(syscall.SIGTERM) }()
		}
		wg.Wait()
		for i, l := range logs {
			checkRaces(t, procs[i].Name, l)
			if t.Failed() {
				t.Logf("--- tail of %s's log:\n%s", procs[i].Name, dproc.LogTail(l, 40))
			}
		}
	})

	withCert := tlsClient(t, f.CA, f.ClientCert, f.ClientKey)
	for _, u := range urls {
		testutil.Eventually(t, 20*time.Second*slow, u+" ready over https", func() (bool, string) {
			code, body, err := tlsCall(withCert, http.MethodGet, u+"/readyz", "")
			if err != nil {
				return false, err.Error()
			}
			return code == http.StatusOK, body
		})
	}

	code, body, err := tlsCall(withCert, http.MethodPost, urls[0]+"/api/v1/locks/e2e/tls/acquire", `{"client_id":"c1","ttl_ms":60000}`)
	if err != nil || code != http.StatusOK {
		t.Fatalf("acquire over https: %d %s %v", code, body, err)
	}
	var a acquireAnswer
	if err := json.Unmarshal([]byte(body), &a); err != nil || !a.Acquired {
		t.Fatalf("acquire answer %s: %v", body, err)
	}
	code, body, err = tlsCall(withCert, http.MethodGet, urls[2]+"/api/v1/locks/e2e/tls", "")
	var v lockView
	if err == nil {
		err = json.Unmarshal([]byte(body), &v)
	}
	if err != nil || code != http.StatusOK || !v.Held || v.Holder.FencingToken != a.FencingToken {
		t.Fatalf("read on n3 over https: %d %s %v, want held with token %d", code, body, err, a.FencingToken)
	}

	// The API requires a client certificate; plain http gets nothing.
	if _, _, err := tlsCall(tlsClient(t, f.CA, "", ""), http.MethodGet, urls[0]+"/api/v1/cluster", ""); err == nil {
		t.Error("https without a client certificate got an answer")
	}
	if code, _, err := tlsCall(httpClient, http.MethodGet, strings.Replace(urls[0], "https", "http", 1)+"/api/v1/cluster", ""); err == nil && code == http.StatusOK {
		t.Error("plain http to the TLS API answered 200")
	}
	// A plaintext forward request to a raft port is dropped unanswered.
	checkRaftPortRefusesPlaintext(t, fmt.Sprintf("127.0.0.1:%d", base+1))

	t.Run("CLI", func(t *testing.T) {
		eps := strings.Join(urls, ",")
		out, _, code := runCLI(t, bin, nil, "acquire", "e2e/cli", "--ttl", "30s", "--endpoints", eps,
			"--cacert", f.CA, "--cert", f.ClientCert, "--key", f.ClientKey)
		if code != 0 || !strings.Contains(out, "acquired e2e/cli") {
			t.Fatalf("dlock acquire with TLS flags: exit %d, output %q", code, out)
		}
		env := []string{"DLOCK_ENDPOINTS=" + eps, "DLOCK_CACERT=" + f.CA, "DLOCK_CERT=" + f.ClientCert, "DLOCK_KEY=" + f.ClientKey}
		out, _, code = runCLI(t, bin, env, "status", "e2e/cli")
		if code != 0 || !strings.Contains(out, "held by") {
			t.Fatalf("dlock status with DLOCK_CACERT/CERT/KEY: exit %d, output %q", code, out)
		}
		snap := filepath.Join(t.TempDir(), "snap")
		out, errOut, code := runCLI(t, bin, env[1:], "snapshot", "save", snap, "--endpoint", urls[1])
		if st, err := os.Stat(snap); code != 0 || err != nil || st.Size() == 0 {
			t.Fatalf("dlock snapshot save over https: exit %d, %s%s", code, out, errOut)
		}
		_, errOut, code = runCLI(t, bin, env[:2], "status", "e2e/cli", "--timeout", "2s")
		if code != 1 || !strings.Contains(errOut, "certificate") {
			t.Fatalf("dlock status without a client certificate: exit %d, stderr %q; want 1 and a certificate error", code, errOut)
		}
	})

	t.Run("BadFlags", func(t *testing.T) {
		cmd := exec.Command(bin, "serve", "--id", "x", "--data-dir", t.TempDir(), "--tls-cert", f.NodeCert)
		out, _ := cmd.CombinedOutput()
		if cmd.ProcessState.ExitCode() != 1 || !strings.Contains(string(out), "--tls-cert and --tls-key go together") {
			t.Fatalf("serve --tls-cert without --tls-key: exit %d, %s", cmd.ProcessState.ExitCode(), out)
		}
	})
}

func tlsClient(t *testing.T, ca, cert, key string) *http.Client {
	t.Helper()
	cfg, err := client.LoadTLSConfig(ca, cert, key)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true, TLSClientConfig: cfg}}
}

func tlsCall(hc *http.Client, method, url, body string) (int, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res.StatusCode, string(b), err
}

// checkRaftPortRefusesPlaintext sends what a plaintext node sends to forward
// a request and expects the connection closed without an answer.
func checkRaftPortRefusesPlaintext(t *testing.T, addr string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, "FGET /forward/status HTTP/1.1\r\nHost: n\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(conn)
	var ne net.Error
	if len(got) > 0 || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("plaintext to the TLS raft port: read %q, %v; want the connection closed unanswered", got, err)
	}
}

// runCLI runs the dlock CLI with extra environment and returns stdout,
// stderr and the exit code.
func runCLI(t *testing.T, bin string, env []string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "DLOCK_ENDPOINTS=", "DLOCK_CACERT=", "DLOCK_CERT=", "DLOCK_KEY=", "GORACE=atexit_sleep_ms=0")
	cmd.Env = append(cmd.Env, env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatalf("dlock %v: %v", args, err)
	}
	return out.String(), errOut.String(), cmd.ProcessState.ExitCode()
}
