package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"github.com/dlock/dlock/internal/loopback"
)

const host = "127.0.0.1"

// pollEvery paces every wait for a condition.
const pollEvery = 50 * time.Millisecond

// node is one `dlock serve` process.
type node struct {
	id      string
	apiAddr string
	p       *proc
}

func (n *node) url() string { return "http://" + n.apiAddr }

// startCluster starts every node on first boot, on free loopback ports:
// node i serves the API on base+10i and Raft on base+10i+1; the data store
// gets base+10n.
func (e *env) startCluster(ctx context.Context) error {
	n := e.cfg.Nodes
	offsets := []int{10 * n}
	for i := range n {
		offsets = append(offsets, 10*i, 10*i+1)
	}
	base, err := loopback.FreeBase([]string{host}, offsets, rand.IntN)
	if err != nil {
		return fmt.Errorf("pick ports: %w", err)
	}
	var initial []string
	for i := range n {
		initial = append(initial, fmt.Sprintf("n%d=%s:%d", i+1, host, base+10*i+1))
	}
	for i := range n {
		nd := &node{id: fmt.Sprintf("n%d", i+1), apiAddr: fmt.Sprintf("%s:%d", host, base+10*i)}
		p, err := e.startProc(nd.id, []string{"serve", "--id", nd.id, "--data-dir", filepath.Join(e.dir, nd.id),
			"--api-addr", nd.apiAddr, "--raft-addr", fmt.Sprintf("%s:%d", host, base+10*i+1),
			"--initial-cluster", strings.Join(initial, ","), "--log-level", "warn"}, nil)
		if err != nil {
			return err
		}
		nd.p = p
		e.nodes = append(e.nodes, nd)
	}
	e.storeURL = fmt.Sprintf("http://%s:%d", host, base+10*n)
	for _, nd := range e.nodes {
		if err := e.waitUntil(ctx, nd.id+" ready (GET /readyz)", nd.p, func() (bool, error) {
			err := e.getJSON(ctx, nd.url()+"/readyz", nil)
			return err == nil, err
		}); err != nil {
			return err
		}
	}
	return nil
}

func (e *env) alive() []*node {
	var out []*node
	for _, nd := range e.nodes {
		if !nd.p.Exited() {
			out = append(out, nd)
		}
	}
	return out
}

// endpoints lists every node, dead or alive: a client is configured once
// and must find its way around the dead ones itself.
func (e *env) endpoints() []string {
	var out []string
	for _, nd := range e.nodes {
		out = append(out, nd.url())
	}
	return out
}

func (e *env) nodeList() string {
	var s []string
	for _, nd := range e.nodes {
		s = append(s, fmt.Sprintf("%s pid %d %s", nd.id, nd.p.Pid(), nd.url()))
	}
	return strings.Join(s, ", ")
}

// waitLeader waits until every node in among names the same leader, one of
// them, and returns it.
func (e *env) waitLeader(ctx context.Context, among []*node) (*node, error) {
	var leader *node
	err := e.waitUntil(ctx, "a leader that every live node agrees on", nil, func() (bool, error) {
		leader = nil
		for _, nd := range among {
			var ci struct {
				LeaderID string `json:"leader_id"`
			}
			if err := e.getJSON(ctx, nd.url()+"/api/v1/cluster", &ci); err != nil {
				return false, err
			}
			if leader != nil && ci.LeaderID != leader.id {
				return false, fmt.Errorf("%s names %q, others %q", nd.id, ci.LeaderID, leader.id)
			}
			if leader = nodeByID(among, ci.LeaderID); leader == nil {
				return false, fmt.Errorf("%s names leader %q", nd.id, ci.LeaderID)
			}
		}
		return true, nil
	})
	return leader, err
}

func nodeByID(nodes []*node, id string) *node {
	for _, nd := range nodes {
		if nd.id == id {
			return nd
		}
	}
	return nil
}

// waitUntil polls cond until it holds or ctx ends; the error then says what
// was awaited and the last reason it did not hold. If p exits meanwhile the
// wait ends at once, pointing at its log.
func (e *env) waitUntil(ctx context.Context, what string, p *proc, cond func() (bool, error)) error {
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	var last error
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		if p != nil && p.Exited() {
			return e.exitedErr(p, "while waiting for "+what)
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("waiting for %s: %w (last: %v)", what, ctx.Err(), last)
			}
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-t.C:
		}
	}
}

// getJSON GETs url and decodes its 200 answer into out (nil: only the
// status matters).
func (e *env) getJSON(ctx context.Context, url string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := e.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	return nil
}
