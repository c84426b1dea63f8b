package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/dlock/dlock/internal/raftnode"
	"github.com/dlock/dlock/internal/tlsconfig"
)

func newSnapshotCmd() *cobra.Command {
	return groupCommand("snapshot", "back up a cluster, seed a new one from a backup",
		`Saves a consistent copy of a running cluster's whole state, or seeds the data
dirs of a new cluster from one (docs/operations.md, "Backup and restore").`,
		"save or restore", newSnapshotSaveCmd(), newSnapshotRestoreCmd())
}

// snapshotFile is the one FILE argument of snapshot save and restore.
var snapshotFile = func(_ *cobra.Command, args []string) error {
	switch {
	case len(args) == 0:
		return usageErrorf("name the snapshot FILE")
	case len(args) > 1:
		return usageErrorf("unexpected arguments %v", args[1:])
	}
	return nil
}

func newSnapshotSaveCmd() *cobra.Command {
	var g globalFlags // only its TLS flags and the ACL token
	var endpoints string
	var force bool
	cmd := &cobra.Command{
		Use:   "save FILE [--endpoints URLS] [--force]",
		Short: "save a consistent copy of the whole state to FILE",
		Long: `Saves a consistent copy of the whole state (locks, leases, queues, counters)
from a running cluster to FILE, never overwriting it without --force. With
--acl, the token needs the admin permission.`,
		Args: snapshotFile,
		RunE: func(_ *cobra.Command, args []string) error {
			file := args[0]
			tlsCfg, err := g.tls()
			if err != nil {
				return err
			}
			if !force {
				if _, err := os.Lstat(file); err == nil {
					return fmt.Errorf("%s already exists: name a new file, or pass --force to overwrite it", file)
				}
			}
			var errs []error
			for ep := range strings.SplitSeq(endpoints, ",") {
				if ep = strings.TrimSpace(ep); ep == "" {
					continue
				}
				err := saveSnapshot(ep, file, tlsCfg, g.token)
				if err == nil {
					return nil
				}
				errs = append(errs, err)
			}
			if len(errs) == 0 {
				return usageErrorf("--endpoints is empty")
			}
			return errors.Join(errs...)
		},
	}
	fs := cmd.Flags()
	def := os.Getenv("DLOCK_ENDPOINTS")
	if def == "" {
		def = defaultEndpoints
	}
	fs.StringVar(&endpoints, "endpoints", def, "comma-separated API `URLS` of the cluster's members (env DLOCK_ENDPOINTS; default: the dlock dev nodes); the first that answers is used")
	// --endpoint, singular, is an older spelling of --endpoints.
	cmd.SetGlobalNormalizationFunc(func(_ *pflag.FlagSet, name string) pflag.NormalizedName {
		if name == "endpoint" {
			name = "endpoints"
		}
		return pflag.NormalizedName(name)
	})
	fs.BoolVar(&force, "force", false, "overwrite FILE if it exists")
	g.registerTLS(fs)
	fs.StringVar(&g.token, "acl-token", aclTokenEnv(), "ACL token `SECRET` with the admin permission (env DLOCK_ACL_TOKEN), for clusters run with --acl")
	return cmd
}

func newSnapshotRestoreCmd() *cobra.Command {
	var dataDir, initial, logStore, engine string
	cmd := &cobra.Command{
		Use:   "restore FILE --data-dir DIR --initial-cluster id=host:port,... [--raft-engine hashicorp|etcd]",
		Short: "seed an empty data dir from FILE for a new cluster",
		Long: `Seeds an EMPTY data dir from FILE for a new cluster with these members. Do it
for every member (same FILE, same --initial-cluster), then start them with
dlock serve (without --initial-cluster). --raft-engine picks the new cluster's
replication engine: restoring a snapshot of a cluster of one engine into data
dirs of the other is how a cluster moves between engines.`,
		Args: snapshotFile,
		RunE: func(_ *cobra.Command, args []string) error {
			file := args[0]
			peers, err := parseCluster(initial)
			if err != nil {
				return err
			}
			if dataDir == "" || len(peers) == 0 {
				return usageErrorf("--data-dir and --initial-cluster are required")
			}
			b, err := os.ReadFile(file)
			if err != nil {
				return fmt.Errorf("read snapshot: %w", err)
			}
			b, err = raftnode.ReadBackup(b)
			switch {
			case errors.Is(err, raftnode.ErrBackupUnchecked):
				fmt.Fprintf(os.Stderr, "warning: %s: %v\n", file, err)
			case err != nil:
				return fmt.Errorf("refusing %s: %w; restore from another copy of the backup (nothing was written to %s)", file, err, dataDir)
			}
			eng, err := raftnode.ParseEngine(engine)
			if err != nil {
				return usageErrorf("--raft-engine: %v", err)
			}
			info, err := raftnode.RestoreSnapshotOn(eng, dataDir, raftnode.LogStoreKind(logStore), b, peers)
			if err != nil {
				return err
			}
			fmt.Printf("seeded %s from %s (%d bytes); start it with dlock serve --data-dir %s (no --initial-cluster)\n", dataDir, file, len(b), dataDir)
			if info.RetiredKeyOK {
				fmt.Printf("the old cluster's token-signing key %x is retired here (it verifies proofs of tokens up to %d only); the new cluster's first leader starts a new key. Retire the old cluster, and keep the snapshot file as secret as the cluster: it holds the old key's seed and every lease id\n",
					info.RetiredKey.ID, info.RetiredKey.MaxToken)
			}
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&dataDir, "data-dir", "", "empty data `DIR` to seed (required)")
	fs.StringVar(&initial, "initial-cluster", "", "the new cluster's members as id=raft-host:port,... (required)")
	fs.StringVar(&logStore, "log-store", string(raftnode.DefaultLogStore), "log store for the new data dir: wal or bolt")
	completeWords(cmd, "log-store", "wal", "bolt")
	fs.StringVar(&engine, "raft-engine", string(raftnode.DefaultEngine), "replication engine of the new data dir: hashicorp or etcd")
	completeWords(cmd, "raft-engine", "hashicorp", "etcd")
	_ = cmd.MarkFlagDirname("data-dir")
	return cmd
}

func saveSnapshot(endpoint, file string, tlsCfg *tls.Config, aclToken string) error {
	client := &http.Client{Timeout: 5 * time.Minute, Transport: tlsconfig.HTTPTransport(tlsCfg)}
	req, err := http.NewRequest(http.MethodGet, strings.TrimRight(endpoint, "/")+"/api/v1/cluster/snapshot", nil)
	if err != nil {
		return fmt.Errorf("bad --endpoint %q: %w", endpoint, err)
	}
	if aclToken != "" {
		req.Header.Set("Authorization", "Bearer "+aclToken)
	}
	res, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("fetch snapshot from %s: %w", endpoint, err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
		return fmt.Errorf("fetch snapshot from %s: %s: %s", endpoint, res.Status, strings.TrimSpace(string(msg)))
	}
	// Write beside the target and rename, so a failed save never leaves a
	// truncated file under the final name.
	tmp, err := os.CreateTemp(filepath.Dir(file), ".dlock-snapshot-*")
	if err != nil {
		return fmt.Errorf("create %s: %w", file, err)
	}
	n, err := raftnode.WriteBackup(tmp, res.Body)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), file)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", file, err)
	}
	fmt.Printf("saved %d bytes at revision %s to %s\n", n, res.Header.Get("X-Dlock-Revision"), file)
	return nil
}

func newRecoverCmd() *cobra.Command {
	var dataDir, peersFlag string
	cmd := &cobra.Command{
		Use:   "recover --data-dir DIR --peers id=host:port,...",
		Short: "force the members after a quorum loss",
		Long: `After a quorum loss, on a STOPPED node: forces the member list to the
surviving nodes. Run it with the same --peers on each survivor, then start
them (docs/operations.md, "Quorum loss").`,
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(_ *cobra.Command, _ []string) error {
			peers, err := parseCluster(peersFlag)
			if err != nil {
				return err
			}
			if dataDir == "" || len(peers) == 0 {
				return usageErrorf("--data-dir and --peers are required")
			}
			if err := raftnode.Recover(dataDir, peers); err != nil {
				return err
			}
			fmt.Printf("recovered %s with members %s; start the node with dlock serve\n", dataDir, peersFlag)
			return nil
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", "", "data `DIR` of a STOPPED node (required)")
	cmd.Flags().StringVar(&peersFlag, "peers", "", "the surviving members as id=raft-host:port,... (required)")
	_ = cmd.MarkFlagDirname("data-dir")
	return cmd
}
