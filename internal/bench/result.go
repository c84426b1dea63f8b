package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// Result is one run of one workload against one target.
type Result struct {
	Target   string `json:"target"`
	Workload string `json:"workload"`
	// Variant names a workload variant, e.g. "ttl-per-acquire".
	Variant string `json:"variant,omitempty"`
	Workers int    `json:"workers"`
	// Label is free text from --label (the script names its rows with it).
	Label string `json:"label,omitempty"`
	// Started is when the measured window began (UTC).
	Started time.Time `json:"started"`
	// Seconds is the length of the measured window.
	Seconds float64 `json:"seconds"`
	// Throughput is the workload's headline rate (ThroughputUnit per second):
	// lock+unlock cycles for uncontended and session, hand-offs for contended,
	// renewals for held, grants for watch.
	Throughput     float64 `json:"throughput"`
	ThroughputUnit string  `json:"throughput_unit"`
	// Ops are per-operation latencies (ms) and rates, only for operations that
	// completed inside the measured window.
	Ops map[string]OpResult `json:"ops"`
	// Errors counts failed operations by "op: reason".
	Errors map[string]int64 `json:"errors,omitempty"`
	// Counters are workload-specific counts (hand-offs, missing events, ...).
	Counters map[string]int64 `json:"counters,omitempty"`
	// Memory is per-node memory from /metrics (held workload), in MiB.
	Memory []NodeMemory `json:"memory,omitempty"`
	// CPU is each server's and the load generator's CPU time over the
	// window (uncontended, session and contended).
	CPU []ProcessCPU `json:"cpu,omitempty"`
	// Samples are raw measurements (failover times in ms).
	Samples []float64 `json:"samples_ms,omitempty"`
	// Rounds are the held workload's renewals per second in each of its
	// --held-rounds windows.
	Rounds []float64 `json:"rounds_per_sec,omitempty"`
	// Notes say how to read the numbers (what was timed, proxies used).
	Notes []string `json:"notes,omitempty"`
	// Config echoes the settings that shape the numbers.
	Config map[string]string `json:"config,omitempty"`
}

// OpResult is one operation's rate and latency.
type OpResult struct {
	PerSec float64 `json:"per_sec"`
	Summary
}

// NodeMemory is one node's memory as its /metrics reported it.
type NodeMemory struct {
	Node      string  `json:"node"`
	Phase     string  `json:"phase"`
	RSSMiB    float64 `json:"rss_mib"`
	HeapInUse float64 `json:"heap_inuse_mib"`
	Error     string  `json:"error,omitempty"`
}

// recorder collects one run's measurements. Only operations that complete
// inside the window [start, end) are kept, so warm-up and the drain at the
// end do not count.
type recorder struct {
	mu       sync.Mutex
	start    time.Time
	end      time.Time
	hists    map[string]*Histogram
	errors   map[string]int64
	counters map[string]int64
}

func newRecorder(start, end time.Time) *recorder {
	return &recorder{start: start, end: end, hists: map[string]*Histogram{},
		errors: map[string]int64{}, counters: map[string]int64{}}
}

// in reports whether t is inside the measured window.
func (r *recorder) in(t time.Time) bool { return !t.Before(r.start) && t.Before(r.end) }

func (r *recorder) hist(op string) *Histogram {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := r.hists[op]
	if h == nil {
		h = NewHistogram()
		r.hists[op] = h
	}
	return h
}

// observe records an operation that began at began and ended now, if it
// ended inside the window. It returns the end time.
func (r *recorder) observe(op string, began time.Time) time.Time {
	now := time.Now()
	if r.in(now) {
		r.hist(op).Record(now.Sub(began))
	}
	return now
}

// record records a duration for op if at (its end) is inside the window.
func (r *recorder) record(op string, at time.Time, d time.Duration) {
	if r.in(at) {
		r.hist(op).Record(d)
	}
}

// fail counts a failed operation (inside the window only).
func (r *recorder) fail(op string, err error) {
	if !r.in(time.Now()) {
		return
	}
	reason := errReason(err)
	r.mu.Lock()
	r.errors[op+": "+reason]++
	r.mu.Unlock()
}

// count adds n to a counter if now is inside the window.
func (r *recorder) count(name string, n int64) {
	if !r.in(time.Now()) {
		return
	}
	r.mu.Lock()
	r.counters[name] += n
	r.mu.Unlock()
}

// countAlways adds n to a counter regardless of the window.
func (r *recorder) countAlways(name string, n int64) {
	r.mu.Lock()
	r.counters[name] += n
	r.mu.Unlock()
}

// errReason shortens an error to a stable reason for counting.
func errReason(err error) string {
	if err == nil {
		return "unknown"
	}
	var ae *apiError
	if asAPIError(err, &ae) {
		return fmt.Sprintf("%d %s", ae.Status, ae.Code)
	}
	s := err.Error()
	switch {
	case strings.Contains(s, "context deadline exceeded"), strings.Contains(s, "Client.Timeout"):
		return "timeout"
	case strings.Contains(s, "connection refused"):
		return "connection refused"
	case strings.Contains(s, "connection reset"):
		return "connection reset"
	case strings.Contains(s, "EOF"):
		return "EOF"
	}
	if len(s) > 80 {
		s = s[:80]
	}
	return s
}

// fill copies the recorder's data into res; the window is [start, end).
func (r *recorder) fill(res *Result, withCDF bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	secs := r.end.Sub(r.start).Seconds()
	res.Started = r.start.UTC()
	res.Seconds = round3(secs)
	res.Ops = map[string]OpResult{}
	for op, h := range r.hists {
		s := h.Summarize(withCDF)
		res.Ops[op] = OpResult{PerSec: round3(float64(s.Count) / secs), Summary: s}
	}
	if len(r.errors) > 0 {
		res.Errors = maps.Clone(r.errors)
	}
	if len(r.counters) > 0 {
		res.Counters = maps.Clone(r.counters)
	}
}

// WriteJSON writes the result as indented JSON.
func (res *Result) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(res)
}

// WriteText writes a human-readable report.
func (res *Result) WriteText(w io.Writer) error {
	var b strings.Builder
	variant := ""
	if res.Variant != "" {
		variant = " (" + res.Variant + ")"
	}
	if res.Workload == "failover" {
		fmt.Fprintf(&b, "%s failover, %s nodes, %s leader kills\n", res.Target, res.Config["nodes"], res.Config["repeat"])
	} else {
		fmt.Fprintf(&b, "%s %s%s, %d workers, %.1f s measured\n", res.Target, res.Workload, variant, res.Workers, res.Seconds)
	}
	if res.ThroughputUnit != "" {
		fmt.Fprintf(&b, "  %.1f %s/s\n", res.Throughput, res.ThroughputUnit)
	}
	if len(res.Ops) > 0 {
		fmt.Fprintf(&b, "  %-26s %9s %10s %9s %9s %9s %9s %9s\n", "operation", "count", "ops/s", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms")
		for _, op := range slices.Sorted(maps.Keys(res.Ops)) {
			o := res.Ops[op]
			fmt.Fprintf(&b, "  %-26s %9d %10.1f %9.3f %9.3f %9.3f %9.3f %9.3f\n", op, o.Count, o.PerSec, o.P50, o.P90, o.P99, o.P999, o.Max)
		}
	}
	if len(res.Samples) > 0 {
		parts := make([]string, len(res.Samples))
		for i, s := range res.Samples {
			parts[i] = fmt.Sprintf("%.0f", s)
		}
		fmt.Fprintf(&b, "  samples (ms): %s\n", strings.Join(parts, " "))
	}
	for _, m := range res.Memory {
		if m.Error != "" {
			fmt.Fprintf(&b, "  memory %-6s %-8s error: %s\n", m.Node, m.Phase, m.Error)
			continue
		}
		fmt.Fprintf(&b, "  memory %-6s %-8s RSS %8.1f MiB  Go heap in use %8.1f MiB\n", m.Node, m.Phase, m.RSSMiB, m.HeapInUse)
	}
	if len(res.CPU) > 0 {
		var total float64
		complete := true
		for _, c := range res.CPU {
			if c.Error != "" {
				fmt.Fprintf(&b, "  cpu    %-16s error: %s\n", c.Process, c.Error)
				complete = false
				continue
			}
			fmt.Fprintf(&b, "  cpu    %-16s %8.2f s  %8.1f µs per %s\n", c.Process, c.Seconds, c.PerOpMicros, perUnit(res.ThroughputUnit))
			total += c.PerOpMicros
		}
		if complete {
			fmt.Fprintf(&b, "  cpu    %-16s %8s    %8.1f µs per %s\n", "all processes", "", total, perUnit(res.ThroughputUnit))
		}
	}
	if len(res.Counters) > 0 {
		keys := slices.Sorted(maps.Keys(res.Counters))
		for _, k := range keys {
			fmt.Fprintf(&b, "  %s: %d\n", k, res.Counters[k])
		}
	}
	if len(res.Errors) > 0 {
		keys := make([]string, 0, len(res.Errors))
		for k := range res.Errors {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fmt.Fprintf(&b, "  errors:\n")
		for _, k := range keys {
			fmt.Fprintf(&b, "    %-50s %d\n", k, res.Errors[k])
		}
	}
	for _, n := range res.Notes {
		fmt.Fprintf(&b, "  note: %s\n", n)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// perUnit is the singular of a throughput unit ("cycles" -> "cycle").
func perUnit(unit string) string { return strings.TrimSuffix(unit, "s") }
