package demo

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/dlock/dlock/client"
)

// WriterConfig configures RunWriter.
type WriterConfig struct {
	Endpoints []string
	ClientID  string
	Lock      string
	TTL       time.Duration
	// StoreURL is the data store's base URL, e.g. http://127.0.0.1:7300.
	StoreURL string
	Data     string
	// MaxWait bounds the wait for the lock and then for the go-ahead.
	// Default 60 s.
	MaxWait time.Duration
	// ReportLease: after the write, wait (at most TTL) for the client to
	// learn its lease's fate and report it ("lease": error is why it ended).
	ReportLease bool
	// Session: hold the lock under a session (of TTL) instead of a lease of
	// its own, so the session's keepalive is what learns of its loss.
	Session bool
}

// writerEvent is one line the writer prints on stdout, for the demo to read.
type writerEvent struct {
	Event  string       `json:"event"` // "granted", then "wrote" (then "lease")
	Grant  *grant       `json:"grant,omitempty"`
	Answer *storeAnswer `json:"answer,omitempty"`
	// Error is, on "lease", why the lease ended ("" if it still holds).
	Error string `json:"error,omitempty"`
}

// RunWriter is the paused client of step d (`dlock demo-writer`). It takes
// the lock (its client renews it), prints the grant, waits for a line on in,
// then writes to the data store with that grant and prints the answer. It
// does not look at its lease again before writing: a process frozen after
// its last check and before its write cannot either, which is the whole
// point of fencing.
func RunWriter(ctx context.Context, cfg WriterConfig, in io.Reader, out io.Writer) error {
	if len(cfg.Endpoints) == 0 || cfg.ClientID == "" || cfg.Lock == "" || cfg.StoreURL == "" || cfg.TTL <= 0 {
		return errors.New("demo-writer: --endpoints, --client-id, --lock, --ttl and --datastore are required")
	}
	setDefault(&cfg.MaxWait, 60*time.Second)
	c, err := client.New(client.Config{Endpoints: cfg.Endpoints, ClientID: cfg.ClientID, RequestTimeout: 3 * time.Second})
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, cfg.MaxWait)
	defer cancel()
	opts := []client.MutexOption{client.WithTTL(cfg.TTL)}
	if cfg.Session {
		s, err := c.NewSession(ctx, cfg.TTL)
		if err != nil {
			return fmt.Errorf("demo-writer: %w", err)
		}
		defer func() {
			cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			defer ccancel()
			s.Close(cctx)
		}()
		opts = append(opts, client.WithSession(s))
	}
	m := c.NewMutex(cfg.Lock, opts...)
	l, err := m.Lock(ctx)
	if err != nil {
		return fmt.Errorf("demo-writer: %w", err)
	}
	// The lease id stays in this process: it can release the lock.
	g := grant{ClientID: cfg.ClientID, Lock: l.Name(), FencingToken: l.Token(), LeaseRef: l.LeaseRef(), TokenProof: l.TokenProof()}
	if err := emit(out, writerEvent{Event: "granted", Grant: &g}); err != nil {
		return err
	}
	if err := waitLine(ctx, in); err != nil {
		return fmt.Errorf("demo-writer: waiting for the go-ahead on stdin: %w", err)
	}
	a, err := postWrite(ctx, &http.Client{Timeout: 5 * time.Second}, cfg.StoreURL, writeRequest{grant: g, Data: cfg.Data})
	if err != nil {
		return fmt.Errorf("demo-writer: %w", err)
	}
	if err := emit(out, writerEvent{Event: "wrote", Answer: &a}); err != nil {
		return err
	}
	if cfg.ReportLease {
		ev := writerEvent{Event: "lease"}
		select {
		case <-l.Done():
			ev.Error = l.Err().Error()
		case <-time.After(cfg.TTL):
		case <-ctx.Done():
		}
		if err := emit(out, ev); err != nil {
			return err
		}
	}
	// After a long pause the lock is someone else's and the cluster says
	// not_holder; that is expected, and there is nothing left to give back.
	uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer ucancel()
	if err := m.Unlock(uctx); err != nil && !errors.Is(err, client.ErrNotHolder) {
		return fmt.Errorf("demo-writer: release: %w", err)
	}
	return nil
}

func emit(out io.Writer, ev writerEvent) error {
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	if _, err := out.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("demo-writer: report %s: %w", ev.Event, err)
	}
	return nil
}

// waitLine waits for one line (or EOF) on in. If ctx ends first the reading
// goroutine stays blocked until in is closed, which for stdin is when the
// process exits, right after.
func waitLine(ctx context.Context, in io.Reader) error {
	got := make(chan error, 1)
	go func() {
		_, err := bufio.NewReader(in).ReadString('\n')
		got <- err
	}()
	select {
	case err := <-got:
		if errors.Is(err, io.EOF) {
			return errors.New("stdin closed before the go-ahead: the demo gave up")
		}
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}
