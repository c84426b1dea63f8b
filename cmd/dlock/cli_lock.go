package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/dlock/dlock/client"
)

const lockLong = `Runs CMD while holding the lock NAME, waiting in line for it first. CMD gets
DLOCK_NAME and DLOCK_FENCING_TOKEN in its environment and runs in its own
process group. dlock renews the lock every TTL/3; if it is lost, dlock sends
SIGTERM to CMD's whole process group, SIGKILL after the grace period, and
exits 4. Otherwise it exits with CMD's exit code (128+N if CMD died of signal
N). SIGINT, SIGTERM and SIGHUP are passed on to CMD's process group; the lock
is released when CMD exits. Flags after "--" are CMD's.`

func newLockCmd() *cobra.Command {
	var h heldFlags
	var noWait bool
	cmd := &cobra.Command{
		Use:   "lock NAME [flags] -- CMD [ARGS...]",
		Short: "run CMD while holding the lock NAME",
		Long:  lockLong,
		Example: `  dlock lock deploy -- ./deploy.sh production
  dlock lock nightly --wait 10m --ttl 1m -- ./backup.sh`,
	}
	cmd.RunE = func(cmd *cobra.Command, args []string) error { return runLock(cmd, args, &h, &noWait) }
	h.register(cmd, client.DefaultTTL, "lock")
	cmd.Flags().BoolVar(&noWait, "no-wait", false, "exit 3 at once if the lock is held")
	return clientCmd(cmd, &h.g)
}

func runLock(cmd *cobra.Command, args []string, h *heldFlags, noWait *bool) error {
	name, argv, opts, c, err := h.parse(cmd, args, "dlock lock NAME -- CMD [ARGS...]")
	if err != nil {
		return err
	}
	defer c.Close()
	g, wait, grace := &h.g, h.wait, h.grace

	// Catch signals from the start: a Ctrl-C while waiting must withdraw
	// from the line, not kill dlock and leave the wait behind.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)

	m := c.NewMutex(name, opts...)
	l, err := lockOrSignal(m, *wait, *noWait, sigs)
	if err != nil {
		var sig *signalled
		if errors.As(err, &sig) {
			fmt.Fprintf(os.Stderr, "dlock lock: %v while waiting for %q\n", sig.sig, name)
			return &exitCodeError{128 + signalNumber(sig.sig)}
		}
		printHolder(err)
		return err
	}
	release := func() {
		timeout := g.timeout
		if l.Err() != nil {
			// Lost: the release is only a courtesy in case the cluster
			// still counts us as holder; do not linger over it.
			timeout = min(timeout, 2*time.Second)
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		if err := m.Unlock(ctx); err != nil && errors.Is(l.Err(), client.ErrReleased) {
			fmt.Fprintf(os.Stderr, "dlock lock: could not release %q, it expires after its TTL: %v\n", name, err)
		}
	}
	if g.verbose {
		fmt.Fprintf(os.Stderr, "dlock lock: holding %q with fencing token %d\n", name, l.Token())
	}

	env := []string{"DLOCK_NAME=" + l.Name(), "DLOCK_FENCING_TOKEN=" + strconv.FormatUint(l.Token(), 10)}
	return runHeld(argv, env, l, sigs, *grace, release, func() string {
		return fmt.Sprintf("dlock lock: lost lock %q: %v", name, l.Err())
	})
}

// holding is what a command runs under: a lock's lease (dlock lock) or an
// election's leadership (dlock elect). Done closes when it may be lost.
type holding interface {
	Done() <-chan struct{}
}

// runHeld runs argv in its own process group while h lasts, passing sigs on
// to the group; if h is lost first it stops the group (supervise), prints
// lostMsg and ends with exit 4, else with the command's exit code. release
// gives h up once the command has ended, however it ended.
func runHeld(argv, env []string, h holding, sigs <-chan os.Signal, grace time.Duration, release func(), lostMsg func() string) error {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), env...)
	ownProcessGroup(cmd)
	if err := cmd.Start(); err != nil {
		release()
		return err
	}
	code, lost := supervise(cmd, h, sigs, grace)
	release()
	if lost {
		fmt.Fprintln(os.Stderr, lostMsg())
		return &exitCodeError{cliExitLost}
	}
	return &exitCodeError{code}
}

type signalled struct{ sig os.Signal }

func (s *signalled) Error() string { return "interrupted by " + s.sig.String() }

// lockOrSignal takes the lock, giving up (and leaving nothing behind) if a
// signal arrives first.
func lockOrSignal(m *client.Mutex, wait time.Duration, noWait bool, sigs <-chan os.Signal) (*client.Lease, error) {
	return waitOrSignal(wait, sigs, func(ctx context.Context) (*client.Lease, error) {
		if noWait {
			return m.TryLock(ctx)
		}
		return m.Lock(ctx)
	}, func(ctx context.Context, _ *client.Lease) { m.Unlock(ctx) })
}

// waitOrSignal runs take (a wait in line: Lock, Campaign) for at most wait
// (0: no limit). If a signal arrives first it cancels take, gives back what
// take got at that very moment, and fails with *signalled.
func waitOrSignal[T any](wait time.Duration, sigs <-chan os.Signal, take func(context.Context) (T, error), giveBack func(context.Context, T)) (T, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if wait > 0 {
		// The client asks the server to wait a little less than the time
		// left (so that a clean wait_timeout beats the deadline); this
		// margin makes that exactly wait.
		ctx, cancel = context.WithTimeout(ctx, wait+min(wait/9, time.Second))
		defer cancel()
	}
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		r.v, r.err = take(ctx)
		done <- r
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case s := <-sigs:
		cancel()
		if r := <-done; r.err == nil {
			gctx, gcancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer gcancel()
			giveBack(gctx, r.v)
		}
		var zero T
		return zero, &signalled{s}
	}
}

// supervise waits for the command to exit, passing signals on to its process
// group, and stops the group if h is lost: SIGTERM, then SIGKILL after
// grace. It returns the command's exit code and whether h was lost.
func supervise(cmd *exec.Cmd, h holding, sigs <-chan os.Signal, grace time.Duration) (int, bool) {
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	lostCh := h.Done()
	lost := false
	var killAt <-chan time.Time
	for {
		select {
		case <-exited:
			if lost {
				// Grandchildren may outlive the command; none may go on
				// working without the lock.
				reapGroup(cmd, killAt)
			}
			return exitStatus(cmd.ProcessState), lost
		case <-lostCh:
			lostCh = nil
			lost = true
			signalGroup(cmd, syscall.SIGTERM)
			killAt = time.After(grace)
		case s := <-sigs:
			signalGroup(cmd, s)
			if killAt == nil {
				killAt = time.After(grace)
			}
		case <-killAt:
			signalGroup(cmd, syscall.SIGKILL)
			killAt = nil
		}
	}
}

// reapGroup waits until the command's process group is empty or the grace
// period ends, then kills what is left.
func reapGroup(cmd *exec.Cmd, killAt <-chan time.Time) {
	if killAt == nil {
		return // the group had its SIGKILL already
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for groupAlive(cmd) {
		select {
		case <-killAt:
			signalGroup(cmd, syscall.SIGKILL)
			return
		case <-tick.C:
		}
	}
}
