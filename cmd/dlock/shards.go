package main

import (
	"errors"
	"fmt"

	"github.com/spf13/pflag"

	"github.com/dlock/dlock/internal/raftnode"
	"github.com/dlock/dlock/internal/shard"
)

// shardFlags are --shards, --shard-bounds and --shard-replicas
// (docs/operations.md, Shards).
type shardFlags struct {
	n        int
	bounds   string
	replicas int
}

func (f *shardFlags) register(fs *pflag.FlagSet) {
	fs.IntVar(&f.n, "shards", 1, "run the lock table as N shards, each its own Raft group, split by the first segment of names (needs the etcd engine; 1 is one group, as always); every node of a cluster must get the same value")
	fs.IntVar(&f.replicas, "shard-replicas", 0, "run each initial shard on this many nodes of --initial-cluster, placed round-robin over the node ids sorted (0: every shard on every node); every node must get the same value; dlock shards move changes the placement later")
	fs.StringVar(&f.bounds, "shard-bounds", "", "explicit shard ranges: the first top-level name segment of each shard after the first, comma-separated (e.g. g,n,t for 4 shards); default: the letters split evenly")
}

// apply returns the shard map (nil for one group) and makes a sharded
// node's engine etcd: a new data dir gets it, another engine is refused.
func (f *shardFlags) apply(c *raftnode.Config) (*shard.Map, error) {
	var m shard.Map
	var err error
	switch {
	case f.bounds != "":
		if m, err = shard.ParseBounds(f.bounds); err != nil {
			return nil, fmt.Errorf("--shard-bounds: %w", err)
		}
		if f.n != 1 && f.n != m.N() {
			return nil, fmt.Errorf("--shards %d but --shard-bounds gives %d shards; give one of them", f.n, m.N())
		}
	case f.n < 1 || f.n > shard.MaxShards:
		return nil, fmt.Errorf("--shards must be between 1 and %d", shard.MaxShards)
	case f.n == 1:
		return nil, nil
	default:
		if m, err = shard.NewMap(shard.DefaultBounds(f.n)); err != nil {
			return nil, err
		}
	}
	if m.N() == 1 {
		if f.replicas != 0 {
			return nil, errors.New("--shard-replicas needs --shards above 1")
		}
		return nil, nil
	}
	if f.replicas < 0 {
		return nil, fmt.Errorf("--shard-replicas must be 0 (every node) or more, got %d", f.replicas)
	}
	// The nodes are --initial-cluster's on the first start; a restart
	// without it reads them from the data dir (shard.RecordedNodes).
	m.Placement = f.replicas
	engine := c.Engine
	if engine == "" {
		if engine, err = raftnode.DataDirEngine(c.DataDir); err != nil {
			return nil, err
		}
	}
	switch engine {
	case "", raftnode.EngineEtcd:
		c.Engine = raftnode.EngineEtcd
	default:
		return nil, fmt.Errorf("--shards needs the etcd replication engine (all shards share one log and one raft port on it); this node would run %s: give --raft-engine etcd with a new data dir", engine)
	}
	return &m, nil
}
