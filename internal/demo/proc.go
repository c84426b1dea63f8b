package demo

import (
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

// stopGrace is how long a process gets to exit after SIGTERM before it is
// SIGKILLed; dlock serve's own shutdown is bounded well below it.
const stopGrace = 5 * time.Second

// proc is one child process the demo started.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited and been reaped
	err  error         // cmd.Wait's result; read only after done
}

// startProc starts the dlock binary with args. Its stderr, and its stdout
// unless prep sets one, go to DIR/name.log. prep may wire stdin and stdout.
func (e *env) startProc(name string, args []string, prep func(*exec.Cmd) error) (*proc, error) {
	logPath := filepath.Join(e.dir, name+".log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open %s's log: %w", name, err)
	}
	// The child has its own copy of the descriptor once started.
	defer logf.Close()
	fmt.Fprintf(logf, "=== %s: dlock %s\n", time.Now().Format(time.RFC3339Nano), shellWords(args))
	cmd := exec.Command(e.cfg.Binary, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = sysProcAttr()
	if prep != nil {
		if err := prep(cmd); err != nil {
			return nil, fmt.Errorf("start %s: %w", name, err)
		}
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (%s): %w; is Config.Binary a dlock binary?", name, e.cfg.Binary, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	e.procs = append(e.procs, p)
	return p, nil
}

// shellWords quotes the arguments that need it, so a logged command line
// can be pasted into a shell.
func shellWords(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = a
		if a == "" || strings.ContainsAny(a, " \t\"'$\\") {
			out[i] = strconv.Quote(a)
		}
	}
	return strings.Join(out, " ")
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) waitExit(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.done:
		return true
	case <-t.C:
		return false
	}
}

// kill SIGKILLs the process, as a crash would, and reaps it.
func (p *proc) kill() error {
	if p.exited() {
		return fmt.Errorf("%s (pid %d) had already exited: %v; see %s.log", p.name, p.pid(), p.err, p.name)
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill %s (pid %d): %w", p.name, p.pid(), err)
	}
	if !p.waitExit(stopGrace) {
		return fmt.Errorf("%s (pid %d) still runs %s after SIGKILL", p.name, p.pid(), stopGrace)
	}
	return nil
}

// stop asks the process to exit (SIGTERM, and SIGCONT in case it is
// frozen) and SIGKILLs it if it has not within stopGrace.
func (p *proc) stop() {
	if p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	_ = resume(p.cmd.Process)
	if !p.waitExit(stopGrace) {
		_ = p.cmd.Process.Kill()
		p.waitExit(stopGrace)
	}
}

// exitedErr says that p exited while it was needed, with the end of its log,
// which usually says why.
func (e *env) exitedErr(p *proc, while string) error {
	logPath := filepath.Join(e.dir, p.name+".log")
	b, _ := os.ReadFile(logPath)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	lines = lines[max(0, len(lines)-5):]
	return fmt.Errorf("%s (pid %d) exited %s: %v; the end of %s:\n%s", p.name, p.pid(), while, p.err, logPath, strings.Join(lines, "\n"))
}
