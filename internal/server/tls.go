package server

import (
	"crypto/tls"
	"net"
)

// apiTLS wraps the API listeners in cfg (both unchanged when cfg is nil).
// The listeners, not the servers, carry TLS so that httpapi and grpcapi stay
// unaware of it. Each gets its own ALPN: HTTP/1.1 only on the HTTP port
// (SSE and WebSocket upgrades are HTTP/1.1), h2 on the gRPC port (gRPC
// clients refuse a TLS server that does not select it).
func apiTLS(ln, grpcLn net.Listener, cfg *tls.Config) (net.Listener, net.Listener) {
	if cfg == nil {
		return ln, grpcLn
	}
	h := cfg.Clone()
	h.NextProtos = []string{"http/1.1"}
	ln = tls.NewListener(ln, h)
	if grpcLn != nil {
		g := cfg.Clone()
		g.NextProtos = []string{"h2"}
		grpcLn = tls.NewListener(grpcLn, g)
	}
	return ln, grpcLn
}
