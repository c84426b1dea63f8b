package bench

import (
	"math"
	"sync"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
)

// Histogram values are recorded in microseconds, from 1 µs to one hour, with
// three significant digits (an error of at most 0.1 %).
const (
	histLowest  = 1
	histHighest = int64(time.Hour / time.Microsecond)
	histDigits  = 3
)

// Histogram is a concurrency-safe HDR latency histogram.
type Histogram struct {
	mu sync.Mutex
	h  *hdrhistogram.Histogram
	// clamped counts values outside the trackable range that were recorded
	// at the nearest bound (negative, zero, or over an hour).
	clamped int64
}

// NewHistogram returns an empty histogram.
func NewHistogram() *Histogram {
	return &Histogram{h: hdrhistogram.New(histLowest, histHighest, histDigits)}
}

// Record adds one duration. Durations under 1 µs count as 1 µs, over an hour
// as an hour.
func (h *Histogram) Record(d time.Duration) {
	us := d.Microseconds()
	clamped := false
	if us < histLowest {
		us, clamped = histLowest, d < 0
	}
	if us > histHighest {
		us, clamped = histHighest, true
	}
	h.mu.Lock()
	_ = h.h.RecordValue(us) // in range by construction
	if clamped {
		h.clamped++
	}
	h.mu.Unlock()
}

// Merge adds every value of o into h.
func (h *Histogram) Merge(o *Histogram) {
	o.mu.Lock()
	snap := o.h.Export()
	cl := o.clamped
	o.mu.Unlock()
	other := hdrhistogram.Import(snap)
	h.mu.Lock()
	h.h.Merge(other)
	h.clamped += cl
	h.mu.Unlock()
}

// Count is the number of recorded values.
func (h *Histogram) Count() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.h.TotalCount()
}

// Quantile returns the value at quantile q (0..1) in milliseconds; 0 when empty.
func (h *Histogram) Quantile(q float64) float64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.h.TotalCount() == 0 {
		return 0
	}
	return usToMs(h.h.ValueAtQuantile(q * 100))
}

// CDFQuantiles are the quantiles (in percent) exported for latency CDF plots:
// dense in the body, then the tail in "nines".
var CDFQuantiles = func() []float64 {
	var qs []float64
	for p := 0.0; p < 90; p += 2.5 {
		qs = append(qs, p)
	}
	qs = append(qs, 90, 92, 94, 95, 96, 97, 98, 99, 99.5, 99.7, 99.9, 99.95, 99.99, 99.999, 100)
	return qs
}()

// Summary is the exported form of a histogram: milliseconds.
type Summary struct {
	Count int64   `json:"count"`
	Mean  float64 `json:"mean_ms"`
	Min   float64 `json:"min_ms"`
	P50   float64 `json:"p50_ms"`
	P90   float64 `json:"p90_ms"`
	P99   float64 `json:"p99_ms"`
	P999  float64 `json:"p999_ms"`
	Max   float64 `json:"max_ms"`
	// Clamped counts values recorded at a bound (see Histogram.Record).
	Clamped int64 `json:"clamped,omitempty"`
	// CDF lists [percent, milliseconds] points of the distribution.
	CDF [][2]float64 `json:"cdf,omitempty"`
}

// Summarize exports the histogram; withCDF adds the CDF points.
func (h *Histogram) Summarize(withCDF bool) Summary {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := Summary{Count: h.h.TotalCount(), Clamped: h.clamped}
	if s.Count == 0 {
		return s
	}
	s.Mean = round3(h.h.Mean() / 1000)
	s.Min = usToMs(h.h.Min())
	s.P50 = usToMs(h.h.ValueAtQuantile(50))
	s.P90 = usToMs(h.h.ValueAtQuantile(90))
	s.P99 = usToMs(h.h.ValueAtQuantile(99))
	s.P999 = usToMs(h.h.ValueAtQuantile(99.9))
	s.Max = usToMs(h.h.Max())
	if withCDF {
		for _, q := range CDFQuantiles {
			v := h.h.ValueAtQuantile(q)
			if q == 0 {
				v = h.h.Min()
			}
			s.CDF = append(s.CDF, [2]float64{q, usToMs(v)})
		}
	}
	return s
}

// usToMs converts HDR microseconds to milliseconds with µs precision. The HDR
// library reports the highest value equivalent to the bucket (Max) or the
// bucket's value; either is within 0.1 % of the recorded value.
func usToMs(us int64) float64 { return round3(float64(us) / 1000) }

func round3(v float64) float64 { return math.Round(v*1000) / 1000 }
