package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dlock/dlock/client"
)

// parseNamed parses a command that takes exactly one lock name.
func parseNamed(fs *cmdFlags, g *globalFlags, args []string) (string, error) {
	pos, rest, err := parseCmd(fs, g, args, 1)
	if err != nil {
		return "", err
	}
	if len(pos) != 1 || len(rest) != 0 {
		return "", usageErrorf("want exactly one lock name")
	}
	return pos[0], nil
}

// holderFlags are the proof of holding that release and renew need.
type holderFlags struct {
	token   uint64
	leaseID string
}

func (h *holderFlags) register(fs *cmdFlags) {
	fs.Uint64Var(&h.token, "token", 0, "fencing token of the grant (required)")
	fs.StringVar(&h.leaseID, "lease-id", "", "lease id of the grant (required)")
}

func (h *holderFlags) check() error {
	if h.token == 0 || h.leaseID == "" {
		return usageErrorf("--token and --lease-id are required (as dlock acquire printed them)")
	}
	return nil
}

const acquireUsage = `Usage: dlock acquire NAME [--ttl 30s] [--wait D] [--takeover] [flags]

Takes a lock and prints its fencing token and lease id. Nothing renews it:
renew it with dlock renew (same --client-id) before the TTL runs out, and
release it with dlock release. To run a command under a lock, use dlock lock.

  --ttl D    lease TTL, 1s to 10m (default 30s)
  --wait D   wait in line up to D, at most 1h (default 0: do not wait)
` + takeoverUsage

func runAcquire(args []string) error {
	fs := newCmdFlags("acquire", acquireUsage)
	g := globalFlags{stableID: true}
	g.register(fs)
	ttl := fs.Duration("ttl", 30*time.Second, "lease TTL")
	wait := fs.Duration("wait", 0, "wait in line up to this long")
	takeover := fs.Bool("takeover", false, takeoverFlagUsage)
	name, err := parseNamed(fs, &g, args)
	if err != nil {
		return err
	}
	if _, err := takeoverOpts(&g, *takeover); err != nil {
		return err
	}
	c, ctx, done, err := g.connect(*wait)
	if err != nil {
		return err
	}
	defer done()
	gr, err := c.Acquire(ctx, name, client.AcquireOptions{TTL: *ttl, Wait: *wait, Takeover: *takeover})
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
}

// printHolder says who holds the lock when an acquire was refused.
func printHolder(err error) {
	var ae *client.APIError
	if errors.As(err, &ae) && ae.Holder != nil && !strings.Contains(err.Error(), strconv.Quote(ae.Holder.ClientID)) {
		fmt.Fprintf(os.Stderr, "dlock: held by %s (fencing token %d, expires %s)\n",
			ae.Holder.ClientID, ae.Holder.FencingToken, showTime(ae.Holder.ExpiresAt))
	}
}

const releaseUsage = `Usage: dlock release NAME --token N --lease-id ID [flags]

Gives a lock taken with dlock acquire back; the next in line gets it at
once. Use the --client-id the lock was acquired with. Exits 4 if that token
and lease do not hold the lock (it expired or was released).
`

func runRelease(args []string) error {
	fs := newCmdFlags("release", releaseUsage)
	return holderCommand(fs, args, func(ctx context.Context, c *client.Client, g *globalFlags, name string, h holderFlags) error {
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
func holderCommand(fs *cmdFlags, args []string, run func(ctx context.Context, c *client.Client, g *globalFlags, name string, h holderFlags) error) error {
	g := globalFlags{stableID: true}
	var h holderFlags
	g.register(fs)
	h.register(fs)
	name, err := parseNamed(fs, &g, args)
	if err != nil {
		return err
	}
	if err := h.check(); err != nil {
		return err
	}
	c, ctx, done, err := g.connect(0)
	if err != nil {
		return err
	}
	defer done()
	return notHolderHint(run(ctx, c, &g, name, h), c)
}

const renewUsage = `Usage: dlock renew NAME --token N --lease-id ID [--ttl D] [flags]

Extends the lease of a lock taken with dlock acquire, optionally with a new
TTL. Use the --client-id the lock was acquired with. Exits 4 if that token
and lease do not hold the lock.
`

func runRenew(args []string) error {
	fs := newCmdFlags("renew", renewUsage)
	ttl := fs.Duration("ttl", 0, "new TTL (default: keep it)")
	return holderCommand(fs, args, func(ctx context.Context, c *client.Client, g *globalFlags, name string, h holderFlags) error {
		exp, err := c.Renew(ctx, name, h.token, h.leaseID, *ttl)
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

const statusUsage = `Usage: dlock status NAME [flags]

Shows who holds a lock, with its fencing token and expiry, and how many wait.
`

func runStatus(args []string) error {
	fs := newCmdFlags("status", statusUsage)
	var g globalFlags
	g.register(fs)
	name, err := parseNamed(fs, &g, args)
	if err != nil {
		return err
	}
	c, ctx, done, err := g.connect(0)
	if err != nil {
		return err
	}
	defer done()
	st, err := c.Status(ctx, name)
	if err != nil {
		return err
	}
	if g.json() {
		return printJSONOut(st)
	}
	if !st.Held {
		fmt.Printf("%s: free, %d waiting\n", st.Name, st.Waiters)
		return nil
	}
	fmt.Printf("%s: held by %s\nfencing_token  %d\ngranted_at     %s\nexpires_at     %s\nwaiting        %d\n",
		st.Name, st.Holder.ClientID, st.Holder.FencingToken, showTime(st.Holder.GrantedAt), showTime(st.Holder.ExpiresAt), st.Waiters)
	return nil
}

const listUsage = `Usage: dlock list [PREFIX] [flags]

Lists the locks that are held or waited for, by name.
`

func runList(args []string) error {
	fs := newCmdFlags("list", listUsage)
	var g globalFlags
	g.register(fs)
	prefix, err := parsePrefix(fs, &g, args)
	if err != nil {
		return err
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
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\n", l.Name, holder, token, exp, l.Waiters)
	}
	return tw.Flush()
}

const membersUsage = `Usage: dlock members [flags]
       dlock members add ID RAFT_ADDR [flags]
       dlock members remove ID [flags]
       dlock members transfer-leadership [ID] [flags]

Without a subcommand, lists the cluster's nodes as one of them sees them, and
the leader.

  add ID RAFT_ADDR          add node ID, reachable for Raft at RAFT_ADDR (its
                            --raft-advertise address); it joins as a
                            non-voter and is promoted once caught up
  remove ID                 take node ID out of the cluster; refused if the
                            remaining voters could not form a quorum
  transfer-leadership [ID]  hand the Raft leadership to node ID, or to the
                            most caught-up other voter (before maintenance
                            on the leader, say)
`

func runMembers(args []string) error {
	if len(args) > 0 {
		switch args[0] {
		case "add", "remove", "transfer-leadership":
			return runMembersChange(args[0], args[1:])
		}
	}
	fs := newCmdFlags("members", membersUsage)
	var g globalFlags
	g.register(fs)
	pos, rest, err := parseCmd(fs, &g, args, 0)
	if err != nil {
		return err
	}
	if len(pos)+len(rest) != 0 {
		return usageErrorf("unknown subcommand %q: use add, remove or transfer-leadership", append(pos, rest...)[0])
	}
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
	leader := ci.LeaderID
	if leader == "" {
		leader = "none known"
	}
	fmt.Printf("leader %s, term %d, as seen by %s\n\n", leader, ci.Term, ci.NodeID)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", m.ID, m.State, m.Suffrage, m.APIAddr, m.RaftAddr, m.AppliedIndex, contact, version)
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

// parsePrefix parses a command that takes at most one name prefix (list,
// watch); "" is every name.
func parsePrefix(fs *cmdFlags, g *globalFlags, args []string) (string, error) {
	pos, rest, err := parseCmd(fs, g, args, 1)
	if err != nil {
		return "", err
	}
	if len(rest) != 0 {
		return "", usageErrorf("want at most one prefix")
	}
	if len(pos) == 1 {
		return pos[0], nil
	}
	return "", nil
}
