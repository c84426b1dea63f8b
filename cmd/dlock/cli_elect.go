package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/dlock/dlock/client"
)

const electUsage = `Usage: dlock elect NAME [--value V] [--ttl 15s] [--wait D] [--grace 10s] [--takeover] [flags] -- CMD [ARGS...]

Runs CMD only while this process is the leader of the election NAME: it
campaigns (waits in line behind the leader and earlier candidates), starts
CMD once elected, and resigns when CMD exits, so that the next candidate
takes over at once. CMD gets DLOCK_NAME, DLOCK_FENCING_TOKEN and
DLOCK_LEADER_VALUE in its environment and runs in its own process group.
dlock renews the leadership every TTL/3; if it is lost, dlock sends SIGTERM
to CMD's whole process group, SIGKILL after the grace period, and exits 4.
Otherwise it exits with CMD's exit code (128+N if CMD died of signal N).
SIGINT, SIGTERM and SIGHUP are passed on to CMD's process group; while
campaigning they withdraw the candidacy.

  --value V   the leader's value, shown to observers (default: the client id)
  --ttl D     lease TTL, 1s to 10m (default 15s): how long the seat outlives
              a dlock that died without resigning
  --wait D    give up after campaigning D (exit 3); default: as long as it
              takes
  --grace D   time between SIGTERM and SIGKILL when leadership is lost (10s)
` + takeoverUsage

func runElect(args []string) error {
	fs := newCmdFlags("elect", electUsage)
	var h heldFlags
	h.register(fs, 15*time.Second, "leadership")
	value := fs.String("value", "", "the leader's value (default: the client id)")
	name, argv, opts, c, err := h.parse(fs, args, "dlock elect NAME -- CMD [ARGS...]")
	if err != nil {
		return err
	}
	defer c.Close()
	g, wait, grace := &h.g, h.wait, h.grace
	if *value == "" {
		*value = c.ClientID()
	}

	// As dlock lock: a signal while campaigning must withdraw the
	// candidacy, not kill dlock and leave it in line.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)

	e := c.NewElection(name, opts...)
	l, err := waitOrSignal(*wait, sigs, func(ctx context.Context) (*client.Leadership, error) {
		return e.Campaign(ctx, *value)
	}, func(ctx context.Context, l *client.Leadership) { l.Resign(ctx) })
	if err != nil {
		var sig *signalled
		if errors.As(err, &sig) {
			fmt.Fprintf(os.Stderr, "dlock elect: %v while campaigning in %q\n", sig.sig, name)
			return &exitCodeError{128 + signalNumber(sig.sig)}
		}
		if errors.Is(err, client.ErrWaitTimeout) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			if leader, lerr := e.Leader(ctx); lerr == nil {
				fmt.Fprintf(os.Stderr, "dlock: %q is led by %s (value %q, fencing token %d)\n", name, leader.CandidateID, leader.Value, leader.FencingToken)
			}
			cancel()
		}
		return err
	}
	resign := func() {
		timeout := g.timeout
		if l.Err() != nil {
			timeout = min(timeout, 2*time.Second) // lost: a courtesy only
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		if err := l.Resign(ctx); err != nil && errors.Is(l.Err(), client.ErrReleased) {
			fmt.Fprintf(os.Stderr, "dlock elect: could not resign from %q, the seat is freed after its TTL: %v\n", name, err)
		}
	}
	if g.verbose {
		fmt.Fprintf(os.Stderr, "dlock elect: leader of %q with fencing token %d\n", name, l.Token())
	}
	env := []string{"DLOCK_NAME=" + l.Name(), "DLOCK_FENCING_TOKEN=" + strconv.FormatUint(l.Token(), 10),
		"DLOCK_LEADER_VALUE=" + l.Value()}
	return runHeld(argv, env, l, sigs, *grace, resign, func() string {
		return fmt.Sprintf("dlock elect: lost leadership of %q: %v", name, l.Err())
	})
}
