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

const snapshotUsage = `Usage:
  dlock snapshot save FILE [--endpoint URL] [--acl-token SECRET] [--cacert F] [--cert F --key F]
      save a consistent copy of the whole state (locks, leases, queues,
      counters) from a running cluster to FILE; with --acl the token
      (or env DLOCK_TOKEN) needs the admin permission
  dlock snapshot restore FILE --data-dir DIR --initial-cluster id=host:port,...
      seed an EMPTY data dir from FILE for a new cluster with these members;
      do it for every member (same FILE, same --initial-cluster), then start
      them with dlock serve (without --initial-cluster)
  dlock recover --data-dir DIR --peers id=host:port,...
      after a quorum loss, on a STOPPED node: force the member list to the
      surviving nodes; run it with the same --peers on each survivor, then
      start them
`

func runSnapshot(args []string) error {
	if len(args) < 1 {
		fmt.Fprint(os.Stderr, snapshotUsage)
		return errUsage
	}
	switch args[0] {
	case "save":
		fs := flag.NewFlagSet("dlock snapshot save", flag.ContinueOnError)
		endpoint := fs.String("endpoint", "http://127.0.0.1:7070", "API URL of any member")
		var g globalFlags // only its TLS flags and the ACL token
		g.registerTLS(fs)
		fs.StringVar(&g.token, "acl-token", os.Getenv("DLOCK_TOKEN"), "ACL token secret with the admin permission (env DLOCK_TOKEN), for clusters run with --acl")
		file, err := parseWithFile(fs, args[1:])
		if err != nil {
			return err
		}
		tlsCfg, err := g.tls()
		if err != nil {
			return err
		}
		return saveSnapshot(*endpoint, file, tlsCfg, g.token)
	case "restore":
		fs := flag.NewFlagSet("dlock snapshot restore", flag.ContinueOnError)
		dataDir := fs.String("data-dir", "", "empty data dir to seed (required)")
		initial := fs.String("initial-cluster", "", "the new cluster's members as id=raft-host:port,... (required)")
		logStore := fs.String("log-store", string(raftnode.DefaultLogStore), "log store for the new data dir: wal or bolt")
		file, err := parseWithFile(fs, args[1:])
		if err != nil {
			return err
		}
		peers, err := parseCluster(*initial)
		if err != nil {
			return err
		}
		if *dataDir == "" || len(peers) == 0 {
			return fmt.Errorf("--data-dir and --initial-cluster are required\n\n%s", snapshotUsage)
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return fmt.Errorf("read snapshot: %w", err)
		}
		info, err := raftnode.RestoreSnapshot(*dataDir, raftnode.LogStoreKind(*logStore), b, peers)
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
	fmt.Fprint(os.Stderr, snapshotUsage)
	return errUsage
}

// parseWithFile parses flags that may come before or after the one FILE argument.
func parseWithFile(fs *flag.FlagSet, args []string) (string, error) {
	var file string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		file, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return "", errUsage
	}
	if file == "" && fs.NArg() == 1 {
		file = fs.Arg(0)
	} else if fs.NArg() != 0 {
		return "", fmt.Errorf("unexpected arguments %v\n\n%s", fs.Args(), snapshotUsage)
	}
	if file == "" {
		return "", fmt.Errorf("name the snapshot FILE\n\n%s", snapshotUsage)
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
	dataDir := fs.String("data-dir", "", "data dir of a STOPPED node (required)")
	peersFlag := fs.String("peers", "", "the surviving members as id=raft-host:port,... (required)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return errUsage
	}
	peers, err := parseCluster(*peersFlag)
	if err != nil {
		return err
	}
	if *dataDir == "" || len(peers) == 0 {
		return fmt.Errorf("--data-dir and --peers are required\n\n%s", snapshotUsage)
	}
	if err := raftnode.Recover(*dataDir, peers); err != nil {
		return err
	}
	fmt.Printf("recovered %s with members %s; start the node with dlock serve\n", *dataDir, *peersFlag)
	return nil
}
