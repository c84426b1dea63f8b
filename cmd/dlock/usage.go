package main

// Usage conventions shared by every command, carried by cobra: -h, --help
// and "dlock help CMD" print the usage to stdout and exit 0; a mistake on
// the command line prints the error first, then a hint, and exits 2; with
// -o json a client command's error is JSON on stdout.

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/dlock/dlock/internal/raftnode"
)

// serveExitRefused is dlock serve's exit code when it refuses its data dir
// (corrupted or truncated log or snapshot).
const serveExitRefused = 3

// usageError is a mistake on the command line: exit 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usageErrorf(format string, args ...any) error {
	return &usageError{fmt.Sprintf(format, args...)}
}

// exitCodeError ends a command with a given code, its messages already
// printed (lock passes its command's exit code through this way).
type exitCodeError struct{ code int }

func (e *exitCodeError) Error() string { return fmt.Sprintf("exit %d", e.code) }

// clientAnnotation marks the client commands: their errors follow -o json.
// groupAnnotation marks the commands that only hold subcommands.
const (
	clientAnnotation = "dlock-client"
	groupAnnotation  = "dlock-group"
)

func isClient(cmd *cobra.Command) bool {
	return cmd != nil && cmd.Annotations[clientAnnotation] != ""
}

// usageTemplate is cobra's, with the flag descriptions wrapped.
var usageTemplate = strings.ReplaceAll((&cobra.Command{}).UsageTemplate(), ".FlagUsages", ".FlagUsagesWrapped 100")

// finish prints a command's error and returns the process's exit code.
// args is the whole command line after "dlock", for -o json.
func finish(cmd *cobra.Command, args []string, err error) int {
	var ec *exitCodeError
	var ue *usageError
	path := "dlock"
	if cmd != nil && cmd.Name() != "help" {
		path = cmd.CommandPath()
	}
	switch {
	case err == nil, errors.Is(err, errHelpShown):
		return cliExitOK
	case errors.As(err, &ec):
		return ec.code
	case isClient(cmd) && wantsJSON(args):
		printJSONError(err)
		return exitCode(err)
	case errors.As(err, &ue):
		fmt.Fprintf(os.Stderr, "%s: %v\nRun '%s --help' for usage.\n", path, err, path)
		return cliExitUsage
	}
	fmt.Fprintf(os.Stderr, "%s: %v\n", path, err)
	var refused *raftnode.RefusedError
	if errors.As(err, &refused) {
		// Restarting will not help: an operator must act (deploy/systemd's
		// unit does not restart on this code).
		return serveExitRefused
	}
	return exitCode(err)
}

// flagError turns pflag's complaints into usage errors that say how to fix
// the common slips: a duration without a unit, a long flag with one dash
// (Go's flag package took -endpoints; dlock follows the usual -o/--output).
func flagError(cmd *cobra.Command, err error) error {
	msg := err.Error()
	if strings.Contains(msg, "in duration") || strings.Contains(msg, "invalid duration") {
		msg += " (durations need a unit, e.g. 30s, 5m or 1h)"
	}
	var ne *pflag.NotExistError
	if errors.As(err, &ne) && ne.GetSpecifiedShortnames() != "" {
		long := ne.GetSpecifiedShortnames()
		long, _, _ = strings.Cut(long, "=")
		if cmd.Flags().Lookup(long) != nil {
			msg += fmt.Sprintf(" (long flags take two dashes: --%s)", long)
		}
	}
	return &usageError{msg}
}

// exactArgs wants n positional arguments, saying what is wrong otherwise.
func exactArgs(n int, want string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != n {
			return usageErrorf("%s", want)
		}
		return nil
	}
}

// rangeArgs wants between lo and hi positional arguments.
func rangeArgs(lo, hi int, want string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) < lo || len(args) > hi {
			return usageErrorf("%s", want)
		}
		return nil
	}
}

// noArgs refuses positional arguments.
func noArgs(_ *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageErrorf("unexpected arguments %q", args)
	}
	return nil
}

// groupCommand is a command that only holds subcommands (acl, snapshot,
// debug): without one, or with an unknown one, it is a usage error;
// "dlock acl help" is its help.
func groupCommand(use, short, long, what string, subs ...*cobra.Command) *cobra.Command {
	cmd := &cobra.Command{
		Use:         use + " COMMAND",
		Short:       short,
		Long:        long,
		Args:        cobra.ArbitraryArgs,
		Annotations: map[string]string{groupAnnotation: "true"},
		RunE: func(cmd *cobra.Command, args []string) error {
			name := strings.TrimPrefix(cmd.CommandPath(), "dlock ")
			switch {
			case len(args) == 0:
				return usageErrorf("name a subcommand: %s", what)
			case args[0] == "help":
				return cmd.Help()
			}
			return usageErrorf("unknown %s command %q: use %s", name, args[0], what)
		},
		ValidArgsFunction: cobra.NoFileCompletions,
	}
	cmd.AddCommand(subs...)
	return cmd
}

// newHelpCommand is `dlock help [COMMAND...]`: cobra's, except that an
// unknown command is a usage error instead of the top-level help.
func newHelpCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "help [COMMAND...]",
		Short: "Help about any command",
		Long:  "Prints the help of a command: dlock help lock is dlock lock --help.",
		ValidArgsFunction: func(c *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
			cmd, _, err := c.Root().Find(args)
			if err != nil {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			var out []cobra.Completion
			for _, sub := range cmd.Commands() {
				if sub.IsAvailableCommand() && strings.HasPrefix(sub.Name(), toComplete) {
					out = append(out, cobra.CompletionWithDesc(sub.Name(), sub.Short))
				}
			}
			return out, cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(c *cobra.Command, args []string) error {
			cmd, rest, err := c.Root().Find(args)
			if err != nil || len(rest) > 0 || (cmd == c.Root() && len(args) > 0) {
				return usageErrorf("unknown command %q: dlock help lists the commands", strings.Join(args, " "))
			}
			return cmd.Help()
		},
	}
}

// completeWords completes a flag's value from a fixed list.
func completeWords(cmd *cobra.Command, flag string, words ...string) {
	_ = cmd.RegisterFlagCompletionFunc(flag, cobra.FixedCompletions(words, cobra.ShellCompDirectiveNoFileComp))
}
