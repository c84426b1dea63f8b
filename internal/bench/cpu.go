package bench

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"time"
)

// loadGenerator names the bench process itself in Result.CPU.
const loadGenerator = "load generator"

// ProcessCPU is the CPU time (user + system) one process used during the
// measured window, and that time per unit of the run's headline throughput
// (per lock+unlock cycle, per hand-off). On a machine whose cores are busy,
// throughput is bounded by the sum of these over every process, which is
// steadier from run to run than the throughput itself.
type ProcessCPU struct {
	// Process is a node id, an etcd member name, or "load generator".
	Process     string  `json:"process"`
	Seconds     float64 `json:"cpu_seconds"`
	PerOpMicros float64 `json:"cpu_us_per_op"`
	Error       string  `json:"error,omitempty"`
}

// cpuMeter reads every server's process_cpu_seconds_total (from its
// Prometheus /metrics) and the load generator's own CPU time at the start and
// the end of the measured window. Its goroutine is owned by the run that
// started it: it exits after the second reading, when ctx ends, or when the
// run abandons it, and finish and abandon wait for it.
type cpuMeter struct {
	done   chan struct{}
	cancel context.CancelFunc
	mu     sync.Mutex
	before map[string]float64
	after  map[string]float64
	errs   map[string]string
	// pid is a dlock node's dlock_process_id: the nodes of one `dlock dev`
	// share a process, whose CPU is counted once, under all their names.
	pid map[string]float64
}

// cpuScrapeTimeout bounds one reading of one node's /metrics.
const cpuScrapeTimeout = 5 * time.Second

// startCPUMeter starts reading at the window that window(cfg) will give a
// workload started right after it (now + warm-up, for the duration).
func startCPUMeter(ctx context.Context, cfg *Config, metricsURLs map[string]string) *cpuMeter {
	ctx, cancel := context.WithCancel(ctx)
	m := &cpuMeter{done: make(chan struct{}), cancel: cancel, before: map[string]float64{}, after: map[string]float64{},
		errs: map[string]string{}, pid: map[string]float64{}}
	start := time.Now().Add(cfg.Warmup)
	end := start.Add(cfg.Duration)
	hc := newHTTPClient(len(metricsURLs), cpuScrapeTimeout)
	go func() {
		defer close(m.done)
		defer cancel()
		defer hc.CloseIdleConnections()
		for _, at := range []struct {
			t    time.Time
			into map[string]float64
		}{{start, m.before}, {end, m.after}} {
			if !pause(ctx, time.Until(at.t)) {
				return
			}
			m.read(ctx, hc, metricsURLs, at.into)
		}
	}()
	return m
}

// read takes one reading of every process, the servers in parallel so the
// readings are as close in time as the scrapes allow.
func (m *cpuMeter) read(ctx context.Context, hc *http.Client, metricsURLs map[string]string, into map[string]float64) {
	var wg sync.WaitGroup
	for id, u := range metricsURLs {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, cpuScrapeTimeout)
			defer cancel()
			v, err := scrapeMetrics(cctx, hc, u, "process_cpu_seconds_total", "dlock_process_id")
			if err == nil {
				err = requireSeries(v, u, "process_cpu_seconds_total")
			}
			m.mu.Lock()
			defer m.mu.Unlock()
			if err != nil {
				m.errs[id] = err.Error()
				return
			}
			into[id] = v["process_cpu_seconds_total"]
			if pid, ok := v["dlock_process_id"]; ok {
				m.pid[id] = pid
			}
		})
	}
	if s, ok := selfCPUSeconds(); ok {
		m.mu.Lock()
		into[loadGenerator] = s
		m.mu.Unlock()
	}
	wg.Wait()
}

// unreadable records a process the meter cannot read at all.
func (m *cpuMeter) unreadable(id, why string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.errs[id] = why
}

// abandon stops the meter of a run that failed, without waiting out its
// window.
func (m *cpuMeter) abandon() {
	m.cancel()
	<-m.done
}

// finish waits for the second reading and adds the CPU per operation to res,
// whose Throughput and Seconds must already be set.
func (m *cpuMeter) finish(res *Result) {
	<-m.done
	m.mu.Lock()
	defer m.mu.Unlock()
	ops := res.Throughput * res.Seconds
	names := map[string][]string{} // the first node id of a process -> all of them
	var ids []string
	byPID := map[float64]string{}
	for _, id := range sortedKeys(m.before) {
		pid, ok := m.pid[id]
		if first, seen := byPID[pid]; ok && seen {
			names[first] = append(names[first], id)
			continue
		}
		if ok {
			byPID[pid] = id
		}
		ids = append(ids, id)
		names[id] = []string{id}
	}
	for _, id := range ids {
		c := ProcessCPU{Process: strings.Join(names[id], "+")}
		after, ok := m.after[id]
		switch {
		case m.errs[id] != "":
			c.Error = m.errs[id]
		case !ok:
			c.Error = "no reading at the end of the window"
		default:
			c.Seconds = round3(after - m.before[id])
			if ops > 0 {
				c.PerOpMicros = round3(c.Seconds * 1e6 / ops)
			}
		}
		res.CPU = append(res.CPU, c)
	}
	for _, id := range sortedKeys(m.errs) {
		if _, ok := m.before[id]; !ok {
			res.CPU = append(res.CPU, ProcessCPU{Process: id, Error: m.errs[id]})
		}
	}
}
