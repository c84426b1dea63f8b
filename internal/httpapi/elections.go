package httpapi

import (
	"context"
	"net/http"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/service"
)

const electionsPrefix = apiPrefix + "/elections"

// Election actions: the last path segment of POST /api/v1/elections/{name}/{action}.
const (
	actionCampaign = "campaign"
	actionProclaim = "proclaim"
	actionResign   = "resign"
)

// election serves /api/v1/elections/{rest}: GET reads (or, with observe=true,
// streams) the election named by the whole rest; POST's last segment is the
// action, as for locks.
func (a *api) election(w http.ResponseWriter, r *http.Request, rest string) {
	switch {
	case isGet(r):
		q, aerr := parseQuery(r, "stale", "observe")
		if aerr != nil {
			a.writeError(w, r, aerr)
			return
		}
		stale, aerr := parseStale(q)
		if aerr != nil {
			a.writeError(w, r, aerr)
			return
		}
		observe, aerr := parseBool(q, "observe")
		if aerr != nil {
			a.writeError(w, r, aerr)
			return
		}
		name, aerr := lockName(rest)
		if aerr != nil {
			a.writeError(w, r, aerr)
			return
		}
		if observe {
			if r.Method != http.MethodGet {
				a.methodNotAllowed(w, r, allowStream)
				return
			}
			a.observe(w, r, name, stale)
			return
		}
		view, err := a.svc.GetElection(r.Context(), name, stale)
		if err == nil {
			staleHeaders(w, view.Stale)
		}
		reply(a, w, r, http.StatusOK, view, err)
	case r.Method == http.MethodPost:
		a.electionAction(w, r, rest)
	default:
		a.methodNotAllowed(w, r, allowLock)
	}
}

func (a *api) electionAction(w http.ResponseWriter, r *http.Request, rest string) {
	name, action, ok := a.splitAction(w, r, rest, "election", electionsPrefix, actionCampaign, actionProclaim, actionRenew, actionResign, actionRevoke)
	if !ok {
		return
	}
	switch action {
	case actionCampaign:
		var req service.CampaignRequest
		if aerr := a.decodeBody(w, r, &req, true); aerr != nil {
			a.writeError(w, r, aerr)
			return
		}
		req.Name = name
		a.holdOpen(w, req.WaitTimeoutMs)
		resp, err := a.svc.Campaign(r.Context(), req)
		if isConflict(err) && resp != nil {
			e := apierror.From(err)
			writeJSON(w, apierror.HTTPStatus(e.Code), campaignConflict{Leader: false, Error: errorBody{Code: e.Code, Message: e.Message}, Current: resp.Current, FencingToken: resp.FencingToken})
			return
		}
		reply(a, w, r, http.StatusOK, resp, err)
	case actionProclaim:
		decodeAndCall(a, w, r, http.StatusOK, true, func(q *service.ProclaimRequest) { q.Name = name }, a.svc.Proclaim)
	case actionRenew:
		decodeAndCall(a, w, r, http.StatusOK, true, nil, func(ctx context.Context, q electionRenew) (*service.RenewResponse, error) {
			return a.svc.RenewElection(ctx, service.RenewRequest{Name: name, ClientID: q.CandidateID,
				FencingToken: q.FencingToken, LeaseID: q.LeaseID, TTLms: q.TTLms, RequestID: q.RequestID})
		})
	case actionResign:
		decodeAndCall(a, w, r, http.StatusOK, true, func(q *service.ResignRequest) { q.Name = name }, a.svc.Resign)
	case actionRevoke:
		decodeAndCall(a, w, r, http.StatusOK, true, func(q *service.RevokeRequest) { q.Name, q.Election = name, true }, a.svc.Revoke)
	}
}

type campaignConflict struct {
	Leader       bool                    `json:"leader"`
	Error        errorBody               `json:"error"`
	Current      *service.ElectionLeader `json:"current,omitempty"`
	FencingToken uint64                  `json:"fencing_token,omitempty"` // lock_lost: the lost grant's
}

// electionRenew is the renew body with the election's field name for the
// holder (candidate_id rather than client_id).
type electionRenew struct {
	CandidateID  string `json:"candidate_id"`
	FencingToken uint64 `json:"fencing_token"`
	LeaseID      string `json:"lease_id"`
	TTLms        int64  `json:"ttl_ms,omitempty"`
	RequestID    string `json:"request_id,omitempty"`
}
