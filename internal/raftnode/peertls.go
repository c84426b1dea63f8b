// Mutual TLS on the raft port: the handshake comes first, the type byte
// after it, so Raft and forwarding are both covered by one configuration.

package raftnode

import (
	"crypto/tls"
	"net"
)

// securePeers wraps the raft port's listener and its dialer in cfg, or
// returns them as they are when cfg is nil.
//
// What is verified, both ways: the other side's certificate chains to the
// peer CA (cfg's RootCAs/ClientCAs) and is a node certificate (tlsconfig.Peer
// checks it is valid for server and client authentication). The dialler also
// checks the certificate names the host of the address it dialled — the
// peer's advertised raft address, taken from the Raft configuration — since
// tls.Dialer derives ServerName from that address when cfg leaves it empty.
// A plaintext peer fails either way: its type byte is not a TLS record, and
// a TLS ClientHello is not a type byte to a plaintext node.
func securePeers(ln net.Listener, d *net.Dialer, cfg *tls.Config) (net.Listener, DialFunc) {
	if cfg == nil {
		return ln, d.DialContext
	}
	return tls.NewListener(ln, cfg), (&tls.Dialer{NetDialer: d, Config: cfg}).DialContext
}
