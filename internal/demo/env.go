package demo

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/dlock/dlock/client"
)

// clientIDs are the demo's three clients.
var clientIDs = []string{"client1", "client2", "client3"}

// env is one run of the demo: its processes, clients and what the data
// store has accepted so far.
type env struct {
	cfg Config
	dir string
	hc  *http.Client

	nodes    []*node
	store    *proc
	storeURL string
	// procs is every process started, for teardown.
	procs []*proc

	clients map[string]*client.Client
	// accepted is every write the data store accepted, in order: GET /data
	// must show exactly these.
	accepted []record
	// l3 is client2's hold of l3 from step d, whose proof step e borrows.
	l3 *held

	summary  []string
	tornDown bool
}

func newEnv(cfg Config, dir string) *env {
	// Every request to a node or the store is bounded here; the waits in
	// line go through package client, which bounds its own.
	return &env{cfg: cfg, dir: dir, hc: &http.Client{Timeout: 5 * time.Second}, clients: map[string]*client.Client{}}
}

// secs shows a duration as the demo's script does: "60s", not "1m0s".
func secs(d time.Duration) string {
	if d%time.Second == 0 {
		return fmt.Sprintf("%ds", d/time.Second)
	}
	return d.String()
}

func (e *env) heading(step, format string, args ...any) {
	fmt.Fprintf(e.cfg.Out, "\n[%s] %s\n", step, fmt.Sprintf(format, args...))
}

func (e *env) say(format string, args ...any) {
	fmt.Fprintf(e.cfg.Out, "    %s\n", fmt.Sprintf(format, args...))
}

// done records a step's one-line result for the summary.
func (e *env) done(format string, args ...any) {
	e.summary = append(e.summary, fmt.Sprintf(format, args...))
}

// setup starts the cluster, waits for a leader, starts the data store and
// makes the three clients.
func (e *env) setup(ctx context.Context) error {
	if err := e.startCluster(ctx); err != nil {
		return err
	}
	leader, err := e.waitLeader(ctx, e.alive())
	if err != nil {
		return err
	}
	e.say("%d nodes up (%s); the leader is %s", len(e.nodes), e.nodeList(), leader.id)
	if err := e.startStore(ctx); err != nil {
		return err
	}
	e.say("data store up at %s (pid %d), checking token proofs with the cluster's keys", e.storeURL, e.store.Pid())
	for _, id := range clientIDs {
		c, err := client.New(client.Config{Endpoints: e.endpoints(), ClientID: id, RequestTimeout: 3 * time.Second})
		if err != nil {
			return fmt.Errorf("make %s: %w", id, err)
		}
		e.clients[id] = c
	}
	return nil
}

// teardown stops every process (by pid), in parallel, and the clients;
// later calls do nothing. Locks still held are not released: the cluster
// goes away with them.
func (e *env) teardown() {
	if e.tornDown {
		return
	}
	e.tornDown = true
	for _, c := range e.clients {
		_ = c.Close()
	}
	var wg sync.WaitGroup
	for _, p := range e.procs {
		wg.Go(p.stop)
	}
	wg.Wait()
	e.hc.CloseIdleConnections()
	if len(e.procs) > 0 {
		var pids []string
		for _, p := range e.procs {
			pids = append(pids, fmt.Sprintf("%s=%d", p.Name, p.Pid()))
		}
		e.heading("end", "stopped every process the demo started: %s", strings.Join(pids, " "))
	}
}

func (e *env) printSummary(took time.Duration) {
	e.heading("summary", "all %d steps passed in %s", len(e.cfg.Steps), took.Round(100*time.Millisecond))
	for _, s := range e.summary {
		e.say("%s", s)
	}
}
