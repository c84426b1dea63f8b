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
	return groupCommand("shards", "change a sharded cluster's ranges online (split)", shardsLong, "split",
		newShardsSplitCmd())
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
