package tlsconfig

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func devFiles(t *testing.T) *DevFiles {
	t.Helper()
	f, err := GenerateDev(t.TempDir(), time.Hour, "node1.example")
	if err != nil {
		t.Fatalf("GenerateDev: %v", err)
	}
	return f
}

func TestGenerateDevFiles(t *testing.T) {
	f := devFiles(t)
	for _, p := range []string{f.NodeKey, f.ClientKey} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", p, st.Mode().Perm())
		}
	}
	// The CA key must not be anywhere in the dir, under any file name: look
	// at every private key written and compare it with the CA's public key.
	caPEM, err := os.ReadFile(f.CA)
	if err != nil {
		t.Fatal(err)
	}
	caBlock, _ := pem.Decode(caPEM)
	if caBlock == nil {
		t.Fatalf("%s holds no PEM block", f.CA)
	}
	caCert, err := x509.ParseCertificate(caBlock.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	caPub, ok := caCert.PublicKey.(interface{ Equal(crypto.PublicKey) bool })
	if !ok {
		t.Fatalf("CA public key %T", caCert.PublicKey)
	}
	entries, err := os.ReadDir(f.Dir)
	if err != nil || len(entries) == 0 {
		t.Fatalf("ReadDir(%s): %d entries, %v", f.Dir, len(entries), err)
	}
	keys := 0
	for _, e := range entries {
		if strings.Contains(e.Name(), "ca-key") {
			t.Errorf("the CA key was written (%s); it must be thrown away", e.Name())
		}
		data, err := os.ReadFile(filepath.Join(f.Dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		for b, rest := pem.Decode(data); b != nil; b, rest = pem.Decode(rest) {
			if !strings.Contains(b.Type, "PRIVATE KEY") {
				continue
			}
			keys++
			k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
			if err != nil {
				t.Errorf("%s: unreadable private key: %v", e.Name(), err)
				continue
			}
			if s, ok := k.(crypto.Signer); !ok || caPub.Equal(s.Public()) {
				t.Errorf("%s holds the CA key (or an unknown key); it must be thrown away", e.Name())
			}
		}
	}
	if keys != 2 {
		t.Errorf("%d private keys in %s, want 2 (node and client)", keys, f.Dir)
	}
	cert, err := tls.LoadX509KeyPair(f.NodeCert, f.NodeKey)
	if err != nil {
		t.Fatal(err)
	}
	leaf := cert.Leaf
	if err := leaf.VerifyHostname("127.0.0.1"); err != nil {
		t.Errorf("node certificate: %v", err)
	}
	for _, h := range []string{"localhost", "node1.example"} {
		if err := leaf.VerifyHostname(h); err != nil {
			t.Errorf("node certificate: %v", err)
		}
	}
	if leaf.NotAfter.After(time.Now().Add(time.Hour+time.Minute)) || leaf.NotAfter.Before(time.Now().Add(time.Hour-time.Minute)) {
		t.Errorf("node certificate valid until %s, want about an hour", leaf.NotAfter)
	}
}

func TestConfigErrors(t *testing.T) {
	f := devFiles(t)
	other := devFiles(t)
	garbage := filepath.Join(t.TempDir(), "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not a certificate\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	expiredDir := t.TempDir()
	expired, err := GenerateDev(expiredDir, -time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		fn   func() error
		want string
	}{
		{"cert without key", func() error { _, err := API(f.NodeCert, "", "", ""); return err }, "give both"},
		{"key of another cert", func() error { _, err := API(f.NodeCert, f.ClientKey, "", ""); return err }, "the key the certificate's own"},
		{"missing cert file", func() error { _, err := API(f.Dir+"/nope.pem", f.NodeKey, "", ""); return err }, "nope.pem"},
		{"require without CA", func() error { _, err := API(f.NodeCert, f.NodeKey, "", ClientAuthRequire); return err }, "needs the CA"},
		{"bad client auth", func() error { _, err := API(f.NodeCert, f.NodeKey, f.CA, "always"); return err }, `"always"`},
		{"CA without certificates", func() error { _, err := API(f.NodeCert, f.NodeKey, garbage, ""); return err }, "holds no PEM certificate"},
		{"expired", func() error { _, err := API(expired.NodeCert, expired.NodeKey, "", ""); return err }, "not now"},
		{"peer without CA", func() error { _, err := Peer(f.NodeCert, f.NodeKey, ""); return err }, "needs a certificate, its key and the CA"},
		{"peer with a client-only cert", func() error { _, err := Peer(f.ClientCert, f.ClientKey, f.CA); return err }, "refused by peers"},
		{"peer cert from another CA", func() error { _, err := Peer(f.NodeCert, f.NodeKey, other.CA); return err }, "refused by peers"},
	}
	for _, tc := range cases {
		err := tc.fn()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	for _, auth := range []ClientAuth{"", ClientAuthOptional, ClientAuthRequire} {
		cfg, err := API(f.NodeCert, f.NodeKey, f.CA, auth)
		if err != nil {
			t.Fatalf("API(%q): %v", auth, err)
		}
		if cfg.MinVersion != tls.VersionTLS12 {
			t.Errorf("MinVersion %x, want TLS 1.2", cfg.MinVersion)
		}
		want := tls.VerifyClientCertIfGiven
		if auth == ClientAuthRequire {
			want = tls.RequireAndVerifyClientCert
		}
		if cfg.ClientAuth != want {
			t.Errorf("API(%q).ClientAuth = %v, want %v", auth, cfg.ClientAuth, want)
		}
	}
}

// handshake runs a TLS handshake between client and server configs over an
// in-memory pipe and returns the client's and the server's error.
func handshake(t *testing.T, client, server *tls.Config) (cerr, serr error) {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	_ = a.SetDeadline(time.Now().Add(10 * time.Second))
	_ = b.SetDeadline(time.Now().Add(10 * time.Second))
	done := make(chan error, 1)
	go func() {
		s := tls.Server(b, server)
		err := s.Handshake()
		if err == nil {
			// Under TLS 1.3 the client learns of a refused client
			// certificate only on its first read.
			_, err = s.Write([]byte{1})
		}
		done <- err
		_ = b.Close()
	}()
	c := tls.Client(a, client)
	cerr = c.Handshake()
	if cerr == nil {
		_, cerr = c.Read(make([]byte, 1))
	}
	_ = a.Close()
	return cerr, <-done
}

func TestPeerHandshakes(t *testing.T) {
	f, other := devFiles(t), devFiles(t)
	peer, err := Peer(f.NodeCert, f.NodeKey, f.CA)
	if err != nil {
		t.Fatal(err)
	}
	dial := func(name string) *tls.Config {
		c := peer.Clone()
		c.ServerName = name
		return c
	}
	if cerr, serr := handshake(t, dial("127.0.0.1"), peer); cerr != nil || serr != nil {
		t.Fatalf("node to node: client %v, server %v", cerr, serr)
	}
	if cerr, _ := handshake(t, dial("10.9.9.9"), peer); cerr == nil {
		t.Errorf("a peer whose certificate does not name the dialled address was accepted")
	}

	// An API client certificate from the same CA is not a node certificate.
	clientCert, err := tls.LoadX509KeyPair(f.ClientCert, f.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	userDial := dial("127.0.0.1")
	userDial.Certificates = []tls.Certificate{clientCert}
	if _, serr := handshake(t, userDial, peer); serr == nil || !strings.Contains(serr.Error(), "not a dlock node certificate") {
		t.Errorf("client-only certificate on the raft port: server got %v, want refused as not a node certificate", serr)
	}

	// A node of another cluster (another CA) is refused both ways.
	stranger, err := Peer(other.NodeCert, other.NodeKey, other.CA)
	if err != nil {
		t.Fatal(err)
	}
	strangerDial := stranger.Clone()
	strangerDial.ServerName = "127.0.0.1"
	if cerr, serr := handshake(t, strangerDial, peer); cerr == nil && serr == nil {
		t.Errorf("a node with another CA's certificate dialled in")
	}
	if cerr, serr := handshake(t, dial("127.0.0.1"), stranger); cerr == nil && serr == nil {
		t.Errorf("dialled a node with another CA's certificate")
	}
}

func TestJoinClientTrustsGivenCAs(t *testing.T) {
	f := devFiles(t)
	api, err := API(f.NodeCert, f.NodeKey, f.CA, ClientAuthRequire)
	if err != nil {
		t.Fatal(err)
	}
	join, err := JoinClient(f.NodeCert, f.NodeKey, "", f.CA)
	if err != nil {
		t.Fatal(err)
	}
	join.ServerName = "localhost"
	if cerr, serr := handshake(t, join, api); cerr != nil || serr != nil {
		t.Fatalf("join client to an API requiring client certs: client %v, server %v", cerr, serr)
	}
}
