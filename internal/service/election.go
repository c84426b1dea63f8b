package service

import (
	"context"
	"time"

	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/state"
)

// An election is a lock in its own namespace whose holder carries a value:
// campaigners wait in its FIFO queue, so the next one takes over as soon as the
// leader resigns or its lease ends, with a new fencing token.

func electionView(ei state.ElectionInfo, rev uint64) ElectionView {
	v := ElectionView{Name: ei.Name, Campaigners: ei.Campaigners, Revision: rev}
	if ei.HasLeader {
		v.Leader = &ElectionLeader{CandidateID: ei.CandidateID, Value: ei.Value, FencingToken: ei.Token, Since: ms(ei.Since), ExpiresAt: ms(ei.ExpiresAt)}
	}
	return v
}

// Campaign waits to become the election's leader.
func (s *Service) Campaign(ctx context.Context, req CampaignRequest) (_ *CampaignResponse, err error) {
	defer s.observe("campaign", time.Now(), &err)
	if err = s.admit(ctx, req.CandidateID); err != nil {
		return nil, err
	}
	name, err := normalize(req.Name)
	if err != nil {
		return nil, err
	}
	if err := checkID("candidate_id", req.CandidateID, true); err != nil {
		return nil, err
	}
	tok, err := s.authToken(ctx, command.PermElect, name, req.CandidateID)
	if err != nil {
		return nil, err
	}
	if err := s.authorizeTakeover(tok, req.Takeover, req.CandidateID); err != nil {
		return nil, err
	}
	ctx, untrack := s.trackToken(ctx, tok)
	defer untrack()
	g, err := s.acquire(ctx, acquireArgs{key: command.ElectionKey(name), what: "election", clientID: req.CandidateID,
		requestID: req.RequestID, ttlMs: req.TTLms, sessionID: req.SessionID, waitMs: req.WaitTimeoutMs, value: req.Value, takeover: req.Takeover})
	if g == nil {
		return nil, err
	}
	res := &CampaignResponse{Leader: g.granted, FencingToken: g.token, TokenProof: g.proof, LeaseRef: g.leaseRef, ExpiresAt: g.expiresAt, LeaseID: g.leaseID, Revision: g.revision}
	if g.holder != nil {
		// The election's current value is read from the local state: on a
		// follower, first apply what the leader answered from.
		if err := s.catchUp(ctx, g.index); err != nil {
			return nil, err
		}
		var cur ElectionView
		s.fsm.Read(func(st *state.State) { cur = electionView(st.GetElection(name), st.Revision()) })
		res.Current = cur.Leader
	}
	return res, err
}

// GetElection returns the election's leader (or none). Linearizable unless stale.
func (s *Service) GetElection(ctx context.Context, name string, stale bool) (_ *ElectionView, err error) {
	defer s.observe("get_election", time.Now(), &err)
	n, err := s.admitRead(ctx, name, stale)
	if err != nil {
		return nil, err
	}
	var v ElectionView
	if err := s.readOwned(n, func(st *state.State) { v = electionView(st.GetElection(n), st.Revision()) }); err != nil {
		return nil, err
	}
	v.Stale = s.staleRead(stale)
	return &v, nil
}

// ListElections lists elections by name prefix, a page at a time, as
// ListLocks lists locks (the same paging and limits).
func (s *Service) ListElections(ctx context.Context, req ListRequest) (_ *ElectionListResponse, err error) {
	defer s.observe("list_elections", time.Now(), &err)
	if err = s.admit(ctx, ""); err != nil {
		return nil, err
	}
	prefix, after, limit, err := s.listArgs(ctx, req)
	if err != nil {
		return nil, err
	}
	out := &ElectionListResponse{Elections: []ElectionView{}, Stale: s.staleRead(req.Stale)}
	s.fsm.Read(func(st *state.State) {
		infos, more := st.ListElections(prefix, after, limit)
		out.Revision, out.More = st.Revision(), more
		for _, sp := range st.Splits() {
			out.SplitGroups = append(out.SplitGroups, sp.Group)
		}
		for _, ei := range infos {
			out.Elections = append(out.Elections, electionView(ei, out.Revision))
		}
	})
	return out, nil
}

type holderProof struct {
	name, clientID, leaseID, requestID string
	token                              uint64
}

// admitHolder is how every call by a lock's or an election's holder starts:
// admission (rate limits), the fields that prove the holding, and the ACL.
func (s *Service) admitHolder(ctx context.Context, p holderProof, idField string, perm uint8) (string, command.LeaseID, error) {
	if err := s.admit(ctx, p.clientID); err != nil {
		return "", command.LeaseID{}, err
	}
	name, id, err := s.checkProof(&p, idField)
	if err != nil {
		return "", command.LeaseID{}, err
	}
	if err := s.authorize(ctx, perm, name, p.clientID); err != nil {
		return "", command.LeaseID{}, err
	}
	return name, id, nil
}

func (s *Service) checkProof(p *holderProof, idField string) (string, command.LeaseID, error) {
	name, err := normalize(p.name)
	if err != nil {
		return "", command.LeaseID{}, err
	}
	if err := checkID(idField, p.clientID, true); err != nil {
		return "", command.LeaseID{}, err
	}
	if err := checkID("request_id", p.requestID, false); err != nil {
		return "", command.LeaseID{}, err
	}
	if p.token == 0 {
		return "", command.LeaseID{}, invalid("fencing_token is required")
	}
	id, err := parseLease("lease_id", p.leaseID)
	return name, id, err
}

// Proclaim changes the leader's value.
func (s *Service) Proclaim(ctx context.Context, req ProclaimRequest) (_ *ProclaimResponse, err error) {
	defer s.observe("proclaim", time.Now(), &err)
	name, id, err := s.admitHolder(ctx, holderProof{req.Name, req.CandidateID, req.LeaseID, req.RequestID, req.FencingToken}, "candidate_id", command.PermElect)
	if err != nil {
		return nil, err
	}
	if len(req.Value) > command.MaxValueLen {
		return nil, invalid("value is %d bytes; the limit is %d", len(req.Value), command.MaxValueLen)
	}
	r, err := s.applyOK(ctx, envelope(req.CandidateID, req.RequestID,
		&command.Proclaim{Name: command.ElectionKey(name), LeaseID: id, Token: req.FencingToken, Value: req.Value}), "proclaim")
	if err != nil {
		return nil, err
	}
	return &ProclaimResponse{Proclaimed: true, Revision: r.Revision}, nil
}

// Resign gives up leadership; the next campaigner in line is elected at once.
func (s *Service) Resign(ctx context.Context, req ResignRequest) (_ *ResignResponse, err error) {
	defer s.observe("resign", time.Now(), &err)
	name, id, err := s.admitHolder(ctx, holderProof{req.Name, req.CandidateID, req.LeaseID, req.RequestID, req.FencingToken}, "candidate_id", command.PermElect)
	if err != nil {
		return nil, err
	}
	r, err := s.applyOK(ctx, envelope(req.CandidateID, req.RequestID,
		&command.Release{Name: command.ElectionKey(name), LeaseID: id, Token: req.FencingToken}), "resign")
	if err != nil {
		return nil, err
	}
	return &ResignResponse{Resigned: true, Revision: r.Revision}, nil
}

// RenewElection extends the lease of an election's leader.
func (s *Service) RenewElection(ctx context.Context, req RenewRequest) (_ *RenewResponse, err error) {
	defer s.observe("election_renew", time.Now(), &err)
	name, id, err := s.admitHolder(ctx, holderProof{req.Name, req.ClientID, req.LeaseID, req.RequestID, req.FencingToken}, "candidate_id", command.PermElect)
	if err != nil {
		return nil, err
	}
	return s.renew(ctx, req, command.ElectionKey(name), id)
}
