package roles

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"syscall"

	"github.com/nats-io/nats.go"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/internal/tracing"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// defaultMetricsAddr is --metrics-addr's default: loopback, and never
// the agents' or the devices' listener (DESIGN.md §11).
const defaultMetricsAddr = "127.0.0.1:9464"

// telemetry is what a role reports to: the registry of its metrics, which
// the process serves at /metrics (--metrics-addr), and the tracer of its
// spans (--otlp-endpoint); nil for none.
type telemetry struct {
	Metrics prometheus.Registerer
	Tracer  *tracing.Tracer
	// MetricsURL is where the metrics are served, for the line that says
	// where the role listens; "" when they are not.
	MetricsURL string
}

// listening adds to the attributes of that line where the metrics are.
func (t telemetry) listening(attrs ...any) []any {
	if t.MetricsURL != "" {
		attrs = append(attrs, "metrics_url", t.MetricsURL)
	}
	return attrs
}

// announces reports whether the role says where it listens in a line of
// its own (servers do; the agent, mock-fleet and stdio do not, and get
// a line for their metrics).
func (l *logFlags) announces() bool {
	switch l.role {
	case "gateway", "device", "remote", "all-in-one":
		return true
	}
	return false
}

// tracer makes the process's tracer when --otlp-endpoint is set: its
// spans are okso-<role>'s.
func (l *logFlags) tracer(ctx context.Context) (*tracing.Tracer, error) {
	if l.otlp == "" {
		return nil, nil
	}
	return tracing.New(ctx, l.otlp, "okso-"+l.role, Version)
}

// newProcessRegistry is a role's registry: the process's and Go's own
// metrics, then the role's.
func newProcessRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// listenMetrics binds --metrics-addr for the process's /metrics, served
// from reg. An address given (flag or OKSO_METRICS_ADDR) that cannot be
// bound stops the role; the default one taken (another okso role on this
// host has it) is said at warn and the role runs without it; "" is off.
func (l *logFlags) listenMetrics(log *slog.Logger, reg *prometheus.Registry) (*httpPart, error) {
	if l.metrics == "" || reg == nil {
		return nil, nil
	}
	p, err := listen("--metrics-addr", l.metrics, 64)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) && !l.fs.Changed("metrics-addr") {
			log.Warn("no metrics: the default --metrics-addr is taken (another okso role on this host?); give each role its own",
				"metrics_addr", l.metrics)
			return nil, nil
		}
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}))
	p.handle(log, mux)
	return p, nil
}

// registerPart registers what every part with a NATS connection and an
// auditor has: its connection's state and traffic, its audit events, and
// the health of the JetStream buckets it reads, labelled with the part
// (gateway, tier, remote) alone.
func (c *common) registerPart(part string, nc *nats.Conn, audit *bus.Auditor, buckets ...string) {
	if c.metrics == nil {
		return
	}
	if len(buckets) > 0 {
		c.metrics.MustRegister(bus.NewBucketHealth(nc, part, buckets...))
	}
	labels := prometheus.Labels{"part": part}
	msgs := func(in bool) func() float64 {
		return func() float64 {
			s := nc.Stats()
			if in {
				return float64(s.InMsgs)
			}
			return float64(s.OutMsgs)
		}
	}
	c.metrics.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "okso_nats_connected", ConstLabels: labels,
			Help: "1 while the part's NATS connection is up, else 0."}, func() float64 {
			if nc.IsConnected() {
				return 1
			}
			return 0
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "okso_nats_reconnects_total", ConstLabels: labels,
			Help: "Times the part's NATS connection was lost and made again."}, func() float64 { return float64(nc.Stats().Reconnects) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "okso_nats_messages_received_total", ConstLabels: labels,
			Help: "Messages the part received from NATS."}, msgs(true)),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "okso_nats_messages_sent_total", ConstLabels: labels,
			Help: "Messages the part published on NATS."}, msgs(false)),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "okso_audit_events_published_total", ConstLabels: labels,
			Help: "Audit events the part published on okso.v1.audit.<tenant>."}, func() float64 { return float64(audit.Published.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "okso_audit_events_failed_total", ConstLabels: labels,
			Help: "Audit events the part could not publish (its connection closed, or its reconnect buffer full)."},
			func() float64 { return float64(audit.Failed.Load()) }),
	)
}
