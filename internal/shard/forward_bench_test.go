package shard_test

import (
	"context"
	"testing"

	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/testcluster"
)

// BenchmarkForwardedAcquireRelease measures an acquire and its release
// through a node that runs none of the name's shard's replicas (two
// forwarded calls), and through a replica (none), on one 4-node cluster.
func BenchmarkForwardedAcquireRelease(b *testing.B) {
	c, m, away := placed4(b, testcluster.Options{})
	for _, via := range []string{"n1", m.Hosts(away, c.IDs())[0]} {
		b.Run("via="+map[bool]string{true: "non-replica", false: "replica"}[via == "n1"], func(b *testing.B) {
			u := c.URL(via) + "/api/v1/locks/" + shardName(b, m, away) + "/bench-" + via
			ctx := context.Background()
			for b.Loop() {
				var a service.AcquireResponse
				if code, err := c.Do(ctx, "POST", u+"/acquire", map[string]any{"client_id": "b", "ttl_ms": 60000}, &a); err != nil || code != 200 {
					b.Fatalf("acquire: %d %v", code, err)
				}
				if code, err := c.Do(ctx, "POST", u+"/release", map[string]any{"client_id": "b", "fencing_token": a.FencingToken, "lease_id": a.LeaseID}, nil); err != nil || code != 200 {
					b.Fatalf("release: %d %v", code, err)
				}
			}
		})
	}
}
