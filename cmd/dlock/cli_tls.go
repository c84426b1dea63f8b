package main

import (
	"crypto/tls"
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/dlock/dlock/client"
)

func (g *globalFlags) registerTLS(fs *pflag.FlagSet) {
	fs.StringVar(&g.cacert, "cacert", os.Getenv("DLOCK_CACERT"), "CA `FILE` of the nodes' https certificates (env DLOCK_CACERT; default: system roots); makes the default endpoints https")
	fs.StringVar(&g.cert, "cert", os.Getenv("DLOCK_CERT"), "client certificate `FILE`, for clusters that ask for one (env DLOCK_CERT)")
	fs.StringVar(&g.key, "key", os.Getenv("DLOCK_KEY"), "private key `FILE` of the client certificate (env DLOCK_KEY)")
}

// tls loads --cacert, --cert and --key (nil when none is given). Given any,
// the built-in default endpoints become https: someone who passes a CA
// means to talk TLS, and http to a TLS port fails obscurely.
func (g *globalFlags) tls() (*tls.Config, error) {
	if g.cacert == "" && g.cert == "" && g.key == "" {
		return nil, nil
	}
	if (g.cert == "") != (g.key == "") {
		return nil, usageErrorf("--cert and --key go together: give both (or neither)")
	}
	cfg, err := client.LoadTLSConfig(g.cacert, g.cert, g.key)
	if err != nil {
		return nil, err
	}
	if g.endpoints == defaultEndpoints {
		g.endpoints = strings.ReplaceAll(defaultEndpoints, "http://", "https://")
	}
	return cfg, nil
}
