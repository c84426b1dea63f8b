package main

import (
	"strings"
	"testing"
)

func TestServeTLSFlagChecks(t *testing.T) {
	cases := []struct {
		f    tlsFlags
		want string
	}{
		{tlsFlags{cert: "c.pem"}, "--tls-cert and --tls-key go together"},
		{tlsFlags{key: "k.pem"}, "--tls-cert and --tls-key go together"},
		{tlsFlags{ca: "ca.pem"}, "--tls-ca needs --tls-cert"},
		{tlsFlags{cert: "c", key: "k", clientAuth: "require"}, "--tls-client-auth=require needs --tls-ca"},
		{tlsFlags{cert: "c", key: "k", ca: "ca", clientAuth: "sometimes"}, `--tls-client-auth "sometimes"`},
		{tlsFlags{clientAuth: "optional", peerCert: "p", peerKey: "k"}, "--peer-cert, --peer-key and --peer-ca go together"},
		{tlsFlags{clientAuth: "optional", peerCA: "ca"}, "--peer-cert, --peer-key and --peer-ca go together"},
	}
	for _, tc := range cases {
		err := tc.f.check()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: got %v, want %q", tc.f, err, tc.want)
		}
	}
	ok := []tlsFlags{
		{clientAuth: "optional"},
		{cert: "c", key: "k", clientAuth: "optional"},
		{cert: "c", key: "k", ca: "ca", clientAuth: "require"},
		{clientAuth: "optional", peerCert: "p", peerKey: "k", peerCA: "ca"},
	}
	for _, f := range ok {
		if err := f.check(); err != nil {
			t.Errorf("%+v: %v", f, err)
		}
	}
}

func TestServeTLSLoadErrorNamesFlags(t *testing.T) {
	f := tlsFlags{cert: "/nonexistent/c.pem", key: "/nonexistent/k.pem", clientAuth: "optional"}
	_, _, _, err := f.load(nil)
	if err == nil || !strings.Contains(err.Error(), "--tls-cert") || !strings.Contains(err.Error(), "/nonexistent/c.pem") {
		t.Fatalf("got %v, want an error naming --tls-cert and the file", err)
	}
}
