package demo

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	dproc "github.com/dlock/dlock/internal/proc"
)

// stopGrace is how long a process gets to exit after SIGTERM before it is
// forced; dlock serve's own shutdown is bounded well below it.
const stopGrace = 5 * time.Second

// proc is one child process the demo started, through the shared harness.
type proc struct{ *dproc.Proc }

// startProc starts the dlock binary with args. Its stderr, and its stdout
// unless prep sets one, go to DIR/name.log. prep may wire stdin and stdout.
func (e *env) startProc(name string, args []string, prep func(*exec.Cmd) error) (*proc, error) {
	p, err := dproc.Start(name, filepath.Join(e.dir, name+".log"), e.cfg.Binary, args, dproc.Options{Prep: prep})
	if err != nil {
		return nil, fmt.Errorf("%w; is Config.Binary a dlock binary?", err)
	}
	pr := &proc{p}
	e.procs = append(e.procs, pr)
	return pr, nil
}

// kill SIGKILLs the process, as a crash would, and reaps it.
func (p *proc) kill() error {
	if p.Exited() {
		return fmt.Errorf("%s (pid %d) had already exited: %v; see %s.log", p.Name, p.Pid(), p.WaitErr(), p.Name)
	}
	return p.Kill(stopGrace)
}

// stop asks the process to exit (SIGTERM, and SIGCONT in case it is
// frozen) and forces it if it has not within stopGrace.
func (p *proc) stop() { p.Stop(syscall.SIGTERM, stopGrace) }

// exitedErr says that p exited while it was needed, with the end of its log,
// which usually says why.
func (e *env) exitedErr(p *proc, while string) error {
	b, _ := os.ReadFile(p.LogPath)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	lines = lines[max(0, len(lines)-5):]
	return fmt.Errorf("%s (pid %d) exited %s: %v; the end of %s:\n%s", p.Name, p.Pid(), while, p.WaitErr(), p.LogPath, strings.Join(lines, "\n"))
}
