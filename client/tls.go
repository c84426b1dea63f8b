package client

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// LoadTLSConfig builds a Config.TLS from PEM files. caFile, when given, is
// the only CA trusted for the nodes' certificates (as curl --cacert);
// empty means the system's roots. certFile and keyFile, given together,
// are this client's certificate for a cluster that asks for one.
func LoadTLSConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("dlock: read the CA file: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("dlock: CA file %s holds no PEM certificate (want -----BEGIN CERTIFICATE-----)", caFile)
		}
	}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("dlock: a client certificate and its key go together: give both or neither")
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("dlock: load client certificate %s with key %s: %w", certFile, keyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
