package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"

	"github.com/spf13/pflag"

	"github.com/dlock/dlock/internal/tlsconfig"
)

// tlsFlags are serve's TLS flags: the client API's and the peers'.
type tlsFlags struct {
	cert, key, ca, clientAuth string
	peerCert, peerKey, peerCA string
}

func (f *tlsFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.cert, "tls-cert", "", "serve the HTTP and gRPC APIs over TLS with this PEM certificate (with --tls-key)")
	fs.StringVar(&f.key, "tls-key", "", "the private key of --tls-cert (PEM)")
	fs.StringVar(&f.ca, "tls-ca", "", "CA of client certificates: asked for and verified when presented (see --tls-client-auth)")
	fs.StringVar(&f.clientAuth, "tls-client-auth", string(tlsconfig.ClientAuthOptional), "with --tls-ca: optional (clients without a certificate get in) or require")
	fs.StringVar(&f.peerCert, "peer-cert", "", "mutual TLS between nodes (Raft and forwarding): this node's PEM certificate, valid for serverAuth and clientAuth, naming its raft advertise host")
	fs.StringVar(&f.peerKey, "peer-key", "", "the private key of --peer-cert (PEM)")
	fs.StringVar(&f.peerCA, "peer-ca", "", "CA that signs every node's --peer-cert; peers without such a certificate are refused")
}

// check refuses incomplete combinations before any file is read.
func (f *tlsFlags) check() error {
	if (f.cert == "") != (f.key == "") {
		return errors.New("--tls-cert and --tls-key go together: give the certificate and its private key")
	}
	if f.ca != "" && f.cert == "" {
		return errors.New("--tls-ca needs --tls-cert and --tls-key: client certificates are only asked for over TLS")
	}
	switch tlsconfig.ClientAuth(f.clientAuth) {
	case tlsconfig.ClientAuthOptional:
	case tlsconfig.ClientAuthRequire:
		if f.ca == "" {
			return errors.New("--tls-client-auth=require needs --tls-ca, the CA that signs the client certificates")
		}
	default:
		return fmt.Errorf("--tls-client-auth %q: use optional or require", f.clientAuth)
	}
	if n := countSet(f.peerCert, f.peerKey, f.peerCA); n != 0 && n != 3 {
		return errors.New("--peer-cert, --peer-key and --peer-ca go together: every node needs its certificate, its key and the CA that signs the others'")
	}
	return nil
}

// load checks the flags and builds the API's, the peers' and the joining
// client's configurations (each nil when not asked for).
func (f *tlsFlags) load(logger *slog.Logger) (api, peer, join *tls.Config, err error) {
	if err := f.check(); err != nil {
		return nil, nil, nil, err
	}
	if f.cert != "" {
		if api, err = tlsconfig.API(f.cert, f.key, f.ca, tlsconfig.ClientAuth(f.clientAuth)); err != nil {
			return nil, nil, nil, fmt.Errorf("--tls-cert/--tls-key/--tls-ca: %w", err)
		}
	}
	if f.peerCert != "" {
		if peer, err = tlsconfig.Peer(f.peerCert, f.peerKey, f.peerCA); err != nil {
			return nil, nil, nil, fmt.Errorf("--peer-cert/--peer-key/--peer-ca: %w", err)
		}
	} else if api != nil {
		logger.Warn("the API is TLS but Raft and forwarding between nodes are plaintext; give --peer-cert, --peer-key and --peer-ca to protect them")
	}
	if join, err = tlsconfig.JoinClient(f.peerCert, f.peerKey, f.ca, f.peerCA); err != nil {
		return nil, nil, nil, fmt.Errorf("--join over https: %w", err)
	}
	return api, peer, join, nil
}

// joinScheme is the scheme of a --join address given without one: https
// when this node serves TLS, as its cluster's members presumably do.
func (f *tlsFlags) joinScheme() string {
	if f.cert != "" {
		return "https://"
	}
	return "http://"
}

func countSet(vals ...string) int {
	n := 0
	for _, v := range vals {
		if v != "" {
			n++
		}
	}
	return n
}
