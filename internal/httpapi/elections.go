package httpapi

import (
	"net/http"
	"strings"

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
			a.observe(w, r, name, stale)
			return
		}
		view, err := a.svc.GetElection(r.Context(), name, stale)
		reply(a, w, r, http.StatusOK, view, err)
	case r.Method == http.MethodPost:
		a.electionAction(w, r, rest)
	default:
		a.methodNotAllowed(w, r, allowLock)
	}
}

func (a *api) electionAction(w http.ResponseWriter, r *http.Request, rest string) {
	namePart, action := "", rest
	if i := strings.LastIndexByte(rest, '/'); i >= 0 {
		namePart, action = rest[:i], rest[i+1:]
	}
	switch action {
	case actionCampaign, actionProclaim, actionResign, actionRenew:
	default:
		a.writeError(w, r, apierror.New(apierror.NotFound,
			"unknown election action %q; POST to %s/{name}/%s, /%s, /%s or /%s",
			action, electionsPrefix, actionCampaign, actionProclaim, actionRenew, actionResign))
		return
	}
	name, aerr := lockName(namePart)
	if aerr != nil {
		a.writeError(w, r, aerr)
		return
	}
	if _, aerr := parseQuery(r); aerr != nil {
		a.writeError(w, r, aerr)
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
		resp, err := a.svc.Campaign(r.Context(), req)
		if err != nil && resp != nil {
			if c := apierror.CodeOf(err); c == apierror.LockHeld || c == apierror.WaitTimeout {
				e := apierror.From(err)
				writeJSON(w, apierror.HTTPStatus(e.Code), campaignConflict{Leader: false, Error: errorBody{Code: e.Code, Message: e.Message}, Current: resp.Current})
				return
			}
		}
		reply(a, w, r, http.StatusOK, resp, err)
	case actionProclaim:
		var req service.ProclaimRequest
		if aerr := a.decodeBody(w, r, &req, true); aerr != nil {
			a.writeError(w, r, aerr)
			return
		}
		req.Name = name
		resp, err := a.svc.Proclaim(r.Context(), req)
		reply(a, w, r, http.StatusOK, resp, err)
	case actionRenew:
		var req electionRenew
		if aerr := a.decodeBody(w, r, &req, true); aerr != nil {
			a.writeError(w, r, aerr)
			return
		}
		resp, err := a.svc.RenewElection(r.Context(), service.RenewRequest{Name: name, ClientID: req.CandidateID,
			FencingToken: req.FencingToken, LeaseID: req.LeaseID, TTLms: req.TTLms, RequestID: req.RequestID})
		reply(a, w, r, http.StatusOK, resp, err)
	case actionResign:
		var req service.ResignRequest
		if aerr := a.decodeBody(w, r, &req, true); aerr != nil {
			a.writeError(w, r, aerr)
			return
		}
		req.Name = name
		resp, err := a.svc.Resign(r.Context(), req)
		reply(a, w, r, http.StatusOK, resp, err)
	}
}

type campaignConflict struct {
	Leader  bool                    `json:"leader"`
	Error   errorBody               `json:"error"`
	Current *service.ElectionLeader `json:"current,omitempty"`
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
