package server

import (
	"crypto/tls"
	"net"
	"sync"
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

// peerNames remembers, per remote address, the common name of each open TLS
// connection's verified client certificate, so gRPC (which sees only the
// address) can authenticate the caller by it (docs/security.md, ACLs).
type peerNames struct {
	net.Listener
	names sync.Map // remote addr string -> common name
}

func (l *peerNames) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc, ok := c.(*tls.Conn)
	if !ok {
		return c, nil
	}
	return &namedConn{Conn: tc, l: l, addr: tc.RemoteAddr().String()}, nil
}

// name is the verified client certificate's common name of the connection
// from addr, "" if none.
func (l *peerNames) name(addr string) string {
	v, _ := l.names.Load(addr)
	s, _ := v.(string)
	return s
}

type namedConn struct {
	*tls.Conn
	l       *peerNames
	addr    string
	once    sync.Once
	closeMu sync.Once
}

// Read records the peer's name once the handshake (which the first Read
// runs) is done.
func (c *namedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.once.Do(func() {
		st := c.Conn.ConnectionState()
		if st.HandshakeComplete && len(st.VerifiedChains) > 0 && len(st.VerifiedChains[0]) > 0 {
			c.l.names.Store(c.addr, st.VerifiedChains[0][0].Subject.CommonName)
		}
	})
	return n, err
}

func (c *namedConn) Close() error {
	c.closeMu.Do(func() { c.l.names.Delete(c.addr) })
	return c.Conn.Close()
}
