package main

// systemd's Type=notify: the node says READY=1 once it would pass /readyz, so
// `systemctl start` returns when the node can serve, and STOPPING=1 when it
// begins to shut down. Without $NOTIFY_SOCKET (not under systemd) this is a
// no-op.

import (
	"context"
	"log/slog"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
)

// readyChecker is what notifyReady needs of a node.
type readyChecker interface{ Ready() error }

// notifyReady polls n until it is ready, tells systemd, and returns; it gives
// up when ctx ends.
func notifyReady(ctx context.Context, n readyChecker, logger *slog.Logger) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for n.Ready() != nil {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
	if sent, err := daemon.SdNotify(false, daemon.SdNotifyReady); err != nil {
		logger.Warn("could not tell systemd the node is ready", "err", err)
	} else if sent {
		logger.Info("told systemd the node is ready")
	}
}

// notifyStopping tells systemd the node is shutting down.
func notifyStopping() { _, _ = daemon.SdNotify(false, daemon.SdNotifyStopping) }
