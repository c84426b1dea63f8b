package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/dlock/dlock/internal/forensics"
	"github.com/dlock/dlock/internal/raftnode"
)

const debugUsage = `Usage (on a COPY of a stopped node's data dir; docs/reliability.md):
  dlock debug log --data-dir DIR [--from N] [--to N] [--log-store wal|bolt]
      list the Raft log entries, decoded (an etcd-engine dir is recognised
      by its RAFT_ENGINE file; --log-store is the hashicorp engine's)
  dlock debug replay --data-dir DIR --snapshot SNAP/state.bin --to N [--compare REF/state.bin]
      restore SNAP, apply the log up to index N and print the resulting
      revision and last token; with --compare, say whether the result is
      byte-for-byte the snapshot REF (taken at index N, on any node)
`

func runDebug(args []string) error {
	if wantsHelp(args) {
		return printHelp(debugUsage)
	}
	if len(args) < 1 || (args[0] != "log" && args[0] != "replay") {
		return usageErrorf("name a subcommand: log or replay")
	}
	fs := flag.NewFlagSet("dlock debug "+args[0], flag.ContinueOnError)
	dataDir := fs.String("data-dir", "", "the node's data dir (a copy: opening it takes its lock)")
	kind := fs.String("log-store", string(raftnode.DefaultLogStore), "the dir's log store: wal or bolt")
	from := fs.Uint64("from", 0, "first index to list")
	to := fs.Uint64("to", ^uint64(0), "last index to list or replay to")
	snap := fs.String("snapshot", "", "state.bin of the snapshot to start from")
	ref := fs.String("compare", "", "state.bin of a snapshot at --to to compare with")
	fs.Usage = func() { fmt.Fprint(fs.Output(), debugUsage) }
	if err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	if *dataDir == "" {
		return usageErrorf("--data-dir is required")
	}
	ls := raftnode.LogStoreKind(*kind)
	if args[0] == "log" {
		return forensics.DumpLog(*dataDir, ls, *from, *to, os.Stdout)
	}
	if *snap == "" || *to == ^uint64(0) {
		return usageErrorf("replay needs --snapshot and --to")
	}
	res, err := forensics.Replay(*snap, *dataDir, ls, *to, *ref)
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
}
