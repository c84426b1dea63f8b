package server_test

import (
	"context"
	"crypto/tls"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/raftnode"
	"github.com/dlock/dlock/internal/server"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/tlsconfig"
)

// startLogged starts a one-node server and returns what it logged at start.
func startLogged(t *testing.T, acl bool, peer *tls.Config) string {
	t.Helper()
	// A file takes writes from every goroutine of the node safely.
	logFile, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	logger := slog.New(slog.NewTextHandler(logFile, &slog.HandlerOptions{Level: slog.LevelWarn}))
	raftAddr := testcluster.FreePort(t)
	s, err := server.Start(server.Config{
		Raft: raftnode.Config{ID: "n1", DataDir: t.TempDir(), RaftAddr: raftAddr, InitialCluster: map[string]string{"n1": raftAddr},
			PeerTLS: peer, Logger: logger},
		APIAddr: testcluster.FreePort(t), ACL: acl, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Logf("shutdown: %v", err)
	}
	out, err := os.ReadFile(logFile.Name())
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// ACLs do not cover the raft port: a node run with --acl and no peer TLS
// says so at start, naming the flags that fix it; with peer TLS, or without
// ACLs, it does not.
func TestACLWithoutPeerTLSWarnsAtStart(t *testing.T) {
	const marker = "ACLs are on but the raft port has no peer TLS"
	out := startLogged(t, true, nil)
	if !strings.Contains(out, marker) || !strings.Contains(out, "--peer-cert") || !strings.Contains(out, "level=WARN") {
		t.Fatalf("no start-up warning with --acl and plaintext peers; log:\n%s", out)
	}
	if out := startLogged(t, false, nil); strings.Contains(out, marker) {
		t.Fatalf("warned without --acl:\n%s", out)
	}
	x := testcluster.NewTLS(t, tlsconfig.ClientAuthOptional)
	if out := startLogged(t, true, x.Peer("n1")); strings.Contains(out, marker) {
		t.Fatalf("warned with peer TLS:\n%s", out)
	}
}
