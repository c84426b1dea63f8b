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

	"github.com/spf13/cobra"

	"github.com/dlock/dlock/client"
)

const electLong = `Runs CMD only while this process is the leader of the election NAME: it
campaigns (waits in line behind the leader and earlier candidates), starts
CMD once elected, and resigns when CMD exits, so that the next candidate
takes over at once. CMD gets DLOCK_NAME, DLOCK_FENCING_TOKEN and
DLOCK_LEADER_VALUE in its environment and runs in its own process group.
dlock renews the leadership every TTL/3; if it is lost, dlock sends SIGTERM
to CMD's whole process group, SIGKILL after the grace period, and exits 4.
Otherwise it exits with CMD's exit code (128+N if CMD died of signal N).
SIGINT, SIGTERM and SIGHUP are passed on to CMD's process group; while
campaigning they withdraw the candidacy. Flags after "--" are CMD's.`

func newElectCmd() *cobra.Command {
	var h heldFlags
	var value string
	cmd := &cobra.Command{
		Use:     "elect NAME [flags] -- CMD [ARGS...]",
		Short:   "run CMD only while leader of the election NAME",
		Long:    electLong,
		Example: `  dlock elect reports/scheduler --value "$(hostname)" -- ./scheduler`,
	}
	cmd.RunE = func(cmd *cobra.Command, args []string) error { return runElect(cmd, args, &h, &value) }
	h.register(cmd, 15*time.Second, "leadership")
	cmd.Flags().StringVar(&value, "value", "", "the leader's value, shown to observers (default: the client id)")
	return clientCmd(cmd, &h.g)
}

func runElect(cmd *cobra.Command, args []string, h *heldFlags, valueFlag *string) error {
	name, argv, opts, c, err := h.parse(cmd, args, "dlock elect NAME -- CMD [ARGS...]")
	if err != nil {
		return err
	}
	defer c.Close()
	g, wait, grace := &h.g, h.wait, h.grace
	value := *valueFlag // set only once parse has read the flags after NAME
	if value == "" {
		value = c.ClientID()
	}

	// As dlock lock: a signal while campaigning must withdraw the
	// candidacy, not kill dlock and leave it in line.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)

	e := c.NewElection(name, opts...)
	l, err := waitOrSignal(*wait, sigs, func(ctx context.Context) (*client.Leadership, error) {
		return e.Campaign(ctx, value)
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
