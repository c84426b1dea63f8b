package client_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock/client"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/tlsconfig"
)

// TestTLSCluster uses the client against a cluster whose API requires client
// certificates and whose nodes talk mutual TLS.
func TestTLSCluster(t *testing.T) {
	x := testcluster.NewTLS(t, tlsconfig.ClientAuthRequire)
	tc := testcluster.NewWith(t, 3, testcluster.Options{TLS: x})
	var eps, bare []string
	for _, id := range tc.IDs() {
		eps = append(eps, tc.URL(id))
		bare = append(bare, strings.TrimPrefix(tc.URL(id), "https://"))
	}
	f := x.Files
	cfg, err := client.LoadTLSConfig(f.CA, f.ClientCert, f.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Bare host:port endpoints mean https once TLS is configured.
	c, err := client.New(client.Config{Endpoints: bare, TLS: cfg, ClientID: "tls-client"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var token uint64
	err = c.WithLock(ctx, "tls/job", func(ctx context.Context, l *client.Lease) error {
		token = l.Token()
		st, err := c.Status(ctx, "tls/job")
		if err != nil {
			return err
		}
		if !st.Held || st.Holder == nil || st.Holder.FencingToken != token {
			t.Errorf("status while holding: %+v, want held with token %d", st, token)
		}
		return nil
	}, client.WithTTL(10*time.Second))
	if err != nil {
		t.Fatalf("WithLock over https: %v", err)
	}
	if token == 0 {
		t.Fatal("no fencing token")
	}

	// Without the CA, or without a client certificate, nothing gets through.
	// The client that lacks the CA has a client certificate the cluster
	// accepts, so only its own check of the nodes' certificates can stop it.
	noCert, err := client.LoadTLSConfig(f.CA, "", "")
	if err != nil {
		t.Fatal(err)
	}
	noCA, err := client.LoadTLSConfig("", f.ClientCert, f.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	for name, tcfg := range map[string]client.Config{
		"system roots":                           {Endpoints: eps, RequestTimeout: time.Second},
		"system roots with a client certificate": {Endpoints: eps, TLS: noCA, RequestTimeout: time.Second},
		"no client certificate":                  {Endpoints: eps, TLS: noCert, RequestTimeout: time.Second},
	} {
		bad, err := client.New(tcfg)
		if err != nil {
			t.Fatal(err)
		}
		sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err = bad.Status(sctx, "tls/job")
		scancel()
		bad.Close()
		if err == nil {
			t.Errorf("%s: Status succeeded, want a TLS failure", name)
			continue
		}
		var verr *tls.CertificateVerificationError
		if wantVerify := tcfg.TLS != noCert; wantVerify != errors.As(err, &verr) {
			t.Errorf("%s: Status = %v; want a failed check of the node's certificate: %v", name, err, wantVerify)
		}
	}
}

func TestLoadTLSConfigErrors(t *testing.T) {
	f, err := tlsconfig.GenerateDev(t.TempDir(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.LoadTLSConfig(f.CA, f.ClientCert, ""); err == nil || !strings.Contains(err.Error(), "give both") {
		t.Errorf("cert without key: %v", err)
	}
	if _, err := client.LoadTLSConfig(f.ClientKey, "", ""); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("a key as CA file: %v", err)
	}
	if _, err := client.LoadTLSConfig(f.CA, f.ClientCert, f.NodeKey); err == nil {
		t.Errorf("mismatched key accepted")
	}
	cfg, _ := client.LoadTLSConfig(f.CA, "", "")
	_, err = client.New(client.Config{Endpoints: []string{"https://127.0.0.1:1"}, TLS: cfg, HTTPClient: &http.Client{}})
	if !errors.Is(err, client.ErrInvalidArgument) {
		t.Errorf("TLS with HTTPClient: %v, want ErrInvalidArgument", err)
	}
}
