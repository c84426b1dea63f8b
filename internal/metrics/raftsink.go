package metrics

import (
	gometrics "github.com/hashicorp/go-metrics/compat"
	"github.com/prometheus/client_golang/prometheus"
)

// raftSink receives hashicorp/raft's go-metrics samples (and the etcd
// engine's, under the same keys) and keeps the few that explain a commit's
// latency and the cost of snapshots, as Prometheus histograms. It drops everything else on a switch, without building a string:
// Raft emits several samples per RPC and per entry, and go-metrics' own
// Prometheus sink (a summary per key behind a lock) took 4–5 % of each node's
// CPU under load for numbers nobody alerts on (docs/benchmarks.md). Histograms,
// unlike summaries, also add up across nodes.
type raftSink struct {
	commit      prometheus.Histogram
	dispatch    prometheus.Histogram
	replicate   *prometheus.HistogramVec
	storeLogs   prometheus.Histogram
	applyBatch  prometheus.Histogram
	snapshot    *prometheus.HistogramVec
	transitions *prometheus.CounterVec
}

// raftBuckets span a loopback fsync (~0.1 ms) to a stalled disk (seconds).
var raftBuckets = prometheus.ExponentialBuckets(0.00005, 2, 18)

func newRaftSink(reg prometheus.Registerer) *raftSink {
	h := func(name, help string) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: raftBuckets})
	}
	hv := func(name, help, label string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: raftBuckets}, []string{label})
	}
	s := &raftSink{
		commit: h("dlock_raft_commit_seconds",
			"Leader: time from writing a batch of entries to the log until a majority has it (Raft commitTime)."),
		dispatch: h("dlock_raft_leader_log_write_seconds",
			"Leader: time to write and fsync a batch of new entries to its own log before replicating them (Raft leader.dispatchLog)."),
		replicate: hv("dlock_raft_replication_seconds",
			"Leader: round trip of one AppendEntries call to a follower, its fsync included (Raft replication.appendEntries.rpc).", "peer_id"),
		storeLogs: h("dlock_raft_follower_log_write_seconds",
			"Follower: time to write and fsync the entries of one AppendEntries call (Raft rpc.appendEntries.storeLogs)."),
		applyBatch: h("dlock_raft_fsm_apply_batch_seconds",
			"Time to apply one batch of committed entries to the state machine (Raft fsm.applyBatch)."),
		snapshot: hv("dlock_raft_snapshot_seconds",
			"Snapshot phases: fsm_snapshot (capture), create (whole), persist (write out), restore (install).", "phase"),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dlock_raft_transitions_total",
			Help: "Raft role changes and their causes: state_candidate, state_follower, state_leader, heartbeat_timeout, leader_lease_timeout."},
			[]string{"kind"}),
	}
	reg.MustRegister(s.commit, s.dispatch, s.replicate, s.storeLogs, s.applyBatch, s.snapshot, s.transitions)
	return s
}

// raftKey strips go-metrics' service prefix; ok is false for anything that is
// not Raft's.
func raftKey(key []string) ([]string, bool) {
	if len(key) < 3 || key[0] != "dlock" || key[1] != "raft" {
		return nil, false
	}
	return key[2:], true
}

// sample maps one timing key (milliseconds, as Raft reports them) to its
// histogram; peer is the peer_id label when there is one.
func (s *raftSink) sample(key []string, ms float32, peer string) {
	k, ok := raftKey(key)
	if !ok {
		return
	}
	sec := float64(ms) / 1000
	switch len(k) {
	case 1:
		if k[0] == "commitTime" {
			s.commit.Observe(sec)
		}
	case 2:
		switch {
		case k[0] == "leader" && k[1] == "dispatchLog":
			s.dispatch.Observe(sec)
		case k[0] == "fsm" && k[1] == "applyBatch":
			s.applyBatch.Observe(sec)
		case k[0] == "fsm" && k[1] == "snapshot":
			s.snapshot.WithLabelValues("fsm_snapshot").Observe(sec)
		case k[0] == "fsm" && k[1] == "restore":
			s.snapshot.WithLabelValues("restore").Observe(sec)
		case k[0] == "snapshot" && k[1] == "create":
			s.snapshot.WithLabelValues("create").Observe(sec)
		case k[0] == "snapshot" && k[1] == "persist":
			s.snapshot.WithLabelValues("persist").Observe(sec)
		}
	case 3:
		switch {
		// The per-peer copy with the peer in the key (len 4) is skipped; the
		// labelled one carries the same sample.
		case k[0] == "replication" && k[1] == "appendEntries" && k[2] == "rpc" && peer != "":
			s.replicate.WithLabelValues(peer).Observe(sec)
		case k[0] == "rpc" && k[1] == "appendEntries" && k[2] == "storeLogs":
			s.storeLogs.Observe(sec)
		}
	}
}

func peerOf(labels []gometrics.Label) string {
	for _, l := range labels {
		if l.Name == "peer_id" {
			return l.Value
		}
	}
	return ""
}

func (s *raftSink) AddSample(key []string, val float32) { s.sample(key, val, "") }
func (s *raftSink) AddSampleWithLabels(key []string, val float32, labels []gometrics.Label) {
	s.sample(key, val, peerOf(labels))
}

func (s *raftSink) IncrCounter(key []string, val float32) {
	k, ok := raftKey(key)
	if !ok || len(k) != 2 {
		return
	}
	switch {
	case k[0] == "state" && (k[1] == "candidate" || k[1] == "follower" || k[1] == "leader"):
		s.transitions.WithLabelValues("state_" + k[1]).Add(float64(val))
	case k[0] == "transition" && (k[1] == "heartbeat_timeout" || k[1] == "leader_lease_timeout"):
		s.transitions.WithLabelValues(k[1]).Add(float64(val))
	}
}

func (s *raftSink) IncrCounterWithLabels(key []string, val float32, _ []gometrics.Label) {
	s.IncrCounter(key, val)
}

// Gauges and keys are not kept: the node's own collectors report Raft's state,
// term and indexes at scrape time.
func (s *raftSink) SetGauge([]string, float32)                              {}
func (s *raftSink) SetGaugeWithLabels([]string, float32, []gometrics.Label) {}
func (s *raftSink) EmitKey([]string, float32)                               {}
