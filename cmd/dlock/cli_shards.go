package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
)

const shardsLong = `Changes the ranges of a sharded cluster (dlock serve --shards N) online.
dlock members lists the shards, their ranges, leaders and the map's generation.`

const shardsSplitLong = `Splits the range that holds the top-level name segment AT at it: the names
whose top-level segment is AT or above (up to the end of that range) move to a
new shard, with their holders, waiters (in order), leases, history and token
counter. Clients keep working: requests for the moving names are re-routed, at
worst answered 503 and retried. Prints the new map once the answering node
routes by it.`

func newShardsCmd() *cobra.Command {
	return groupCommand("shards", "change a sharded cluster's ranges online (split, move)", shardsLong, "split",
		newShardsSplitCmd(), newShardsMoveCmd())
}

const shardsMoveLong = `Moves shard SHARD's replica from node FROM to node TO, online: TO joins the
shard's Raft group as a non-voter, catches up (a snapshot, then the log) and is
promoted; leadership leaves FROM if it leads; FROM is removed, stops the shard's
group and deletes its data. Holders, waiters (in their places) and tokens stay;
requests are re-routed, at worst answered 503 and retried. Waits until the move
is done (at most 2 minutes; it goes on after that: run the same move again to
wait for it). dlock members shows each shard's replicas, and "leaving" while a
move runs.`

func newShardsMoveCmd() *cobra.Command {
	var g globalFlags
	var id int
	var from, to string
	cmd := &cobra.Command{
		Use:               "move --shard ID --from NODE --to NODE",
		Short:             "move a shard's replica from one node to another",
		Long:              shardsMoveLong,
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
	}
	cmd.Flags().IntVar(&id, "shard", -1, "the shard's id (dlock members lists them)")
	cmd.Flags().StringVar(&from, "from", "", "the node giving up its replica")
	cmd.Flags().StringVar(&to, "to", "", "the node taking it")
	cmd.RunE = func(*cobra.Command, []string) error {
		if id < 0 || from == "" || to == "" {
			return usageErrorf("give --shard, --from and --to")
		}
		c, ctx, done, err := g.connect(150 * time.Second)
		if err != nil {
			return err
		}
		defer done()
		ci, err := c.MoveShard(ctx, id, from, to)
		if err != nil {
			return err
		}
		if g.json() {
			return printJSONOut(ci)
		}
		fmt.Printf("moved shard %d's replica from %s to %s; the shard map is at generation %d\n", id, from, to, ci.ShardGeneration)
		for _, sh := range ci.Shards {
			fmt.Printf("  shard %d  replicas %v  leader %s\n", sh.ID, sh.Replicas, orNone(sh.LeaderID))
		}
		return nil
	}
	return clientCmd(cmd, &g)
}

func newShardsSplitCmd() *cobra.Command {
	var g globalFlags
	var at string
	cmd := &cobra.Command{
		Use:               "split --at AT",
		Short:             "split a range at a top-level name segment",
		Long:              shardsSplitLong,
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
	}
	cmd.Flags().StringVar(&at, "at", "", "the top-level name segment the new range starts at (strictly inside a range)")
	cmd.RunE = func(*cobra.Command, []string) error {
		if at == "" {
			return usageErrorf("give --at: the top-level name segment to split at")
		}
		// The split waits for the new map to reach the answering node.
		c, ctx, done, err := g.connect(20 * time.Second)
		if err != nil {
			return err
		}
		defer done()
		ci, err := c.SplitShard(ctx, at)
		if err != nil {
			return err
		}
		if g.json() {
			return printJSONOut(ci)
		}
		fmt.Printf("split at %q; the shard map is at generation %d\n", at, ci.ShardGeneration)
		for _, sh := range ci.Shards {
			end := fmt.Sprintf("%q", sh.End)
			if sh.End == "" {
				end = "…"
			}
			fmt.Printf("  shard %d  [%q, %s)  leader %s\n", sh.ID, sh.Start, end, orNone(sh.LeaderID))
		}
		return nil
	}
	return clientCmd(cmd, &g)
}

func orNone(s string) string {
	if s == "" {
		return "none known"
	}
	return s
}
