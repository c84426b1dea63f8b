package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/spf13/cobra"

	"github.com/dlock/dlock/internal/raftnode"
	"github.com/dlock/dlock/internal/testcluster"
)

// dlock serve on a data dir with a damaged log entry exits with the refusal
// (exit status 3, which a supervisor must not restart on) instead of serving.
func TestServeRefusesDamagedDataDir(t *testing.T) {
	dir := t.TempDir()
	st, closeFn, err := raftnode.OpenLogStore(raftnode.LogStoreWAL, dir)
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 3; i++ {
		if err := st.StoreLogs([]*raft.Log{{Index: i, Term: 1, Type: raft.LogNoop, Data: []byte{'e', 'n', 't', 'r', 'y', '0' + byte(i)}}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.SetUint64([]byte("CurrentTerm"), 1); err != nil {
		t.Fatal(err)
	}
	if err := closeFn(); err != nil {
		t.Fatal(err)
	}
	segs, _ := filepath.Glob(filepath.Join(dir, "wal", "*.wal"))
	if len(segs) != 1 {
		t.Fatalf("segments: %v", segs)
	}
	b, err := os.ReadFile(segs[0])
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(b, []byte("entry2"))
	if i < 0 {
		t.Fatal("entry 2 not found")
	}
	b[i] = 'E'
	if err := os.WriteFile(segs[0], b, 0o644); err != nil {
		t.Fatal(err)
	}
	type result struct {
		cmd *cobra.Command
		err error
	}
	done := make(chan result, 1)
	go func() {
		cmd, err := execute("serve", "--id", "n1", "--data-dir", dir, "--api-addr", testcluster.FreePort(t),
			"--raft-addr", testcluster.FreePort(t), "--log-level", "error")
		done <- result{cmd, err}
	}()
	var res result
	select {
	case res = <-done:
		err = res.err
	case <-time.After(30 * time.Second):
		t.Fatal("dlock serve started on a damaged data dir")
	}
	if err == nil || !strings.Contains(err.Error(), "refusing data dir") || !strings.Contains(err.Error(), "raft log entry 2 in "+segs[0]) {
		t.Fatalf("dlock serve answered %v; want the refusal naming entry 2 and its file", err)
	}
	if code := finish(res.cmd, nil, err); code != serveExitRefused {
		t.Fatalf("exit code %d for a refused data dir, want %d", code, serveExitRefused)
	}
}

// A node that stops itself (a storage failure) ends serve's wait without a
// signal, after an orderly shutdown.
func TestWaitForSignalOrEndsWhenTheNodeStops(t *testing.T) {
	stop := make(chan struct{})
	shut := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- waitForSignalOr(stop, func(context.Context) error { close(shut); return nil }, func(string, ...any) {})
	}()
	close(stop)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("wait returned %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve kept waiting after its node stopped")
	}
	select {
	case <-shut:
	default:
		t.Fatal("the server was not shut down")
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "64MiB": 64 << 20, "1GiB": 1 << 30, "512 KiB": 512 << 10, "100": 100, "100B": 100} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-1", "64MB", "lots"} {
		if _, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) accepted", in)
		}
	}
}
