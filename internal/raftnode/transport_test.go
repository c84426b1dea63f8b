// Tests for the raft-port Mux over real loopback TCP, including a real
// raft.NetworkTransport RPC and HTTP over forward connections.

package raftnode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dlock/dlock/internal/testutil"
)

// startMux listens on loopback, starts Serve and registers a cleanup that
// closes the Mux and checks Serve returned net.ErrClosed.
func startMux(t *testing.T) *Mux {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	return startMuxOn(t, ln)
}

// startMuxOn is startMux on a given listener (a TLS one, say).
func startMuxOn(t *testing.T, ln net.Listener) *Mux {
	t.Helper()
	m := NewMux(ln, nil, nil)
	serveErr := make(chan error, 1)
	go func() { serveErr <- m.Serve() }()
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		select {
		case err := <-serveErr:
			if !errors.Is(err, net.ErrClosed) {
				t.Errorf("Serve returned %v, want net.ErrClosed", err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("Serve did not return after Close")
		}
	})
	return m
}

func newTestTransport(t *testing.T, m *Mux) *raft.NetworkTransport {
	t.Helper()
	tr := raft.NewNetworkTransport(m.RaftLayer(), 2, 2*time.Second, io.Discard)
	t.Cleanup(func() { _ = tr.Close() })
	return tr
}

func TestMuxRaftRPC(t *testing.T) {
	m1, m2 := startMux(t), startMux(t)
	t1, t2 := newTestTransport(t, m1), newTestTransport(t, m2)

	if got, want := string(t2.LocalAddr()), m2.ForwardListener().Addr().String(); got != want {
		t.Fatalf("transport advertises %q, want the mux address %q", got, want)
	}

	// Answer whatever arrives on node 2 the way raft would.
	served := make(chan struct{})
	go func() {
		defer close(served)
		for i := 0; i < 2; i++ {
			select {
			case rpc := <-t2.Consumer():
				switch cmd := rpc.Command.(type) {
				case *raft.AppendEntriesRequest:
					rpc.Respond(&raft.AppendEntriesResponse{Term: cmd.Term, LastLog: cmd.PrevLogEntry + uint64(len(cmd.Entries)), Success: true}, nil)
				case *raft.RequestVoteRequest:
					rpc.Respond(&raft.RequestVoteResponse{Term: cmd.Term, Granted: true}, nil)
				default:
					rpc.Respond(nil, fmt.Errorf("unexpected rpc %T", cmd))
				}
			case <-time.After(10 * time.Second):
				return
			}
		}
	}()

	target := t2.LocalAddr()
	aeReq := &raft.AppendEntriesRequest{
		RPCHeader:    raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("n1"), Addr: []byte(t1.LocalAddr())},
		Term:         7,
		PrevLogEntry: 41,
		Entries:      []*raft.Log{{Index: 42, Term: 7, Type: raft.LogCommand, Data: []byte("acquire lock-a")}},
	}
	var aeResp raft.AppendEntriesResponse
	if err := t1.AppendEntries("n2", target, aeReq, &aeResp); err != nil {
		t.Fatalf("AppendEntries over mux: %v", err)
	}
	if !aeResp.Success || aeResp.Term != 7 || aeResp.LastLog != 42 {
		t.Fatalf("AppendEntries response = %+v, want success term 7 lastlog 42", aeResp)
	}

	rvReq := &raft.RequestVoteRequest{
		RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("n1"), Addr: []byte(t1.LocalAddr())},
		Term:      8,
	}
	var rvResp raft.RequestVoteResponse
	if err := t1.RequestVote("n2", target, rvReq, &rvResp); err != nil {
		t.Fatalf("RequestVote over mux: %v", err)
	}
	if !rvResp.Granted || rvResp.Term != 8 {
		t.Fatalf("RequestVote response = %+v, want granted term 8", rvResp)
	}
	<-served
}

func TestMuxForwardHTTP(t *testing.T) {
	m := startMux(t)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "forwarded %s %s", r.Method, r.URL.Path)
		}),
		ReadHeaderTimeout: 5 * time.Second,
	}
	go func() { _ = srv.Serve(m.ForwardListener()) }()
	t.Cleanup(func() { _ = srv.Close() })

	// The same port must keep speaking raft alongside HTTP.
	newTestTransport(t, m)

	client := &http.Client{Transport: &http.Transport{DialContext: ForwardDialer(nil)}, Timeout: 5 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	for i := 0; i < 3; i++ { // reuses the kept-alive forward connection
		resp, err := client.Get("http://" + m.ForwardListener().Addr().String() + "/v1/locks/a")
		if err != nil {
			t.Fatalf("GET over forward conn: %v", err)
		}
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			t.Fatalf("read body: %v", err)
		}
		if got, want := string(body), "forwarded GET /v1/locks/a"; got != want {
			t.Fatalf("body = %q, want %q", got, want)
		}
	}

	// DialForward is the plain form of the same dial.
	conn, err := DialForward(context.Background(), m.ForwardListener().Addr().String())
	if err != nil {
		t.Fatalf("DialForward: %v", err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(conn, "GET /x HTTP/1.1\r\nHost: n\r\nConnection: close\r\n\r\n"); err != nil {
		t.Fatalf("write request: %v", err)
	}
	raw, err := io.ReadAll(conn)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	if !strings.HasSuffix(string(raw), "forwarded GET /x") {
		t.Fatalf("raw response %q does not end with handler output", raw)
	}
}

// expectClosedByPeer fails unless the server closes conn within d.
func expectClosedByPeer(t *testing.T, conn net.Conn, d time.Duration) {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(d))
	var b [1]byte
	_, err := conn.Read(b[:])
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("server kept the connection open for %v", d)
	}
	if err == nil {
		t.Fatalf("read a byte from a connection the server should have dropped")
	}
}

func TestMuxUnknownTypeByteClosed(t *testing.T) {
	m := startMux(t)
	conn, err := net.Dial("tcp", m.ForwardListener().Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("GET / HTTP/1.1\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	expectClosedByPeer(t, conn, 5*time.Second)
}

func TestMuxSilentConnTimesOut(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := NewMux(ln, nil, nil)
	m.HandshakeTimeout = 100 * time.Millisecond
	go func() { _ = m.Serve() }()
	defer m.Close()

	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Well inside the default timeout (5 s): the configured one must be used.
	expectClosedByPeer(t, conn, 2*time.Second)
}

func TestMuxHandoffTimeoutWhenNobodyAccepts(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := NewMux(ln, nil, nil)
	m.HandoffTimeout = 100 * time.Millisecond
	go func() { _ = m.Serve() }()
	defer m.Close()

	// Nobody calls ForwardListener().Accept.
	conn, err := DialForward(context.Background(), ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Well inside the default timeout (5 s): the configured one must be used.
	expectClosedByPeer(t, conn, 2*time.Second)
}

func TestMuxSubListenerCloseIsIndependent(t *testing.T) {
	m := startMux(t)
	rl := m.RaftLayer()
	if err := rl.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := rl.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("raft Accept after its Close = %v, want net.ErrClosed", err)
	}

	// A closed layer dials no more.
	if c, err := rl.Dial(raft.ServerAddress(rl.Addr().String()), time.Second); err == nil {
		c.Close()
		t.Fatal("a closed raft layer dialled")
	}
	// Raft conns from peers are now refused promptly, forward conns still flow.
	rc, err := m.RaftLayer().Dial(raft.ServerAddress(rl.Addr().String()), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	expectClosedByPeer(t, rc, 5*time.Second)

	accepted := make(chan error, 1)
	go func() {
		c, err := m.ForwardListener().Accept()
		if err == nil {
			c.Close()
		}
		accepted <- err
	}()
	fc, err := DialForward(context.Background(), rl.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer fc.Close()
	if err := <-accepted; err != nil {
		t.Fatalf("forward Accept after raft layer closed: %v", err)
	}
}

func TestMuxCloseStopsEverything(t *testing.T) {
	before := runtime.NumGoroutine()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := NewMux(ln, nil, nil)
	serveErr := make(chan error, 1)
	go func() { serveErr <- m.Serve() }()

	acceptErrs := make(chan error, 2)
	for _, l := range []net.Listener{m.RaftLayer(), m.ForwardListener()} {
		go func() {
			_, err := l.Accept()
			acceptErrs <- err
		}()
	}

	// A connection stuck before its type byte must not delay Close by the
	// handshake timeout.
	silent, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	time.Sleep(50 * time.Millisecond) // let Serve accept it

	start := time.Now()
	if err := m.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("Close took %v; it should not wait out the handshake timeout", took)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}

	select {
	case err := <-serveErr:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Serve returned %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after Close")
	}
	for i := 0; i < 2; i++ {
		select {
		case err := <-acceptErrs:
			if !errors.Is(err, net.ErrClosed) {
				t.Fatalf("Accept returned %v, want net.ErrClosed", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Accept did not return after Close")
		}
	}
	if _, err := m.ForwardListener().Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close = %v, want net.ErrClosed", err)
	}
	if err := m.Serve(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Serve after Close = %v, want net.ErrClosed", err)
	}
	expectClosedByPeer(t, silent, 5*time.Second)

	// Every goroutine the Mux started has exited (allow the runtime a
	// moment to reap the ones that just returned).
	testutil.Eventually(t, 5*time.Second, "every goroutine the Mux started to exit", func() (bool, string) {
		if runtime.NumGoroutine() <= before {
			return true, ""
		}
		buf := make([]byte, 1<<16)
		return false, fmt.Sprintf("%d before, %d after Close\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
	})
}

func TestDialForwardHonoursContext(t *testing.T) {
	// A port that accepts connections, so only the context can make the dial
	// fail (a refused port would fail whatever DialForward did with ctx).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if c, err := DialForward(context.Background(), ln.Addr().String()); err != nil {
		t.Fatalf("DialForward to a listening port: %v", err)
	} else {
		c.Close()
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	c, err := DialForward(ctx, ln.Addr().String())
	if err == nil {
		c.Close()
		t.Fatal("DialForward with a cancelled context succeeded")
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("DialForward with a cancelled context: %v, want context.Canceled", err)
	}
}

// Closing the Raft layer cuts the connections it dialled and accepted: a
// read blocked on a silent peer returns at once (net.ErrClosed, a local
// close), not after the transport's I/O timeout.
func TestRaftLayerCloseCutsItsConnections(t *testing.T) {
	pair := func() (dialer, acceptor raft.StreamLayer, out, in net.Conn) {
		t.Helper()
		dialer, acceptor = startMux(t).RaftLayer(), startMux(t).RaftLayer()
		accepted := make(chan net.Conn, 1)
		go func() {
			if c, err := acceptor.Accept(); err == nil {
				accepted <- c
			}
		}()
		out, err := dialer.Dial(raft.ServerAddress(acceptor.Addr().String()), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { out.Close() })
		select {
		case in = <-accepted:
			t.Cleanup(func() { in.Close() })
		case <-time.After(10 * time.Second):
			t.Fatal("the raft layer accepted nothing")
		}
		return dialer, acceptor, out, in
	}
	blockedRead := func(c net.Conn) <-chan error {
		errc := make(chan error, 1)
		go func() {
			var b [1]byte
			_, err := c.Read(b[:])
			errc <- err
		}()
		return errc
	}
	wantLocalClose := func(what string, errc <-chan error) {
		t.Helper()
		select {
		case err := <-errc:
			if !errors.Is(err, net.ErrClosed) {
				t.Errorf("%s: read ended with %v, want net.ErrClosed (closed by its own layer)", what, err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("%s: still open after its layer closed", what)
		}
	}

	dialer, _, out, _ := pair()
	errc := blockedRead(out)
	if err := dialer.Close(); err != nil {
		t.Fatal(err)
	}
	wantLocalClose("dialled connection", errc)

	_, acceptor, _, in := pair()
	errc = blockedRead(in)
	if err := acceptor.Close(); err != nil {
		t.Fatal(err)
	}
	wantLocalClose("accepted connection", errc)
}
