package main

import (
	"fmt"
	"os"
	"strconv"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/dlock/dlock/client"
)

const historyLong = `Shows who held a lock recently, newest first: the grant that holds it now,
then those that ended, with their fencing tokens, when they were granted and
ended, how they ended (released, expired, session_deleted, revoked with the
operator's reason, taken_over, resigned), their TTL and holder value. The
cluster keeps this history replicated on every node, within the retention its
leader was started with (dlock serve --history-*).`

func newHistoryCmd() *cobra.Command {
	var g globalFlags
	var limit int
	var election bool
	cmd := &cobra.Command{
		Use:               "history NAME [--limit N] [--election]",
		Short:             "who held a lock recently, and how each grant ended",
		Long:              historyLong,
		Example:           "  dlock history billing/batch-job\n  dlock history billing/batch-job --limit 3 -o json",
		Args:              exactArgs(1, oneName),
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(_ *cobra.Command, args []string) error {
			if limit < 0 {
				return usageErrorf("--limit %d must not be negative (0: all that are kept)", limit)
			}
			c, ctx, done, err := g.connect(0)
			if err != nil {
				return err
			}
			defer done()
			h, err := c.History(ctx, args[0], client.HistoryOptions{Limit: limit, Election: election})
			if err != nil {
				return err
			}
			if g.json() {
				if h.Grants == nil {
					h.Grants = []client.GrantRecord{}
				}
				return printJSONOut(h)
			}
			if len(h.Grants) == 0 {
				fmt.Printf("%s: no grants in the history\n", h.Name)
				return nil
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "TOKEN\tHOLDER\tGRANTED\tENDED\tEND CAUSE\tTTL\tVALUE\tREASON")
			for _, gr := range h.Grants {
				cause, ended := gr.EndCause, showTime(gr.EndedAt)
				if cause == "" {
					cause, ended = "(holds it)", "-"
				}
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", gr.FencingToken, gr.ClientID, showTime(gr.GrantedAt), ended, cause,
					msString(gr.TTLms), dash(gr.Value), dash(gr.Reason))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().IntVar(&limit, "limit", 0, "show at most `N` grants (0: all that are kept)")
	cmd.Flags().BoolVar(&election, "election", false, "NAME is an election's")
	return clientCmd(cmd, &g)
}

const revokeLong = `Ends a grant of a lock by force, for an operator freeing a lock whose holder is
stuck: the next in line gets the lock at once with a higher fencing token (or
after the grant's lock-delay), the reason goes into the lock's history and
watch event, and the old holder's next renewal answers lock_lost (dlock lock
then signals its command). A fenced resource refuses the old holder's late
writes by their lower token. Without --token, whoever holds the lock is
revoked. With --election NAME is an election: its leader's seat is revoked
and the next campaigner elected (dlock elect then signals its command). With
ACLs it needs a token with the revoke permission on the name, or admin.
Exits 1 with not_found if no such grant holds the lock.`

func newRevokeCmd() *cobra.Command {
	var g globalFlags
	var token uint64
	var reason string
	var election bool
	cmd := &cobra.Command{
		Use:               "revoke NAME [--token T] [--election] --reason TEXT",
		Short:             "end a stuck holder's grant by force (operators)",
		Long:              revokeLong,
		Example:           "  dlock history billing/batch-job\n  dlock revoke billing/batch-job --token 42 --reason \"holder paused since 02:13\"",
		Args:              exactArgs(1, oneName),
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(_ *cobra.Command, args []string) error {
			if reason == "" {
				return usageErrorf("--reason is required: say why (it is kept in the lock's history)")
			}
			c, ctx, done, err := g.connect(0)
			if err != nil {
				return err
			}
			defer done()
			revoke := c.Revoke
			if election {
				revoke = c.RevokeElection
			}
			tokens, err := revoke(ctx, args[0], token, reason)
			if err != nil {
				return err
			}
			if g.json() {
				out := map[string]any{"name": args[0], "revoked": true, "fencing_tokens": tokens}
				return printJSONOut(out)
			}
			for _, t := range tokens {
				fmt.Printf("revoked %s fencing_token %d\n", args[0], t)
			}
			return nil
		},
	}
	cmd.Flags().Uint64Var(&token, "token", 0, "fencing token `T` of the grant to revoke (default: whoever holds it)")
	cmd.Flags().StringVar(&reason, "reason", "", "why, in at most 256 bytes (required; kept in the history)")
	cmd.Flags().BoolVar(&election, "election", false, "NAME is an election: revoke its leader's seat")
	return clientCmd(cmd, &g)
}

func msString(ms int64) string {
	if ms == 0 {
		return "-"
	}
	return strconv.FormatInt(ms/1000, 10) + "s"
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
