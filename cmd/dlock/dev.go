package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/dlock/dlock/internal/raftnode"
	"github.com/dlock/dlock/internal/server"
)

// newDevCmd is dlock dev printing to out and waiting with wait (tests stop
// the cluster without a signal).
func newDevCmd(out io.Writer, wait func(shutdown func(context.Context) error, info func(string, ...any)) error) *cobra.Command {
	cmd := &cobra.Command{
		Use:               "dev [flags]",
		Short:             "run a local cluster in one process, for trying dlock",
		Long:              "Runs a local cluster in one process with throwaway data, for trying dlock." + configHelp,
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
	}
	fs := cmd.Flags()
	var rf raftFlags
	nodes := fs.Int("nodes", 3, "number of nodes")
	host := fs.String("host", "127.0.0.1", "address to bind (loopback by default)")
	basePort := fs.Int("base-port", 7070, "node i serves HTTP on base+10*i, Raft on base+10*i+1 and gRPC on base+10*i+2")
	dataDir := fs.String("data-dir", "", "keep data in `DIR` (default: a temporary directory removed on exit)")
	withTLS := fs.Bool("tls", false, "TLS on the API and mutual TLS between nodes, with a throwaway CA and certificates made in the data dir")
	withACL := fs.Bool("acl", false, "require ACL tokens (docs/security.md); a management token is bootstrapped and printed")
	rf.register(fs)
	var sf shardFlags
	sf.register(fs)
	var lf limitFlags
	lf.register(fs)
	configPath := registerConfig(fs)
	rf.complete(cmd)
	_ = cmd.MarkFlagDirname("data-dir")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := applyConfig(fs, *configPath, cmd.CommandPath()); err != nil {
			return &usageError{err.Error()}
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
		var dt *devTLS
		if *withTLS {
			if dt, err = newDevTLS(filepath.Join(dir, "tls"), *host); err != nil {
				return err
			}
		}
		cluster := map[string]string{}
		for i := 0; i < *nodes; i++ {
			cluster[fmt.Sprintf("n%d", i+1)] = fmt.Sprintf("%s:%d", *host, *basePort+10*i+1)
		}
		var servers []*server.Server
		shutdown := func(ctx context.Context) error {
			for _, s := range servers {
				s.Node.Stopping()
			}
			var errs []error
			for _, s := range servers {
				errs = append(errs, s.Shutdown(ctx))
			}
			return errors.Join(errs...)
		}
		limits, err := lf.limits()
		if err != nil {
			return err
		}
		for i := 0; i < *nodes; i++ {
			id := fmt.Sprintf("n%d", i+1)
			rc := raftnode.Config{ID: id, DataDir: filepath.Join(dir, id), RaftAddr: cluster[id], InitialCluster: cluster, Logger: logger, PeerTLS: dt.peerConfig()}
			if err := rf.apply(&rc); err != nil {
				return err
			}
			shards, err := sf.apply(&rc)
			if err != nil {
				return err
			}
			s, err := server.Start(server.Config{Raft: rc, TLS: dt.apiConfig(), APIAddr: fmt.Sprintf("%s:%d", *host, *basePort+10*i),
				GRPCAddr: fmt.Sprintf("%s:%d", *host, *basePort+10*i+2), MaxBodyBytes: rf.maxBody, Logger: logger, EnablePprof: rf.pprof, DisableConsole: !rf.ui, Limits: limits, ACL: *withACL, Shards: shards})
			if err != nil {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_ = shutdown(ctx)
				cancel()
				return err
			}
			servers = append(servers, s)
		}
		fmt.Fprintf(out, "dlock dev cluster: %d nodes, data in %s\n", *nodes, dir)
		var urls []string
		for i, s := range servers {
			urls = append(urls, dt.scheme()+s.APIAddr())
			fmt.Fprintf(out, "  n%d  %s  (raft %s)  grpc %s\n", i+1, urls[i], cluster[fmt.Sprintf("n%d", i+1)], s.GRPCAddr())
		}
		dt.printFiles(out)
		curl := "curl -s " + dt.curlFlags()
		if *withACL {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			tok, err := servers[0].ACLBootstrap(ctx)
			cancel()
			if err != nil {
				_ = shutdown(context.Background())
				return fmt.Errorf("bootstrap the ACL management token: %w", err)
			}
			fmt.Fprintf(out, `
	ACLs are on. The management token (all permissions; shown only now):
	  export DLOCK_ACL_TOKEN=%s
	Make a worker token: dlock acl token create --rule billing/=lock,read --client-ids 'worker-*'
	`, tok.SecretID)
			curl += "-H 'Authorization: Bearer " + tok.SecretID + "' "
		}
		fmt.Fprintf(out, `
	Try:
	  %[2]s--json '{"client_id":"me","ttl_ms":30000}' %[1]s/api/v1/locks/demo/acquire
	  %[2]s%[1]s/api/v1/locks/demo
	  %[2]s%[1]s/api/v1/cluster
	`, urls[0], curl)
		if rf.ui {
			fmt.Fprintf(out, "\nWeb console (every node serves it): %s/ui/\n", urls[0])
		}
		dt.printCLIEnv(out, urls)
		fmt.Fprint(out, "\nPress Ctrl-C to stop.\n")
		return wait(shutdown, logger.Info)
	}
	return cmd
}
