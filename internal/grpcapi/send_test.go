package grpcapi

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// A send that the client does not take is abandoned at the timeout, or when
// stop closes and giveUp agrees; otherwise stop only lets it finish. A send
// abandoned ends when its stream does (here: when release is closed).
func TestStreamSender(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		s := newStreamSender()
		defer s.close()
		if err := s.send(ctx, func() error { return nil }, time.Second, nil, nil); err != nil {
			t.Fatalf("a send the client takes: %v", err)
		}
		boom := errors.New("stream broken")
		if err := s.send(ctx, func() error { return boom }, time.Second, nil, nil); err != boom {
			t.Fatalf("a failing send: %v", err)
		}

		// stop closes, but giveUp says no: the send is waited for.
		stop := make(chan struct{})
		close(stop)
		finish := make(chan struct{})
		go func() { time.Sleep(100 * time.Millisecond); close(finish) }()
		err := s.send(ctx, func() error { <-finish; return nil }, time.Second, stop, func() bool { return false })
		if err != nil {
			t.Fatalf("a send past a stop that does not give up: %v; want it waited for", err)
		}

		// giveUp says yes: abandoned at once.
		release := make(chan struct{})
		start := time.Now()
		err = s.send(ctx, func() error { <-release; return errors.New("stream done") }, time.Second, stop, func() bool { return true })
		if !errors.Is(err, errSendStopped) || time.Since(start) != 0 {
			t.Fatalf("a send abandoned on stop: %v after %v", err, time.Since(start))
		}
		close(release) // the stream ends; the goroutine gets its answer
		synctest.Wait()

		// A fresh sender whose send is never taken: the timeout.
		s2 := newStreamSender()
		defer s2.close()
		never := make(chan struct{})
		defer close(never)
		start = time.Now()
		if err := s2.send(ctx, func() error { <-never; return nil }, 30*time.Second, nil, nil); !errors.Is(err, errSendTimeout) || time.Since(start) != 30*time.Second {
			t.Fatalf("a send never taken: %v after %v; want errSendTimeout after 30 s", err, time.Since(start))
		}
	})
}
