package raftnode

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/dlock/dlock/internal/command"
)

// BenchmarkEngineCommit: one write committed and applied by a 3-node
// in-process cluster on each engine (real TCP on loopback, real fsyncs),
// from 1 and from 16 concurrent writers; one op is one committed write.
// Compare the engines within one run:
//
//	go test -run '^$' -bench BenchmarkEngineCommit -benchtime 2000x ./internal/raftnode/
func BenchmarkEngineCommit(b *testing.B) {
	for _, writers := range []int{1, 16} {
		for _, engine := range []EngineKind{EngineHashicorp, EngineEtcd} {
			b.Run(fmt.Sprintf("%s/writers=%d", engine, writers), func(b *testing.B) {
				nodes, leader := openBenchCluster(b, engine)
				n := nodes[leader]
				ctx := context.Background()
				per := b.N/writers + 1
				b.ResetTimer()
				var wg sync.WaitGroup
				for range writers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range per {
							if _, err := n.Apply(ctx, &command.Envelope{ClientID: "bench", Body: &command.Tick{}}); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
			})
		}
	}
}

func openBenchCluster(b *testing.B, engine EngineKind) (map[string]*Node, string) {
	b.Helper()
	return openTestClusterWith(b, []string{"n1", "n2", "n3"}, func(cfg *Config) { cfg.Engine = engine })
}
