// The raft port behind mutual TLS, over real loopback TCP: Raft and
// forwarding work between nodes of one CA, and everything else is refused.

package raftnode

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dlock/dlock/internal/tlsconfig"
)

// peerTLS returns the mTLS config of a node of a fresh CA.
func peerTLS(t *testing.T) *tls.Config {
	t.Helper()
	f, err := tlsconfig.GenerateDev(t.TempDir(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := tlsconfig.Peer(f.NodeCert, f.NodeKey, f.CA)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// startPeerMux starts a Mux whose port and dials go through cfg (nil:
// plaintext), as Open wires them.
func startPeerMux(t *testing.T, cfg *tls.Config) (*Mux, DialFunc) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	ln, dial := securePeers(ln, &net.Dialer{Timeout: 5 * time.Second}, cfg)
	m := startMuxOn(t, ln)
	m.Dialer = dial
	return m, dial
}

// serveForward answers every forward request on m with "ok".
func serveForward(t *testing.T, m *Mux) {
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }),
		ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(m.ForwardListener()) }()
	t.Cleanup(func() { _ = srv.Close() })
}

func forwardGet(dial DialFunc, addr string) error {
	client := &http.Client{Transport: &http.Transport{DialContext: ForwardDialer(dial)}, Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	res, err := client.Get("http://" + addr + "/forward/status")
	if err != nil {
		return err
	}
	defer res.Body.Close()
	_, err = io.ReadAll(res.Body)
	return err
}

func TestPeerTLSCarriesRaftAndForwarding(t *testing.T) {
	cfg := peerTLS(t)
	m1, dial1 := startPeerMux(t, cfg)
	m2, _ := startPeerMux(t, cfg)
	t1, t2 := newTestTransport(t, m1), newTestTransport(t, m2)
	serveForward(t, m2)

	go func() {
		select {
		case rpc := <-t2.Consumer():
			cmd := rpc.Command.(*raft.RequestVoteRequest)
			rpc.Respond(&raft.RequestVoteResponse{Term: cmd.Term, Granted: true}, nil)
		case <-time.After(10 * time.Second):
		}
	}()
	req := &raft.RequestVoteRequest{
		RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("n1"), Addr: []byte(t1.LocalAddr())},
		Term:      3,
	}
	var resp raft.RequestVoteResponse
	if err := t1.RequestVote("n2", t2.LocalAddr(), req, &resp); err != nil {
		t.Fatalf("RequestVote over mTLS: %v", err)
	}
	if !resp.Granted || resp.Term != 3 {
		t.Fatalf("RequestVote response = %+v, want granted term 3", resp)
	}
	if err := forwardGet(dial1, m2.ForwardListener().Addr().String()); err != nil {
		t.Fatalf("forward request over mTLS: %v", err)
	}
}

func TestPeerTLSRefusesPlaintextPeer(t *testing.T) {
	m, _ := startPeerMux(t, peerTLS(t))
	serveForward(t, m)
	addr := m.ForwardListener().Addr().String()

	// A plaintext node's first bytes are a type byte and a request, not a
	// TLS ClientHello: the connection is dropped.
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "FGET /forward/status HTTP/1.1\r\nHost: n\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	expectClosedByPeer(t, conn, 5*time.Second)

	if err := forwardGet(nil, addr); err == nil {
		t.Fatal("a plaintext forward request to a TLS raft port succeeded")
	}
	// Nor does a plaintext node's Raft RPC get an answer.
	plain, _ := startPeerMux(t, nil)
	tr := newTestTransport(t, plain)
	req := &raft.RequestVoteRequest{
		RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("n1"), Addr: []byte(tr.LocalAddr())},
		Term:      3,
	}
	var resp raft.RequestVoteResponse
	if err := tr.RequestVote("n2", raft.ServerAddress(addr), req, &resp); err == nil {
		t.Fatalf("a plaintext RequestVote to a TLS raft port was answered: %+v", resp)
	}
}

func TestPeerTLSNodeDoesNotTalkToPlaintextPeer(t *testing.T) {
	plain, _ := startPeerMux(t, nil)
	serveForward(t, plain)
	_, dial := startPeerMux(t, peerTLS(t))
	if err := forwardGet(dial, plain.ForwardListener().Addr().String()); err == nil {
		t.Fatal("a TLS node's forward request to a plaintext raft port succeeded")
	}
}

func TestPeerTLSRefusesOtherCA(t *testing.T) {
	ours, theirs := peerTLS(t), peerTLS(t)
	m, dialOurs := startPeerMux(t, ours)
	serveForward(t, m)
	stranger, dialTheirs := startPeerMux(t, theirs)
	serveForward(t, stranger)

	if err := forwardGet(dialTheirs, m.ForwardListener().Addr().String()); err == nil {
		t.Error("a node with another CA's certificate dialled in")
	}
	if err := forwardGet(dialOurs, stranger.ForwardListener().Addr().String()); err == nil {
		t.Error("dialled a node with another CA's certificate")
	}
}

func TestPeerTLSSilentHandshakeTimesOut(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, _ = securePeers(ln, &net.Dialer{}, peerTLS(t))
	m := NewMux(ln, nil, nil)
	m.HandshakeTimeout = 100 * time.Millisecond
	go func() { _ = m.Serve() }()
	defer m.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Well inside the default timeout (5 s): the configured one must be used.
	expectClosedByPeer(t, conn, 2*time.Second)
}
