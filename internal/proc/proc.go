// Package proc runs child processes for the end-to-end tests, the chaos
// suite and `dlock demo`: start one with its output appended to a log file,
// see whether it exited, signal, stop or kill it (and reap it), and read the
// end of its log. One harness, so every caller stops its children the same
// bounded way.
package proc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Proc is one started child process.
type Proc struct {
	Name    string
	LogPath string
	Cmd     *exec.Cmd
	done    chan struct{} // closed once the process has exited and been reaped
	waitErr error         // cmd.Wait's result; read only after done
}

// Options tune Start.
type Options struct {
	// Stdout, when set, gets the child's stdout instead of the log.
	Stdout *os.File
	// Env is the child's environment (nil: this process's).
	Env []string
	// Prep runs on the command just before it starts (stdin, extra files).
	Prep func(*exec.Cmd) error
}

// Start runs bin with args. Its stderr, and its stdout unless
// opts.Stdout is set, are appended to logPath after a header naming the
// command. On Linux the child is SIGKILLed if this process dies without
// cleaning up, so no child outlives its parent.
func Start(name, logPath, bin string, args []string, opts Options) (*Proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open %s's log: %w", name, err)
	}
	defer f.Close() // the child has its own copy of the descriptor
	fmt.Fprintf(f, "=== %s: %s %s\n", time.Now().Format(time.RFC3339Nano), filepath.Base(bin), ShellWords(args))
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if opts.Stdout != nil {
		cmd.Stdout = opts.Stdout
	}
	cmd.Env = opts.Env
	if engine := os.Getenv("DLOCK_TEST_RAFT_ENGINE"); engine != "" {
		// The suites' switch to run every dlock they start on one
		// replication engine (dlock serve and dev read DLOCK_RAFT_ENGINE).
		if cmd.Env == nil {
			cmd.Env = os.Environ()
		}
		cmd.Env = append(cmd.Env, "DLOCK_RAFT_ENGINE="+engine)
	}
	cmd.SysProcAttr = sysProcAttr()
	if opts.Prep != nil {
		if err := opts.Prep(cmd); err != nil {
			return nil, fmt.Errorf("start %s: %w", name, err)
		}
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (%s): %w", name, bin, err)
	}
	p := &Proc{Name: name, LogPath: logPath, Cmd: cmd, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.Cmd.Process.Pid }

// Done is closed once the process has exited and been reaped.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// WaitErr is cmd.Wait's result once the process has exited (nil before).
func (p *Proc) WaitErr() error {
	if !p.Exited() {
		return nil
	}
	return p.waitErr
}

// WaitExit waits up to d for the process to exit and reports whether it did.
func (p *Proc) WaitExit(d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-p.done:
		return true
	case <-timer.C:
		return false
	}
}

// ExitCode waits for the process and returns its exit status (-1 if a
// signal ended it).
func (p *Proc) ExitCode() int {
	<-p.done
	return p.Cmd.ProcessState.ExitCode()
}

// Signal sends sig; it fails if the process has exited.
func (p *Proc) Signal(sig os.Signal) error {
	if p.Exited() {
		return fmt.Errorf("%s has exited: %v", p.Name, p.waitErr)
	}
	return p.Cmd.Process.Signal(sig)
}

// Kill SIGKILLs the process, as a crash or `kill -9` would (it also ends a
// stopped one), and reaps it, waiting at most within. Killing a process that
// has exited is not an error.
func (p *Proc) Kill(within time.Duration) error {
	if p.Exited() {
		return nil
	}
	if err := p.Cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill %s (pid %d): %w", p.Name, p.Pid(), err)
	}
	if !p.WaitExit(within) {
		return fmt.Errorf("%s (pid %d) still running %s after SIGKILL", p.Name, p.Pid(), within)
	}
	return nil
}

// Stop sends sig (and SIGCONT, in case the process is frozen) and waits up
// to grace. A process still running then gets SIGQUIT, which makes a Go
// program write every goroutine's stack to its log and exit (what held it
// up is then in the log), and, 5 s later, SIGKILL. It returns how long the
// exit took and whether it needed more than sig.
func (p *Proc) Stop(sig os.Signal, grace time.Duration) (took time.Duration, forced bool) {
	if p.Exited() {
		return 0, false
	}
	start := time.Now()
	_ = p.Cmd.Process.Signal(sig)
	_ = p.Cmd.Process.Signal(syscall.SIGCONT)
	if p.WaitExit(grace) {
		return time.Since(start), false
	}
	_ = p.Cmd.Process.Signal(syscall.SIGQUIT)
	if p.WaitExit(5 * time.Second) {
		return time.Since(start), true
	}
	_ = p.Cmd.Process.Kill()
	p.WaitExit(grace) // SIGKILL cannot be ignored; this returns at once
	return time.Since(start), true
}

// LogTail returns the last n lines of a log file.
func LogTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("... (%d earlier lines in %s)", len(lines)-n, path)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}

// ShellWords quotes the arguments that need it, so a logged command line can
// be pasted into a shell.
func ShellWords(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = a
		if a == "" || strings.ContainsAny(a, " \t\"'$\\") {
			out[i] = strconv.Quote(a)
		}
	}
	return strings.Join(out, " ")
}

// Build compiles the Go package pkg (e.g. "github.com/dlock/dlock/cmd/dlock")
// to out, with the race detector if race, and extra environment (e.g.
// CGO_ENABLED=0 for a static binary). It gives up after five minutes.
func Build(pkg, out string, race bool, env ...string) error {
	goTool, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("the go command is needed to build %s: %w", pkg, err)
	}
	args := []string{"build"}
	if race {
		args = append(args, "-race")
	}
	args = append(args, "-o", out, pkg)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goTool, args...)
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, b)
	}
	return nil
}
