// Command dlock is the distributed lock service: `dlock serve` runs one node,
// `dlock dev` a throwaway local cluster. This package only parses flags and
// wires packages together; the behaviour lives under internal/. The command
// line is cobra's: its conventions give help, `dlock help CMD` and shell
// completion (`dlock completion bash|zsh|fish`).
package main

import (
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"
)

const rootLong = `dlock — a distributed lock and leader-election service on Raft

Client commands find the cluster through --endpoints URLS (env DLOCK_ENDPOINTS,
default ` + defaultEndpoints + `);
--client-id ID (env DLOCK_CLIENT_ID), -o json; for TLS clusters --cacert,
--cert, --key (env DLOCK_CACERT, DLOCK_CERT, DLOCK_KEY); for ACL clusters
--acl-token (env DLOCK_ACL_TOKEN).

Exit codes: 0 ok, 1 error, 2 usage; client commands also 3 lock held or
wait timed out, 4 lock lost (lock), leadership lost (elect) or not the
holder (release, renew). dlock lock and dlock elect otherwise exit with
CMD's exit code.`

func main() {
	os.Exit(runCLI(os.Args[1:]))
}

// runCLI runs the command line args (without the program name) and returns
// the exit code.
func runCLI(args []string) int {
	root := newRootCmd()
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	return finish(cmd, args, err)
}

func newRootCmd() *cobra.Command {
	var showVersion bool
	root := &cobra.Command{
		Use:   "dlock",
		Short: "a distributed lock and leader-election service on Raft",
		Long:  rootLong,
		// Our own messages: the error first, then a hint (finish).
		SilenceErrors: true,
		SilenceUsage:  true,
		Args:          cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			switch {
			case showVersion:
				return printVersion("human")
			case len(args) == 0:
				return usageErrorf("name a command")
			}
			msg := fmt.Sprintf("unknown command %q", args[0])
			if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
				msg += " (did you mean " + strings.Join(s, " or ") + "?)"
			}
			return &usageError{msg}
		},
		ValidArgsFunction: cobra.NoFileCompletions,
	}
	root.Flags().BoolVar(&showVersion, "version", false, "print the version (as dlock version)")
	root.SetFlagErrorFunc(flagError)
	root.SetUsageTemplate(usageTemplate)
	root.SetHelpCommand(newHelpCommand())
	root.AddGroup(
		&cobra.Group{ID: "node", Title: "Run a cluster:"},
		&cobra.Group{ID: "client", Title: "Use a cluster (client commands):"},
		&cobra.Group{ID: "ops", Title: "Back up, repair, inspect:"},
	)
	add := func(group string, cmds ...*cobra.Command) {
		for _, c := range cmds {
			c.GroupID = group
			root.AddCommand(c)
		}
	}
	add("node", newServeCmd(), newDevCmd(os.Stdout, waitForSignal), newHealthCmd())
	add("client", newLockCmd(), newElectCmd(), newAcquireCmd(), newRenewCmd(), newReleaseCmd(),
		newStatusCmd(), newListCmd(), newHistoryCmd(), newRevokeCmd(), newWatchCmd(), newMembersCmd(), newShardsCmd(), newACLCmd())
	add("ops", newBenchCmd(), newSnapshotCmd(), newRecoverCmd(), newDebugCmd(), newDatastoreCmd(), newDemoCmd())
	root.AddCommand(newVersionCmd(), newDemoWriterCmd())
	return root
}

func newLogger(level string, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: use debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(format) {
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	case "text", "":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: use text or json", format)
}
