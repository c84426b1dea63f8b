package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/dlock/dlock/internal/demo"
)

// runDemo runs the fencing demo (package demo) with this binary as the
// cluster's nodes, the data store and the paused client.
func runDemo(args []string) error {
	fs := flag.NewFlagSet("dlock demo", flag.ContinueOnError)
	keep := fs.Bool("keep", false, "keep the work dir (every process's data and log) after a successful run")
	dir := fs.String("dir", "", "work dir, new or empty (default: a temporary dir, removed after a successful run unless --keep)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: dlock demo [--keep] [--dir DIR]

Runs the fencing demo with real processes and checks it: a
5-node cluster of dlock serve, a dlock datastore, and three clients that
contend for locks, outlive a leader crash, write late after a pause
(refused: stale_token) and forge a token (refused: bad_proof). Takes about
half a minute; exits non-zero naming the step whose expectation failed.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	// Ctrl-C ends the current step; Run still stops every process it started.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := demo.Run(ctx, demo.Config{Dir: *dir, Keep: *keep, Out: os.Stdout}); err != nil {
		return fmt.Errorf("demo failed: %w", err)
	}
	return nil
}

// runDemoWriter is `dlock demo-writer`, the demo's paused client: a hidden
// command that only `dlock demo` starts.
func runDemoWriter(args []string) error {
	fs := flag.NewFlagSet("dlock demo-writer", flag.ContinueOnError)
	var cfg demo.WriterConfig
	endpoints := fs.String("endpoints", "", "comma-separated node URLs")
	fs.StringVar(&cfg.ClientID, "client-id", "", "holder id")
	fs.StringVar(&cfg.Lock, "lock", "", "lock to take")
	fs.DurationVar(&cfg.TTL, "ttl", 2*time.Second, "lease TTL")
	fs.StringVar(&cfg.StoreURL, "datastore", "", "data store base URL")
	fs.StringVar(&cfg.Data, "data", "", "what to write")
	fs.DurationVar(&cfg.MaxWait, "max-wait", time.Minute, "bound on the wait for the lock and then for the go-ahead on stdin")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *endpoints != "" {
		cfg.Endpoints = strings.Split(*endpoints, ",")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return demo.RunWriter(ctx, cfg, os.Stdin, os.Stdout)
}
