// Package tlsconfig builds a dlock node's *tls.Config values from PEM files:
// TLS for the client API (optionally verifying client certificates), mutual
// TLS between nodes on the raft port, and the client side a node uses to
// --join through another member's API. It also writes the throwaway CA and
// certificates of `dlock dev --tls`. Files are read once, at start: replacing
// a certificate takes a restart.
package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"
)

// MinVersion is the oldest protocol dlock speaks. TLS 1.2 still has clients
// in the field (older curl and JVMs); everything older is broken.
const MinVersion = tls.VersionTLS12

// ClientAuth says whether the API insists on client certificates once a CA
// for them is given.
type ClientAuth string

const (
	// ClientAuthOptional asks for a certificate and verifies one that is
	// presented, but lets clients without one in (curl with only --cacert).
	ClientAuthOptional ClientAuth = "optional"
	// ClientAuthRequire refuses the handshake of a client without a
	// certificate signed by the CA.
	ClientAuthRequire ClientAuth = "require"
)

// API returns the server side of the HTTP and gRPC listeners. With caFile,
// client certificates are asked for and must chain to it; auth decides
// whether a client may go without one. The caller sets NextProtos per
// listener (HTTP/1.1 and h2 differ).
func API(certFile, keyFile, caFile string, auth ClientAuth) (*tls.Config, error) {
	cert, err := loadKeyPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{MinVersion: MinVersion, Certificates: []tls.Certificate{cert}}
	switch auth {
	case "", ClientAuthOptional, ClientAuthRequire:
	default:
		return nil, fmt.Errorf("client auth %q: use %s or %s", auth, ClientAuthOptional, ClientAuthRequire)
	}
	if caFile == "" {
		if auth == ClientAuthRequire {
			return nil, errors.New("requiring client certificates needs the CA that signs them")
		}
		return cfg, nil
	}
	if cfg.ClientCAs, err = loadPool(nil, caFile); err != nil {
		return nil, err
	}
	cfg.ClientAuth = tls.VerifyClientCertIfGiven
	if auth == ClientAuthRequire {
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// Peer returns the mutual-TLS configuration of the raft port, used both to
// accept and to dial. Either side must present a certificate that chains to
// caFile and is valid for both server and client authentication (a node
// certificate: every node both accepts and dials). The dialling side also
// checks the accepting node's certificate names the host it dialled (the
// peer's advertised raft address); the accepting side cannot check a name,
// because a dialler's source address is not the one it advertises.
//
// Requiring both usages is what keeps a client certificate from the same
// CA (an API user's) off the raft port.
func Peer(certFile, keyFile, caFile string) (*tls.Config, error) {
	if certFile == "" || keyFile == "" || caFile == "" {
		return nil, errors.New("peer TLS needs a certificate, its key and the CA that signs every node's certificate")
	}
	cert, err := loadKeyPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	pool, err := loadPool(nil, caFile)
	if err != nil {
		return nil, err
	}
	// Fail at start, not at the first handshake, when this node's own
	// certificate would be refused by its peers.
	chain, err := parseChain(cert)
	if err != nil {
		return nil, fmt.Errorf("certificate %s: %w", certFile, err)
	}
	if err := verifyNode(chain, pool); err != nil {
		return nil, fmt.Errorf("certificate %s would be refused by peers: %w (sign it with %s, with extendedKeyUsage serverAuth and clientAuth)",
			certFile, err, caFile)
	}
	return &tls.Config{
		MinVersion:   MinVersion,
		Certificates: []tls.Certificate{cert},
		RootCAs:      pool,
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		// Raft keeps its connections pooled, so resumption saves little,
		// and without it every connection shows a full, fresh chain.
		SessionTicketsDisabled: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("peer presented no certificate")
			}
			if err := verifyNode(cs.PeerCertificates, pool); err != nil {
				return fmt.Errorf("peer certificate %q is not a dlock node certificate: %w", cs.PeerCertificates[0].Subject, err)
			}
			return nil
		},
	}, nil
}

// JoinClient returns the client side of a --join request to an https API
// URL: it trusts the system roots plus the given CA files (the API's and the
// peers' CA, either may sign the members' API certificates) and presents the
// node's peer certificate, if any, for an API that requires one.
func JoinClient(certFile, keyFile string, caFiles ...string) (*tls.Config, error) {
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	for _, f := range caFiles {
		if f == "" {
			continue
		}
		if pool, err = loadPool(pool, f); err != nil {
			return nil, err
		}
	}
	cfg := &tls.Config{MinVersion: MinVersion, RootCAs: pool}
	if certFile != "" {
		cert, err := loadKeyPair(certFile, keyFile)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// HTTPTransport is a clone of http.DefaultTransport that uses cfg for https,
// or nil (meaning the default transport itself) when cfg is nil.
func HTTPTransport(cfg *tls.Config) http.RoundTripper {
	if cfg == nil {
		return nil
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = cfg
	return tr
}

// verifyNode checks chain[0] chains to pool, through the rest of chain, for
// both server and client authentication. x509 accepts a chain valid for any
// one listed usage, so the two are checked apart.
func verifyNode(chain []*x509.Certificate, pool *x509.CertPool) error {
	inters := x509.NewCertPool()
	for _, c := range chain[1:] {
		inters.AddCert(c)
	}
	for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if _, err := chain[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inters, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
			return err
		}
	}
	return nil
}

func parseChain(cert tls.Certificate) ([]*x509.Certificate, error) {
	chain := []*x509.Certificate{cert.Leaf}
	for _, raw := range cert.Certificate[1:] {
		c, err := x509.ParseCertificate(raw)
		if err != nil {
			return nil, fmt.Errorf("parse intermediate certificate: %w", err)
		}
		chain = append(chain, c)
	}
	return chain, nil
}

func loadKeyPair(certFile, keyFile string) (tls.Certificate, error) {
	if certFile == "" || keyFile == "" {
		return tls.Certificate{}, errors.New("a certificate and its private key go together: give both")
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("load certificate %s with key %s: %w (both must be PEM, the key the certificate's own)", certFile, keyFile, err)
	}
	// A node that starts with an expired certificate only fails later, at
	// every handshake, with the error on the other side; say it here.
	now := time.Now()
	if leaf := cert.Leaf; now.Before(leaf.NotBefore) || now.After(leaf.NotAfter) {
		return tls.Certificate{}, fmt.Errorf("certificate %s is valid from %s to %s, not now: issue a new one (or check the clock)",
			certFile, leaf.NotBefore.Format(time.RFC3339), leaf.NotAfter.Format(time.RFC3339))
	}
	return cert, nil
}

// loadPool adds the PEM certificates in file to pool (a new one if nil).
func loadPool(pool *x509.CertPool, file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read CA file: %w", err)
	}
	if pool == nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("CA file %s holds no PEM certificate (want -----BEGIN CERTIFICATE-----)", file)
	}
	return pool, nil
}
