package tlsconfig

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// DevFiles are the files GenerateDev wrote.
type DevFiles struct {
	Dir string
	// CA is the throwaway CA's certificate; its key is never written, so
	// nothing else can ever be signed by it.
	CA string
	// NodeCert and NodeKey serve the API and the raft port of every node
	// (valid for server and client authentication).
	NodeCert, NodeKey string
	// ClientCert and ClientKey are a client certificate for mTLS to the API
	// (client authentication only, so the raft port refuses it).
	ClientCert, ClientKey string
	NotAfter              time.Time
}

// GenerateDev writes a new CA, a node certificate and a client certificate
// (ECDSA P-256) valid for validity from now into dir. The node certificate
// names 127.0.0.1, localhost and hosts. For `dlock dev --tls` and tests only.
func GenerateDev(dir string, validity time.Duration, hosts ...string) (*DevFiles, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("make certificate dir: %w", err)
	}
	now := time.Now()
	// Back-dated a little so a node whose clock lags by seconds accepts them.
	notBefore, notAfter := now.Add(-5*time.Minute), now.Add(validity)
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	ca := &x509.Certificate{
		Subject:               pkix.Name{Organization: []string{"dlock dev"}, CommonName: "dlock dev CA " + now.UTC().Format(time.RFC3339)},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := sign(ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	if ca, err = x509.ParseCertificate(caDER); err != nil {
		return nil, fmt.Errorf("parse the new CA: %w", err)
	}
	f := &DevFiles{Dir: dir, CA: filepath.Join(dir, "ca.pem"),
		NodeCert: filepath.Join(dir, "node.pem"), NodeKey: filepath.Join(dir, "node-key.pem"),
		ClientCert: filepath.Join(dir, "client.pem"), ClientKey: filepath.Join(dir, "client-key.pem"),
		NotAfter: notAfter}
	if err := writePEM(f.CA, "CERTIFICATE", caDER, 0o644); err != nil {
		return nil, err
	}
	node := leaf("dlock dev node", notBefore, notAfter, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
	for _, h := range append([]string{"127.0.0.1", "localhost"}, hosts...) {
		if ip := net.ParseIP(h); ip != nil {
			if !slices.ContainsFunc(node.IPAddresses, ip.Equal) {
				node.IPAddresses = append(node.IPAddresses, ip)
			}
		} else if h != "" && !slices.Contains(node.DNSNames, h) {
			node.DNSNames = append(node.DNSNames, h)
		}
	}
	if err := issue(node, ca, caKey, f.NodeCert, f.NodeKey); err != nil {
		return nil, err
	}
	client := leaf("dlock dev client", notBefore, notAfter, x509.ExtKeyUsageClientAuth)
	if err := issue(client, ca, caKey, f.ClientCert, f.ClientKey); err != nil {
		return nil, err
	}
	return f, nil
}

// leaf is the template of an end-entity certificate for usages.
func leaf(name string, notBefore, notAfter time.Time, usages ...x509.ExtKeyUsage) *x509.Certificate {
	return &x509.Certificate{
		Subject:     pkix.Name{Organization: []string{"dlock dev"}, CommonName: name},
		NotBefore:   notBefore,
		NotAfter:    notAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: usages,
	}
}

// issue makes a key for tmpl, signs tmpl with the CA and writes both.
func issue(tmpl, ca *x509.Certificate, caKey *ecdsa.PrivateKey, certFile, keyFile string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generate key for %s: %w", tmpl.Subject.CommonName, err)
	}
	der, err := sign(tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("encode key for %s: %w", tmpl.Subject.CommonName, err)
	}
	if err := writePEM(keyFile, "PRIVATE KEY", keyDER, 0o600); err != nil {
		return err
	}
	return writePEM(certFile, "CERTIFICATE", der, 0o644)
}

func sign(tmpl, parent *x509.Certificate, pub *ecdsa.PublicKey, signer *ecdsa.PrivateKey) ([]byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("draw a serial number: %w", err)
	}
	tmpl.SerialNumber = serial
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
	if err != nil {
		return nil, fmt.Errorf("sign certificate %q: %w", tmpl.Subject.CommonName, err)
	}
	return der, nil
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	data := pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
	// Remove first: WriteFile keeps an old file's (maybe wider) mode.
	_ = os.Remove(path)
	if err := os.WriteFile(path, data, mode); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
