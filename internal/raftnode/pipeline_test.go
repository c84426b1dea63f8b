package raftnode

// A fake hashicorp/raft peer over real TCP, speaking NetworkTransport's wire
// protocol, and the pipeline and shutdown faults it provokes in a real
// leader.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"

	"github.com/dlock/dlock/internal/loopback"
	"github.com/dlock/dlock/internal/testutil"
)

// NetworkTransport's RPC type bytes (net_transport.go, v1.7.3).
const (
	fakeRPCAppendEntries uint8 = iota
	fakeRPCRequestVote
	fakeRPCInstallSnapshot
	fakeRPCTimeoutNow
	fakeRPCRequestPreVote
)

// fakePeer is a Raft member that keeps only what a voter must (its term,
// its vote, the last entry it acknowledged) and acknowledges every append
// of the current term without storing it. With trap set it rejects each
// append that is still unanswered when the next request arrives on the same
// connection — which happens only on a pipeline, whose sender has then sent
// that next request and waits for the transport's decoder. With stall set
// it stops reading and answering on every connection.
type fakePeer struct {
	ln   net.Listener
	addr string

	trap  atomic.Bool
	stall chan struct{}
	// stop ends every connection (cleanup).
	stop      chan struct{}
	stallOnce sync.Once

	// traps counts rejected pipelined appends; appends counts appends with
	// entries received.
	traps   atomic.Int64
	appends atomic.Int64

	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	// A voter's state, under mu.
	term, lastIdx, lastTerm uint64
	votedFor                string
	// heard is when an append of the current term last came: while a
	// leader is heard from, votes go to nobody else (as Raft's followers do).
	heard time.Time
}

func startFakePeer(t testing.TB) *fakePeer {
	t.Helper()
	addr, err := loopback.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakePeer{ln: ln, addr: addr, stall: make(chan struct{}), stop: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	f.wg.Add(1)
	go f.accept()
	t.Cleanup(f.close)
	return f
}

func (f *fakePeer) stallNow() { f.stallOnce.Do(func() { close(f.stall) }) }

func (f *fakePeer) close() {
	close(f.stop)
	_ = f.ln.Close()
	f.mu.Lock()
	for c := range f.conns {
		_ = c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

func (f *fakePeer) accept() {
	defer f.wg.Done()
	for {
		conn, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		select {
		case <-f.stop:
			f.mu.Unlock()
			_ = conn.Close()
			return
		default:
		}
		f.conns[conn] = struct{}{}
		f.mu.Unlock()
		f.wg.Add(1)
		go f.serve(conn)
	}
}

// fakeRequest is one decoded request and its RPC type.
type fakeRequest struct {
	typ uint8
	req any
}

// serve reads requests on one goroutine and answers them in order on this
// one, so that it can see a request arrive while an earlier one waits.
func (f *fakePeer) serve(conn net.Conn) {
	defer f.wg.Done()
	defer conn.Close()
	r := bufio.NewReader(conn)
	if b, err := r.ReadByte(); err != nil || b != ConnRaft {
		return
	}
	reqs := make(chan fakeRequest, 64)
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		defer close(reqs)
		dec := codec.NewDecoder(r, &codec.MsgpackHandle{})
		for {
			select {
			case <-f.stall:
				<-f.stop
				return
			default:
			}
			typ, err := r.ReadByte()
			if err != nil {
				return
			}
			var req any
			switch typ {
			case fakeRPCAppendEntries:
				req = &raft.AppendEntriesRequest{}
			case fakeRPCRequestVote:
				req = &raft.RequestVoteRequest{}
			case fakeRPCRequestPreVote:
				req = &raft.RequestPreVoteRequest{}
			default:
				// Snapshots and leadership transfers are not part of
				// these tests: drop the connection.
				return
			}
			if err := dec.Decode(req); err != nil {
				return
			}
			select {
			case reqs <- fakeRequest{typ, req}:
			case <-f.stop:
				return
			}
		}
	}()

	w := bufio.NewWriter(conn)
	enc := codec.NewEncoder(w, &codec.MsgpackHandle{BasicHandle: codec.BasicHandle{TimeNotBuiltin: true}})
	var next *fakeRequest
	for {
		var cur fakeRequest
		if next != nil {
			cur, next = *next, nil
		} else {
			var ok bool
			if cur, ok = <-reqs; !ok {
				return
			}
		}
		var resp any
		switch req := cur.req.(type) {
		case *raft.AppendEntriesRequest:
			if stale, term := f.staleTerm(req.Term); stale {
				resp = &raft.AppendEntriesResponse{Term: term, Success: false}
				break
			}
			ok := true
			if n := len(req.Entries); n > 0 {
				f.appends.Add(1)
				if f.trap.Load() {
					// Wait a little for the next request on this
					// connection; if it comes, the sender waits for the
					// decoder, which waits for this answer: reject it.
					// Meanwhile the leader appends more, so its sender
					// has new entries when it is freed.
					select {
					case nr, open := <-reqs:
						if open {
							next = &nr
							ok = false
							select {
							case <-time.After(20 * time.Millisecond):
							case <-f.stop:
								return
							}
						}
					case <-time.After(100 * time.Millisecond):
					case <-f.stop:
						return
					}
				}
			}
			last := req.PrevLogEntry
			if n := len(req.Entries); n > 0 && ok {
				last = req.Entries[n-1].Index
				f.mu.Lock()
				f.lastIdx, f.lastTerm = last, req.Entries[n-1].Term
				f.mu.Unlock()
			}
			if !ok {
				f.traps.Add(1)
			}
			resp = &raft.AppendEntriesResponse{Term: req.Term, LastLog: last, Success: ok}
		case *raft.RequestVoteRequest:
			resp = f.vote(req)
		case *raft.RequestPreVoteRequest:
			f.mu.Lock()
			resp = &raft.RequestPreVoteResponse{Term: f.term, Granted: req.Term > f.term && !f.leaderHeard() && f.upToDate(req.LastLogTerm, req.LastLogIndex)}
			f.mu.Unlock()
		}
		select {
		case <-f.stall:
			<-f.stop
			return
		default:
		}
		if enc.Encode("") != nil || enc.Encode(resp) != nil || w.Flush() != nil {
			return
		}
	}
}

// staleTerm reports whether term is older than the fake's, and the fake's
// term (which a newer term replaces).
func (f *fakePeer) staleTerm(term uint64) (bool, uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if term < f.term {
		return true, f.term
	}
	if term > f.term {
		f.term, f.votedFor = term, ""
	}
	f.heard = time.Now()
	return false, f.term
}

// leaderHeard reports whether a leader was heard from lately. Called with
// mu held.
func (f *fakePeer) leaderHeard() bool { return time.Since(f.heard) < 300*time.Millisecond }

// upToDate is Raft's vote rule: the candidate's log is at least the fake's.
// Called with mu held.
func (f *fakePeer) upToDate(lastTerm, lastIdx uint64) bool {
	return lastTerm > f.lastTerm || (lastTerm == f.lastTerm && lastIdx >= f.lastIdx)
}

// vote grants one vote per term, to a candidate whose log is up to date.
func (f *fakePeer) vote(req *raft.RequestVoteRequest) *raft.RequestVoteResponse {
	f.mu.Lock()
	defer f.mu.Unlock()
	if req.Term < f.term || (f.leaderHeard() && !req.LeadershipTransfer) {
		return &raft.RequestVoteResponse{Term: f.term}
	}
	if req.Term > f.term {
		f.term, f.votedFor = req.Term, ""
	}
	id := string(req.ID)
	granted := (f.votedFor == "" || f.votedFor == id) && f.upToDate(req.LastLogTerm, req.LastLogIndex)
	if granted {
		f.votedFor = id
	}
	return &raft.RequestVoteResponse{Term: f.term, Granted: granted}
}

// openWithFakePeer starts real nodes with the ids given (hashicorp engine)
// in a cluster with fake as one more member, "f", and waits until one of them
// leads; it returns them and the leader's id.
func openWithFakePeer(t *testing.T, fake *fakePeer, ids []string, set func(*Config)) (map[string]*Node, string) {
	t.Helper()
	addrs := map[string]string{"f": fake.addr}
	for _, id := range ids {
		addrs[id] = freeRaftAddr(t)
	}
	nodes := map[string]*Node{}
	for _, id := range ids {
		cfg := Config{ID: id, DataDir: t.TempDir(), RaftAddr: addrs[id], InitialCluster: addrs,
			Engine: EngineHashicorp, RaftLogLevel: "off", Logger: quietLogger()}
		if set != nil {
			set(&cfg)
		}
		n, err := Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		nodes[id] = n
		t.Cleanup(func() { shutdownWithin(t, n, time.Minute) })
	}
	var leader string
	testutil.Eventually(t, 30*time.Second, "a real node leads", func() bool {
		for id, n := range nodes {
			if n.IsLeader() {
				leader = id
				return true
			}
		}
		return false
	})
	return nodes, leader
}

// shutdownWithin stops n and fails the test if that takes longer than d (a
// hang guard: the node stops in milliseconds).
func shutdownWithin(t testing.TB, n *Node, d time.Duration) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- n.Shutdown() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("shutdown: %v", err)
		}
	case <-time.After(d):
		t.Errorf("Shutdown did not return within %s", d)
	}
}

// writeLoad proposes writes from workers until the test ends.
func writeLoad(t *testing.T, n *Node, workers int) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				actx, acancel := context.WithTimeout(ctx, 2*time.Second)
				_, err := n.Apply(actx, registerMemberEnvelope(fmt.Sprintf("w%d-%d", w, i)))
				acancel()
				if err != nil {
					// No leader, or stopped: do not spin.
					select {
					case <-ctx.Done():
					case <-time.After(10 * time.Millisecond):
					}
				}
			}
		}()
	}
	// Registered after the node's cleanup, so it runs first.
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// A follower that rejects a pipelined append while the leader's sender has
// the next one out must not stop replication to it: with hashicorp/raft's
// pipeline as it is, the sender then often waits forever for a decoder
// that waits for a consumer that has gone (pipeline.go), the follower gets
// no entry again, and the leader's Shutdown never returns.
func TestPipelineKeepsReplicatingAfterRejection(t *testing.T) {
	fake := startFakePeer(t)
	// Two real nodes commit without the fake, so the leader keeps appending
	// while its sender to the fake is held, and the sender has new entries
	// when it is freed.
	nodes, leader := openWithFakePeer(t, fake, []string{"a", "b"}, func(c *Config) { c.PackInFlight = 64 })
	writeLoad(t, nodes[leader], 32)
	fake.trap.Store(true)

	const traps = 20
	testutil.Eventually(t, 2*time.Minute, fmt.Sprintf("%d rejected pipelined appends, replication to the follower going on after each", traps), func() (bool, string) {
		got := fake.traps.Load()
		return got >= traps, fmt.Sprintf("%d rejected so far, %d appends with entries received", got, fake.appends.Load())
	})
	fake.trap.Store(false)
	before := fake.appends.Load()
	testutil.Eventually(t, time.Minute, "entries still replicated to the follower after the rejections", func() bool {
		return fake.appends.Load() > before+10
	})
	for _, n := range nodes {
		shutdownWithin(t, n, time.Minute)
	}
}

// A peer that accepts the connection and stops reading (a paused process, a
// frozen VM) must not hold the leader's shutdown for the transport's I/O
// timeout: raft waits for its replication goroutines before it closes the
// transport, and they are blocked on that peer.
func TestShutdownNotHeldByStalledPeer(t *testing.T) {
	fake := startFakePeer(t)
	nodes, _ := openWithFakePeer(t, fake, []string{"a"}, func(c *Config) {
		// Far beyond the bound below: a shutdown that waits for the
		// timeout fails the test instead of passing slowly.
		c.raftIOTimeout = 10 * time.Minute
	})
	n := nodes["a"]
	writeLoad(t, n, 4)
	testutil.Eventually(t, 30*time.Second, "entries replicated to the peer", func() bool {
		return fake.appends.Load() > 10
	})
	fake.stallNow()
	// The stalled peer is half the cluster: the leader stops leading once
	// its heartbeats go unanswered, with its RPCs to the peer blocked.
	testutil.Eventually(t, 30*time.Second, "the leader steps down", func() bool { return !n.IsLeader() })
	shutdownWithin(t, n, time.Minute)
}

// The guard passes answers on until raft's consumer ends and discards the
// rest, and Close ends it while a send waits.
func TestGuardedPipelineDrainsAfterConsumerEnds(t *testing.T) {
	inner := &chanPipeline{consumer: make(chan raft.AppendFuture)}
	closed := make(chan struct{})
	p := newGuardedPipeline(inner, func(*guardedPipeline) { close(closed) })
	ok := answered(2, 2, true)
	rejected := answered(2, 2, false)
	stale := answered(2, 3, false)

	inner.consumer <- ok
	if got := <-p.Consumer(); got != ok {
		t.Fatal("a successful answer was not passed on")
	}
	inner.consumer <- rejected
	if got := <-p.Consumer(); got != rejected {
		t.Fatal("a rejection was not passed on")
	}
	// Nobody reads Consumer now (raft's pipelineDecode has returned), yet
	// the transport's decoder must be able to hand over more answers.
	for range 3 {
		select {
		case inner.consumer <- answered(2, 2, true):
		case <-time.After(10 * time.Second):
			t.Fatal("the decoder was left waiting after the consumer ended")
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-closed:
	default:
		t.Fatal("Close did not tell the transport")
	}
	if !inner.closed.Load() {
		t.Fatal("Close did not close the transport's pipeline")
	}
	_ = p.Close() // twice is fine

	// A newer term ends the consumer as well.
	inner2 := &chanPipeline{consumer: make(chan raft.AppendFuture)}
	p2 := newGuardedPipeline(inner2, func(*guardedPipeline) {})
	defer p2.Close()
	inner2.consumer <- stale
	<-p2.Consumer()
	select {
	case inner2.consumer <- answered(2, 2, true):
	case <-time.After(10 * time.Second):
		t.Fatal("the decoder was left waiting after a newer term")
	}
}

// chanPipeline is a raft.AppendPipeline whose answers a test hands over.
type chanPipeline struct {
	consumer chan raft.AppendFuture
	closed   atomic.Bool
}

func (c *chanPipeline) AppendEntries(*raft.AppendEntriesRequest, *raft.AppendEntriesResponse) (raft.AppendFuture, error) {
	return nil, errors.New("not used")
}
func (c *chanPipeline) Consumer() <-chan raft.AppendFuture { return c.consumer }
func (c *chanPipeline) Close() error                       { c.closed.Store(true); return nil }

// answeredFuture is an answered raft.AppendFuture.
type answeredFuture struct {
	req  *raft.AppendEntriesRequest
	resp *raft.AppendEntriesResponse
}

func answered(reqTerm, respTerm uint64, success bool) *answeredFuture {
	return &answeredFuture{req: &raft.AppendEntriesRequest{Term: reqTerm}, resp: &raft.AppendEntriesResponse{Term: respTerm, Success: success}}
}

func (f *answeredFuture) Error() error                          { return nil }
func (f *answeredFuture) Start() time.Time                      { return time.Time{} }
func (f *answeredFuture) Request() *raft.AppendEntriesRequest   { return f.req }
func (f *answeredFuture) Response() *raft.AppendEntriesResponse { return f.resp }
