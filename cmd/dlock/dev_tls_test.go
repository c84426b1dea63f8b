package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock/client"
	"github.com/dlock/dlock/internal/loopback"
)

// TestDevTLS starts `dlock dev --tls` in-process and uses what it prints:
// the curl line's CA over https, and the CLI's --cacert.
func TestDevTLS(t *testing.T) {
	base, err := loopback.FreeBase([]string{"127.0.0.1"}, []int{0, 1, 2, 10, 11, 12, 20, 21, 22}, rand.IntN)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	args := []string{"--tls", "--base-port", fmt.Sprint(base), "--data-dir", t.TempDir(), "--log-level", "warn"}
	ran := false
	dev := newDevCmd(&out, func(shutdown func(context.Context) error, _ func(string, ...any)) error {
		ran = true
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := shutdown(ctx); err != nil {
				t.Errorf("shutdown: %v", err)
			}
		}()
		checkDevTLS(t, out.String(), base)
		return nil
	})
	dev.SetArgs(args)
	dev.SilenceErrors, dev.SilenceUsage = true, true
	if err := dev.Execute(); err != nil {
		t.Fatalf("dlock dev --tls: %v\n%s", err, out.String())
	}
	if !ran {
		t.Fatal("dlock dev --tls returned before serving")
	}
}

var (
	curlRe   = regexp.MustCompile(`curl -s --cacert (\S+) --json '[^']*' (https://\S+)/api/v1/locks/demo/acquire`)
	envRe    = regexp.MustCompile(`export DLOCK_CACERT=(\S+) DLOCK_CERT=(\S+) DLOCK_KEY=(\S+)`)
	endptsRe = regexp.MustCompile(`export DLOCK_ENDPOINTS=(\S+)`)
)

func checkDevTLS(t *testing.T, banner string, base int) {
	t.Helper()
	m := curlRe.FindStringSubmatch(banner)
	env := envRe.FindStringSubmatch(banner)
	eps := endptsRe.FindStringSubmatch(banner)
	if m == nil || env == nil || eps == nil {
		t.Fatalf("the banner lacks the curl line or the CLI environment:\n%s", banner)
	}
	ca, url := m[1], m[2]
	if want := fmt.Sprintf("https://127.0.0.1:%d", base); url != want {
		t.Fatalf("curl line names %s, want %s", url, want)
	}
	if env[1] != ca {
		t.Fatalf("DLOCK_CACERT %s differs from the curl line's CA %s", env[1], ca)
	}

	// What the curl line does, with Go: the CA verifies the node.
	cfg, err := client.LoadTLSConfig(ca, "", "")
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 30 * time.Second}
	defer hc.CloseIdleConnections()
	res, err := hc.Post(url+"/api/v1/locks/demo/acquire", "application/json", strings.NewReader(`{"client_id":"me","ttl_ms":30000}`))
	if err != nil {
		t.Fatalf("acquire over https with the printed CA: %v", err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("acquire over https: %s", res.Status)
	}
	if res, err := http.Get(url + "/api/v1/locks/demo"); err == nil {
		res.Body.Close()
		t.Fatalf("https without the CA answered %s", res.Status)
	}

	// The CLI with the printed environment's files, as flags.
	code := runCLI([]string{"status", "demo", "--endpoints", eps[1], "--cacert", env[1], "--cert", env[2], "--key", env[3], "-o", "json"})
	if code != cliExitOK {
		t.Fatalf("dlock status with --cacert/--cert/--key exited %d", code)
	}
}
