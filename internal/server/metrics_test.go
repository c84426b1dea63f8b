package server_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/testcluster"
)

func TestMetricsEndpoint(t *testing.T) {
	c := testcluster.New(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	code, a := acquire(t, c, leader, "m/x", map[string]any{"client_id": "c", "ttl_ms": 10000})
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
		"go_goroutines ",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	_ = a
	// Raft's own timings come through the go-metrics bridge.
	if !strings.Contains(text, "dlock_raft_") {
		t.Errorf("no raft metrics")
	}
}
