package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// execute runs `dlock args...` in this process.
func execute(args ...string) (*cobra.Command, error) {
	root := newRootCmd()
	root.SetArgs(args)
	return root.ExecuteC()
}

// executeOut is execute with cobra's own output (help, completion)
// captured.
func executeOut(args ...string) (string, error) {
	root := newRootCmd()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	_, err := root.ExecuteC()
	return out.String(), err
}

// commandPaths lists every command of the tree but the hidden ones, as
// argument lists ("acl", "token", "create").
func commandPaths(cmd *cobra.Command, prefix []string) [][]string {
	var out [][]string
	for _, c := range cmd.Commands() {
		if c.Hidden {
			continue
		}
		p := append(slices.Clone(prefix), c.Name())
		out = append(out, p)
		out = append(out, commandPaths(c, p)...)
	}
	return out
}

// Every command and subcommand answers -h, --help and dlock help CMD with
// its usage, and no error (exit 0).
func TestHelpOnEveryCommand(t *testing.T) {
	paths := commandPaths(newRootCmd(), nil)
	if len(paths) < 30 {
		t.Fatalf("only %d commands found: %v", len(paths), paths)
	}
	for _, p := range paths {
		for _, args := range [][]string{append(slices.Clone(p), "-h"), append(slices.Clone(p), "--help"), append([]string{"help"}, p...)} {
			out, err := executeOut(args...)
			if err != nil || !strings.Contains(out, "Usage:") || !strings.Contains(out, "dlock "+strings.Join(p, " ")) {
				t.Errorf("dlock %s: %v, output %q; want its usage", strings.Join(args, " "), err, out)
			}
		}
	}
}

// Short flags have one meaning wherever they appear.
func TestOneMeaningPerShortFlag(t *testing.T) {
	want := map[string]string{"h": "help", "o": "output", "v": "verbose", "q": "quiet"}
	var walk func(*cobra.Command)
	walk = func(cmd *cobra.Command) {
		cmd.InitDefaultHelpFlag()
		cmd.LocalFlags().VisitAll(func(f *pflag.Flag) {
			if f.Shorthand == "" {
				return
			}
			if want[f.Shorthand] != f.Name {
				t.Errorf("%s: -%s is --%s; elsewhere it is --%s", cmd.CommandPath(), f.Shorthand, f.Name, want[f.Shorthand])
			}
		})
		for _, c := range cmd.Commands() {
			walk(c)
		}
	}
	walk(newRootCmd())
}

// Every client command takes -o json.
func TestEveryClientCommandTakesOutputJSON(t *testing.T) {
	n := 0
	var walk func(*cobra.Command)
	walk = func(cmd *cobra.Command) {
		if isClient(cmd) && cmd.Annotations[groupAnnotation] == "" {
			n++
			if f := cmd.Flags().ShorthandLookup("o"); f == nil || f.Name != "output" {
				t.Errorf("%s has no -o/--output", cmd.CommandPath())
			}
		}
		for _, c := range cmd.Commands() {
			walk(c)
		}
	}
	walk(newRootCmd())
	if n < 15 {
		t.Fatalf("only %d client commands", n)
	}
}

func TestUsageErrorsExit2(t *testing.T) {
	for _, args := range [][]string{
		nil, {"frob"}, {"help", "frob"}, {"serve", "extra"}, {"serve", "--bogus"}, {"acl"}, {"acl", "frob"},
		{"acl", "token"}, {"acl", "token", "frob"}, {"snapshot"}, {"snapshot", "save"}, {"debug"}, {"debug", "log"},
		{"status"}, {"status", "a", "b"}, {"list", "a", "b"}, {"members", "add", "n4"}, {"lock", "x"},
		{"lock", "--", "x", "true"}, {"status", "x", "-endpoints", "http://127.0.0.1:1"}, {"status", "x", "-o", "yaml"},
		{"acquire", "x", "--ttl", "30"}, {"version", "-o", "yaml"},
	} {
		cmd, err := execute(args...)
		var ue *usageError
		if !errors.As(err, &ue) {
			t.Errorf("dlock %s: %v; want a usage error", strings.Join(args, " "), err)
			continue
		}
		if code := exitCodeOf(cmd, args, err); code != cliExitUsage {
			t.Errorf("dlock %s: exit %d, want 2", strings.Join(args, " "), code)
		}
	}
}

// exitCodeOf is finish without its message on stderr.
func exitCodeOf(cmd *cobra.Command, args []string, err error) int {
	stderr := os.Stderr
	os.Stderr, _ = os.Open(os.DevNull)
	defer func() { os.Stderr.Close(); os.Stderr = stderr }()
	return finish(cmd, args, err)
}

// dlock lock and elect: flags before "--" are dlock's, wherever they are
// among NAME; everything after "--", or after NAME and a word that is no
// flag, is the command's, its flags included.
func TestHeldCommandArguments(t *testing.T) {
	type parsed struct {
		name string
		argv []string
		ttl  time.Duration
		wait time.Duration
	}
	run := func(args ...string) (parsed, error) {
		var h heldFlags
		var got parsed
		cmd := &cobra.Command{Use: "lock", SilenceErrors: true, SilenceUsage: true}
		cmd.RunE = func(cmd *cobra.Command, args []string) error {
			name, argv, _, c, err := h.parse(cmd, args, "dlock lock NAME -- CMD [ARGS...]")
			if err != nil {
				return err
			}
			c.Close()
			got = parsed{name, argv, *h.ttl, *h.wait}
			return nil
		}
		h.register(cmd, 30*time.Second, "lock")
		clientCmd(cmd, &h.g)
		cmd.SetFlagErrorFunc(flagError)
		cmd.SetOut(&bytes.Buffer{})
		cmd.SetArgs(args)
		return got, cmd.Execute()
	}
	for _, c := range []struct {
		args []string
		want parsed
	}{
		{[]string{"deploy", "--", "sh", "-c", "echo --ttl 1s"}, parsed{"deploy", []string{"sh", "-c", "echo --ttl 1s"}, 30 * time.Second, 0}},
		{[]string{"--ttl", "5s", "deploy", "--wait", "1m", "--", "./x", "--wait", "2s"}, parsed{"deploy", []string{"./x", "--wait", "2s"}, 5 * time.Second, time.Minute}},
		{[]string{"deploy", "--ttl=7s", "./x", "--ttl", "9s", "--", "y"}, parsed{"deploy", []string{"./x", "--ttl", "9s", "--", "y"}, 7 * time.Second, 0}},
		{[]string{"deploy", "--", "--ttl", "1s"}, parsed{"deploy", []string{"--ttl", "1s"}, 30 * time.Second, 0}},
	} {
		got, err := run(c.args...)
		if err != nil || got.name != c.want.name || !slices.Equal(got.argv, c.want.argv) || got.ttl != c.want.ttl || got.wait != c.want.wait {
			t.Errorf("lock %q: %+v, %v; want %+v", c.args, got, err, c.want)
		}
	}
	for _, args := range [][]string{{"deploy"}, {"deploy", "--"}, {"--", "deploy", "x"}, {"deploy", "--bogus", "--", "x"}, {"deploy", "--ttl", "5", "--", "x"}} {
		var ue *usageError
		if _, err := run(args...); !errors.As(err, &ue) {
			t.Errorf("lock %q: %v; want a usage error", args, err)
		}
	}
	if _, err := run("deploy", "--help", "--", "x"); !errors.Is(err, errHelpShown) {
		t.Errorf("lock deploy --help: %v; want the help", err)
	}
}

// cobra's hidden __complete command is what every shell's script asks.
func TestCompletionCandidates(t *testing.T) {
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"__complete", ""}, []string{"lock", "serve", "acl", "completion", "help"}},
		{[]string{"__complete", "lo"}, []string{"lock"}},
		{[]string{"__complete", "lock", "--t"}, []string{"--ttl", "--timeout", "--takeover"}},
		{[]string{"__complete", "status", "-o", ""}, []string{"human", "json"}},
		{[]string{"__complete", "acl", "token", ""}, []string{"create", "list", "revoke"}},
		{[]string{"__complete", "serve", "--log-store", ""}, []string{"wal", "bolt"}},
		{[]string{"__complete", "completion", ""}, []string{"bash", "zsh", "fish"}},
	} {
		out, err := executeOut(c.args...)
		if err != nil {
			t.Fatalf("%q: %v", c.args, err)
		}
		var got []string
		for _, l := range strings.Split(out, "\n") {
			if l != "" && !strings.HasPrefix(l, ":") && !strings.HasPrefix(l, "Completion ended") {
				w, _, _ := strings.Cut(l, "\t")
				got = append(got, w)
			}
		}
		for _, w := range c.want {
			if !slices.Contains(got, w) {
				t.Errorf("completing %q: %q lacks %q", c.args[1:], got, w)
			}
		}
	}
}

// completionScript writes `dlock completion shell` to a file.
func completionScript(t *testing.T, shell string) string {
	t.Helper()
	out, err := executeOut("completion", shell)
	if err != nil || len(out) < 500 || !strings.Contains(out, "__complete") {
		t.Fatalf("dlock completion %s: %v, %d bytes", shell, err, len(out))
	}
	file := filepath.Join(t.TempDir(), "dlock."+shell)
	if err := os.WriteFile(file, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

// needTool skips a test without tool, unless DLOCK_COMPLETION_TESTS=require
// (CI installs bash-completion, zsh and fish).
func needTool(t *testing.T, tool string) {
	t.Helper()
	if _, err := os.Stat(tool); err == nil {
		return
	}
	if _, err := exec.LookPath(tool); err == nil {
		return
	}
	if os.Getenv("DLOCK_COMPLETION_TESTS") == "require" {
		t.Fatalf("%s is missing and DLOCK_COMPLETION_TESTS=require", tool)
	}
	t.Skipf("%s is not installed", tool)
}

// The zsh and fish scripts are generated and parse in their shells.
func TestZshAndFishCompletionScripts(t *testing.T) {
	for _, shell := range []string{"zsh", "fish"} {
		t.Run(shell, func(t *testing.T) {
			script := completionScript(t, shell)
			needTool(t, shell)
			if out, err := exec.Command(shell, "-n", script).CombinedOutput(); err != nil {
				t.Fatalf("%s -n: %v\n%s", shell, err, out)
			}
		})
	}
}
