package raftnode

import (
	"sync"

	"github.com/hashicorp/raft"
)

// guardedPipeline wraps one of hashicorp/raft's append pipelines (v1.7.3)
// against a deadlock in the library that stops replication to a follower
// for good and, with it, the node's shutdown.
//
// Three goroutines work a pipeline: raft's sender (pipelineReplicate) hands
// each request to the transport's decoder over an unbuffered channel, the
// decoder reads the answer and hands it over another unbuffered channel to
// raft's consumer (pipelineDecode). The consumer returns after the first
// answer that is not a success (a follower whose log does not match, or
// that knows a newer term), and then nobody reads the decoder's channel.
// If the sender, instead of noticing that the consumer ended, sends one
// more request (its select picks at random between "consumer ended" and
// "new entries"), it waits for the decoder, which waits for the consumer
// that is gone: only closing the pipeline frees them, and that is deferred
// in the sender. The follower then receives no entry again while heartbeats
// keep it from calling an election, and raft.Shutdown waits for the sender
// forever (upstream: hashicorp/raft#612, open).
//
// The guard puts a pump between the decoder and raft's consumer: it passes
// answers on one at a time, exactly as before, and once it has passed the
// answer that ends the consumer it discards the rest, so the decoder never
// waits on nobody; the sender then sees the consumer's end and closes the
// pipeline. The pump mirrors pipelineDecode's two exits: an upgrade of
// hashicorp/raft must check them again (TestPipelineKeepsReplicatingAfterRejection
// provokes the rejection with a real leader).
type guardedPipeline struct {
	inner raft.AppendPipeline
	out   chan raft.AppendFuture
	// done is closed by Close; the pump exits on it and closes exited.
	done    chan struct{}
	exited  chan struct{}
	once    sync.Once
	onClose func(*guardedPipeline)
}

func newGuardedPipeline(inner raft.AppendPipeline, onClose func(*guardedPipeline)) *guardedPipeline {
	p := &guardedPipeline{
		inner: inner, out: make(chan raft.AppendFuture),
		done: make(chan struct{}), exited: make(chan struct{}), onClose: onClose,
	}
	go p.pump()
	return p
}

// AppendEntries implements raft.AppendPipeline.
func (p *guardedPipeline) AppendEntries(args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) (raft.AppendFuture, error) {
	return p.inner.AppendEntries(args, resp)
}

// Consumer implements raft.AppendPipeline.
func (p *guardedPipeline) Consumer() <-chan raft.AppendFuture { return p.out }

// Close implements raft.AppendPipeline. It may be called from any goroutine
// and more than once; it returns once the pump has exited.
func (p *guardedPipeline) Close() error {
	var err error
	p.once.Do(func() {
		close(p.done)
		// Closes the pipeline's connection and ends the transport's
		// decoder and any send waiting for it.
		err = p.inner.Close()
		<-p.exited
		p.onClose(p)
	})
	return err
}

func (p *guardedPipeline) pump() {
	defer close(p.exited)
	in := p.inner.Consumer()
	for {
		var f raft.AppendFuture
		select {
		case f = <-in:
		case <-p.done:
			return
		}
		// pipelineDecode's exits: a newer term, or no success (which a
		// failed request also reads as: its response stays zero).
		req, resp := f.Request(), f.Response()
		last := resp.Term > req.Term || !resp.Success
		select {
		case p.out <- f:
		case <-p.done:
			return
		}
		if last {
			break
		}
	}
	// Raft's consumer is gone: discard what is still in flight until the
	// sender closes the pipeline.
	for {
		select {
		case <-in:
		case <-p.done:
			return
		}
	}
}

// AppendEntriesPipeline implements raft.Transport: the transport's pipeline
// behind a guard (guardedPipeline), which Close closes.
func (t *serialTransport) AppendEntriesPipeline(id raft.ServerID, target raft.ServerAddress) (raft.AppendPipeline, error) {
	inner, err := t.NetworkTransport.AppendEntriesPipeline(id, target)
	if err != nil {
		return nil, err
	}
	p := newGuardedPipeline(inner, t.forget)
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		_ = p.Close()
		return nil, raft.ErrTransportShutdown
	}
	t.pipes[p] = struct{}{}
	t.mu.Unlock()
	return p, nil
}

func (t *serialTransport) forget(p *guardedPipeline) {
	t.mu.Lock()
	delete(t.pipes, p)
	t.mu.Unlock()
}

// Close implements raft.WithClose. It closes every open pipeline, then the
// transport and its stream layer, which closes every Raft connection: a
// replication goroutine blocked on a peer (a send that a stopped peer does
// not read, an answer it never sends) returns at once instead of after the
// transport's I/O timeout, so Raft's shutdown, which waits for those
// goroutines, is not held by a peer.
func (t *serialTransport) Close() error {
	t.mu.Lock()
	t.closed = true
	pipes := make([]*guardedPipeline, 0, len(t.pipes))
	for p := range t.pipes {
		pipes = append(pipes, p)
	}
	t.mu.Unlock()
	for _, p := range pipes {
		_ = p.Close()
	}
	return t.NetworkTransport.Close()
}
