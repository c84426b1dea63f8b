package main

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/dlock/dlock/internal/raftnode"
	"github.com/dlock/dlock/internal/tlsconfig"
)

const recoverUsage = `Usage:
  dlock recover --data-dir DIR --peers id=host:port,...
      after a quorum loss, on a STOPPED node: force the member list to the
      surviving nodes; run it with the same --peers on each survivor, then
      start them (docs/operations.md, "Quorum loss")
`

const snapshotUsage = `Usage:
  dlock snapshot save FILE [--endpoints URLS] [--force] [--acl-token SECRET] [--cacert F] [--cert F --key F]
      save a consistent copy of the whole state (locks, leases, queues,
      counters) from a running cluster to FILE (never overwritten without
      --force); --endpoints defaults to env DLOCK_ENDPOINTS, then the
      dlock dev nodes; with --acl the token (or env DLOCK_ACL_TOKEN) needs the
      admin permission
  dlock snapshot restore FILE --data-dir DIR --initial-cluster id=host:port,... [--raft-engine hashicorp|etcd]
      seed an EMPTY data dir from FILE for a new cluster with these members;
      do it for every member (same FILE, same --initial-cluster), then start
      them with dlock serve (without --initial-cluster); --raft-engine picks
      the new cluster's engine (this is how a cluster moves between engines)
  dlock recover --data-dir DIR --peers id=host:port,...
      after a quorum loss, on a STOPPED node: force the member list to the
      surviving nodes; run it with the same --peers on each survivor, then
      start them
`

func runSnapshot(args []string) error {
	if len(args) < 1 {
		return usageErrorf("name a subcommand: save or restore")
	}
	if wantsHelp(args) {
		return printHelp(snapshotUsage)
	}
	switch args[0] {
	case "save":
		fs := flag.NewFlagSet("dlock snapshot save", flag.ContinueOnError)
		def := os.Getenv("DLOCK_ENDPOINTS")
		if def == "" {
			def = defaultEndpoints
		}
		endpoints := fs.String("endpoints", def, "comma-separated API URLs of the cluster's members (env DLOCK_ENDPOINTS); the first that answers is used")
		fs.StringVar(endpoints, "endpoint", def, "same as --endpoints")
		force := fs.Bool("force", false, "overwrite FILE if it exists")
		var g globalFlags // only its TLS flags and the ACL token
		g.registerTLS(fs)
		fs.StringVar(&g.token, "acl-token", aclTokenEnv(), "ACL token secret with the admin permission (env DLOCK_ACL_TOKEN), for clusters run with --acl")
		file, err := parseWithFile(fs, args[1:])
		if err != nil {
			return err
		}
		tlsCfg, err := g.tls()
		if err != nil {
			return err
		}
		if !*force {
			if _, err := os.Lstat(file); err == nil {
				return fmt.Errorf("%s already exists: name a new file, or pass --force to overwrite it", file)
			}
		}
		var errs []error
		for ep := range strings.SplitSeq(*endpoints, ",") {
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
	case "restore":
		fs := flag.NewFlagSet("dlock snapshot restore", flag.ContinueOnError)
		dataDir := fs.String("data-dir", "", "empty data dir to seed (required)")
		initial := fs.String("initial-cluster", "", "the new cluster's members as id=raft-host:port,... (required)")
		logStore := fs.String("log-store", string(raftnode.DefaultLogStore), "log store for the new data dir: wal or bolt")
		engine := fs.String("raft-engine", string(raftnode.DefaultEngine), "replication engine of the new data dir: hashicorp or etcd (restoring a snapshot of a cluster of one engine into the other moves it)")
		file, err := parseWithFile(fs, args[1:])
		if err != nil {
			return err
		}
		peers, err := parseCluster(*initial)
		if err != nil {
			return err
		}
		if *dataDir == "" || len(peers) == 0 {
			return usageErrorf("--data-dir and --initial-cluster are required")
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return fmt.Errorf("read snapshot: %w", err)
		}
		eng, err := raftnode.ParseEngine(*engine)
		if err != nil {
			return usageErrorf("--raft-engine: %v", err)
		}
		info, err := raftnode.RestoreSnapshotOn(eng, *dataDir, raftnode.LogStoreKind(*logStore), b, peers)
		if err != nil {
			return err
		}
		fmt.Printf("seeded %s from %s (%d bytes); start it with dlock serve --data-dir %s (no --initial-cluster)\n", *dataDir, file, len(b), *dataDir)
		if info.RetiredKeyOK {
			fmt.Printf("the old cluster's token-signing key %x is retired here (it verifies proofs of tokens up to %d only); the new cluster's first leader starts a new key. Retire the old cluster, and keep the snapshot file as secret as the cluster: it holds the old key's seed and every lease id\n",
				info.RetiredKey.ID, info.RetiredKey.MaxToken)
		}
		return nil
	}
	return usageErrorf("unknown snapshot command %q: use save or restore", args[0])
}

// parseWithFile parses flags that may come before or after the one FILE argument.
func parseWithFile(fs *flag.FlagSet, args []string) (string, error) {
	var file string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		file, args = args[0], args[1:]
	}
	fs.Usage = func() { fmt.Fprint(fs.Output(), snapshotUsage) }
	if err := parseFlags(fs, args); err != nil {
		return "", err
	}
	if file == "" && fs.NArg() == 1 {
		file = fs.Arg(0)
	} else if fs.NArg() != 0 {
		return "", usageErrorf("unexpected arguments %v", fs.Args())
	}
	if file == "" {
		return "", usageErrorf("name the snapshot FILE")
	}
	return file, nil
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
	n, err := io.Copy(tmp, res.Body)
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

func runRecover(args []string) error {
	fs := flag.NewFlagSet("dlock recover", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), recoverUsage) }
	dataDir := fs.String("data-dir", "", "data dir of a STOPPED node (required)")
	peersFlag := fs.String("peers", "", "the surviving members as id=raft-host:port,... (required)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	peers, err := parseCluster(*peersFlag)
	if err != nil {
		return err
	}
	if *dataDir == "" || len(peers) == 0 {
		return usageErrorf("--data-dir and --peers are required")
	}
	if err := raftnode.Recover(*dataDir, peers); err != nil {
		return err
	}
	fmt.Printf("recovered %s with members %s; start the node with dlock serve\n", *dataDir, *peersFlag)
	return nil
}
