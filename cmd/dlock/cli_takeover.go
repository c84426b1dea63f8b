package main

import (
	"errors"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/dlock/dlock/client"
)

const takeoverFlagUsage = "take it (or a place in line) at once from another lease of the same --client-id: a holder that restarted before its old lease ended. Needs --client-id (or DLOCK_CLIENT_ID); with ACLs, a token whose client_ids name it"

// takeoverOpts turns --takeover into client options. A takeover only means
// something under a client id chosen on purpose: the default one is new in
// every process, so nothing could be taken over with it.
func takeoverOpts(g *globalFlags, takeover bool) ([]client.MutexOption, error) {
	if !takeover {
		return nil, nil
	}
	if g.clientID == "" {
		return nil, usageErrorf("--takeover needs --client-id (or DLOCK_CLIENT_ID): the id of the lease to take over")
	}
	return []client.MutexOption{client.WithTakeover()}, nil
}

// heldFlags are what dlock lock and dlock elect share: the flags, and the
// NAME -- CMD [ARGS...] arguments.
type heldFlags struct {
	g                globalFlags
	ttl, wait, grace *time.Duration
	takeover         *bool
}

// register adds the shared flags to cmd, a command of the form
// NAME [flags] -- CMD [ARGS...]; what names the held thing in their help.
func (h *heldFlags) register(cmd *cobra.Command, ttl time.Duration, what string) {
	fs := cmd.Flags()
	// Flags stop at NAME, so that CMD's own flags stay CMD's even without
	// "--"; parse reads the flags between NAME and "--".
	fs.SetInterspersed(false)
	h.ttl = fs.Duration("ttl", ttl, "lease TTL, 1s to 10m: how long the "+what+" outlives a dlock that died without giving it up")
	h.wait = fs.Duration("wait", 0, "give up after waiting this long in line (exit 3); 0: as long as it takes")
	h.grace = fs.Duration("grace", 10*time.Second, "time between SIGTERM and SIGKILL when the "+what+" is lost")
	h.takeover = fs.Bool("takeover", false, takeoverFlagUsage)
	cmd.Args = cobra.ArbitraryArgs
	cmd.ValidArgsFunction = func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) == 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp // NAME
		}
		// cobra completes no flags after NAME, as they are not interspersed;
		// up to CMD or "--" they are still dlock's.
		if _, rest, err := parseUpTo(cmd.Flags(), args, 1); err == nil && rest == nil && strings.HasPrefix(toComplete, "-") {
			var out []cobra.Completion
			cmd.Flags().VisitAll(func(f *pflag.Flag) {
				if !f.Hidden && strings.HasPrefix("--"+f.Name, toComplete) {
					out = append(out, cobra.CompletionWithDesc("--"+f.Name, f.Usage))
				}
			})
			return out, cobra.ShellCompDirectiveNoFileComp
		}
		return nil, cobra.ShellCompDirectiveDefault // CMD [ARGS...]
	}
}

// errHelpShown ends a command whose help was asked for and printed: exit 0.
var errHelpShown = errors.New("help shown")

// parse reads NAME [flags] -- CMD [ARGS...] (cobra has parsed the flags
// before NAME), checks the flags and opens the client; usage is the command
// line to show when the arguments are wrong. The caller closes the client.
func (h *heldFlags) parse(cmd *cobra.Command, args []string, usage string) (name string, argv []string, opts []client.MutexOption, c *client.Client, err error) {
	pos, argv := []string(nil), args
	if cmd.ArgsLenAtDash() != 0 { // else "--" came before any NAME
		if pos, argv, err = parseUpTo(cmd.Flags(), args, 1); err != nil {
			return "", nil, nil, nil, cmd.FlagErrorFunc()(cmd, err)
		}
	}
	if help, _ := cmd.Flags().GetBool("help"); help {
		if err := cmd.Help(); err != nil {
			return "", nil, nil, nil, err
		}
		return "", nil, nil, nil, errHelpShown
	}
	if err := h.g.check(); err != nil {
		return "", nil, nil, nil, err
	}
	if len(pos) != 1 || len(argv) == 0 {
		return "", nil, nil, nil, usageErrorf("want a name and a command: %s", usage)
	}
	if *h.wait < 0 || *h.grace < 0 {
		return "", nil, nil, nil, usageErrorf("--wait and --grace must not be negative")
	}
	if opts, err = takeoverOpts(&h.g, *h.takeover); err != nil {
		return "", nil, nil, nil, err
	}
	if c, err = h.g.client(); err != nil {
		return "", nil, nil, nil, err
	}
	return pos[0], argv, append(opts, client.WithTTL(*h.ttl)), c, nil
}

// parseUpTo parses flags placed anywhere among up to npos positional
// arguments (fs must not be interspersed). What follows "--", or follows the
// last positional argument expected, is returned as rest, untouched: it is a
// command and its own flags.
func parseUpTo(fs *pflag.FlagSet, args []string, npos int) (pos, rest []string, err error) {
	for {
		if err := fs.Parse(args); err != nil {
			return nil, nil, err
		}
		left := fs.Args()
		if i := len(args) - len(left); i > 0 && args[i-1] == "--" {
			return pos, left, nil
		}
		if len(left) == 0 {
			return pos, nil, nil
		}
		if len(pos) == npos {
			return pos, left, nil
		}
		pos = append(pos, left[0])
		args = left[1:]
	}
}
