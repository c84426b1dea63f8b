package grpcapi

import (
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	dlockv1 "github.com/dlock/dlock/api/dlock/v1"
	"github.com/dlock/dlock/internal/service"
)

// ts leaves a zero time out of the message, so "not set" stays distinguishable
// from 1970.
func ts(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func holderPB(h *service.Holder) *dlockv1.Holder {
	if h == nil {
		return nil
	}
	return &dlockv1.Holder{ClientId: h.ClientID, FencingToken: h.FencingToken, GrantedAt: ts(h.GrantedAt), ExpiresAt: ts(h.ExpiresAt),
		Mode: h.Mode, Subtree: h.Subtree, Lock: h.Lock}
}

func lockPB(v *service.LockView) *dlockv1.Lock {
	out := &dlockv1.Lock{Name: v.Name, Held: v.Held, Holder: holderPB(v.Holder), Waiters: int64(v.Waiters), Revision: v.Revision,
		Limit: int64(v.Limit), Mode: v.Mode, Subtree: v.Subtree, Value: v.Value, DelayedUntil: ts(v.DelayedUntil)}
	for i := range v.Holders {
		out.Holders = append(out.Holders, holderPB(&v.Holders[i]))
	}
	return out
}

func leaderPB(l *service.ElectionLeader) *dlockv1.ElectionLeader {
	if l == nil {
		return nil
	}
	return &dlockv1.ElectionLeader{CandidateId: l.CandidateID, Value: l.Value, FencingToken: l.FencingToken, Since: ts(l.Since), ExpiresAt: ts(l.ExpiresAt)}
}

func electionPB(v *service.ElectionView) *dlockv1.Election {
	return &dlockv1.Election{Name: v.Name, Leader: leaderPB(v.Leader), Campaigners: int64(v.Campaigners), Revision: v.Revision}
}

func eventPB(e service.WatchEvent) *dlockv1.Event {
	return &dlockv1.Event{Revision: e.Revision, Type: e.Type, Kind: e.Kind, Name: e.Name, ClientId: e.ClientID,
		FencingToken: e.FencingToken, Cause: e.Cause, Reason: e.Reason, Value: e.Value, At: ts(e.At), Mode: e.Mode, Subtree: e.Subtree}
}

func renewPB(r *service.RenewResponse) *dlockv1.RenewResponse {
	return &dlockv1.RenewResponse{Renewed: r.Renewed, ExpiresAt: ts(r.ExpiresAt), TtlMs: r.TTLms, Revision: r.Revision}
}

func clusterPB(c *service.ClusterInfo) *dlockv1.Cluster {
	out := &dlockv1.Cluster{NodeId: c.NodeID, LeaderId: c.LeaderID, LeaderApiAddr: c.LeaderAPI, Term: c.Term,
		CommitIndex: c.CommitIndex, AppliedIndex: c.AppliedIndex, Revision: c.Revision, LastFencingToken: c.LastToken}
	for _, m := range c.Members {
		out.Members = append(out.Members, &dlockv1.Member{Id: m.ID, RaftAddr: m.RaftAddr, ApiAddr: m.APIAddr, Suffrage: m.Suffrage, State: m.State})
	}
	return out
}
