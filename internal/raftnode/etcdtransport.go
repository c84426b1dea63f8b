// The etcd engine's transport: Raft messages of every group, framed and
// pipelined over one stream per peer on the node's raft port (the mux's 'E'
// connections, behind the same peer mTLS as everything else there).

package raftnode

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

// maxFrame bounds one message on the wire (a snapshot travels as one
// message): a peer that announces more is not a dlock node, or is broken.
const maxFrame = 512 << 20

// frameStep is the most a frame's buffer grows by before its bytes arrive.
const frameStep = 1 << 20

// peerQueue is how many messages wait for one peer's stream. Raft tolerates
// lost messages, so a full queue drops rather than blocks the Raft loop.
const peerQueue = 4096

// etcdTransport carries framed Raft messages between nodes. A frame is
// uvarint(length) | uvarint(group) | raftpb.Message: the group id lets every
// group a node hosts share one stream and one port.
type etcdTransport struct {
	mux    *Mux
	logger *slog.Logger

	mu     sync.Mutex
	peers  map[string]*peerStream // by raft address
	groups map[uint64]groupHandler
	// learned maps a sender's raft id to the address its streams announce:
	// a node that has just joined knows no member's address until its
	// first snapshot, yet must answer the leader.
	learned map[uint64]string
	closed  bool

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// noticesDropped and noticesSent count commit notices (commitNotices)
	// that a later append made unneeded and that went out on their own.
	noticesDropped, noticesSent atomic.Uint64
}

// groupHandler is one group's side of the transport.
type groupHandler interface {
	// receive hands a message to the group; it may block (back-pressure on
	// the sender's stream) but returns once the group stops.
	receive(m raftpb.Message)
	// unreachable and snapshotDone report what happened to sent messages.
	unreachable(to uint64)
	snapshotDone(to uint64, ok bool)
	// peerFailing tracks a peer stream's health for the member list.
	peerFailing(addr string, failing bool)
	// peerGone says the stream the peer at addr sends on ended: its
	// process exited or restarted, or the link was cut.
	peerGone(addr string)
}

func newEtcdTransport(mux *Mux, logger *slog.Logger) *etcdTransport {
	ctx, cancel := context.WithCancel(context.Background())
	t := &etcdTransport{mux: mux, logger: logger, peers: map[string]*peerStream{}, groups: map[uint64]groupHandler{}, learned: map[uint64]string{}, ctx: ctx, cancel: cancel}
	t.wg.Add(1)
	go func() { defer t.wg.Done(); t.accept(mux.EtcdListener()) }()
	return t
}

func (t *etcdTransport) register(group uint64, h groupHandler) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.groups[group] = h
}

func (t *etcdTransport) unregister(group uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.groups, group)
}

// send queues m of group for the peer at addr; false if it was dropped.
func (t *etcdTransport) send(group uint64, addr string, m raftpb.Message) bool {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return false
	}
	p := t.peers[addr]
	if p == nil {
		p = &peerStream{t: t, addr: addr, q: make(chan outMsg, peerQueue)}
		t.peers[addr] = p
		t.wg.Add(1)
		go func() { defer t.wg.Done(); p.run() }()
	}
	t.mu.Unlock()
	select {
	case p.q <- outMsg{group: group, m: m}:
		return true
	default:
		return false
	}
}

// learnedAddr is the address a peer's streams announced for raft id id.
func (t *etcdTransport) learnedAddr(id uint64) (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	a, ok := t.learned[id]
	return a, ok
}

func (t *etcdTransport) handler(group uint64) groupHandler {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.groups[group]
}

// Close stops every stream and waits for their goroutines.
func (t *etcdTransport) Close() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	t.cancel()
	_ = t.mux.EtcdListener().Close()
	t.wg.Wait()
}

type outMsg struct {
	group uint64
	m     raftpb.Message
}

// peerStream owns the outbound stream to one peer: it dials, writes queued
// messages (flushing when the queue runs dry, so a burst goes out as few
// writes), and redials after a failure.
type peerStream struct {
	t    *etcdTransport
	addr string
	q    chan outMsg
}

func (p *peerStream) run() {
	backoff := 10 * time.Millisecond
	var carried *outMsg
	for {
		var first outMsg
		if carried != nil {
			first, carried = *carried, nil
		} else {
			select {
			case <-p.t.ctx.Done():
				return
			case first = <-p.q:
			}
		}
		ctx, cancel := context.WithTimeout(p.t.ctx, 2*time.Second)
		conn, err := p.t.mux.dialEtcd(ctx, p.addr)
		cancel()
		if err != nil {
			p.failed(first)
			p.drain()
			p.t.reportPeer(p.addr, true)
			select {
			case <-p.t.ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, time.Second)
			continue
		}
		backoff = 10 * time.Millisecond
		p.t.reportPeer(p.addr, false)
		carried, err = p.write(conn, first)
		_ = conn.Close()
		if p.t.ctx.Err() != nil {
			return
		}
		p.t.logger.Debug("etcd raft stream to peer ended", "peer", p.addr, "err", err)
	}
}

var errPeerClosedStream = errors.New("the peer closed the stream")

// write sends messages on conn until a write fails, the peer closes the
// stream or the transport closes. A message taken from the queue when the
// peer had already closed the stream is returned, for the next one.
// A dead peer is noticed by the write deadline (or by TCP).
func (p *peerStream) write(conn net.Conn, first outMsg) (*outMsg, error) {
	stop := context.AfterFunc(p.t.ctx, func() { _ = conn.Close() })
	defer stop()
	// The peer sends nothing, so a read that ends says it closed the stream
	// (a restarted peer's old connection, say). Writing on would put the
	// next message into a socket nobody reads and lose it — after a
	// leader's death that is the survivors' first vote to each other — so
	// the stream ends and the next message redials.
	gone := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, conn); close(gone) }()
	w := bufio.NewWriterSize(conn, 64<<10)
	// The stream opens with a hello frame (group 0): the address this
	// node's peers reach it at.
	adv := p.t.mux.advertise.String()
	buf := binary.AppendUvarint(nil, uint64(1+len(adv)))
	buf = append(append(buf, 0), adv...)
	if _, err := w.Write(buf); err != nil {
		p.failed(first)
		return nil, err
	}
	emit := func(m outMsg) error {
		var err error
		buf, err = appendFrame(buf[:0], m.group, &m.m)
		if err == nil {
			_ = conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
			_, err = w.Write(buf)
		}
		if err == nil && m.m.Type == raftpb.MsgSnap {
			if err = w.Flush(); err == nil {
				if h := p.t.handler(m.group); h != nil {
					h.snapshotDone(m.m.To, true)
				}
			}
		}
		if err != nil {
			p.failed(m)
		}
		return err
	}
	notices := commitNotices{dropped: &p.t.noticesDropped, sent: &p.t.noticesSent}
	defer notices.stop()
	m, have := first, true
	for {
		if have {
			for _, out := range notices.next(m) {
				if err := emit(out); err != nil {
					return nil, err
				}
			}
		}
		if len(p.q) == 0 && w.Buffered() > 0 {
			if err := w.Flush(); err != nil {
				return nil, err
			}
		}
		select {
		case <-p.t.ctx.Done():
			return nil, p.t.ctx.Err()
		case <-gone:
			return nil, errPeerClosedStream
		case m = <-p.q:
			select {
			case <-gone:
				return &m, errPeerClosedStream
			default:
			}
			have = true
		case <-notices.due():
			have = false
			for _, out := range notices.release() {
				if err := emit(out); err != nil {
					return nil, err
				}
			}
		}
	}
}

// commitNotices holds back, per group, a leader's append that carries no
// entries — go.etcd.io/raft sends one to every follower each time the commit
// index moves, only to announce it — for up to DefaultCommitNoticeDelay. When
// the group's next append follows within that time (a busy leader's next
// entry, which carries the same commit index), the notice is dropped: the
// follower learns the commit from that append, and neither side spends a
// write, a read, a Ready and an acknowledgement on the notice — half the
// messages of a commit. Otherwise it goes out when the time is up, so a
// follower's watchers and reads wait at most that much longer for a commit
// after the leader's last write (the hashicorp engine's packer waits as long
// before its commit notice). Dropping or delaying a Raft message is always
// safe: Raft tolerates lost and late messages.
type commitNotices struct {
	held  map[uint64]outMsg
	timer *time.Timer
	armed bool
	// dropped and sent count notices an append covered and notices that
	// went out.
	dropped, sent *atomic.Uint64
}

// isNotice says whether m is an append with no entries.
func isNotice(m raftpb.Message) bool {
	return m.Type == raftpb.MsgApp && len(m.Entries) == 0 && m.Snapshot == nil
}

// covers says whether append a tells its follower all that the held notice
// n would: same term, from at or past n's position, with at least its commit.
func covers(a, n raftpb.Message) bool {
	return a.Type == raftpb.MsgApp && a.Term == n.Term && a.Index >= n.Index && a.Commit >= n.Commit
}

// next takes the stream's next message and returns what to write now, in
// order.
func (c *commitNotices) next(m outMsg) []outMsg {
	defer c.disarmIfIdle()
	old, held := c.held[m.group]
	if held && !covers(m.m, old.m) {
		// Something the held notice must not be overtaken by.
		delete(c.held, m.group)
		c.sent.Add(1)
		if !isNotice(m.m) {
			return []outMsg{old, m}
		}
		c.hold(m)
		return []outMsg{old}
	}
	if held {
		delete(c.held, m.group) // m carries the news
		c.dropped.Add(1)
	}
	if isNotice(m.m) {
		c.hold(m)
		return nil
	}
	return []outMsg{m}
}

func (c *commitNotices) hold(m outMsg) {
	if c.held == nil {
		c.held = map[uint64]outMsg{}
	}
	c.held[m.group] = m
	if !c.armed {
		if c.timer == nil {
			c.timer = time.NewTimer(DefaultCommitNoticeDelay)
		} else {
			c.timer.Reset(DefaultCommitNoticeDelay)
		}
		c.armed = true
	}
}

// disarmIfIdle stops the timer once nothing is held, so the next notice
// waits its whole delay.
func (c *commitNotices) disarmIfIdle() {
	if c.armed && len(c.held) == 0 {
		c.timer.Stop()
		c.armed = false
	}
}

// due fires when held notices are to go out (nil, never, when none is held).
func (c *commitNotices) due() <-chan time.Time {
	if !c.armed || len(c.held) == 0 {
		return nil
	}
	return c.timer.C
}

// release returns every held notice, to be written now.
func (c *commitNotices) release() []outMsg {
	c.armed = false
	out := make([]outMsg, 0, len(c.held))
	for g, m := range c.held {
		out = append(out, m)
		delete(c.held, g)
	}
	c.sent.Add(uint64(len(out)))
	return out
}

func (c *commitNotices) stop() {
	if c.timer != nil {
		c.timer.Stop()
	}
}

// failed reports a message that did not go out.
func (p *peerStream) failed(m outMsg) {
	h := p.t.handler(m.group)
	if h == nil {
		return
	}
	h.unreachable(m.m.To)
	if m.m.Type == raftpb.MsgSnap {
		h.snapshotDone(m.m.To, false)
	}
}

// drain drops (and reports) what queued while the peer was unreachable:
// Raft resends what matters once the peer answers again.
func (p *peerStream) drain() {
	for {
		select {
		case m := <-p.q:
			p.failed(m)
		default:
			return
		}
	}
}

func (t *etcdTransport) reportPeer(addr string, failing bool) {
	for _, h := range t.handlers() {
		h.peerFailing(addr, failing)
	}
}

// handlers returns the groups' handlers, to call outside the lock.
func (t *etcdTransport) handlers() []groupHandler {
	t.mu.Lock()
	defer t.mu.Unlock()
	hs := make([]groupHandler, 0, len(t.groups))
	for _, h := range t.groups {
		hs = append(hs, h)
	}
	return hs
}

// streamEnded tells every group that the inbound stream from the peer at
// from (the address its hello announced) ended, unless this transport is
// closing.
func (t *etcdTransport) streamEnded(from string) {
	if from == "" || t.ctx.Err() != nil {
		return
	}
	for _, h := range t.handlers() {
		h.peerGone(from)
	}
}

func appendFrame(buf []byte, group uint64, m *raftpb.Message) ([]byte, error) {
	size := m.Size()
	payload := uvarintLen(group) + size
	if payload > maxFrame {
		return nil, fmt.Errorf("raft message of %d bytes exceeds the %d-byte frame limit", payload, maxFrame)
	}
	buf = binary.AppendUvarint(buf, uint64(payload))
	buf = binary.AppendUvarint(buf, group)
	start := len(buf)
	buf = append(buf, make([]byte, size)...)
	if _, err := m.MarshalTo(buf[start:]); err != nil {
		return nil, err
	}
	return buf, nil
}

func uvarintLen(x uint64) int {
	var b [binary.MaxVarintLen64]byte
	return binary.PutUvarint(b[:], x)
}

// accept serves inbound streams until the transport closes.
func (t *etcdTransport) accept(ln net.Listener) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		t.wg.Add(1)
		go func() { defer t.wg.Done(); t.serve(conn) }()
	}
}

// errBadFrame is a frame no dlock node sends: a zero or oversized length, or
// no group id.
var errBadFrame = errors.New("bad frame")

// readFrame reads one frame from r: its group and its body (the hello's
// address for group 0, else a raftpb.Message). The body is read into *buf,
// grown as needed and reused by the next call. An error other than
// errBadFrame says the stream ended or broke.
func readFrame(r *bufio.Reader, buf *[]byte) (group uint64, body []byte, err error) {
	n, err := binary.ReadUvarint(r)
	if err != nil {
		return 0, nil, err
	}
	if n == 0 || n > maxFrame {
		return 0, nil, fmt.Errorf("%w: length %d", errBadFrame, n)
	}
	// A length is only a claim: the buffer grows as the bytes arrive, so a
	// peer that announces a large frame and sends little costs little.
	b := (*buf)[:0]
	for uint64(len(b)) < n {
		if len(b) == cap(b) {
			b = slices.Grow(b, int(min(n-uint64(len(b)), uint64(max(cap(b), frameStep)))))
		}
		got, err := io.ReadFull(r, b[len(b):int(min(n, uint64(cap(b))))])
		b = b[:len(b)+got]
		if err != nil {
			*buf = b
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF // inside a frame
			}
			return 0, nil, err
		}
	}
	*buf = b
	group, k := binary.Uvarint(b)
	if k <= 0 {
		return 0, nil, fmt.Errorf("%w: no group id", errBadFrame)
	}
	return group, b[k:], nil
}

// serve reads frames from one peer and hands each message to its group.
func (t *etcdTransport) serve(conn net.Conn) {
	stop := context.AfterFunc(t.ctx, func() { _ = conn.Close() })
	defer stop()
	defer conn.Close()
	r := bufio.NewReaderSize(conn, 64<<10)
	var buf []byte
	var from string // the address the peer announced in its hello
	for {
		group, body, err := readFrame(r, &buf)
		if errors.Is(err, errBadFrame) {
			t.logger.Warn("etcd raft stream: dropping a peer that sent a bad frame", "remote", conn.RemoteAddr().String(), "err", err)
			return
		}
		if err != nil {
			t.streamEnded(from)
			return
		}
		if group == 0 {
			from = string(body)
			continue
		}
		var m raftpb.Message
		if err := m.Unmarshal(body); err != nil {
			t.logger.Warn("etcd raft stream: dropping a peer that sent an undecodable message", "remote", conn.RemoteAddr().String(), "err", err)
			return
		}
		if m.Type == raftpb.MsgSnap {
			// The message keeps its snapshot's bytes; buf is reused.
			buf = nil
		}
		if from != "" {
			t.mu.Lock()
			if t.learned[m.From] != from {
				t.learned[m.From] = from
			}
			t.mu.Unlock()
		}
		h := t.handler(group)
		if h == nil {
			continue // a group this node does not (or no longer) host
		}
		h.receive(m)
	}
}

var errEngineStopped = errors.New("raft engine stopped")
