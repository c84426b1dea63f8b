// Package demo is `dlock demo`: the fencing demo (a data store, paused writers, a crashed leader), automated and
// checked. It starts a real cluster of `dlock serve` processes and a real
// `dlock datastore`, then walks three clients through contention, an expired
// holder, a leader crash with clients waiting in line, a paused holder whose
// late write must be refused, and a forged token; it narrates every step and
// returns an error naming the first expectation that failed. The paused
// client (RunWriter, `dlock demo-writer`) lives here too: it must be a process
// of its own so that it can be frozen with SIGSTOP.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// Config configures Run. The zero value runs the whole demo.
type Config struct {
	// Binary is the dlock binary that runs the nodes, the data store and the
	// paused writer. Default: this process's executable.
	Binary string
	// Dir holds every process's data and log. Default: a new temporary
	// directory, removed at the end unless Keep is set or the demo failed.
	// A given Dir must be empty or missing (the demo starts a fresh cluster)
	// and is never removed.
	Dir  string
	Keep bool
	// Out receives the narration. Default: os.Stdout.
	Out io.Writer
	// Nodes is the cluster size (3 to 9). Default 5.
	Nodes int
	// Steps picks the steps to run, in order, from "abcde". Default: all.
	// Step e borrows the grant step d leaves, so it needs d.
	Steps string
	// ShortTTL is the TTL of the holders that stop renewing: client2 in
	// step b, the paused writer in step d. Default 2 s (the minimum is 1 s).
	ShortTTL time.Duration
	// HoldTTL is the TTL of the holders that keep renewing. Default 60 s,
	// the script's; it never runs out during the demo.
	HoldTTL time.Duration
	// WaitTimeout bounds every wait in a lock's queue. Default 20 s.
	WaitTimeout time.Duration
	// StepTimeout bounds the start-up and each step. Default 45 s.
	StepTimeout time.Duration
}

const allSteps = "abcde"

func (c *Config) setDefaults() error {
	if c.Binary == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("find the dlock binary to start the cluster with: %w; set Config.Binary", err)
		}
		c.Binary = exe
	}
	if c.Out == nil {
		c.Out = os.Stdout
	}
	if c.Nodes == 0 {
		c.Nodes = 5
	}
	if c.Nodes < 3 || c.Nodes > 9 {
		return fmt.Errorf("demo: %d nodes: use 3 to 9 (a leader is killed, and the rest must keep a quorum)", c.Nodes)
	}
	if c.Steps == "" {
		c.Steps = allSteps
	}
	for i, s := range c.Steps {
		if !strings.ContainsRune(allSteps, s) || strings.ContainsRune(c.Steps[:i], s) {
			return fmt.Errorf("demo: steps %q: use each of the letters %q at most once", c.Steps, allSteps)
		}
	}
	if strings.ContainsRune(c.Steps, 'e') && !strings.Contains(c.Steps[:strings.IndexRune(c.Steps, 'e')], "d") {
		return fmt.Errorf("demo: steps %q: step e borrows the grant of step d; run d before e", c.Steps)
	}
	setDefault(&c.ShortTTL, 2*time.Second)
	setDefault(&c.HoldTTL, 60*time.Second)
	setDefault(&c.WaitTimeout, 20*time.Second)
	setDefault(&c.StepTimeout, 45*time.Second)
	if c.ShortTTL < time.Second || c.ShortTTL%time.Millisecond != 0 {
		return fmt.Errorf("demo: ShortTTL %s: the cluster takes whole milliseconds from 1s", c.ShortTTL)
	}
	return nil
}

func setDefault(d *time.Duration, def time.Duration) {
	if *d <= 0 {
		*d = def
	}
}

// Run runs the demo and stops every process it started before it returns.
// The error names the step whose expectation failed.
func Run(ctx context.Context, cfg Config) (err error) {
	if err := cfg.setDefaults(); err != nil {
		return err
	}
	started := time.Now()
	dir, ownDir, err := workDir(cfg.Dir)
	if err != nil {
		return err
	}
	e := newEnv(cfg, dir)
	defer func() {
		e.teardown()
		switch {
		case err != nil:
			err = fmt.Errorf("%w\nthe log of every process is in %s", err, dir)
		case ownDir && !cfg.Keep:
			if rerr := os.RemoveAll(dir); rerr != nil {
				e.say("could not remove the work dir %s: %v", dir, rerr)
			}
		default:
			e.say("data and logs kept in %s", dir)
		}
	}()

	fmt.Fprintf(cfg.Out, "dlock demo: the fencing story with real processes; every step is checked\n")
	e.heading("setup", "a cluster of %d dlock serve processes and a dlock datastore, in %s", cfg.Nodes, dir)
	if err := e.timed(ctx, e.setup); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("interrupted in the setup: %w", ctx.Err())
		}
		return fmt.Errorf("setup: %w", err)
	}
	for _, s := range cfg.Steps {
		st := steps[s]
		e.heading(string(s), "%s", st.title)
		if err := e.timed(ctx, func(ctx context.Context) error { return st.run(e, ctx) }); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("interrupted in step %c (%s): %w", s, st.title, ctx.Err())
			}
			return fmt.Errorf("step %c (%s): %w", s, st.title, err)
		}
	}
	took := time.Since(started)
	e.teardown()
	e.printSummary(took)
	return nil
}

// timed runs f under the step bound, so no step can hang the demo.
func (e *env) timed(ctx context.Context, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.StepTimeout)
	defer cancel()
	err := f(ctx)
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		err = fmt.Errorf("%w (the step took longer than its %s bound; a busy machine may need a larger Config.StepTimeout)", err, e.cfg.StepTimeout)
	}
	return err
}

// workDir returns the demo's directory and whether the demo made it.
func workDir(dir string) (string, bool, error) {
	if dir == "" {
		d, err := os.MkdirTemp("", "dlock-demo-")
		if err != nil {
			return "", false, fmt.Errorf("make a temporary work dir: %w; or pass --dir", err)
		}
		return d, true, nil
	}
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", false, fmt.Errorf("create work dir: %w", err)
		}
	case err != nil:
		return "", false, fmt.Errorf("read work dir: %w", err)
	case len(entries) > 0:
		return "", false, fmt.Errorf("work dir %s is not empty: give a new or empty directory, the demo starts a fresh cluster", dir)
	}
	return dir, false, nil
}
