package metrics

import "github.com/prometheus/client_golang/prometheus"

func newLimited() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dlock_limited_requests_total",
		Help: "Requests and streams refused by an abuse limit (429 rate_limited), by limit: rate_client, rate_remote, " +
			"waiters_per_lock, leases_per_client, watchers, watchers_per_conn, ws_acquires_per_conn, ws_queue.",
	}, []string{"limit"})
}

// Limited counts one refusal by a limit (service.LimitRecorder; the
// WebSocket API's per-connection limits too).
func (m *Metrics) Limited(limit string) { m.limited.WithLabelValues(limit).Inc() }
