package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/dlock/dlock/internal/raftnode"
	"github.com/dlock/dlock/internal/server"
)

func runDev(args []string) error {
	fs := flag.NewFlagSet("dlock dev", flag.ContinueOnError)
	var rf raftFlags
	nodes := fs.Int("nodes", 3, "number of nodes")
	host := fs.String("host", "127.0.0.1", "address to bind (loopback by default)")
	basePort := fs.Int("base-port", 7070, "node i serves HTTP on base+10*i, Raft on base+10*i+1 and gRPC on base+10*i+2")
	dataDir := fs.String("data-dir", "", "keep data here (default: a temporary directory removed on exit)")
	rf.register(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: dlock dev [flags]\n\nRuns a local cluster in one process with throwaway data, for trying dlock.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return errUsage
	}
	if *nodes < 1 || *nodes > 9 {
		return fmt.Errorf("--nodes must be between 1 and 9")
	}
	logger, err := newLogger(rf.logLevel, rf.logFormat)
	if err != nil {
		return err
	}
	dir := *dataDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "dlock-dev-"); err != nil {
			return fmt.Errorf("make a temporary data dir: %w", err)
		}
		defer os.RemoveAll(dir)
	}
	cluster := map[string]string{}
	for i := 0; i < *nodes; i++ {
		cluster[fmt.Sprintf("n%d", i+1)] = fmt.Sprintf("%s:%d", *host, *basePort+10*i+1)
	}
	var servers []*server.Server
	shutdown := func(ctx context.Context) error {
		var errs []error
		for _, s := range servers {
			errs = append(errs, s.Shutdown(ctx))
		}
		return errors.Join(errs...)
	}
	for i := 0; i < *nodes; i++ {
		id := fmt.Sprintf("n%d", i+1)
		rc := raftnode.Config{ID: id, DataDir: filepath.Join(dir, id), RaftAddr: cluster[id], InitialCluster: cluster, Logger: logger}
		if err := rf.apply(&rc); err != nil {
			return err
		}
		s, err := server.Start(server.Config{Raft: rc, APIAddr: fmt.Sprintf("%s:%d", *host, *basePort+10*i),
			GRPCAddr: fmt.Sprintf("%s:%d", *host, *basePort+10*i+2), MaxBodyBytes: rf.maxBody, Logger: logger, EnablePprof: rf.pprof})
		if err != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = shutdown(ctx)
			cancel()
			return err
		}
		servers = append(servers, s)
	}
	first := servers[0].APIAddr()
	fmt.Printf("dlock dev cluster: %d nodes, data in %s\n", *nodes, dir)
	for i, s := range servers {
		fmt.Printf("  n%d  http://%s  (raft %s)  grpc %s\n", i+1, s.APIAddr(), cluster[fmt.Sprintf("n%d", i+1)], s.GRPCAddr())
	}
	fmt.Printf(`
Try:
  curl -s --json '{"client_id":"me","ttl_ms":30000}' http://%[1]s/api/v1/locks/demo/acquire
  curl -s http://%[1]s/api/v1/locks/demo
  curl -s http://%[1]s/api/v1/cluster

Press Ctrl-C to stop.
`, first)
	return waitForSignal(shutdown, logger.Info)
}
