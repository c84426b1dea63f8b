// Package metrics exposes one node's Prometheus metrics at /metrics: request
// latencies by operation and outcome, state-machine events, the lock table's
// size, watchers, and Raft's state, indexes, leader changes and forwarding —
// plus hashicorp/raft's own timings (commit, log writes, replication,
// snapshots) bridged from go-metrics.
package metrics

import (
	"errors"
	"net/http"
	"os"
	"sync"
	"time"

	gometrics "github.com/hashicorp/go-metrics/compat"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/dlock/dlock/internal/buildinfo"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/raftnode"
	"github.com/dlock/dlock/internal/state"
)

// Source is what the metrics read on each scrape.
type Source interface {
	Status() raftnode.Status
	Read(fn func(*state.State))
	Watchers() int
}

// Metrics holds one node's collectors. It implements fsm.Observer (event
// counters) and the service's Recorder (request latencies).
type Metrics struct {
	reg     *prometheus.Registry
	ops     *prometheus.HistogramVec
	events  *prometheus.CounterVec
	limited *prometheus.CounterVec
}

// raftReg holds the histograms fed by hashicorp/raft's go-metrics (raftSink),
// process-wide because go-metrics has a single global sink per process. Raft
// emits through go-metrics/compat, which forwards to armon/go-metrics unless
// the binary is built with the hashicorpmetrics tag; installing the sink
// through the same compat package puts it where Raft writes under either build.
var (
	raftOnce sync.Once
	raftReg  = prometheus.NewRegistry()
)

func bridgeRaftMetrics() {
	raftOnce.Do(func() {
		cfg := gometrics.DefaultConfig("dlock")
		cfg.EnableHostname = false
		cfg.EnableRuntimeMetrics = false
		// NewGlobal fails only for sinks that cannot start; this one cannot.
		_, _ = gometrics.NewGlobal(cfg, newRaftSink(raftReg))
	})
}

// New makes the collectors; Attach adds the ones that read the node. The split
// lets the event counter observe the FSM from before Raft starts.
func New() *Metrics {
	bridgeRaftMetrics()
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.ops = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "dlock_request_duration_seconds",
		Help:    "Time to answer a client request, by operation and outcome code (ok or the error code).",
		Buckets: []float64{.0002, .0005, .001, .002, .005, .01, .02, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"op", "code"})
	m.events = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dlock_events_total",
		Help: "State changes applied on this node, by event type and kind (lock, election, session).",
	}, []string{"type", "kind"})
	m.limited = newLimited()
	// Nodes of one `dlock dev` share a process, and so its process_* series:
	// the pid tells a reader (dlock bench's CPU accounting) which of them to
	// count once.
	pid := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "dlock_process_id",
		Help: "The operating system's id of the process that serves this node (nodes of one `dlock dev` share it).",
	}, func() float64 { return float64(os.Getpid()) })
	bi := buildinfo.Get()
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "dlock_build_info",
		Help:        "Always 1; its labels say which build of dlock this node runs.",
		ConstLabels: prometheus.Labels{"version": bi.Version, "commit": bi.Commit, "goversion": bi.GoVersion},
	})
	build.Set(1)
	m.reg.MustRegister(m.ops, m.events, m.limited, pid, build,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Attach adds the gauges read from the running node at scrape time.
func (m *Metrics) Attach(src Source) { m.reg.MustRegister(&tableCollector{src: src}) }

// Handler serves the node's metrics and Raft's.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(prometheus.Gatherers{m.reg, raftReg}, promhttp.HandlerOpts{})
}

// Op records one request's latency and outcome (service.Recorder).
func (m *Metrics) Op(op string, d time.Duration, err error) {
	code := "ok"
	if err != nil {
		var ae *apierror.Error
		if errors.As(err, &ae) {
			code = string(ae.Code)
		} else {
			code = string(apierror.Internal)
		}
	}
	m.ops.WithLabelValues(op, code).Observe(d.Seconds())
}

// Applied counts public events (fsm.Observer).
func (m *Metrics) Applied(_ uint64, events []state.Event) {
	for i := range events {
		e := &events[i]
		if !e.Type.Public() {
			continue
		}
		kind := "lock"
		switch {
		case e.Type == state.EventSessionCreated || e.Type == state.EventSessionExpired || e.Type == state.EventSessionDeleted:
			kind = "session"
		default:
			if _, election := command.SplitKey(e.Name); election {
				kind = "election"
			}
		}
		m.events.WithLabelValues(e.Type.String(), kind).Inc()
	}
}

// Restored is a no-op: gauges are read from the state at scrape time.
func (m *Metrics) Restored(*state.State) {}

// tableCollector reads gauges at scrape time, so they can never drift from
// the state they describe.
type tableCollector struct{ src Source }

var (
	descRaftState     = prometheus.NewDesc("dlock_raft_state", "1 for this node's current Raft state.", []string{"state"}, nil)
	descTerm          = prometheus.NewDesc("dlock_raft_term", "Current Raft term.", nil, nil)
	descCommit        = prometheus.NewDesc("dlock_raft_commit_index", "Raft commit index known to this node.", nil, nil)
	descApplied       = prometheus.NewDesc("dlock_raft_applied_index", "Last log index applied to this node's state machine.", nil, nil)
	descLastContact   = prometheus.NewDesc("dlock_raft_last_contact_seconds", "Time since this follower last heard from the leader (0 on the leader).", nil, nil)
	descLeaderChanges = prometheus.NewDesc("dlock_raft_leadership_changes_total", "Times this node gained or lost leadership.", nil, nil)
	descForwarded     = prometheus.NewDesc("dlock_forwarded_requests_total", "Writes this node forwarded to the leader.", nil, nil)
	descProposed      = prometheus.NewDesc("dlock_raft_proposed_entries_total", "Log entries this node proposed as leader (writes are packed into them; see dlock_raft_proposed_commands_total).", nil, nil)
	descNotices       = prometheus.NewDesc("dlock_raft_commit_notices_total", "Barrier entries this node appended as leader to tell the followers of its last commit when no further write followed within the notice delay (1 ms), so their watches, reads and forwarded writes need not wait for Raft's 50-100 ms commit timeout.", nil, nil)
	descPackLingers   = prometheus.NewDesc("dlock_raft_pack_lingers_total", "Lone writes this node held back as leader, up to the pack linger (100 µs by default), for a second write to share their log entry, because lone writes had just come in pairs (a contended lock's hand-offs).", nil, nil)
	descProposedCmds  = prometheus.NewDesc("dlock_raft_proposed_commands_total", "Writes this node proposed as leader, over all its entries: divided by dlock_raft_proposed_entries_total, the writes per log entry.", nil, nil)
	descCommitsBy     = prometheus.NewDesc("dlock_raft_commits_total", "Etcd engine only: commit-index advances this node made as leader, by what came last: leader_write (its own log write became durable), follower_ack (a follower's acknowledgement, the leader's write already durable) or followers_alone (followers' acknowledgements before the leader's write was durable). The leader writes while it replicates: a growing share of leader_write and followers_alone says its own disk holds commits back.", []string{"by"}, nil)
	descHasLeader     = prometheus.NewDesc("dlock_raft_has_leader", "1 if this node knows a leader.", nil, nil)
	descLocks         = prometheus.NewDesc("dlock_locks_held", "Locks and election seats currently held.", nil, nil)
	descWaiters       = prometheus.NewDesc("dlock_waiters", "Acquires and campaigns waiting in queues.", nil, nil)
	descLeases        = prometheus.NewDesc("dlock_leases", "Live leases (implicit and sessions).", nil, nil)
	descSessions      = prometheus.NewDesc("dlock_sessions", "Live sessions.", nil, nil)
	descWatchers      = prometheus.NewDesc("dlock_watchers", "Open watch streams on this node.", nil, nil)
	descRevision      = prometheus.NewDesc("dlock_revision", "State revision applied on this node.", nil, nil)
	descToken         = prometheus.NewDesc("dlock_fencing_token_last", "Last fencing token granted.", nil, nil)
)

func (c *tableCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRaftState, descTerm, descCommit, descApplied, descLastContact, descLeaderChanges,
		descForwarded, descProposed, descProposedCmds, descPackLingers, descNotices, descCommitsBy, descHasLeader, descLocks, descWaiters, descLeases, descSessions, descWatchers, descRevision, descToken} {
		ch <- d
	}
}

func (c *tableCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.src.Status()
	for _, s := range []string{"Follower", "Candidate", "Leader", "Shutdown"} {
		v := 0.0
		if st.State == s {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(descRaftState, prometheus.GaugeValue, v, s)
	}
	gauge := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	counter := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	gauge(descTerm, float64(st.Term))
	gauge(descCommit, float64(st.CommitIndex))
	gauge(descApplied, float64(st.AppliedIndex))
	contact := st.LastContact.Seconds()
	if st.State == "Leader" {
		contact = 0
	}
	gauge(descLastContact, contact)
	counter(descLeaderChanges, float64(st.LeaderChanges))
	counter(descForwarded, float64(st.Forwarded))
	counter(descProposed, float64(st.ProposedEntries))
	counter(descProposedCmds, float64(st.ProposedCommands))
	counter(descNotices, float64(st.CommitNotices))
	counter(descPackLingers, float64(st.PackLingers))
	if by := st.CommitsBy; by != nil {
		ch <- prometheus.MustNewConstMetric(descCommitsBy, prometheus.CounterValue, float64(by.LeaderWrite), "leader_write")
		ch <- prometheus.MustNewConstMetric(descCommitsBy, prometheus.CounterValue, float64(by.FollowerAck), "follower_ack")
		ch <- prometheus.MustNewConstMetric(descCommitsBy, prometheus.CounterValue, float64(by.FollowersAlone), "followers_alone")
	}
	has := 0.0
	if st.LeaderID != "" {
		has = 1
	}
	gauge(descHasLeader, has)
	var counts state.Counts
	c.src.Read(func(s *state.State) { counts = s.Counts() })
	gauge(descLocks, float64(counts.Held))
	gauge(descWaiters, float64(counts.Waiters))
	gauge(descLeases, float64(counts.Leases))
	gauge(descSessions, float64(counts.Sessions))
	gauge(descWatchers, float64(c.src.Watchers()))
	gauge(descRevision, float64(st.Revision))
	gauge(descToken, float64(st.LastToken))
}
