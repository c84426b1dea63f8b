package shard

import (
	"context"
	"log/slog"
	"sort"
	"time"

	"github.com/dlock/dlock/internal/raftnode"
)

// Group is what the balancer needs of one shard's Raft node on this node.
type Group interface {
	ID() string
	IsLeader() bool
	Status() raftnode.Status
	TransferLeadership(ctx context.Context, id string) error
}

// Balance timing: how often this node looks at the shards it leads, and how
// long it leaves a shard alone after handing it on (or failing to).
const (
	balanceEvery    = time.Second
	balanceCooldown = 5 * time.Second
	transferTimeout = 5 * time.Second
)

// Preferred is the voter that should lead shard k: the voters sorted by id,
// shard k preferring voter k mod their number, so N shards spread evenly.
func Preferred(k int, voters []string) string {
	if len(voters) == 0 {
		return ""
	}
	v := append([]string(nil), voters...)
	sort.Strings(v)
	return v[k%len(v)]
}

// Balanced is one shard's group for the balancer: shard ID prefers voter
// ID mod the number of voters.
type Balanced struct {
	ID int
	G  Group
}

// Balance runs until ctx ends: every shard this node leads whose preferred
// voter is another, reachable one is handed to it by leadership transfer.
// So leaders spread over the nodes, stay on the survivors while a node is
// down (a leader never hands on to a voter it cannot reach), and move back
// once it returns. groups is asked afresh each round (ranges split).
func Balance(ctx context.Context, groups func() []Balanced, logger *slog.Logger) {
	last := map[int]time.Time{}
	t := time.NewTicker(balanceEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, b := range groups() {
			k, g := b.ID, b.G
			if !g.IsLeader() || time.Since(last[k]) < balanceCooldown {
				continue
			}
			st := g.Status()
			var voters []string
			reachable := map[string]bool{}
			for _, s := range st.Servers {
				if s.Suffrage == "voter" {
					voters = append(voters, s.ID)
					reachable[s.ID] = s.State != "unreachable"
				}
			}
			want := Preferred(k, voters)
			if want == "" || want == g.ID() || !reachable[want] {
				continue
			}
			last[k] = time.Now()
			tctx, cancel := context.WithTimeout(ctx, transferTimeout)
			err := g.TransferLeadership(tctx, want)
			cancel()
			if err != nil {
				logger.Info("could not hand a shard's leadership to its preferred node; will retry", "shard", k, "to", want, "err", err)
				continue
			}
			logger.Info("handed a shard's leadership to its preferred node", "shard", k, "to", want)
		}
	}
}
