package server

import (
	"context"
	"fmt"
	"io"

	"github.com/dlock/dlock/internal/raftnode"
	"github.com/dlock/dlock/internal/shard"
)

// Stream opens a forwarded watch on node (shard.Streamer): the replica's
// event stream, read by the router of this node until it closes it.
func (ss *shardSet) Stream(ctx context.Context, node string, body []byte) (io.ReadCloser, error) {
	addr, ok := ss.members()[node]
	if !ok {
		return nil, fmt.Errorf("no node %q in the cluster", node)
	}
	return ss.shared.Stream(ctx, addr, raftnode.RoutePrefix+"watch", body)
}

// Router is a sharded node's router (nil on a one-group node): tests set
// its stream limits and read its forwarded-watch counts.
func (s *Server) Router() *shard.Router { return s.router }
