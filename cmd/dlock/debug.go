package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/dlock/dlock/internal/forensics"
	"github.com/dlock/dlock/internal/raftnode"
)

const debugLong = `Reads a stopped node's Raft log, on a COPY of its data dir (opening it takes
its lock; docs/reliability.md).`

func newDebugCmd() *cobra.Command {
	return groupCommand("debug", "read a stopped node's log (forensics)", debugLong, "log or replay",
		newDebugLogCmd(), newDebugReplayCmd())
}

// debugFlags are the flags of both debug subcommands.
type debugFlags struct {
	dataDir, kind string
	to            uint64
}

func (f *debugFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.dataDir, "data-dir", "", "the node's data `DIR` (a copy: opening it takes its lock) (required)")
	cmd.Flags().StringVar(&f.kind, "log-store", string(raftnode.DefaultLogStore), "the dir's log store: wal or bolt")
	completeWords(cmd, "log-store", "wal", "bolt")
	_ = cmd.MarkFlagDirname("data-dir")
	cmd.Args = noArgs
	cmd.ValidArgsFunction = cobra.NoFileCompletions
}

func newDebugLogCmd() *cobra.Command {
	var f debugFlags
	var from uint64
	cmd := &cobra.Command{
		Use:   "log --data-dir DIR [--from N] [--to N] [--log-store wal|bolt]",
		Short: "list the Raft log entries, decoded",
		Long: "Lists the Raft log entries, decoded. A data dir of the etcd engine is recognised by\n" +
			"its RAFT_ENGINE file (--log-store is the hashicorp engine's).\n\n" + debugLong,
		RunE: func(_ *cobra.Command, _ []string) error {
			if f.dataDir == "" {
				return usageErrorf("--data-dir is required")
			}
			return forensics.DumpLog(f.dataDir, raftnode.LogStoreKind(f.kind), from, f.to, os.Stdout)
		},
	}
	f.register(cmd)
	cmd.Flags().Uint64Var(&from, "from", 0, "first index to list")
	cmd.Flags().Uint64Var(&f.to, "to", ^uint64(0), "last index to list")
	return cmd
}

func newDebugReplayCmd() *cobra.Command {
	var f debugFlags
	var snap, ref string
	cmd := &cobra.Command{
		Use:   "replay --data-dir DIR --snapshot SNAP/state.bin --to N [--compare REF/state.bin]",
		Short: "replay the log onto a snapshot; compare with another",
		Long: `Restores SNAP, applies the log up to index N and prints the resulting
revision and last token; with --compare, says whether the result is
byte-for-byte the snapshot REF (taken at index N, on any node).

` + debugLong,
		RunE: func(_ *cobra.Command, _ []string) error {
			if f.dataDir == "" {
				return usageErrorf("--data-dir is required")
			}
			if snap == "" || f.to == ^uint64(0) {
				return usageErrorf("replay needs --snapshot and --to")
			}
			res, err := forensics.Replay(snap, f.dataDir, raftnode.LogStoreKind(f.kind), f.to, ref)
			if err != nil {
				return err
			}
			fmt.Printf("replayed %d..%d: revision %d, last token %d\n", res.FromIndex, res.ToIndex, res.Revision, res.LastToken)
			if res.Compared {
				verdict := "DIFFERENT"
				if res.Same {
					verdict = "identical"
				}
				fmt.Printf("reference at index %d: revision %d, last token %d: %s\n", res.RefIndex, res.RefRevision, res.RefLastTok, verdict)
				if !res.Same {
					return fmt.Errorf("the replayed state differs from the reference")
				}
			}
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().Uint64Var(&f.to, "to", ^uint64(0), "the index to replay to (required)")
	cmd.Flags().StringVar(&snap, "snapshot", "", "state.bin of the snapshot to start from (required)")
	cmd.Flags().StringVar(&ref, "compare", "", "state.bin of a snapshot at --to to compare with")
	return cmd
}
