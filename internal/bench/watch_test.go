package bench

import (
	"context"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/testcluster"
)

// A member whose API address refuses connections (down, or advertised at an
// address the bench host cannot reach) must not make the watch workload wait
// for ever for its stream to open: it ends with an error, at the latest when
// its context does (Ctrl-C).
func TestWatchWorkloadEndsWhenAMemberIsUnreachable(t *testing.T) {
	dead := testcluster.FreePort(t) // nothing listens there

	cfg := Config{Workload: "watch", Endpoints: []string{"http://" + dead}, Duration: time.Second}
	cfg.defaults()
	ci := &clusterInfo{LeaderID: "n1", Members: []clusterMember{{ID: "n1", APIAddr: dead}}}
	c := newDlockClient(cfg.Endpoints, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- dlockWatch(ctx, &cfg, &Result{Config: map[string]string{}}, c, ci, "rv") }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the watch workload reported success although a member's stream never opened")
		}
	case <-time.After(6 * time.Second):
		t.Fatalf("dlockWatch still blocked 4 s after its context ended (ready.Wait never returns)")
	}
}
