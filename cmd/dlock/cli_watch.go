package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/dlock/dlock/client"
)

const watchLong = `Prints every change to the locks, elections and sessions whose names start
with PREFIX as it happens, one line per event, until interrupted (exit 0).
-o json prints one JSON object per line. A broken connection is resumed on
another node without losing or repeating events.

To see every change after a listing, take the "revision" of dlock list -o
json and watch from it + 1 (--from-revision). Exits 1 if that revision is
older than the history the nodes keep (the last 10,000 events): list again
and watch from the new revision + 1.`

func newWatchCmd() *cobra.Command {
	var g globalFlags
	var from uint64
	cmd := &cobra.Command{
		Use:               "watch [PREFIX] [--from-revision N]",
		Short:             "print changes as they happen",
		Long:              watchLong,
		Args:              rangeArgs(0, 1, "want at most one prefix"),
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(_ *cobra.Command, args []string) error {
			prefix := ""
			if len(args) == 1 {
				prefix = args[0]
			}
			return runWatch(&g, prefix, from)
		},
	}
	cmd.Flags().Uint64Var(&from, "from-revision", 0, "start at revision `N` instead of now")
	return clientCmd(cmd, &g)
}

func runWatch(g *globalFlags, prefix string, from uint64) error {
	c, err := g.client()
	if err != nil {
		return err
	}
	defer c.Close()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	// The watch itself retries an unreachable cluster for ever; say so now
	// rather than wait in silence.
	cctx, cancel := context.WithTimeout(ctx, g.timeout)
	_, err = c.Cluster(cctx)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	enc := json.NewEncoder(os.Stdout)
	for ev, err := range c.Watch(ctx, prefix, from) {
		if err != nil {
			var ce *client.CompactedError
			if errors.As(err, &ce) {
				return fmt.Errorf("revision %d is no longer kept (current revision %d): list again and watch from its revision + 1", ce.Requested, ce.Current)
			}
			return err
		}
		if g.json() {
			if err := enc.Encode(ev); err != nil {
				return err
			}
			continue
		}
		if _, err := fmt.Println(formatEvent(ev)); err != nil {
			return err
		}
	}
	return nil
}

// formatEvent is the human form of an event:
// "42 lock billing/job acquired client=w7 token=9 cause=handoff".
func formatEvent(ev client.WatchEvent) string {
	var b strings.Builder
	name := ev.Name
	if name == "" {
		name = "-" // session events have no name
	}
	fmt.Fprintf(&b, "%d %s %s %s", ev.Revision, ev.Kind, name, ev.Type)
	if ev.ClientID != "" {
		fmt.Fprintf(&b, " client=%s", ev.ClientID)
	}
	if ev.FencingToken != 0 {
		fmt.Fprintf(&b, " token=%d", ev.FencingToken)
	}
	if ev.Cause != "" {
		fmt.Fprintf(&b, " cause=%s", ev.Cause)
	}
	if ev.Value != "" {
		fmt.Fprintf(&b, " value=%q", ev.Value)
	}
	return b.String()
}
