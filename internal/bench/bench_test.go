package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dlockv1 "github.com/dlock/dlock/api/dlock/v1"
	"github.com/dlock/dlock/internal/testcluster"
)

func near(got, want, tol float64) bool { return math.Abs(got-want) <= tol*math.Abs(want) }

func TestHistogramPercentiles(t *testing.T) {
	h := NewHistogram()
	// 1..1000 ms, once each: the q-quantile is q*1000 ms.
	for i := 1; i <= 1000; i++ {
		h.Record(time.Duration(i) * time.Millisecond)
	}
	s := h.Summarize(true)
	if s.Count != 1000 {
		t.Fatalf("count = %d, want 1000", s.Count)
	}
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"min", s.Min, 1}, {"p50", s.P50, 500}, {"p90", s.P90, 900}, {"p99", s.P99, 990},
		{"p99.9", s.P999, 999}, {"max", s.Max, 1000}, {"mean", s.Mean, 500.5},
	} {
		// Three significant digits: within 0.1 %, plus rounding to whole µs.
		if !near(c.got, c.want, 0.0011) {
			t.Errorf("%s = %v ms, want %v ms (±0.1 %%)", c.name, c.got, c.want)
		}
	}
	if len(s.CDF) != len(CDFQuantiles) {
		t.Fatalf("CDF has %d points, want %d", len(s.CDF), len(CDFQuantiles))
	}
	for i := 1; i < len(s.CDF); i++ {
		if s.CDF[i][0] <= s.CDF[i-1][0] || s.CDF[i][1] < s.CDF[i-1][1] {
			t.Fatalf("CDF not monotonic at %d: %v then %v", i, s.CDF[i-1], s.CDF[i])
		}
	}
	if s.CDF[0][1] != s.Min || s.CDF[len(s.CDF)-1][1] != s.Max {
		t.Errorf("CDF ends %v..%v, want min %v .. max %v", s.CDF[0], s.CDF[len(s.CDF)-1], s.Min, s.Max)
	}
}

func TestHistogramClampsAndMerges(t *testing.T) {
	a, b := NewHistogram(), NewHistogram()
	a.Record(-time.Millisecond) // an event that beat its answer: recorded at the floor, counted
	a.Record(500 * time.Nanosecond)
	b.Record(2 * time.Hour)
	b.Record(3 * time.Millisecond)
	a.Merge(b)
	s := a.Summarize(false)
	if s.Count != 4 || s.Clamped != 2 {
		t.Fatalf("count %d clamped %d, want 4 and 2", s.Count, s.Clamped)
	}
	if s.Min != 0.001 || !near(s.Max, 3_600_000, 0.001) {
		t.Fatalf("min %v max %v, want 0.001 ms and one hour", s.Min, s.Max)
	}
	if e := NewHistogram().Summarize(true); e.Count != 0 || e.P99 != 0 || e.CDF != nil {
		t.Fatalf("empty summary = %+v", e)
	}
}

func TestRecorderCountsOnlyInsideWindow(t *testing.T) {
	now := time.Now()
	r := newRecorder(now.Add(-time.Second), now.Add(9*time.Second))
	r.record("op", now.Add(-2*time.Second), time.Millisecond) // before the window
	r.record("op", now, 2*time.Millisecond)
	r.record("op", now.Add(10*time.Second), time.Millisecond) // after it
	r.observe("op", now.Add(-3*time.Millisecond))
	r.fail("op", &apiError{Status: 503, Code: "no_leader"})
	r.fail("op", context.DeadlineExceeded)
	var res Result
	r.fill(&res, false)
	if got := res.Ops["op"].Count; got != 2 {
		t.Fatalf("recorded %d ops, want the 2 inside the window", got)
	}
	if res.Errors["op: 503 no_leader"] != 1 || res.Errors["op: timeout"] != 1 {
		t.Fatalf("errors = %v", res.Errors)
	}
	want := 2 / r.end.Sub(r.start).Seconds()
	if !near(res.Ops["op"].PerSec, want, 0.01) {
		t.Fatalf("per_sec = %v, want %v", res.Ops["op"].PerSec, want)
	}
}

func TestPacer(t *testing.T) {
	p := newPacer(200) // 5 ms apart
	start := time.Now()
	for range 21 {
		if !p.wait(context.Background()) {
			t.Fatal("wait returned false")
		}
	}
	if took := time.Since(start); took < 95*time.Millisecond {
		t.Fatalf("21 paced waits at 200/s took %s, want at least 100 ms", took)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if newPacer(0).wait(ctx) {
		t.Fatal("an unlimited pacer must still stop on a cancelled context")
	}
}

func TestScrapeMemory(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte("# HELP go_memstats_heap_inuse_bytes x\n# TYPE go_memstats_heap_inuse_bytes gauge\n" +
			"go_memstats_heap_inuse_bytes 1.048576e+07\nprocess_resident_memory_bytes 52428800\nother 1\n"))
	}))
	defer srv.Close()
	rss, heap, err := scrapeMemory(context.Background(), srv.Client(), srv.URL)
	if err != nil || rss != 50<<20 || heap != 10<<20 {
		t.Fatalf("scrape = %v, %v, %v; want 50 MiB, 10 MiB", rss, heap, err)
	}
	mem := memoryOf(context.Background(), srv.Client(), "x", map[string]string{"a": srv.URL, "b": srv.URL + "/nope"})
	if len(mem) != 2 || mem[0].RSSMiB != 50 || mem[0].HeapInUse != 10 || mem[1].Error == "" {
		t.Fatalf("memoryOf = %+v", mem)
	}
}

// TestCPUMeter checks the CPU accounting: the CPU a process used over the
// window per operation, nodes that report one dlock_process_id counted once,
// and a node whose /metrics cannot be read reported as such.
func TestCPUMeter(t *testing.T) {
	var mu sync.Mutex
	cpu := map[string]float64{"/a": 10, "/b": 10, "/c": 3}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		v, ok := cpu[r.URL.Path]
		cpu[r.URL.Path] = v + 0.5 // each reading is half a second of CPU later
		mu.Unlock()
		if !ok {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total %g\n", v)
		if r.URL.Path != "/c" {
			// a and b are two nodes of one process (dlock dev).
			w.Write([]byte("dlock_process_id 4242\n"))
		}
	}))
	defer srv.Close()
	cfg := &Config{Warmup: 10 * time.Millisecond, Duration: 50 * time.Millisecond}
	m := startCPUMeter(context.Background(), cfg, map[string]string{
		"n1": srv.URL + "/a", "n2": srv.URL + "/b", "e0": srv.URL + "/c", "n3": srv.URL + "/missing"})
	m.unreadable("n4", "no API address")
	res := &Result{Throughput: 100, Seconds: 1} // 100 operations
	m.finish(res)
	got := map[string]ProcessCPU{}
	for _, c := range res.CPU {
		got[c.Process] = c
	}
	if len(got) != 5 {
		t.Fatalf("CPU = %+v, want e0, n1+n2, n3, n4 and the load generator", res.CPU)
	}
	if c := got["n4"]; c.Error != "no API address" {
		t.Errorf("n4 (a member without an API address) = %+v, want its error", c)
	}
	if c := got["e0"]; c.Seconds != 0.5 || c.PerOpMicros != 5000 || c.Error != "" {
		t.Errorf("e0 = %+v, want 0.5 s, 5000 µs per op", c)
	}
	if c := got["n1+n2"]; c.Error != "" || c.PerOpMicros <= 0 {
		t.Errorf("n1+n2 (one process) = %+v", c)
	}
	if c := got["n3"]; c.Error == "" {
		t.Errorf("n3 (no /metrics) = %+v, want an error", c)
	}
	if c, ok := got[loadGenerator]; runtime.GOOS == "linux" && (!ok || c.Error != "" || c.Seconds < 0) {
		t.Errorf("load generator = %+v (present %v)", c, ok)
	}
	// A cancelled run ends the meter without a second reading, and so does a
	// failed one (abandon), without waiting out the window.
	ctx, cancel := context.WithCancel(context.Background())
	m = startCPUMeter(ctx, &Config{Warmup: time.Hour, Duration: time.Hour}, map[string]string{"e0": srv.URL + "/c"})
	cancel()
	res = &Result{Throughput: 100, Seconds: 1}
	m.finish(res)
	if len(res.CPU) != 0 {
		t.Errorf("cancelled meter reported %+v", res.CPU)
	}
	m = startCPUMeter(context.Background(), &Config{Warmup: time.Hour, Duration: time.Hour}, map[string]string{"e0": srv.URL + "/c"})
	abandoned := make(chan struct{})
	go func() { m.abandon(); close(abandoned) }()
	select {
	case <-abandoned:
	case <-time.After(5 * time.Second):
		t.Fatal("abandon waited for the meter's window instead of stopping it")
	}
}

func TestValidate(t *testing.T) {
	for _, c := range []Config{
		{Workload: "nope", Endpoints: []string{"x"}},
		{Workload: "uncontended"},
		{Workload: "uncontended", Target: "etcd"},
		{Workload: "contended", Target: "etcd", EtcdEndpoints: []string{"x"}, TTLPerAcquire: true},
		{Workload: "uncontended", Target: "etcd", EtcdEndpoints: []string{"x"}, TTL: 1500 * time.Millisecond},
		{Workload: "failover", Nodes: 2},
		{Workload: "uncontended", Protocol: "grpc", Endpoints: []string{"x"}},
		{Workload: "uncontended", Protocol: "quic", Endpoints: []string{"x"}},
		{Workload: "failover", Protocol: "grpc", GRPCEndpoints: []string{"x"}},
		{Workload: "uncontended", Target: "etcd", Protocol: "grpc", EtcdEndpoints: []string{"x"}},
		{Workload: "uncontended", Protocol: "grpc", GRPCEndpoints: []string{"x"}, ViaFollower: true},
		{Workload: "held", Endpoints: []string{"x"}, ViaFollower: true},
		{Workload: "failover", ViaFollower: true},
		{Workload: "uncontended", Target: "etcd", EtcdEndpoints: []string{"x"}, EtcdAllEndpoints: true, ViaFollower: true},
		{Workload: "semaphore", Target: "etcd", EtcdEndpoints: []string{"x"}},
		{Workload: "readers", Target: "etcd", EtcdEndpoints: []string{"x"}},
	} {
		c.defaults()
		if err := c.Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil, want an error", c)
		}
	}
}

// runClean runs cfg, logs its text report and fails the test unless it
// measured a throughput and counted no errors.
func runClean(t *testing.T, cfg Config, logs *bytes.Buffer) *Result {
	t.Helper()
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, logs.String())
	}
	var text bytes.Buffer
	if err := res.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", text.String())
	if res.Throughput <= 0 || res.ThroughputUnit == "" {
		t.Fatalf("throughput %v %q, want > 0", res.Throughput, res.ThroughputUnit)
	}
	if len(res.Errors) > 0 {
		t.Fatalf("errors: %v", res.Errors)
	}
	return res
}

// TestWorkloadsInProcess runs every HTTP workload for a moment against a real
// 3-node cluster (Raft over loopback, fsync'd logs) and checks that each
// measured something and nothing failed.
func TestWorkloadsInProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	c := testcluster.New(t, 3)
	var eps []string
	for _, id := range c.IDs() {
		eps = append(eps, c.URL(id))
	}
	for _, wl := range []string{"uncontended", "session", "contended", "semaphore", "readers", "held", "watch"} {
		t.Run(wl, func(t *testing.T) {
			var logs bytes.Buffer
			cfg := Config{Target: "dlock", Workload: wl, Endpoints: eps[1:], Workers: 4, Duration: 1500 * time.Millisecond,
				Warmup: 200 * time.Millisecond, Keys: 200, HeldRelease: true, CDF: true, Log: &logs}
			if wl == "watch" {
				cfg.Rate = 100
			}
			if wl == "held" {
				// Two rounds, through a gate this test opens as a script
				// taking turns would.
				cfg.HeldRounds, cfg.HeldGate = 2, t.TempDir()
				go func() {
					for _, step := range [][2]string{{"ready", "round-1"}, {"round-1.done", "round-2"}} {
						if awaitGate(context.Background(), cfg.HeldGate, step[0]) != nil {
							return
						}
						os.WriteFile(filepath.Join(cfg.HeldGate, step[1]), nil, 0o644)
					}
				}()
			}
			res := runClean(t, cfg, &logs)
			for op, o := range res.Ops {
				if o.Count == 0 || o.P50 <= 0 && !strings.HasPrefix(op, "delivery") || o.Max < o.P99 || o.P99 < o.P50 {
					t.Errorf("op %s: implausible %+v", op, o.Summary)
				}
			}
			switch wl {
			case "semaphore", "readers":
				want := []string{"acquire"}
				if wl == "readers" {
					want = []string{"acquire_shared", "acquire_exclusive"}
				}
				for _, op := range want {
					if res.Ops[op].Count == 0 {
						t.Errorf("op %s: %+v", op, res.Ops[op])
					}
				}
				if res.ThroughputUnit != "grants" || res.Throughput <= 0 {
					t.Errorf("throughput %v %s", res.Throughput, res.ThroughputUnit)
				}
			}
			switch wl {
			case "uncontended", "session", "contended", "semaphore", "readers":
				// The three nodes share this test's process: counted once.
				var names []string
				for _, c := range res.CPU {
					names = append(names, c.Process)
					if c.Error != "" || c.Seconds <= 0 || c.PerOpMicros <= 0 {
						t.Errorf("cpu %+v", c)
					}
				}
				if want := []string{loadGenerator, "n1+n2+n3"}; !slices.Equal(names, want) {
					t.Errorf("cpu processes %v, want %v", names, want)
				}
			case "held":
				if len(res.Rounds) != 2 || res.Rounds[0] <= 0 || res.Rounds[1] <= 0 {
					t.Errorf("rounds %v, want two rates", res.Rounds)
				}
				if _, err := os.Stat(filepath.Join(cfg.HeldGate, "round-2.done")); err != nil {
					t.Errorf("gate: %v", err)
				}
				if len(res.Memory) != 9 {
					t.Errorf("memory readings: %d, want 3 phases x 3 nodes", len(res.Memory))
				}
				for _, m := range res.Memory {
					if m.Error != "" || m.RSSMiB <= 0 || m.HeapInUse <= 0 {
						t.Errorf("memory %+v", m)
					}
				}
			case "watch":
				all := res.Ops["delivery (all nodes)"]
				if all.Count == 0 || all.Count != res.Ops["acquire"].Count {
					t.Errorf("delivered %d of %d grants", all.Count, res.Ops["acquire"].Count)
				}
				if res.Counters["grants with events missing"] != 0 {
					t.Errorf("counters %v", res.Counters)
				}
			}
			// The JSON form decodes back.
			var buf bytes.Buffer
			if err := res.WriteJSON(&buf); err != nil {
				t.Fatal(err)
			}
			var back Result
			if err := json.Unmarshal(buf.Bytes(), &back); err != nil || back.Throughput != res.Throughput {
				t.Fatalf("JSON round trip: %v", err)
			}
		})
	}
	// Through a follower: every call goes to a node that is not the leader.
	t.Run("via-follower", func(t *testing.T) {
		// A loaded machine may move leadership during the run, onto the
		// follower the run chose: that says nothing about the choice, so
		// the run is judged only when the leader stayed put (three tries).
		for try := 1; ; try++ {
			var logs bytes.Buffer
			cfg := Config{Target: "dlock", Workload: "uncontended", Endpoints: eps, Workers: 2, Duration: time.Second,
				Warmup: 100 * time.Millisecond, ViaFollower: true, Log: &logs}
			before := c.URL(c.WaitLeader(5 * time.Second))
			res := runClean(t, cfg, &logs)
			via, leader := res.Config["via_follower"], c.URL(c.WaitLeader(5*time.Second))
			if leader != before && try < 3 {
				t.Logf("leadership moved from %s to %s during the run; again", before, leader)
				continue
			}
			if via == "" || via == leader || res.Config["leader"] != "" {
				t.Fatalf("config %v: want the calls sent to a follower, not the leader %s (leader before the run %s)", res.Config, leader, before)
			}
			return
		}
	})
	// An interrupted run (Ctrl-C) has no result: its counts cover part of
	// the window, its rates would be divided by all of it.
	t.Run("interrupted", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
		defer cancel()
		cfg := Config{Target: "dlock", Workload: "uncontended", Endpoints: eps[1:], Workers: 2, Duration: 10 * time.Second,
			Warmup: 100 * time.Millisecond, Log: io.Discard}
		res, err := Run(ctx, cfg)
		if err == nil || !errors.Is(err, context.DeadlineExceeded) || res != nil {
			t.Fatalf("interrupted run: %+v, %v; want no result and the context's error", res, err)
		}
	})
}

// TestGRPCError checks that gRPC statuses become the *apiError the HTTP path
// would have made: the dlock code from the ErrorDetail, its HTTP status, and
// retryable only where HTTP's answer would be.
func TestGRPCError(t *testing.T) {
	withDetail := func(c codes.Code, code string) error {
		st, err := status.New(c, "msg "+code).WithDetails(&dlockv1.ErrorDetail{Code: code})
		if err != nil {
			t.Fatal(err)
		}
		return st.Err()
	}
	for _, c := range []struct {
		err       error
		status    int
		code      string
		retryable bool
	}{
		{withDetail(codes.Unavailable, "no_leader"), 503, "no_leader", true},
		{withDetail(codes.Unavailable, "unavailable"), 503, "unavailable", true},
		{withDetail(codes.ResourceExhausted, "rate_limited"), 429, "rate_limited", true},
		{withDetail(codes.FailedPrecondition, "lock_held"), 409, "lock_held", false},
		{withDetail(codes.FailedPrecondition, "not_holder"), 409, "not_holder", false},
		{withDetail(codes.DeadlineExceeded, "wait_timeout"), 409, "wait_timeout", false},
		{withDetail(codes.Aborted, "lock_lost"), 409, "lock_lost", false},
		{withDetail(codes.NotFound, "session_not_found"), 404, "session_not_found", false},
		{withDetail(codes.InvalidArgument, "invalid_argument"), 400, "invalid_argument", false},
		{withDetail(codes.Internal, "internal"), 500, "internal", false},
		// A code this build does not know goes by its gRPC code.
		{withDetail(codes.Unavailable, "some_future_code"), 503, "some_future_code", true},
		// No ErrorDetail: gRPC's own statuses.
		{status.Error(codes.Unavailable, "connection refused"), 503, "grpc_unavailable", true},
		{status.Error(codes.Internal, "boom"), 500, "grpc_internal", false},
	} {
		got := grpcError(c.err)
		var ae *apiError
		if !errors.As(got, &ae) {
			t.Errorf("%v: got %T %v, want an *apiError", c.err, got, got)
			continue
		}
		if ae.Status != c.status || ae.Code != c.code || retryable(got) != c.retryable {
			t.Errorf("%v: got status %d code %q retryable %v, want %d %q %v", c.err, ae.Status, ae.Code, retryable(got), c.status, c.code, c.retryable)
		}
		if !strings.Contains(ae.Error(), ae.Code) || !strings.HasPrefix(ae.Error(), "gRPC ") {
			t.Errorf("Error() = %q", ae.Error())
		}
	}
	// The call's own deadline or cancellation stays a transport error:
	// retryable and counted as a timeout, like an HTTP client timeout.
	dl := status.FromContextError(context.DeadlineExceeded).Err()
	if got := grpcError(dl); !retryable(got) || errReason(got) != "timeout" {
		t.Errorf("client deadline: %v retryable %v reason %q", got, retryable(got), errReason(got))
	}
	if grpcError(nil) != nil {
		t.Error("grpcError(nil) != nil")
	}
	plain := errors.New("not a status")
	if grpcError(plain) != plain {
		t.Error("a non-status error must pass through")
	}
}

// TestWorkloadsGRPC runs the uncontended and session workloads over gRPC
// against a real 3-node cluster and checks that each measured something,
// nothing failed and the result says which protocol it used.
func TestWorkloadsGRPC(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	c := testcluster.New(t, 3)
	var eps []string
	for _, id := range c.IDs() {
		eps = append(eps, c.GRPCAddr(id))
	}
	for _, wl := range []string{"uncontended", "session"} {
		t.Run(wl, func(t *testing.T) {
			var logs bytes.Buffer
			// Workers > 32 so that two connections are round-robined.
			cfg := Config{Target: "dlock", Protocol: "grpc", Workload: wl, GRPCEndpoints: eps, Workers: 40,
				Duration: time.Second, Warmup: 200 * time.Millisecond, Log: &logs}
			before := c.WaitLeader(5 * time.Second)
			res := runClean(t, cfg, &logs)
			if res.ThroughputUnit != "cycles" {
				t.Errorf("throughput unit %q, want cycles", res.ThroughputUnit)
			}
			for _, op := range []string{"acquire", "release", "cycle"} {
				if o := res.Ops[op]; o.Count == 0 || o.P50 <= 0 {
					t.Errorf("op %s: %+v", op, o.Summary)
				}
			}
			if res.Config["protocol"] != "grpc" || res.Config["grpc_conns"] != "2" || !slices.Contains(eps, res.Config["leader"]) {
				t.Errorf("config %v", res.Config)
			}
			// An election during the run (a loaded machine) may move the
			// leader; with one leader throughout, the run must have named it.
			if after := c.WaitLeader(5 * time.Second); after == before && res.Config["leader"] != c.GRPCAddr(before) {
				t.Errorf("config names leader %s, but %s led throughout", res.Config["leader"], c.GRPCAddr(before))
			}
			if !slices.ContainsFunc(res.Notes, func(n string) bool { return strings.Contains(n, "over gRPC") }) {
				t.Errorf("notes do not name the protocol: %q", res.Notes)
			}
		})
	}
}
