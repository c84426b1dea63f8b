package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"
)

// historyGrant is one grant of GET /api/v1/history/{name}.
type historyGrant struct {
	FencingToken uint64 `json:"fencing_token"`
	ClientID     string `json:"client_id"`
	EndCause     string `json:"end_cause"`
	Reason       string `json:"reason"`
}

// perNameKept is the default --history-per-name the suite's nodes run with.
const perNameKept = 16

// grantHistory checks, once the cluster is healthy again, that the
// replicated grant history kept every grant the clients saw: each token an
// acquire was answered with is in its lock's history (unless older than the
// per-name bound keeps), a grant whose release was acknowledged ended
// "released", and every ended grant says how it ended. Then it revokes a
// fresh grant and checks that its holder is fenced: the next holder's token
// is higher and the revoked holder's renew answers lock_lost.
func (r *runner) grantHistory() {
	ops := r.h.snapshotOps()
	granted := map[string]map[uint64]string{} // lock -> token -> client
	released := map[uint64]bool{}
	for _, o := range ops {
		switch {
		case o.Kind == kAcquire && o.Out == oOK && o.OutToken != 0:
			if granted[o.Lock] == nil {
				granted[o.Lock] = map[uint64]string{}
			}
			granted[o.Lock][o.OutToken] = o.Client
		case o.Kind == kRelease && o.Out == oOK:
			released[o.Token] = true
		}
	}
	names := make([]string, 0, len(granted))
	for n := range granted {
		names = append(names, n)
	}
	sort.Strings(names)
	leader := r.c.leaderOrZero()
	valid := map[string]bool{"": true, "released": true, "expired": true, "session_deleted": true, "revoked": true, "taken_over": true, "resigned": true}
	checked := 0
	for _, key := range names {
		grants, err := r.history(leader, key)
		if err != nil {
			r.anomaly(anomaly{Kind: "harness", What: fmt.Sprintf("history of %s: %v", key, err)})
			continue
		}
		byToken := map[uint64]historyGrant{}
		ended, oldestKept := 0, uint64(0)
		for _, g := range grants {
			byToken[g.FencingToken] = g
			if !valid[g.EndCause] {
				r.anomaly(anomaly{Kind: "history:bad-cause", What: fmt.Sprintf("%s token %d ended with %q", key, g.FencingToken, g.EndCause)})
			}
			if g.EndCause != "" {
				ended++
				if oldestKept == 0 || g.FencingToken < oldestKept {
					oldestKept = g.FencingToken
				}
			}
		}
		for tok, client := range granted[key] {
			g, ok := byToken[tok]
			switch {
			case !ok && ended >= perNameKept && tok < oldestKept:
				// Dropped by the per-name bound: older than what is kept.
			case !ok:
				r.anomaly(anomaly{Kind: "history:grant-missing", What: fmt.Sprintf("%s: token %d (granted to %s) is not in the history %+v", key, tok, client, grants)})
			case g.ClientID != client:
				r.anomaly(anomaly{Kind: "history:wrong-holder", What: fmt.Sprintf("%s: token %d was granted to %s, the history says %s", key, tok, client, g.ClientID)})
			case released[tok] && g.EndCause != "released" && g.EndCause != "resigned":
				r.anomaly(anomaly{Kind: "history:wrong-cause", What: fmt.Sprintf("%s: token %d was released (acknowledged), the history says %q", key, tok, g.EndCause)})
			default:
				checked++
			}
		}
	}
	r.logf("history: %d acknowledged grants of %d names found with their end causes", checked, len(names))
	r.revokeFences(leader)
}

// history reads a lock's (or an election's) whole history on one node.
func (r *runner) history(node int, key string) ([]historyGrant, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	path := "/api/v1/history/" + url.PathEscape(realName(key))
	if isElection(key) {
		path += "?kind=election"
	}
	status, body, err := r.api.send(ctx, node, http.MethodGet, path, nil)
	if err != nil {
		return nil, err
	}
	if status != 200 {
		return nil, fmt.Errorf("status %d: %s", status, strings.TrimSpace(string(body)))
	}
	var h struct {
		Grants []historyGrant `json:"grants"`
	}
	return h.Grants, json.Unmarshal(body, &h)
}

// revokeFences revokes a fresh grant and checks the revoked holder is fenced.
func (r *runner) revokeFences(node int) {
	rng := rand.New(rand.NewPCG(r.cfg.seed, 99))
	first := &Op{Proc: 121, Client: "revoked", Kind: kAcquire, Lock: "final/revoke", TTL: int64(30 * time.Second), ReqID: "revoke-1"}
	r.api.acquire(first, rng, callOpts{attempt: 3 * time.Second, overall: 20 * time.Second})
	if first.Out != oOK {
		r.anomaly(anomaly{Kind: "liveness:final-acquire", What: "an acquire to revoke failed: " + first.String()})
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	status, body, err := r.api.send(ctx, node, http.MethodPost, lockPath("final/revoke", "revoke"),
		map[string]any{"fencing_token": first.OutToken, "reason": "chaos", "request_id": "chaos-revoke"})
	if err != nil || status != 200 {
		r.anomaly(anomaly{Kind: "revoke:failed", What: fmt.Sprintf("revoke of token %d: %d %v %s", first.OutToken, status, err, body)})
		return
	}
	next := &Op{Proc: 122, Client: "after-revoke", Kind: kAcquire, Lock: "final/revoke", TTL: int64(time.Second), ReqID: "revoke-2"}
	r.api.acquire(next, rng, callOpts{attempt: 3 * time.Second, overall: 20 * time.Second})
	if next.Out != oOK || next.OutToken <= first.OutToken {
		r.anomaly(anomaly{Kind: "safety:revoke-not-fenced", What: fmt.Sprintf("after revoking token %d the next grant is %s", first.OutToken, next.String())})
	}
	status, body, err = r.api.send(ctx, node, http.MethodPost, lockPath("final/revoke", "renew"),
		map[string]any{"client_id": "revoked", "fencing_token": first.OutToken, "lease_id": first.OutLease})
	if err != nil || status != 409 || !strings.Contains(string(body), "lock_lost") {
		r.anomaly(anomaly{Kind: "safety:revoke-not-fenced", What: fmt.Sprintf("the revoked holder's renew: %d %v %s; want 409 lock_lost", status, err, body)})
	}
}
