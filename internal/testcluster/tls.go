package testcluster

import (
	"crypto/tls"
	"net/http"
	"testing"
	"time"

	"github.com/dlock/dlock/client"
	"github.com/dlock/dlock/internal/tlsconfig"
)

// TLS is a test cluster's TLS setup. Its fields may be changed between
// node starts (Peer is asked at every start), so a test can restart a node
// with other certificates or none.
type TLS struct {
	Files *tlsconfig.DevFiles
	// API is every node's API server side; Join what a joining node
	// dials the others' APIs with.
	API, Join *tls.Config
	// Peer returns a node's raft-port mTLS config (nil: plaintext).
	Peer func(id string) *tls.Config
	// Client trusts the CA and presents the client certificate.
	Client *tls.Config
}

// NewTLS makes a throwaway CA and certificates (tlsconfig.GenerateDev) and
// a setup where every node uses them, API and peers alike; auth says
// whether the API requires client certificates.
func NewTLS(t testing.TB, auth tlsconfig.ClientAuth) *TLS {
	t.Helper()
	f, err := tlsconfig.GenerateDev(t.TempDir(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	api, err := tlsconfig.API(f.NodeCert, f.NodeKey, f.CA, auth)
	if err != nil {
		t.Fatal(err)
	}
	peer, err := tlsconfig.Peer(f.NodeCert, f.NodeKey, f.CA)
	if err != nil {
		t.Fatal(err)
	}
	join, err := tlsconfig.JoinClient(f.NodeCert, f.NodeKey, f.CA)
	if err != nil {
		t.Fatal(err)
	}
	return &TLS{Files: f, API: api, Join: join, Peer: func(string) *tls.Config { return peer }, Client: ClientTLS(t, f, true)}
}

// ClientTLS is a client configuration that trusts f's CA and, withCert,
// presents f's client certificate.
func ClientTLS(t testing.TB, f *tlsconfig.DevFiles, withCert bool) *tls.Config {
	t.Helper()
	cert, key := "", ""
	if withCert {
		cert, key = f.ClientCert, f.ClientKey
	}
	cfg, err := client.LoadTLSConfig(f.CA, cert, key)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// transport is Cluster.Client's transport: the default one, or one that
// speaks TLS with Client.
func (x *TLS) transport() http.RoundTripper {
	if x == nil {
		return nil
	}
	return tlsconfig.HTTPTransport(x.Client)
}
