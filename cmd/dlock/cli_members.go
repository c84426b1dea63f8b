package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/dlock/dlock/client"
)

// newMembersChangeCmds are dlock members add, remove and
// transfer-leadership.
func newMembersChangeCmds() []*cobra.Command {
	return []*cobra.Command{
		membersChangeCmd("add ID RAFT_ADDR", "add a node, by its Raft address",
			`Adds node ID, reachable for Raft at RAFT_ADDR (its --raft-advertise
address); it joins as a non-voter and is promoted once caught up.`, exactArgs(2, "want: dlock members add ID RAFT_ADDR")),
		membersChangeCmd("remove ID", "take a node out of the cluster",
			`Takes node ID out of the cluster; refused if the remaining voters could
not form a quorum.`, exactArgs(1, "want: dlock members remove ID")),
		membersChangeCmd("transfer-leadership [ID]", "hand the Raft leadership to another node",
			`Hands the Raft leadership to node ID, or to the most caught-up other voter
(before maintenance on the leader, say), and says who leads then.`, rangeArgs(0, 1, "want: dlock members transfer-leadership [ID]")),
	}
}

func membersChangeCmd(use, short, long string, args cobra.PositionalArgs) *cobra.Command {
	var g globalFlags
	cmd := &cobra.Command{Use: use, Short: short, Long: long, Args: args, ValidArgsFunction: cobra.NoFileCompletions}
	cmd.RunE = func(cmd *cobra.Command, pos []string) error {
		c, ctx, done, err := g.connect(0)
		if err != nil {
			return err
		}
		defer done()
		var ci *client.ClusterInfo
		var msg string
		switch cmd.Name() {
		case "add":
			ci, err = c.AddMember(ctx, pos[0], pos[1])
			msg = fmt.Sprintf("added %s (%s); it is promoted to voter once caught up", pos[0], pos[1])
		case "remove":
			ci, err = c.RemoveMember(ctx, pos[0])
			msg = "removed " + pos[0]
		case "transfer-leadership":
			to := ""
			if len(pos) == 1 {
				to = pos[0]
			}
			ci, err = transferLeadership(ctx, c, to)
			if err == nil {
				msg = "leader is now " + ci.LeaderID
			}
		}
		if err != nil {
			return err
		}
		if g.json() {
			return printJSONOut(ci)
		}
		fmt.Println(msg)
		return nil
	}
	return clientCmd(cmd, &g)
}

// transferLeadership hands leadership on and waits until a node names the
// new leader, so the answer says who leads.
func transferLeadership(ctx context.Context, c *client.Client, to string) (*client.ClusterInfo, error) {
	before, err := c.Cluster(ctx)
	if err != nil {
		return nil, err
	}
	ci, err := c.TransferLeadership(ctx, to)
	if err != nil {
		return nil, err
	}
	for {
		if ci.LeaderID != "" && (ci.LeaderID == to || (to == "" && ci.LeaderID != before.LeaderID)) {
			return ci, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("leadership was handed over, but no node named the new leader in time: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
		if next, err := c.Cluster(ctx); err == nil {
			ci = next
		}
	}
}
