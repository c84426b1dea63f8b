// Command dlock is the distributed lock service: `dlock serve` runs one node,
// `dlock dev` a throwaway local cluster. This package only parses flags and
// wires packages together; the behaviour lives under internal/.
package main

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
)

const usage = `dlock — a distributed lock and leader-election service on Raft

Usage:
  dlock serve [flags]   run one node of a cluster (see dlock serve -h)
  dlock dev [flags]     run a local 3-node cluster in one process (see dlock dev -h)
  dlock version [-o json]   print the version, commit and Go version
  dlock health [--url U]    exit 0 if the node answers /readyz with 200 (container health checks)
  dlock snapshot save|restore ...   back up a cluster, seed a new one from a backup
  dlock recover --data-dir D --peers id=addr,...   force members after a quorum loss
  dlock datastore --data-dir D --cluster URL   run the example fenced data store
  dlock demo            run the fencing demo: 5 nodes, a data store, 3 clients
  dlock debug log|replay --data-dir D ...   read a stopped node's log (forensics)

Client commands (each takes -h):
  dlock lock NAME [--ttl 30s] [--wait D] -- CMD [ARGS...]
                        run CMD while holding the lock NAME
  dlock elect NAME [--value V] [--ttl 15s] -- CMD [ARGS...]
                        run CMD only while leader of the election NAME
  dlock acquire NAME [--ttl 30s] [--wait D]
                        take a lock; print its fencing token and lease id
  dlock renew NAME --token N --lease-id ID [--ttl D]
  dlock release NAME --token N --lease-id ID
  dlock status NAME     who holds NAME
  dlock list [PREFIX]   locks held or waited for
  dlock watch [PREFIX] [--from-revision N]
                        print changes as they happen
  dlock members         the cluster's nodes and leader
  dlock members add ID RAFT_ADDR | remove ID | transfer-leadership [ID]
  dlock acl bootstrap | token create|list|revoke   manage ACL tokens (--acl clusters)
  dlock bench [--workload W] [--workers N] [--target dlock|etcd]   load generator
  Common flags: --endpoints URLS (env DLOCK_ENDPOINTS, default
  http://127.0.0.1:7070,http://127.0.0.1:7080,http://127.0.0.1:7090),
  --client-id ID (env DLOCK_CLIENT_ID), -o json; for TLS clusters --cacert,
  --cert, --key (env DLOCK_CACERT, DLOCK_CERT, DLOCK_KEY).

Exit codes: 0 ok, 1 error, 2 usage; client commands also 3 lock held or
wait timed out, 4 lock lost (lock), leadership lost (elect) or not the
holder (release, renew). dlock lock and dlock elect otherwise exit with
CMD's exit code.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(cliExitUsage)
	}
	cmd, args := os.Args[1], os.Args[2:]
	var err error
	switch cmd {
	case "serve":
		err = runServe(args)
	case "dev":
		err = runDev(args)
	case "snapshot":
		err = runSnapshot(args)
	case "recover":
		err = runRecover(args)
	case "bench":
		err = runBench(args)
	case "datastore":
		err = runDatastore(args)
	case "debug":
		err = runDebug(args)
	case "demo":
		err = runDemo(args)
	case "health":
		err = runHealth(args)
	case "demo-writer":
		err = runDemoWriter(args)
	case "lock", "acquire", "release", "renew", "status", "list", "members", "elect", "watch", "acl":
		os.Exit(runClientCommand(cmd, args))
	case "version", "--version":
		err = runVersion(args)
	case "help", "-h", "--help":
		if len(args) > 0 {
			// dlock help CMD is dlock CMD --help.
			os.Args = []string{os.Args[0], args[0], "--help"}
			main()
			return
		}
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "dlock: unknown command %q\nRun 'dlock --help' for the commands.\n", cmd)
		os.Exit(cliExitUsage)
	}
	os.Exit(finish(cmd, err))
}

func newLogger(level string, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: use debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(format) {
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	case "text", "":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: use text or json", format)
}
