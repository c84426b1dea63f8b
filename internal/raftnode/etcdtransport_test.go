package raftnode

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/dlock/dlock/internal/testutil"
)

func TestCommitNoticesHeldUntilCoveredOrDue(t *testing.T) {
	notice := func(g, term, index, commit uint64) outMsg {
		return outMsg{group: g, m: raftpb.Message{Type: raftpb.MsgApp, Term: term, Index: index, Commit: commit}}
	}
	appendOf := func(g, term, index, commit uint64) outMsg {
		m := notice(g, term, index, commit)
		m.m.Entries = []raftpb.Entry{{Index: index + 1, Term: term}}
		return m
	}
	heartbeat := outMsg{group: 1, m: raftpb.Message{Type: raftpb.MsgHeartbeat, Term: 2, Commit: 9}}
	cases := []struct {
		name string
		in   []outMsg
		// out is what the stream writes at once, in order; held what is
		// still held afterwards (released when due).
		out, held  []outMsg
		dropped    uint64
		timerArmed bool
	}{
		{name: "a notice alone waits", in: []outMsg{notice(1, 2, 10, 10)},
			held: []outMsg{notice(1, 2, 10, 10)}, timerArmed: true},
		{name: "the next append carries the commit", in: []outMsg{notice(1, 2, 10, 10), appendOf(1, 2, 10, 10)},
			out: []outMsg{appendOf(1, 2, 10, 10)}, dropped: 1},
		{name: "a heartbeat does not overtake it", in: []outMsg{notice(1, 2, 10, 10), heartbeat},
			out: []outMsg{notice(1, 2, 10, 10), heartbeat}},
		{name: "a newer notice replaces it", in: []outMsg{notice(1, 2, 10, 9), notice(1, 2, 10, 10)},
			held: []outMsg{notice(1, 2, 10, 10)}, dropped: 1, timerArmed: true},
		{name: "an append with a lower commit does not cover it", in: []outMsg{notice(1, 2, 10, 10), appendOf(1, 2, 10, 9)},
			out: []outMsg{notice(1, 2, 10, 10), appendOf(1, 2, 10, 9)}},
		{name: "an append from an earlier position does not cover it", in: []outMsg{notice(1, 2, 10, 10), appendOf(1, 2, 8, 10)},
			out: []outMsg{notice(1, 2, 10, 10), appendOf(1, 2, 8, 10)}},
		{name: "a new term's notice sends the old one", in: []outMsg{notice(1, 2, 10, 10), notice(1, 3, 10, 10)},
			out: []outMsg{notice(1, 2, 10, 10)}, held: []outMsg{notice(1, 3, 10, 10)}, timerArmed: true},
		{name: "groups are apart", in: []outMsg{notice(1, 2, 10, 10), appendOf(2, 2, 10, 10)},
			out: []outMsg{appendOf(2, 2, 10, 10)}, held: []outMsg{notice(1, 2, 10, 10)}, timerArmed: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var dropped, sent atomic.Uint64
			c := commitNotices{dropped: &dropped, sent: &sent}
			defer c.stop()
			var out []outMsg
			for _, m := range tc.in {
				out = append(out, c.next(m)...)
			}
			if got, want := fmt.Sprint(out), fmt.Sprint(tc.out); got != want {
				t.Errorf("written at once: %s, want %s", got, want)
			}
			if dropped.Load() != tc.dropped {
				t.Errorf("dropped %d notices, want %d", dropped.Load(), tc.dropped)
			}
			if (c.due() != nil) != tc.timerArmed {
				t.Errorf("timer armed %v, want %v", c.due() != nil, tc.timerArmed)
			}
			if len(tc.held) == 0 {
				return
			}
			select {
			case <-c.due():
			case <-time.After(10 * time.Second):
				t.Fatal("a held notice never fell due")
			}
			if got, want := fmt.Sprint(c.release()), fmt.Sprint(tc.held); got != want {
				t.Errorf("released %s, want %s", got, want)
			}
			if c.due() != nil {
				t.Error("the timer is still armed with nothing held")
			}
		})
	}
}

// A leader busy with writes drops most of its commit notices (each next
// append carries the commit), and once the writes stop the last notice still
// reaches the followers, which then commit everything.
func TestEtcdEngineCommitNoticesThroughARealCluster(t *testing.T) {
	nodes, _ := openEtcdCluster(t, []string{"a", "b", "c"}, nil)
	leader := nodes[waitLeader(t, nodes)]
	trans := leader.etcdTrans
	for i := range 50 {
		acquire(t, leader, fmt.Sprintf("n%d", i))
	}
	if trans.noticesDropped.Load() == 0 {
		t.Errorf("50 writes in a row dropped no commit notice (sent %d)", trans.noticesSent.Load())
	}
	want := leader.Status().CommitIndex
	testutil.Eventually(t, 10*time.Second, "a follower never learned the last commit", func() bool {
		for _, n := range nodes {
			if n.Status().CommitIndex < want {
				return false
			}
		}
		return true
	})
	sameState(t, nodes)
	t.Logf("commit notices: %d dropped, %d sent", trans.noticesDropped.Load(), trans.noticesSent.Load())
}

// closeNotingConn tells when the transport closes its end of a stream.
type closeNotingConn struct {
	net.Conn
	once   sync.Once
	closed chan struct{}
}

func (c *closeNotingConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// A restarted peer has closed its end of the old stream, and a follower
// sends it nothing until an election; the first message after that (a
// survivor's vote) must reach it on a new stream, not vanish into the old one.
func TestPeerStreamRedialsAPeerThatClosedIt(t *testing.T) {
	peer, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := NewMux(ln, nil, nil)
	defer mux.Close()
	streams := make(chan *closeNotingConn, 4)
	mux.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		nc := &closeNotingConn{Conn: c, closed: make(chan struct{})}
		streams <- nc
		return nc, nil
	}
	tr := newEtcdTransport(mux, slog.New(slog.DiscardHandler))
	defer tr.Close()

	// receive accepts the transport's next stream and reads one message.
	receive := func() (net.Conn, raftpb.Message) {
		t.Helper()
		_ = peer.(*net.TCPListener).SetDeadline(time.Now().Add(10 * time.Second))
		conn, err := peer.Accept()
		if err != nil {
			t.Fatalf("the transport opened no stream: %v", err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		r := bufio.NewReader(conn)
		if typ, err := r.ReadByte(); err != nil || typ != ConnEtcd {
			t.Fatalf("stream type %q, %v", typ, err)
		}
		var buf []byte
		for {
			group, body, err := readFrame(r, &buf)
			if err != nil {
				t.Fatalf("read a frame: %v", err)
			}
			if group != 0 {
				var m raftpb.Message
				if err := m.Unmarshal(body); err != nil {
					t.Fatal(err)
				}
				return conn, m
			}
		}
	}
	heartbeat := func(commit uint64) raftpb.Message {
		return raftpb.Message{Type: raftpb.MsgHeartbeat, To: 2, From: 1, Term: 3, Commit: commit}
	}

	tr.send(1, peer.Addr().String(), heartbeat(1))
	conn, m := receive()
	if m.Commit != 1 {
		t.Fatalf("received %v, want the first heartbeat", m)
	}
	first := <-streams
	_ = conn.Close() // the peer restarts
	select {
	case <-first.closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the transport kept a stream its peer had closed")
	}
	tr.send(1, peer.Addr().String(), heartbeat(2))
	conn, m = receive()
	defer conn.Close()
	if m.Commit != 2 {
		t.Fatalf("received %v on the new stream, want the second heartbeat", m)
	}
}

// goneHandler records what the transport hands one group.
type goneHandler struct {
	got  chan raftpb.Message
	gone chan string
}

func (h *goneHandler) receive(m raftpb.Message)  { h.got <- m }
func (h *goneHandler) unreachable(uint64)        {}
func (h *goneHandler) snapshotDone(uint64, bool) {}
func (h *goneHandler) peerFailing(string, bool)  {}
func (h *goneHandler) peerGone(addr string)      { h.gone <- addr }
func (h *goneHandler) String() string            { return "goneHandler" }
func (h *goneHandler) wait(t *testing.T) (raftpb.Message, string) {
	t.Helper()
	select {
	case m := <-h.got:
		select {
		case addr := <-h.gone:
			return m, addr
		case <-time.After(10 * time.Second):
			t.Fatal("the end of the stream was not reported")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the message was not delivered")
	}
	return raftpb.Message{}, ""
}

// dialTransport starts a transport whose group 1 is h and opens a raw
// stream to it, which has sent its type byte and a hello announcing peer.
func dialTransport(t *testing.T, peer string) (h *goneHandler, conn net.Conn) {
	t.Helper()
	mux := startMux(t)
	tr := newEtcdTransport(mux, slog.New(slog.DiscardHandler))
	t.Cleanup(tr.Close)
	h = &goneHandler{got: make(chan raftpb.Message, 1), gone: make(chan string, 1)}
	tr.register(1, h)
	conn, err := net.Dial("tcp", mux.EtcdListener().Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	hello := binary.AppendUvarint([]byte{ConnEtcd}, uint64(1+len(peer)))
	if _, err := conn.Write(append(append(hello, 0), peer...)); err != nil {
		t.Fatal(err)
	}
	return h, conn
}

// When a peer's stream ends (its process died), every group hears which
// peer it was, by the address the stream's hello announced.
func TestTransportReportsAnEndedInboundStream(t *testing.T) {
	const peer = "127.0.0.9:7001"
	h, conn := dialTransport(t, peer)
	stream, err := appendFrame(nil, 1, &raftpb.Message{Type: raftpb.MsgHeartbeat, From: 2, To: 1, Term: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(stream); err != nil {
		t.Fatal(err)
	}
	_ = conn.Close() // the peer's process dies
	m, addr := h.wait(t)
	if m.Type != raftpb.MsgHeartbeat || addr != peer {
		t.Fatalf("got %v and the end of %q, want the heartbeat and the end of %q", m.Type, addr, peer)
	}
}

// A stream that breaks the framing is dropped at once, and not taken for the
// end of a live peer's stream: peerGone would let a follower count its
// leader's lease as ended.
func TestTransportDropsAStreamWithABadFrame(t *testing.T) {
	const peer = "127.0.0.9:7001"
	msg, err := appendFrame(nil, 1, &raftpb.Message{Type: raftpb.MsgHeartbeat, From: 2, To: 1, Term: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		frame []byte
	}{
		{"zero length", []byte{0}},
		{"over the bound", binary.AppendUvarint(nil, maxFrame+1)},
		{"no group id", []byte{1, 0x80}},
		{"an undecodable message", []byte{3, 1, 0xff, 0xff}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, conn := dialTransport(t, peer)
			if _, err := conn.Write(append(append([]byte(nil), tc.frame...), msg...)); err != nil {
				t.Fatal(err)
			}
			_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := conn.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
				t.Fatalf("read after a bad frame: %v, want the transport to close the stream", err)
			}
			select {
			case m := <-h.got:
				t.Fatalf("the message after the bad frame was delivered: %v", m)
			case addr := <-h.gone:
				t.Fatalf("a bad frame was reported as the end of %s's stream", addr)
			case <-time.After(50 * time.Millisecond):
			}
		})
	}
}

func TestReadFrame(t *testing.T) {
	msg, err := appendFrame(nil, 7, &raftpb.Message{Type: raftpb.MsgApp, Index: 9})
	if err != nil {
		t.Fatal(err)
	}
	var buf []byte
	group, body, err := readFrame(bufio.NewReader(bytes.NewReader(msg)), &buf)
	if err != nil || group != 7 {
		t.Fatalf("readFrame = group %d, %v; want group 7", group, err)
	}
	var m raftpb.Message
	if err := m.Unmarshal(body); err != nil || m.Index != 9 {
		t.Fatalf("body decodes to %v, %v", m, err)
	}
	// A stream cut inside a frame is the stream's end, not a bad frame.
	if _, _, err := readFrame(bufio.NewReader(bytes.NewReader(msg[:len(msg)-1])), &buf); err == nil || errors.Is(err, errBadFrame) {
		t.Fatalf("truncated frame: %v, want a read error", err)
	}

	// A frame larger than the buffer's step (a snapshot) arrives whole.
	snap := &raftpb.Message{Type: raftpb.MsgSnap, Snapshot: &raftpb.Snapshot{Data: bytes.Repeat([]byte("s"), 3*frameStep+5)}}
	big, err := appendFrame(nil, 2, snap)
	if err != nil {
		t.Fatal(err)
	}
	group, body, err = readFrame(bufio.NewReader(bytes.NewReader(big)), &buf)
	m = raftpb.Message{}
	if err != nil || group != 2 || m.Unmarshal(body) != nil || !bytes.Equal(m.Snapshot.Data, snap.Snapshot.Data) {
		t.Fatalf("a %d-byte frame: group %d, %v", len(big), group, err)
	}

	// A length is a claim: announcing the largest frame and sending 1 KiB
	// does not allocate the frame.
	claim := append(binary.AppendUvarint(nil, maxFrame), make([]byte, 1024)...)
	buf = nil
	if _, _, err := readFrame(bufio.NewReader(bytes.NewReader(claim)), &buf); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("a cut claim of %d bytes: %v, want io.ErrUnexpectedEOF", maxFrame, err)
	}
	if cap(buf) > 2*frameStep {
		t.Fatalf("reading 1 KiB of a frame claimed at %d bytes grew the buffer to %d", maxFrame, cap(buf))
	}
}
