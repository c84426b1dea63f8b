package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/dlock/dlock/client"
	"github.com/dlock/dlock/fence"
	"github.com/dlock/dlock/internal/buildinfo"
	"github.com/dlock/dlock/internal/datastore"
)

const (
	// keyFetchLimit bounds the wait for the cluster at start: long enough to
	// start both at once, short enough that a wrong --cluster is reported.
	keyFetchLimit = 10 * time.Second
	// keyRefreshEvery is how often the key set is fetched again, so a key
	// rotation in the cluster reaches the store within a minute.
	keyRefreshEvery = 60 * time.Second
)

const insecureBanner = `
*****************************************************************************
* INSECURE: --insecure-no-proof is set. Token proofs are NOT checked.       *
* Any client can send any fencing token; one huge token locks every honest  *
* writer out of its lock for good. Use only to compare with the safe mode.  *
*****************************************************************************
`

// newDatastoreCmd is `dlock datastore`: the fenced data store (package
// datastore), run until SIGINT/SIGTERM.
func newDatastoreCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "datastore --data-dir DIR --cluster URL [flags]",
		Short: "run the example fenced data store",
		Long: `Runs the example fenced data store: POST /write appends a record only if its
fencing token is the newest seen for its lock and its token proof verifies
with the cluster's keys; GET /data lists the records.`,
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
	}
	fs := cmd.Flags()
	addr := fs.String("addr", "127.0.0.1:7300", "HTTP listen address")
	dataDir := fs.String("data-dir", "", "`DIR` for the highest-token file and the records (required)")
	cluster := fs.String("cluster", "", "a dlock node's API `URL`, e.g. http://127.0.0.1:7070: the token key set is fetched from it at start and every minute (required unless --insecure-no-proof)")
	cacert := fs.String("cacert", os.Getenv("DLOCK_CACERT"), "CA `FILE` to verify an https --cluster with (env DLOCK_CACERT; default: the system's roots)")
	insecure := fs.Bool("insecure-no-proof", false, "UNSAFE, for comparison only: accept fencing tokens without checking the cluster's signature")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	completeWords(cmd, "log-level", "debug", "info", "warn", "error")
	completeWords(cmd, "log-format", "text", "json")
	_ = cmd.MarkFlagDirname("data-dir")
	cmd.RunE = func(_ *cobra.Command, _ []string) error {
		if *dataDir == "" {
			return errors.New("--data-dir is required")
		}
		if *cluster == "" && !*insecure {
			return errors.New("--cluster is required: the data store verifies token proofs with the cluster's keys (or pass --insecure-no-proof to see what goes wrong without them)")
		}
		logger, err := newLogger(*logLevel, *logFormat)
		if err != nil {
			return err
		}
		clusterURL := *cluster
		if clusterURL != "" && !strings.Contains(clusterURL, "://") {
			clusterURL = "http://" + clusterURL
		}

		var keys *fence.KeySet
		if *insecure {
			fmt.Fprint(os.Stderr, insecureBanner)
			if clusterURL != "" {
				logger.Warn("--cluster is ignored with --insecure-no-proof: no keys are fetched")
			}
		} else {
			// Interruptible: Ctrl-C while the cluster is still starting must
			// not wait out the retries.
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			if *cacert != "" {
				tc, err := client.LoadTLSConfig(*cacert, "", "")
				if err != nil {
					return fmt.Errorf("--cacert: %w", err)
				}
				keyClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
			}
			keys, err = fetchKeysAtStart(ctx, clusterURL, logger)
			stop()
			if err != nil {
				return err
			}
		}

		store, err := datastore.New(datastore.Config{DataDir: *dataDir, KeySet: keys, InsecureNoProof: *insecure, Logger: logger})
		if err != nil {
			return err
		}
		ln, err := net.Listen("tcp", *addr)
		if err != nil {
			_ = store.Close()
			return fmt.Errorf("listen on --addr %s: %w", *addr, err)
		}
		hs := &http.Server{
			Handler:           store.Handler(),
			ReadHeaderTimeout: 10 * time.Second,
			ReadTimeout:       30 * time.Second,
			WriteTimeout:      30 * time.Second,
			IdleTimeout:       2 * time.Minute,
			ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		}
		go func() {
			if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				logger.Error("HTTP server stopped; writes are no longer served: restart the data store", "error", err)
			}
		}()

		refreshCtx, stopRefresh := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		if !*insecure {
			wg.Go(func() { refreshKeys(refreshCtx, clusterURL, store, keys, logger) })
		}
		logger.Info("dlock datastore started", "addr", ln.Addr().String(), "data_dir", *dataDir, "cluster", clusterURL, "insecure_no_proof", *insecure, "version", buildinfo.Get().Version, "commit", buildinfo.Get().Commit)
		return waitForSignal(func(ctx context.Context) error {
			stopRefresh()
			err := hs.Shutdown(ctx)
			wg.Wait()
			return errors.Join(err, store.Close())
		}, logger.Info)
	}
	return cmd
}

// keyClient bounds each key-set request; the loops above it bound the rest.
var keyClient = &http.Client{Timeout: 5 * time.Second}

// fetchKeysAtStart retries for up to keyFetchLimit, so the store can be
// started together with the cluster.
func fetchKeysAtStart(parent context.Context, clusterURL string, logger *slog.Logger) (*fence.KeySet, error) {
	ctx, cancel := context.WithTimeout(parent, keyFetchLimit)
	defer cancel()
	backoff := 200 * time.Millisecond
	for attempt := 1; ; attempt++ {
		keys, err := fence.FetchKeySet(ctx, keyClient, clusterURL)
		if err == nil {
			logger.Info("fetched the cluster's token key set", "cluster", clusterURL, "keys", keyIDs(keys))
			return keys, nil
		}
		if attempt == 1 {
			logger.Info("waiting for the cluster's token key set", "cluster", clusterURL, "error", err)
		}
		select {
		case <-ctx.Done():
			if parent.Err() != nil {
				return nil, errors.New("interrupted while waiting for the cluster's token key set")
			}
			return nil, fmt.Errorf("no token key set from %s within %s (--cluster): %w", clusterURL, keyFetchLimit, err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// refreshKeys follows key rotations. A failed fetch keeps the previous set:
// an unreachable cluster must not stop the store from accepting valid proofs.
func refreshKeys(ctx context.Context, clusterURL string, store *datastore.Server, current *fence.KeySet, logger *slog.Logger) {
	tick := time.NewTicker(keyRefreshEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		keys, err := fence.FetchKeySet(ctx, keyClient, clusterURL)
		if err != nil {
			if ctx.Err() == nil {
				logger.Warn("token key set refresh failed; keeping the previous keys", "cluster", clusterURL, "error", err)
			}
			continue
		}
		if !slices.Equal(keys.IDs(), current.IDs()) {
			logger.Info("token key set changed", "keys", keyIDs(keys), "previous", keyIDs(current))
		}
		store.SetKeySet(keys)
		current = keys
	}
}

func keyIDs(ks *fence.KeySet) []string {
	var out []string
	for _, id := range ks.IDs() {
		out = append(out, id.String())
	}
	return out
}
