package main

import (
	"crypto/tls"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/dlock/dlock/internal/tlsconfig"
)

// devCertValidity is short on purpose: the CA's key is thrown away and the
// certificates are for one session of trying things out.
const devCertValidity = 24 * time.Hour

// devTLS is `dlock dev --tls`: a throwaway CA, one node certificate every
// node uses (they share the host), and a client certificate. A nil *devTLS
// is dev without TLS; its methods then answer for plaintext.
type devTLS struct {
	files     *tlsconfig.DevFiles
	api, peer *tls.Config
}

func newDevTLS(dir, host string) (*devTLS, error) {
	f, err := tlsconfig.GenerateDev(dir, devCertValidity, host)
	if err != nil {
		return nil, fmt.Errorf("make dev certificates in %s: %w", dir, err)
	}
	// Client certificates are optional, so curl with just --cacert works;
	// one that is presented must be signed by the dev CA.
	api, err := tlsconfig.API(f.NodeCert, f.NodeKey, f.CA, tlsconfig.ClientAuthOptional)
	if err != nil {
		return nil, err
	}
	peer, err := tlsconfig.Peer(f.NodeCert, f.NodeKey, f.CA)
	if err != nil {
		return nil, err
	}
	return &devTLS{files: f, api: api, peer: peer}, nil
}

func (d *devTLS) apiConfig() *tls.Config {
	if d == nil {
		return nil
	}
	return d.api
}

func (d *devTLS) peerConfig() *tls.Config {
	if d == nil {
		return nil
	}
	return d.peer
}

func (d *devTLS) scheme() string {
	if d == nil {
		return "http://"
	}
	return "https://"
}

func (d *devTLS) curlFlags() string {
	if d == nil {
		return ""
	}
	return "--cacert " + d.files.CA + " "
}

func (d *devTLS) printFiles(out io.Writer) {
	if d == nil {
		return
	}
	f := d.files
	fmt.Fprintf(out, `
TLS: the API over TLS, Raft and forwarding over mutual TLS. Throwaway CA,
certificates valid until %s (ECDSA P-256; the node certificate names
127.0.0.1, localhost and --host):
  CA           %s
  node         %s  key %s
  client       %s  key %s
               (optional: the API verifies a client certificate when one is presented)
`, f.NotAfter.Local().Format(time.RFC3339), f.CA, f.NodeCert, f.NodeKey, f.ClientCert, f.ClientKey)
}

func (d *devTLS) printCLIEnv(out io.Writer, urls []string) {
	if d == nil {
		return
	}
	f := d.files
	fmt.Fprintf(out, `
CLI (dlock acquire, lock, status, ...; or --cacert, --cert, --key):
  export DLOCK_ENDPOINTS=%s
  export DLOCK_CACERT=%s DLOCK_CERT=%s DLOCK_KEY=%s
`, strings.Join(urls, ","), f.CA, f.ClientCert, f.ClientKey)
}
