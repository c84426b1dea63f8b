package chaos

import (
	"context"
	"encoding/json"
	"fmt"
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
	released := map[string]bool{}             // lock#token (tokens repeat across shards)
	// Locks that had several holders at once (shared or counting): their
	// grants end out of token order.
	multi := map[string]bool{}
	for _, o := range ops {
		if o.Kind == kAcquire && (o.Shared || o.Limit > 1) {
			multi[o.Lock] = true
		}
		switch {
		case o.Kind == kAcquire && o.Out == oOK && o.OutToken != 0:
			if granted[o.Lock] == nil {
				granted[o.Lock] = map[uint64]string{}
			}
			granted[o.Lock][o.OutToken] = o.Client
		case o.Kind == kRelease && o.Out == oOK:
			released[fmt.Sprintf("%s#%d", o.Lock, o.Token)] = true
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
		ended, oldestKept, newestKept := 0, uint64(0), uint64(0)
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
				newestKept = max(newestKept, g.FencingToken)
			}
		}
		// The per-name bound drops the records that ended first. One
		// holder at a time ends in token order, so a dropped grant is older
		// than every kept one; grants held side by side end in any order,
		// so a dropped one is only known to be older than the newest kept.
		bound := oldestKept
		if multi[key] {
			bound = newestKept
		}
		for tok, client := range granted[key] {
			g, ok := byToken[tok]
			switch {
			case !ok && ended >= perNameKept && tok < bound:
				// Dropped by the per-name bound.
			case !ok:
				r.anomaly(anomaly{Kind: "history:grant-missing", What: fmt.Sprintf("%s: token %d (granted to %s) is not in the history %+v", key, tok, client, grants)})
			case g.ClientID != client:
				r.anomaly(anomaly{Kind: "history:wrong-holder", What: fmt.Sprintf("%s: token %d was granted to %s, the history says %s", key, tok, client, g.ClientID)})
			case released[fmt.Sprintf("%s#%d", key, tok)] && g.EndCause != "released" && g.EndCause != "resigned":
				r.anomaly(anomaly{Kind: "history:wrong-cause", What: fmt.Sprintf("%s: token %d was released (acknowledged), the history says %q", key, tok, g.EndCause)})
			default:
				checked++
			}
		}
	}
	r.logf("history: %d acknowledged grants of %d names found with their end causes", checked, len(names))
	// On every shard: each has its own counter and revoke path.
	for k := range r.sm.n() {
		name, err := r.sm.nameIn(k, "final", "revoke")
		if err != nil {
			r.anomaly(anomaly{Kind: "harness", What: err.Error()})
			continue
		}
		r.revokeFences(leader, name)
	}
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

// revokeFences revokes a fresh grant and checks the revoked holder is
// fenced. Its calls stay out of the recorded history: the linearizability
// model has no revoke.
func (r *runner) revokeFences(node int, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	type grant struct {
		FencingToken uint64 `json:"fencing_token"`
		LeaseID      string `json:"lease_id"`
	}
	acquire := func(client string) (grant, error) {
		var g grant
		status, body, err := r.api.send(ctx, node, http.MethodPost, lockPath(name, "acquire"),
			map[string]any{"client_id": client, "ttl_ms": 30000, "wait_timeout_ms": 10000, "request_id": client + "-1"})
		if err == nil && status != 200 {
			err = fmt.Errorf("status %d: %s", status, body)
		}
		if err == nil {
			err = json.Unmarshal(body, &g)
		}
		return g, err
	}
	first, err := acquire("revoked")
	if err != nil {
		r.anomaly(anomaly{Kind: "liveness:final-acquire", What: "an acquire to revoke failed: " + err.Error()})
		return
	}
	status, body, err := r.api.send(ctx, node, http.MethodPost, lockPath(name, "revoke"),
		map[string]any{"fencing_token": first.FencingToken, "reason": "chaos", "request_id": "chaos-revoke"})
	if err != nil || status != 200 {
		r.anomaly(anomaly{Kind: "revoke:failed", What: fmt.Sprintf("revoke of token %d: %d %v %s", first.FencingToken, status, err, body)})
		return
	}
	next, err := acquire("after-revoke")
	if err != nil || next.FencingToken <= first.FencingToken {
		r.anomaly(anomaly{Kind: "safety:revoke-not-fenced", What: fmt.Sprintf("after revoking token %d the next grant is %+v (%v)", first.FencingToken, next, err)})
	}
	status, body, err = r.api.send(ctx, node, http.MethodPost, lockPath(name, "renew"),
		map[string]any{"client_id": "revoked", "fencing_token": first.FencingToken, "lease_id": first.LeaseID})
	if err != nil || status != 409 || !strings.Contains(string(body), "lock_lost") {
		r.anomaly(anomaly{Kind: "safety:revoke-not-fenced", What: fmt.Sprintf("the revoked holder's renew: %d %v %s; want 409 lock_lost", status, err, body)})
	}
	r.logf("revoke on %s: token %d revoked, the next grant has %d, the revoked holder's renew is lock_lost", name, first.FencingToken, next.FencingToken)
}
