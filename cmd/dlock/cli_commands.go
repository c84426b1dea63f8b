package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/dlock/dlock/client"
)

// holderFlags are the proof of holding that release and renew need.
type holderFlags struct {
	token   uint64
	leaseID string
}

func (h *holderFlags) register(fs *pflag.FlagSet) {
	fs.Uint64Var(&h.token, "token", 0, "fencing token `N` of the grant, as dlock acquire printed it (required)")
	fs.StringVar(&h.leaseID, "lease-id", "", "lease `ID` of the grant, as dlock acquire printed it (required)")
}

func (h *holderFlags) check() error {
	if h.token == 0 || h.leaseID == "" {
		return usageErrorf("--token and --lease-id are required (as dlock acquire printed them)")
	}
	return nil
}

const acquireLong = `Takes a lock and prints its fencing token and lease id. Nothing renews it:
renew it with dlock renew (same --client-id) before the TTL runs out, and
release it with dlock release. To run a command under a lock, use dlock lock.`

const oneName = "want exactly one lock name"

func newAcquireCmd() *cobra.Command {
	g := globalFlags{stableID: true}
	var ttl, wait time.Duration
	var takeover bool
	var k kindFlags
	cmd := &cobra.Command{
		Use:               "acquire NAME [--ttl 30s] [--wait D] [--takeover] [--limit N] [--shared] [--subtree]",
		Short:             "take a lock; print its fencing token and lease id",
		Long:              acquireLong,
		Args:              exactArgs(1, oneName),
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(_ *cobra.Command, args []string) error {
			name := args[0]
			if _, err := takeoverOpts(&g, takeover); err != nil {
				return err
			}
			if err := k.check(); err != nil {
				return err
			}
			c, ctx, done, err := g.connect(wait)
			if err != nil {
				return err
			}
			defer done()
			gr, err := c.Acquire(ctx, name, k.options(client.AcquireOptions{TTL: ttl, Wait: wait, Takeover: takeover}))
			if err != nil {
				printHolder(err)
				return err
			}
			if g.json() {
				return printJSONOut(gr)
			}
			fmt.Printf("acquired %s\nfencing_token  %d\nlease_id       %s\nclient_id      %s\nexpires_at     %s\n",
				gr.Name, gr.FencingToken, gr.LeaseID, gr.ClientID, showTime(gr.ExpiresAt))
			return nil
		},
	}
	cmd.Flags().DurationVar(&ttl, "ttl", 30*time.Second, "lease TTL, 1s to 10m")
	cmd.Flags().DurationVar(&wait, "wait", 0, "wait in line up to this long, at most 1h (0: do not wait)")
	cmd.Flags().BoolVar(&takeover, "takeover", false, takeoverFlagUsage)
	k.register(cmd.Flags())
	return clientCmd(cmd, &g)
}

// printHolder says who holds the lock when an acquire was refused.
func printHolder(err error) {
	var ae *client.APIError
	if errors.As(err, &ae) && ae.Holder != nil && !strings.Contains(err.Error(), strconv.Quote(ae.Holder.ClientID)) {
		fmt.Fprintf(os.Stderr, "dlock: held by %s (fencing token %d, expires %s)\n",
			ae.Holder.ClientID, ae.Holder.FencingToken, showTime(ae.Holder.ExpiresAt))
	}
}

const releaseLong = `Gives a lock taken with dlock acquire back; the next in line gets it at
once. Use the --client-id the lock was acquired with. Exits 4 if that token
and lease do not hold the lock (it expired or was released).`

func newReleaseCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "release NAME --token N --lease-id ID",
		Short: "give a lock taken with dlock acquire back",
		Long:  releaseLong,
	}
	return holderCommand(cmd, func(ctx context.Context, c *client.Client, g *globalFlags, name string, h holderFlags) error {
		if err := c.Release(ctx, name, h.token, h.leaseID); err != nil {
			return err
		}
		if g.json() {
			return printJSONOut(map[string]any{"name": name, "released": true})
		}
		fmt.Printf("released %s\n", name)
		return nil
	})
}

// holderCommand runs a command that proves it holds a lock (release,
// renew): NAME --token --lease-id, under the stable default client id, with a
// not_holder answer explained.
func holderCommand(cmd *cobra.Command, run func(ctx context.Context, c *client.Client, g *globalFlags, name string, h holderFlags) error) *cobra.Command {
	g := globalFlags{stableID: true}
	var h holderFlags
	h.register(cmd.Flags())
	cmd.Args = exactArgs(1, oneName)
	cmd.ValidArgsFunction = cobra.NoFileCompletions
	cmd.RunE = func(_ *cobra.Command, args []string) error {
		if err := h.check(); err != nil {
			return err
		}
		c, ctx, done, err := g.connect(0)
		if err != nil {
			return err
		}
		defer done()
		return notHolderHint(run(ctx, c, &g, args[0], h), c)
	}
	return clientCmd(cmd, &g)
}

const renewLong = `Extends the lease of a lock taken with dlock acquire, optionally with a new
TTL. Use the --client-id the lock was acquired with. Exits 4 if that token
and lease do not hold the lock.`

func newRenewCmd() *cobra.Command {
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "renew NAME --token N --lease-id ID [--ttl D]",
		Short: "extend the lease of a lock taken with dlock acquire",
		Long:  renewLong,
	}
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "new TTL (default: keep it)")
	return holderCommand(cmd, func(ctx context.Context, c *client.Client, g *globalFlags, name string, h holderFlags) error {
		exp, err := c.Renew(ctx, name, h.token, h.leaseID, ttl)
		if err != nil {
			return err
		}
		if g.json() {
			return printJSONOut(map[string]any{"name": name, "renewed": true, "expires_at": exp})
		}
		fmt.Printf("renewed %s until %s\n", name, showTime(exp))
		return nil
	})
}

func newStatusCmd() *cobra.Command {
	var g globalFlags
	cmd := &cobra.Command{
		Use:               "status NAME",
		Short:             "who holds a lock",
		Long:              "Shows who holds a lock, with its fencing token and expiry, and how many wait; a counting, shared or subtree lock with its limit, mode and every holder.",
		Args:              exactArgs(1, oneName),
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(_ *cobra.Command, args []string) error {
			c, ctx, done, err := g.connect(0)
			if err != nil {
				return err
			}
			defer done()
			st, err := c.Status(ctx, args[0])
			if err != nil {
				return err
			}
			if g.json() {
				return printJSONOut(st)
			}
			return printStatus(st)
		},
	}
	return clientCmd(cmd, &g)
}

func newListCmd() *cobra.Command {
	var g globalFlags
	cmd := &cobra.Command{
		Use:               "list [PREFIX]",
		Short:             "locks held or waited for",
		Long:              "Lists the locks that are held or waited for, by name.",
		Args:              rangeArgs(0, 1, "want at most one prefix"),
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(_ *cobra.Command, args []string) error {
			prefix := ""
			if len(args) == 1 {
				prefix = args[0]
			}
			c, ctx, done, err := g.connect(0)
			if err != nil {
				return err
			}
			defer done()
			locks, rev, err := c.ListWithRevision(ctx, prefix)
			if err != nil {
				return err
			}
			if g.json() {
				if locks == nil {
					locks = []client.LockStatus{}
				}
				// revision: dlock watch --from-revision revision+1 sees every later change.
				return printJSONOut(map[string]any{"locks": locks, "revision": rev})
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tHOLDER\tTOKEN\tEXPIRES\tWAITING")
			for _, l := range locks {
				holder, token, exp := "-", "-", "-"
				if l.Holder != nil {
					holder, token, exp = l.Holder.ClientID, strconv.FormatUint(l.Holder.FencingToken, 10), showTime(l.Holder.ExpiresAt)
					if n := len(l.Holders); n > 1 {
						holder += fmt.Sprintf(" (+%d more)", n-1)
					}
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\n", l.Name, holder, token, exp, l.Waiters)
			}
			return tw.Flush()
		},
	}
	return clientCmd(cmd, &g)
}

const membersLong = `Without a subcommand, lists the cluster's nodes as one of them sees them, and
the leader. add, remove and transfer-leadership change them.`

func newMembersCmd() *cobra.Command {
	var g globalFlags
	cmd := &cobra.Command{
		Use:   "members [add|remove|transfer-leadership]",
		Short: "the cluster's nodes and leader; add, remove, transfer leadership",
		Long:  membersLong,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageErrorf("unknown subcommand %q: use add, remove or transfer-leadership", args[0])
			}
			return nil
		},
		RunE: func(_ *cobra.Command, _ []string) error {
			c, ctx, done, err := g.connect(0)
			if err != nil {
				return err
			}
			defer done()
			ci, err := c.ClusterHealth(ctx)
			if err != nil {
				return err
			}
			if g.json() {
				return printJSONOut(ci)
			}
			return printMembers(os.Stdout, ci)
		},
	}
	cmd.AddCommand(newMembersChangeCmds()...)
	return clientCmd(cmd, &g)
}

// printMembers writes the members table and, on a sharded cluster, the
// shards table.
func printMembers(w io.Writer, ci *client.ClusterInfo) error {
	leader := ci.LeaderID
	if leader == "" {
		leader = "none known"
	}
	fmt.Fprintf(w, "leader %s, term %d, as seen by %s\n\n", leader, ci.Term, ci.NodeID)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tSUFFRAGE\tAPI\tRAFT\tAPPLIED\tLAST CONTACT\tVERSION")
	for _, m := range ci.Members {
		contact := "unreachable"
		if m.Reachable {
			contact = fmt.Sprintf("%.1fms", m.LastContactMs)
		}
		version := m.Version
		if version == "" {
			version = "-" // not registered yet, or a build before versions
		}
		state := m.State
		if m.Removing {
			state += " (removing)" // its removal began and has not finished
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", m.ID, state, m.Suffrage, m.APIAddr, m.RaftAddr, m.AppliedIndex, contact, version)
	}
	if err := tw.Flush(); err != nil || len(ci.Shards) == 0 {
		return err
	}
	fmt.Fprintf(w, "\nshard map generation %d\n", ci.ShardGeneration)
	fmt.Fprintln(tw, "SHARD	RANGE	LEADER	TERM	COMMIT	APPLIED	REVISION	LAST TOKEN	REPLICAS")
	for _, sh := range ci.Shards {
		end := strconv.Quote(sh.End)
		if sh.End == "" {
			end = "…"
		}
		leader := sh.LeaderID
		if leader == "" {
			leader = "none known"
		}
		replicas := strings.Join(sh.Replicas, ",")
		if sh.Leaving != "" {
			replicas += " (moving off " + sh.Leaving + ")"
		}
		fmt.Fprintf(tw, "%d\t[%q, %s)\t%s\t%d\t%d\t%d\t%d\t%d\t%s\n", sh.ID, sh.Start, end, leader, sh.Term, sh.CommitIndex, sh.AppliedIndex, sh.Revision, sh.LastFencingToken, replicas)
	}
	return tw.Flush()
}

// notHolderHint says which client id a not_holder answer was about: the usual
// cause is a lock acquired under another --client-id.
func notHolderHint(err error, c *client.Client) error {
	if errors.Is(err, client.ErrNotHolder) {
		return fmt.Errorf("%w (asked as client id %q; a lock acquired under another --client-id, or a wrong --token or --lease-id, is not held by this one)", err, c.ClientID())
	}
	return err
}
