package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/dlock/dlock/internal/demo"
)

// newDemoCmd runs the fencing demo (package demo) with this binary as the
// cluster's nodes, the data store and the paused client.
func newDemoCmd() *cobra.Command {
	var keep bool
	var dir string
	cmd := &cobra.Command{
		Use:   "demo [--keep] [--dir DIR]",
		Short: "run the fencing demo: 5 nodes, a data store, 3 clients",
		Long: `Runs the fencing demo with real processes and checks it: a
5-node cluster of dlock serve, a dlock datastore, and three clients that
contend for locks, outlive a leader crash, write late after a pause
(refused: stale_token) and forge a token (refused: bad_proof). Takes about
half a minute; exits non-zero naming the step whose expectation failed.`,
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(_ *cobra.Command, _ []string) error {
			// Ctrl-C ends the current step; Run still stops every process it started.
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if err := demo.Run(ctx, demo.Config{Dir: dir, Keep: keep, Out: os.Stdout}); err != nil {
				return fmt.Errorf("demo failed: %w", err)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&keep, "keep", false, "keep the work dir (every process's data and log) after a successful run")
	cmd.Flags().StringVar(&dir, "dir", "", "work `DIR`, new or empty (default: a temporary dir, removed after a successful run unless --keep)")
	_ = cmd.MarkFlagDirname("dir")
	return cmd
}

// newDemoWriterCmd is `dlock demo-writer`, the demo's paused client: a
// hidden command that only `dlock demo` starts.
func newDemoWriterCmd() *cobra.Command {
	var cfg demo.WriterConfig
	var endpoints string
	cmd := &cobra.Command{
		Use:    "demo-writer",
		Short:  "the fencing demo's paused client (started by dlock demo)",
		Hidden: true,
		Args:   noArgs,
		RunE: func(_ *cobra.Command, _ []string) error {
			if endpoints != "" {
				cfg.Endpoints = strings.Split(endpoints, ",")
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return demo.RunWriter(ctx, cfg, os.Stdin, os.Stdout)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&endpoints, "endpoints", "", "comma-separated node URLs")
	fs.StringVar(&cfg.ClientID, "client-id", "", "holder id")
	fs.StringVar(&cfg.Lock, "lock", "", "lock to take")
	fs.DurationVar(&cfg.TTL, "ttl", 2*time.Second, "lease TTL")
	fs.StringVar(&cfg.StoreURL, "datastore", "", "data store base URL")
	fs.StringVar(&cfg.Data, "data", "", "what to write")
	fs.DurationVar(&cfg.MaxWait, "max-wait", time.Minute, "bound on the wait for the lock and then for the go-ahead on stdin")
	fs.BoolVar(&cfg.ReportLease, "report-lease", false, "after the write, report how the lease ended (waits at most the TTL)")
	fs.BoolVar(&cfg.Session, "session", false, "hold the lock under a session of --ttl")
	return cmd
}
