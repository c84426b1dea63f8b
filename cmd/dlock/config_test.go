package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// A flag on the command line wins over DLOCK_<FLAG>, which wins over the
// config file; lists in the file become comma-separated values.
func TestConfigPrecedence(t *testing.T) {
	file := filepath.Join(t.TempDir(), "dlock.yaml")
	if err := os.WriteFile(file, []byte("data-dir: /from/file\napi-addr: 127.0.0.1:1\nttl: 30s\nacl: true\ninitial-cluster:\n  - n1=127.0.0.1:7071\n  - n2=127.0.0.1:7081\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fs := pflag.NewFlagSet("dlock serve", pflag.ContinueOnError)
	dataDir := fs.String("data-dir", "", "")
	apiAddr := fs.String("api-addr", "default", "")
	ttl := fs.Duration("ttl", 0, "")
	acl := fs.Bool("acl", false, "")
	initial := fs.String("initial-cluster", "", "")
	id := fs.String("id", "", "")
	cfg := registerConfig(fs)
	t.Setenv("DLOCK_API_ADDR", "127.0.0.1:2")
	t.Setenv("DLOCK_ID", "from-env")
	if err := fs.Parse([]string{"--config", file, "--id", "from-flag"}); err != nil {
		t.Fatal(err)
	}
	if err := applyConfig(fs, *cfg, "dlock serve"); err != nil {
		t.Fatal(err)
	}
	if *id != "from-flag" || *apiAddr != "127.0.0.1:2" || *dataDir != "/from/file" || *ttl != 30*time.Second || !*acl ||
		*initial != "n1=127.0.0.1:7071,n2=127.0.0.1:7081" {
		t.Fatalf("id %q api %q data %q ttl %s acl %v initial %q", *id, *apiAddr, *dataDir, *ttl, *acl, *initial)
	}
}

func TestConfigRefusesUnknownKeysAndBadValues(t *testing.T) {
	newFS := func() (*pflag.FlagSet, *string) {
		fs := pflag.NewFlagSet("dlock serve", pflag.ContinueOnError)
		fs.String("data-dir", "", "")
		fs.Int("nodes", 3, "")
		return fs, registerConfig(fs)
	}
	file := filepath.Join(t.TempDir(), "dlock.yaml")
	os.WriteFile(file, []byte("data-dir: x\ndatadir: y\n"), 0o600)
	fs, cfg := newFS()
	if err := fs.Parse([]string{"--config", file}); err != nil {
		t.Fatal(err)
	}
	if err := applyConfig(fs, *cfg, "dlock serve"); err == nil || !strings.Contains(err.Error(), "unknown key(s) datadir") {
		t.Fatalf("unknown key: %v", err)
	}
	fs, cfg = newFS()
	t.Setenv("DLOCK_NODES", "three")
	fs.Parse(nil)
	if err := applyConfig(fs, *cfg, "dlock serve"); err == nil || !strings.Contains(err.Error(), "DLOCK_NODES") {
		t.Fatalf("bad env value: %v", err)
	}
}

// Through the command line: the file's keys are checked against serve's
// flags, of which --help and --config are none.
func TestServeConfigThroughTheCommandLine(t *testing.T) {
	file := filepath.Join(t.TempDir(), "dlock.yaml")
	os.WriteFile(file, []byte("datadir: /x\n"), 0o600)
	_, err := execute("serve", "--config", file)
	if err == nil || !strings.Contains(err.Error(), "unknown key(s) datadir") || !strings.Contains(err.Error(), "dlock serve --help") {
		t.Fatalf("unknown key: %v", err)
	}
	os.WriteFile(file, []byte("help: true\nconfig: other.yaml\n"), 0o600)
	if _, err := execute("serve", "--config", file); err == nil || !strings.Contains(err.Error(), "unknown key(s) config, help") {
		t.Fatalf("help and config in the file: %v; want them refused", err)
	}
}
