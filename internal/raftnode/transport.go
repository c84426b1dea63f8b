// Multiplexed stream layer: one TCP port carries both Raft RPCs and
// follower-to-leader forward connections, told apart by a first byte.

// Package raftnode runs one dlock Raft node: lifecycle, transport, log store, the apply helper and linearizable reads.
package raftnode

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// Connection type bytes. Every connection to the raft port starts with one of
// these so a single port (one firewall rule, one TLS config) can serve
// both protocols; this is the scheme Consul and Nomad use on their RPC port.
const (
	ConnRaft    byte = 'R' // hashicorp/raft NetworkTransport RPCs
	ConnForward byte = 'F' // follower → leader request forwarding (HTTP/1.1)
	ConnEtcd    byte = 'E' // etcd engine: framed Raft messages of any group
)

// Defaults for the Mux timeouts; see the Mux fields for why each exists.
const (
	DefaultHandshakeTimeout = 5 * time.Second
	DefaultHandoffTimeout   = 5 * time.Second
)

// DialFunc has the shape of (*net.Dialer).DialContext and
// (*tls.Dialer).DialContext so either can be plugged in unchanged, and so a
// value can be used directly as http.Transport.DialContext.
type DialFunc func(ctx context.Context, network, address string) (net.Conn, error)

// Mux accepts connections on the node's raft port and routes each one to the
// Raft stream layer or the forward listener based on its first byte.
//
// The listener given to NewMux may be a TLS listener (securePeers): the
// handshake then runs first, under HandshakeTimeout, and the type byte is
// read through the TLS connection. Outbound Raft dials go through Dialer,
// the matching client side.
//
// The exported fields must be set before Serve is called and before
// RaftLayer is used; they are not guarded against concurrent change.
type Mux struct {
	// HandshakeTimeout bounds how long an accepted connection may take to
	// finish its TLS handshake (if any) and send its type byte, so silent or
	// slow clients cannot pin goroutines.
	HandshakeTimeout time.Duration

	// HandoffTimeout bounds how long a classified connection waits for its
	// sub-listener's Accept. A sub-listener whose owner has stopped
	// accepting then sheds connections instead of piling up goroutines.
	HandoffTimeout time.Duration

	// Dialer makes outbound Raft connections. Nil means a plain
	// net.Dialer; set it to a TLS dialer when the listener is TLS.
	Dialer DialFunc

	ln        net.Listener
	advertise net.Addr
	logger    *slog.Logger

	raft    *subListener
	forward *subListener
	etcd    *subListener

	// ctx is cancelled by Close; in-flight handshakes watch it so Close does
	// not have to wait out HandshakeTimeout.
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	closed bool // guards Serve starting after Close

	// lastTLSWarn (unix nanoseconds) spaces out warnings about failed
	// handshakes: a misconfigured peer retries many times a second.
	lastTLSWarn atomic.Int64

	closeOnce sync.Once
	closeErr  error
	// wg counts Serve and every per-connection goroutine it starts. Serve
	// holds a count while it runs, so its wg.Add calls never race with the
	// wg.Wait in Close on a zero counter.
	wg sync.WaitGroup
}

// NewMux wraps ln. advertise is the address other nodes dial to reach this
// one and is what the Raft transport announces; it must not be an
// unspecified address such as 0.0.0.0. A nil advertise falls back to
// ln.Addr(), and a nil logger discards log output.
//
// The Mux owns ln from here on: Close closes it.
func NewMux(ln net.Listener, advertise net.Addr, logger *slog.Logger) *Mux {
	if advertise == nil {
		advertise = ln.Addr()
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if tcp, ok := advertise.(*net.TCPAddr); ok && (tcp.IP == nil || tcp.IP.IsUnspecified()) {
		// Raft would tell peers to dial this address and they would fail.
		logger.Warn("raft advertise address is unspecified; peers will not be able to reach this node, set an explicit advertise address",
			"advertise", advertise.String())
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &Mux{
		HandshakeTimeout: DefaultHandshakeTimeout,
		HandoffTimeout:   DefaultHandoffTimeout,
		ln:               ln,
		advertise:        advertise,
		logger:           logger,
		ctx:              ctx,
		cancel:           cancel,
	}
	m.raft = newSubListener(advertise)
	m.forward = newSubListener(advertise)
	m.etcd = newSubListener(advertise)
	return m
}

// Serve accepts connections until Close is called or the listener fails. It
// always returns a non-nil error; after Close that error satisfies
// errors.Is(err, net.ErrClosed).
func (m *Mux) Serve() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return fmt.Errorf("raft mux serve: %w", net.ErrClosed)
	}
	m.wg.Add(1)
	m.mu.Unlock()
	defer m.wg.Done()

	var backoff time.Duration
	for {
		conn, err := m.ln.Accept()
		if err != nil {
			if m.ctx.Err() != nil {
				return fmt.Errorf("raft mux serve: %w", net.ErrClosed)
			}
			if errors.Is(err, net.ErrClosed) {
				// Someone else closed ln; retrying would spin forever.
				return fmt.Errorf("raft mux: listener %s closed outside Mux.Close: %w", m.ln.Addr(), err)
			}
			// Errors such as EMFILE are transient; spinning on them would
			// burn a core and flood the log, so back off like net/http.
			backoff = min(max(backoff*2, 5*time.Millisecond), time.Second)
			m.logger.Warn("raft port accept failed; retrying", "error", err, "retry_in", backoff)
			select {
			case <-time.After(backoff):
				continue
			case <-m.ctx.Done():
				return fmt.Errorf("raft mux serve: %w", net.ErrClosed)
			}
		}
		backoff = 0
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			m.route(conn)
		}()
	}
}

// route reads the type byte and hands conn to its sub-listener. It owns conn
// until the hand-off succeeds and closes it on every other path.
func (m *Mux) route(conn net.Conn) {
	// Close unblocks the read below instead of waiting for the deadline.
	stop := context.AfterFunc(m.ctx, func() { _ = conn.Close() })

	typ, err := m.readType(conn)
	if !stop() {
		// Close already closed conn (or is about to): nothing left to do.
		return
	}
	if err != nil {
		var herr *handshakeError
		if errors.As(err, &herr) {
			m.refusedHandshake(conn, herr)
		} else {
			m.logger.Debug("raft port: dropping connection that sent no type byte",
				"remote", conn.RemoteAddr().String(), "error", err)
		}
		_ = conn.Close()
		return
	}

	var sub *subListener
	switch typ {
	case ConnRaft:
		sub = m.raft
	case ConnForward:
		sub = m.forward
	case ConnEtcd:
		sub = m.etcd
	default:
		m.logger.Debug("raft port: dropping connection with unknown type byte",
			"remote", conn.RemoteAddr().String(), "type", typ)
		_ = conn.Close()
		return
	}

	timer := time.NewTimer(m.HandoffTimeout)
	defer timer.Stop()
	select {
	case sub.ch <- conn:
	case <-timer.C:
		m.logger.Warn("raft port: sub-listener not accepting; dropping connection",
			"remote", conn.RemoteAddr().String(), "type", string(typ), "waited", m.HandoffTimeout)
		_ = conn.Close()
	case <-sub.done:
		_ = conn.Close()
	case <-m.ctx.Done():
		_ = conn.Close()
	}
}

func (m *Mux) readType(conn net.Conn) (byte, error) {
	// Both directions: a TLS handshake writes as well as reads.
	if err := conn.SetDeadline(time.Now().Add(m.HandshakeTimeout)); err != nil {
		return 0, err
	}
	if tc, ok := conn.(*tls.Conn); ok {
		if err := tc.Handshake(); err != nil {
			return 0, &handshakeError{err}
		}
	}
	var b [1]byte
	// Read exactly one byte straight from conn, never through a buffer, so
	// nothing the peer sends after the type byte is swallowed here.
	if _, err := io.ReadFull(conn, b[:]); err != nil {
		return 0, err
	}
	// Clear the deadline: the new owner sets its own.
	if err := conn.SetDeadline(time.Time{}); err != nil {
		return 0, err
	}
	return b[0], nil
}

// handshakeError is a failed TLS handshake on the raft port.
type handshakeError struct{ err error }

func (e *handshakeError) Error() string { return "TLS handshake: " + e.err.Error() }
func (e *handshakeError) Unwrap() error { return e.err }

// refusedHandshake reports a peer refused by TLS: at warn level at most once
// every 10 s (it is a misconfiguration the operator must fix, but the peer
// retries at Raft's pace), at debug level otherwise.
func (m *Mux) refusedHandshake(conn net.Conn, err error) {
	now := time.Now().UnixNano()
	last := m.lastTLSWarn.Load()
	if now-last >= int64(10*time.Second) && m.lastTLSWarn.CompareAndSwap(last, now) {
		m.logger.Warn("raft port: refused a connection whose TLS handshake failed; is the peer a plaintext node, or is its certificate not a node certificate signed by this node's --peer-ca?",
			"remote", conn.RemoteAddr().String(), "error", err)
		return
	}
	m.logger.Debug("raft port: refused a connection whose TLS handshake failed",
		"remote", conn.RemoteAddr().String(), "error", err)
}

// Close stops Serve, closes the listener, makes both sub-listeners' Accept
// return net.ErrClosed and waits for every goroutine the Mux started. It does
// not close connections already handed to a sub-listener; their new owners
// (the Raft transport, the HTTP server) do. Close is idempotent.
func (m *Mux) Close() error {
	m.closeOnce.Do(func() {
		m.mu.Lock()
		m.closed = true
		m.mu.Unlock()

		m.cancel()
		err := m.ln.Close()
		m.raft.close()
		m.forward.close()
		m.etcd.close()
		m.wg.Wait()
		if err != nil && !errors.Is(err, net.ErrClosed) {
			m.closeErr = fmt.Errorf("close raft listener %s: %w", m.ln.Addr(), err)
		}
	})
	return m.closeErr
}

// RaftLayer returns the stream layer to build a raft.NetworkTransport on.
// Closing it (which NetworkTransport.Close does) stops only Raft traffic —
// its listener, its dials in flight and every connection it made or
// accepted; forwarding keeps working until Mux.Close.
func (m *Mux) RaftLayer() raft.StreamLayer {
	ctx, cancel := context.WithCancel(m.ctx)
	return &raftLayer{subListener: m.raft, mux: m, ctx: ctx, cancel: cancel, conns: map[*layerConn]struct{}{}}
}

// ForwardListener returns the listener to serve forwarded requests on, e.g.
// with http.Server.Serve. Closing it stops only forward traffic.
func (m *Mux) ForwardListener() net.Listener {
	return m.forward
}

// EtcdListener returns the listener of the etcd engine's message streams.
func (m *Mux) EtcdListener() net.Listener {
	return m.etcd
}

// dialEtcd opens an etcd-engine message stream to the raft port at address.
func (m *Mux) dialEtcd(ctx context.Context, address string) (net.Conn, error) {
	return dialTyped(ctx, orDefaultDialer(m.Dialer), "tcp", address, ConnEtcd)
}

// DialForward opens a forward connection to the raft port at address over
// plain TCP. Use ForwardDialer to plug a forward dial into
// http.Transport.DialContext or to dial through TLS.
func DialForward(ctx context.Context, address string) (net.Conn, error) {
	return ForwardDialer(nil)(ctx, "tcp", address)
}

// ForwardDialer returns a DialFunc that dials with dial (nil means a plain
// net.Dialer) and then announces a forward connection. The result can be
// assigned directly to http.Transport.DialContext; the HTTP request URL then
// carries the peer's raft address, e.g. http://10.0.0.2:7000/....
func ForwardDialer(dial DialFunc) DialFunc {
	dial = orDefaultDialer(dial)
	return func(ctx context.Context, network, address string) (net.Conn, error) {
		return dialTyped(ctx, dial, network, address, ConnForward)
	}
}

func orDefaultDialer(dial DialFunc) DialFunc {
	if dial != nil {
		return dial
	}
	var d net.Dialer
	return d.DialContext
}

// dialTyped dials and writes the type byte, honouring ctx for both steps: a
// TLS dialer may complete its handshake lazily on the first write, which
// could otherwise block past the caller's deadline.
func dialTyped(ctx context.Context, dial DialFunc, network, address string, typ byte) (net.Conn, error) {
	conn, err := dial(ctx, network, address)
	if err != nil {
		return nil, fmt.Errorf("dial raft port %s: %w", address, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetWriteDeadline(dl)
	}
	// A deadline in the past aborts a write blocked on a cancelled ctx.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetWriteDeadline(time.Unix(1, 0)) })
	_, err = conn.Write([]byte{typ})
	if cancelled := !stop(); cancelled || err != nil {
		_ = conn.Close()
		if cancelled {
			err = errors.Join(ctx.Err(), err)
		}
		return nil, fmt.Errorf("announce %q connection to raft port %s (is the peer a dlock node on its raft port?): %w",
			typ, address, err)
	}
	_ = conn.SetWriteDeadline(time.Time{})
	return conn, nil
}

// subListener is the net.Listener face of one connection type. Conns arrive
// over an unbuffered channel so a conn is always owned by exactly one side:
// the routing goroutine until Accept takes it, the caller afterwards.
type subListener struct {
	addr      net.Addr
	ch        chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
}

func newSubListener(addr net.Addr) *subListener {
	return &subListener{addr: addr, ch: make(chan net.Conn), done: make(chan struct{})}
}

func (l *subListener) Accept() (net.Conn, error) {
	// Prefer reporting closure over a conn that raced with it.
	select {
	case <-l.done:
		return nil, net.ErrClosed
	default:
	}
	select {
	case conn := <-l.ch:
		return conn, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *subListener) Close() error {
	l.close()
	return nil
}

func (l *subListener) close() { l.closeOnce.Do(func() { close(l.done) }) }

func (l *subListener) Addr() net.Addr { return l.addr }

// raftLayer is the Raft stream layer. It keeps every connection it dialed
// or accepted so that Close can cut them: hashicorp/raft's NetworkTransport
// never closes a connection in use, and its reads and writes wait up to
// its I/O timeout on a peer that stopped reading or answering (a paused
// process, a frozen VM), which would hold the node's shutdown that long.
type raftLayer struct {
	*subListener
	mux *Mux
	// ctx ends dials in flight when the layer closes.
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	closed bool
	conns  map[*layerConn]struct{}
}

// Accept implements net.Listener.
func (r *raftLayer) Accept() (net.Conn, error) {
	conn, err := r.subListener.Accept()
	if err != nil {
		return nil, err
	}
	return r.track(conn)
}

// Dial implements raft.StreamLayer.
func (r *raftLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(r.ctx, timeout)
	defer cancel()
	conn, err := dialTyped(ctx, orDefaultDialer(r.mux.Dialer), "tcp", string(address), ConnRaft)
	if err != nil {
		return nil, err
	}
	return r.track(conn)
}

// Close implements net.Listener: no more connections in or out, and every
// open one is closed.
func (r *raftLayer) Close() error {
	r.subListener.close()
	r.cancel()
	r.mu.Lock()
	r.closed = true
	conns := r.conns
	r.conns = nil
	r.mu.Unlock()
	for c := range conns {
		_ = c.Conn.Close()
	}
	return nil
}

// track hands out conn wrapped so that the layer can close it, or closes it
// if the layer has closed meanwhile.
func (r *raftLayer) track(conn net.Conn) (net.Conn, error) {
	c := &layerConn{Conn: conn, layer: r}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		_ = conn.Close()
		return nil, fmt.Errorf("raft stream layer: %w", net.ErrClosed)
	}
	r.conns[c] = struct{}{}
	return c, nil
}

// layerConn is a Raft connection its layer knows of until it is closed.
type layerConn struct {
	net.Conn
	layer *raftLayer
}

func (c *layerConn) Close() error {
	c.layer.mu.Lock()
	delete(c.layer.conns, c)
	c.layer.mu.Unlock()
	return c.Conn.Close()
}
