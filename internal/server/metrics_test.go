package server_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/raftnode"
	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/testcluster"
)

func TestMetricsEndpoint(t *testing.T) {
	c := testcluster.New(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	code, _ := acquire(t, c, leader, "m/x", map[string]any{"client_id": "c", "ttl_ms": 10000})
	if code != 200 {
		t.Fatalf("acquire: %d", code)
	}
	acquire(t, c, leader, "m/x", map[string]any{"client_id": "d", "ttl_ms": 10000})
	res, err := http.Get(c.URL(leader) + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	text := string(body)
	for _, want := range []string{
		`dlock_request_duration_seconds_count{code="ok",op="acquire"} 1`,
		`dlock_request_duration_seconds_count{code="lock_held",op="acquire"} 1`,
		`dlock_events_total{kind="lock",type="acquired"}`,
		`dlock_raft_state{state="Leader"} 1`,
		`dlock_locks_held 1`,
		"dlock_raft_term ",
		"dlock_raft_applied_index ",
		"dlock_fencing_token_last ",
		"dlock_watchers 0",
		"dlock_raft_proposed_entries_total ",
		"dlock_raft_proposed_commands_total ",
		"dlock_raft_commit_notices_total ",
		"dlock_raft_pack_lingers_total ",
		"go_goroutines ",
		`dlock_build_info{commit="`,
		fmt.Sprintf("dlock_process_id %d\n", os.Getpid()),
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	// Only the etcd engine can say what completed a commit (its leader
	// writes while it replicates).
	byAck := `dlock_raft_commits_total{by="follower_ack"}`
	if has := strings.Contains(text, byAck); has != (testcluster.Engine() == raftnode.EngineEtcd) {
		t.Errorf("engine %s: metrics have %s: %v", testcluster.Engine(), byAck, has)
	}
	// Raft's own timings and role changes come through the go-metrics bridge
	// (the gauges above are ours; these are emitted by hashicorp/raft itself,
	// and under the same keys by the etcd engine). The cluster's nodes share
	// this process, so the followers' writes show here as well. A snapshot
	// taken now times its phases.
	if err := c.Server(leader).Node.Raft().Snapshot().Error(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	res, err = http.Get(c.URL(leader) + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(res.Body)
	res.Body.Close()
	text = string(body)
	timings := []string{
		"dlock_raft_leader_log_write_seconds_count ", "dlock_raft_follower_log_write_seconds_count ",
		"dlock_raft_fsm_apply_batch_seconds_count ", "dlock_raft_commit_seconds_count ",
		`dlock_raft_replication_seconds_count{peer_id="`,
		`dlock_raft_snapshot_seconds_count{phase="create"}`, `dlock_raft_snapshot_seconds_count{phase="persist"}`,
		`dlock_raft_snapshot_seconds_count{phase="fsm_snapshot"}`,
		`dlock_raft_transitions_total{kind="state_leader"}`,
	}
	// A histogram is listed from the start, with a count of 0: each must
	// have counted something.
	for _, want := range timings {
		counted := false
		for _, line := range strings.Split(text, "\n") {
			if strings.HasPrefix(line, want) && !strings.HasSuffix(line, " 0") {
				counted = true
			}
		}
		if !counted {
			t.Errorf("metrics lack Raft's own %q with a count above 0 (engine %s)", want, c.Server(leader).Node.Engine())
		}
	}
}

func TestClusterHealthProbesMembers(t *testing.T) {
	c := testcluster.New(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	get := func() service.ClusterInfo {
		var ci service.ClusterInfo
		if code, err := c.Do(context.Background(), http.MethodGet, c.URL(leader)+"/api/v1/cluster?health=true", nil, &ci); err != nil || code != 200 {
			t.Fatalf("cluster?health: %d %v", code, err)
		}
		return ci
	}
	for _, m := range get().Members {
		if m.Reachable == nil || !*m.Reachable || m.AppliedIndex == 0 {
			t.Fatalf("member %+v not probed", m)
		}
	}
	victim := c.Follower()
	c.Kill(victim)
	for _, m := range get().Members {
		if m.Reachable == nil || (m.ID == victim) == *m.Reachable {
			t.Fatalf("member %+v: reachable should be %v", m, m.ID != victim)
		}
	}
}
