package metrics

import (
	"testing"

	gometrics "github.com/hashicorp/go-metrics/compat"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestRaftSinkKeepsTheTimingsThatExplainLatency(t *testing.T) {
	peer := []gometrics.Label{{Name: "peer_id", Value: "n2"}}
	cases := []struct {
		name   string
		key    []string
		labels []gometrics.Label
		metric string // name{labels} of the series that must get the sample; "" for dropped
	}{
		{"commit", []string{"dlock", "raft", "commitTime"}, nil, "dlock_raft_commit_seconds"},
		{"leader write", []string{"dlock", "raft", "leader", "dispatchLog"}, nil, "dlock_raft_leader_log_write_seconds"},
		{"replication", []string{"dlock", "raft", "replication", "appendEntries", "rpc"}, peer, `dlock_raft_replication_seconds{peer_id="n2"}`},
		{"follower write", []string{"dlock", "raft", "rpc", "appendEntries", "storeLogs"}, nil, "dlock_raft_follower_log_write_seconds"},
		{"apply batch", []string{"dlock", "raft", "fsm", "applyBatch"}, nil, "dlock_raft_fsm_apply_batch_seconds"},
		{"snapshot persist", []string{"dlock", "raft", "snapshot", "persist"}, nil, `dlock_raft_snapshot_seconds{phase="persist"}`},
		{"restore", []string{"dlock", "raft", "fsm", "restore"}, nil, `dlock_raft_snapshot_seconds{phase="restore"}`},
		// Dropped: per-RPC and per-entry noise, the per-peer copy, other services.
		{"per-peer copy", []string{"dlock", "raft", "replication", "appendEntries", "rpc", "n2"}, nil, ""},
		{"rpc decode", []string{"dlock", "raft", "net", "rpcDecode"}, []gometrics.Label{{Name: "rpcType", Value: "AppendEntries"}}, ""},
		{"enqueue", []string{"dlock", "raft", "fsm", "enqueue"}, nil, ""},
		{"replication without peer", []string{"dlock", "raft", "replication", "appendEntries", "rpc"}, nil, ""},
		{"other service", []string{"consul", "raft", "commitTime"}, nil, ""},
		{"short", []string{"dlock"}, nil, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			s := newRaftSink(reg)
			s.AddSampleWithLabels(c.key, 2.5, c.labels)
			mfs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, mf := range mfs {
				for _, m := range mf.GetMetric() {
					h := m.GetHistogram()
					if h == nil || h.GetSampleCount() == 0 {
						continue
					}
					series := mf.GetName()
					for _, l := range m.GetLabel() {
						series += "{" + l.GetName() + `="` + l.GetValue() + `"}`
					}
					got = append(got, series)
					if h.GetSampleSum() != 0.0025 {
						t.Errorf("%s: sum %v s, want 0.0025 (2.5 ms)", series, h.GetSampleSum())
					}
				}
			}
			switch {
			case c.metric == "" && len(got) != 0:
				t.Errorf("sample kept in %v, want dropped", got)
			case c.metric != "" && (len(got) != 1 || got[0] != c.metric):
				t.Errorf("sample in %v, want %s", got, c.metric)
			}
		})
	}
}

func TestRaftSinkCountsRoleChanges(t *testing.T) {
	s := newRaftSink(prometheus.NewRegistry())
	s.IncrCounter([]string{"dlock", "raft", "state", "leader"}, 1)
	s.IncrCounter([]string{"dlock", "raft", "transition", "heartbeat_timeout"}, 1)
	s.IncrCounter([]string{"dlock", "raft", "apply"}, 1) // per entry: dropped
	if n := testutil.ToFloat64(s.transitions.WithLabelValues("state_leader")); n != 1 {
		t.Errorf("state_leader = %v", n)
	}
	if n := testutil.ToFloat64(s.transitions.WithLabelValues("heartbeat_timeout")); n != 1 {
		t.Errorf("heartbeat_timeout = %v", n)
	}
	if n := testutil.CollectAndCount(s.transitions); n != 2 {
		t.Errorf("%d transition series, want 2", n)
	}
}
