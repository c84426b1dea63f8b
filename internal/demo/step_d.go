package demo

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"time"
)

// writerProc is the demo's side of a `dlock demo-writer` child.
type writerProc struct {
	p      *proc
	stdin  io.WriteCloser
	events chan writerEvent // closed when the child's stdout ends
}

func (e *env) startWriter(who, lock, data string) (*writerProc, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("start the writer: %w", err)
	}
	var stdin io.WriteCloser
	p, err := e.startProc("writer", []string{"demo-writer", "--endpoints", strings.Join(e.endpoints(), ","),
		"--client-id", who, "--lock", lock, "--ttl", e.cfg.ShortTTL.String(), "--datastore", e.storeURL, "--data", data},
		func(cmd *exec.Cmd) error {
			cmd.Stdout = w
			var err error
			stdin, err = cmd.StdinPipe()
			return err
		})
	// The child has its own copy; ours must go for EOF to come when it exits.
	w.Close()
	if err != nil {
		r.Close()
		return nil, err
	}
	wp := &writerProc{p: p, stdin: stdin, events: make(chan writerEvent, 8)}
	go wp.read(r)
	return wp, nil
}

// read forwards the child's events until its stdout ends (it exits or is
// stopped at teardown). It never blocks on the channel, so it always ends.
func (w *writerProc) read(r *os.File) {
	defer close(w.events)
	defer r.Close()
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		var ev writerEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			ev = writerEvent{Event: fmt.Sprintf("unreadable line %q", sc.Text())}
		}
		select {
		case w.events <- ev:
		default:
		}
	}
}

func (e *env) next(ctx context.Context, w *writerProc, want string) (writerEvent, error) {
	select {
	case ev, ok := <-w.events:
		switch {
		case !ok:
			w.p.WaitExit(stopGrace) // its stdout ended: it is exiting
			return ev, e.exitedErr(w.p, fmt.Sprintf("before it reported %q", want))
		case ev.Event != want || (want == "granted" && ev.Grant == nil) || (want == "wrote" && ev.Answer == nil):
			return ev, fmt.Errorf("the writer reported %q, want %q", ev.Event, want)
		}
		return ev, nil
	case <-ctx.Done():
		return writerEvent{}, fmt.Errorf("waiting for the writer (pid %d) to report %q: %w", w.p.Pid(), want, ctx.Err())
	}
}

// stepD is the reason fencing exists: a holder frozen past its TTL wakes up
// still believing it holds the lock, and only the data store can stop it.
func (e *env) stepD(ctx context.Context) error {
	const data = "late write from the paused client1"
	w, err := e.startWriter("client1", "l3", data)
	if err != nil {
		return err
	}
	ev, err := e.next(ctx, w, "granted")
	if err != nil {
		return err
	}
	g1, pid := *ev.Grant, w.p.Pid()
	e.say("client1 runs as its own process (pid %d) and took l3: token %d, TTL %s, renewed by its client", pid, g1.FencingToken, secs(e.cfg.ShortTTL))

	if err := pause(w.p.Cmd.Process); err != nil {
		return err
	}
	frozenAt := time.Now()
	e.say("SIGSTOP pid %d: client1 is frozen after its grant and before its write, as in a long GC pause; its renewals stop", pid)
	wctx, cancel := context.WithTimeout(ctx, e.cfg.WaitTimeout)
	h2, err := e.lock(wctx, "client2", "l3", e.cfg.HoldTTL)
	cancel()
	if err != nil {
		return err
	}
	e.l3 = h2
	if h2.l.Token() <= g1.FencingToken {
		return fmt.Errorf("client2's token %d is not above the paused client1's %d", h2.l.Token(), g1.FencingToken)
	}
	e.say("client2 waited for l3 and got it %.1fs later, when client1's lease ran out: token %d", time.Since(frozenAt).Seconds(), h2.l.Token())
	if err := e.mustWrite(ctx, h2.grant(), "client2 owns l3 now"); err != nil {
		return err
	}

	if err := resume(w.p.Cmd.Process); err != nil {
		return err
	}
	e.say("SIGCONT pid %d after %.1fs frozen; client1 carries on with its write, token %d", pid, time.Since(frozenAt).Seconds(), g1.FencingToken)
	if _, err := io.WriteString(w.stdin, "write\n"); err != nil {
		return fmt.Errorf("tell the writer to write: %w", err)
	}
	if ev, err = e.next(ctx, w, "wrote"); err != nil {
		return err
	}
	a := *ev.Answer
	e.noteAnswer(g1, data, a)
	e.say("the data store answered client1's late write: %s", a)
	if a.Status != http.StatusConflict || a.code() != "stale_token" || a.HighestToken != h2.l.Token() {
		return fmt.Errorf("client1's late write with token %d after client2 wrote with %d: the data store answered %s, want 409 stale_token (highest token %d)",
			g1.FencingToken, h2.l.Token(), a, h2.l.Token())
	}
	if err := e.waitWriterExit(ctx, w); err != nil {
		return err
	}
	e.done("d. client1, frozen past its TTL, wrote with token %d after client2 wrote with %d: 409 stale_token", g1.FencingToken, h2.l.Token())
	return nil
}

func (e *env) waitWriterExit(ctx context.Context, w *writerProc) error {
	select {
	case <-w.p.Done():
	case <-ctx.Done():
		return fmt.Errorf("the writer (pid %d) did not exit after its write: %w", w.p.Pid(), ctx.Err())
	}
	if w.p.WaitErr() != nil {
		return e.exitedErr(w.p, "with an error after its write")
	}
	return nil
}
