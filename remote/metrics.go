package remote

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/okso-io/okso/schemas"
)

// registerMetrics registers the tier's metrics on reg (nil: none): the
// calls it answered, by upstream (a name of its config: bounded) and
// outcome, and whether a session serves each upstream.
func (t *Tier) registerMetrics(reg prometheus.Registerer) {
	if reg == nil {
		return
	}
	t.calls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "okso_remote_calls_total",
		Help: "Calls of upstreams' tools the remote tier answered, by upstream and outcome (ok, tool_error for the upstream's own isError, or the okso code).",
	}, []string{"upstream", "code"})
	reg.MustRegister(t.calls, upstreamsCollector{t})
}

// counted counts a call of upstream's tool that ended with code ("":
// ok).
func (t *Tier) counted(upstream, code string) {
	if t.calls == nil {
		return
	}
	switch {
	case code == "":
		code = "ok"
	case code != "tool_error" && !schemas.KnownCode(code):
		code = "other"
	}
	t.calls.WithLabelValues(upstream, code).Inc()
}

// upstreamsCollector reports, at each scrape, whether a session serves
// each configured upstream.
type upstreamsCollector struct{ t *Tier }

var upstreamUp = prometheus.NewDesc("okso_remote_upstream_up",
	"1 while a session of this remote tier serves the upstream (connected and listed), else 0.", []string{"upstream"}, nil)

func (c upstreamsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- upstreamUp }

func (c upstreamsCollector) Collect(ch chan<- prometheus.Metric) {
	for _, u := range c.t.o.Config.Upstreams {
		v := 0.0
		if b, ok := c.t.connected.Load(u.Name); ok && b.(*atomic.Bool).Load() {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(upstreamUp, prometheus.GaugeValue, v, u.Name)
	}
}
