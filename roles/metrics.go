package roles

import (
	"errors"
	"log/slog"
	"net/http"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// defaultMetricsAddr is --metrics-addr's default: loopback, and never
// the agents' or the devices' listener (DESIGN.md §11).
const defaultMetricsAddr = "127.0.0.1:9464"

// processMetrics is where a role registers its metrics: the registry
// the process serves at /metrics (--metrics-addr), or nil for none.
type processMetrics struct{ Metrics prometheus.Registerer }

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
	log.Info("metrics listener", "metrics_url", "http://"+p.addr()+"/metrics")
	return p, nil
}
