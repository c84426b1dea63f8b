package grpcapi

import (
	"context"
	"errors"
	"time"
)

// streamSender runs a stream's sends on a goroutine of their own, so the
// handler can stop waiting for one. gRPC flow control blocks a send while the
// client reads nothing, and a blocked send cannot be interrupted; but ending
// the call can: when the handler returns, gRPC finishes the stream and
// cancels its context, which the blocked send's flow-control wait selects on,
// so the send returns and the goroutine exits. The handler owns the sender
// and closes it when it returns.
type streamSender struct {
	in     chan func() error
	result chan error
}

// errSendStopped: send gave up because stop was closed.
var errSendStopped = errors.New("stream send abandoned")

// errSendTimeout: the client took nothing for the whole send timeout.
var errSendTimeout = errors.New("the client did not read the stream")

func newStreamSender() *streamSender {
	s := &streamSender{in: make(chan func() error), result: make(chan error, 1)}
	go func() {
		for fn := range s.in {
			s.result <- fn()
		}
	}()
	return s
}

// send runs fn (one Send on the stream) and waits for it, but no longer than
// timeout, nor past ctx, nor — once stop is closed — past giveUp() saying so.
// After an error other than fn's own the send may still be running: the
// stream is done, and the handler must return without sending again.
func (s *streamSender) send(ctx context.Context, fn func() error, timeout time.Duration, stop <-chan struct{}, giveUp func() bool) error {
	s.in <- fn // the goroutine is idle: every send waits for the one before
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case err := <-s.result:
			return err
		case <-t.C:
			return errSendTimeout
		case <-ctx.Done():
			return ctx.Err()
		case <-stop:
			if giveUp() {
				return errSendStopped
			}
			stop = nil // let this send finish
		}
	}
}

// close lets the goroutine exit once its last send has returned.
func (s *streamSender) close() { close(s.in) }
