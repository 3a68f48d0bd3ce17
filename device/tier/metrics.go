package tier

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/schemas"
)

// tierMetrics are a tier's Prometheus metrics (DESIGN.md §11), with
// bounded labels: a call's kind_short (never its node), its decision and
// code as the audit has them; a close's code. nil records nothing.
type tierMetrics struct {
	events *prometheus.CounterVec
	closes *prometheus.CounterVec
}

// newTierMetrics registers t's metrics on reg (nil: none).
func newTierMetrics(reg prometheus.Registerer, t *Tier) *tierMetrics {
	if reg == nil {
		return nil
	}
	m := &tierMetrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "okso_tier_events_total",
			Help: "What the tier audited: calls to its nodes (kind_short of the tool) and refused devices (kind_short none), by decision and code.",
		}, []string{"kind_short", "decision", "code"}),
		closes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "okso_tier_session_closes_total",
			Help: "Device sessions the tier closed, by close code (1001 shutting down, 4400 bad frame or manifest, 4401 authentication, 4403 not allowed, 4408 missed pings, 4409 replaced, 4413 frame too large, 4429 too many attempts).",
		}, []string{"code"}),
	}
	reg.MustRegister(m.events, m.closes,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "okso_tier_sessions",
			Help: "Devices with a live session on this tier.",
		}, func() float64 { return float64(t.Sessions()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "okso_tier_pending_calls",
			Help: "Calls sent to this tier's devices and not yet answered.",
		}, func() float64 { return float64(t.pendingCalls()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "okso_tier_handshakes",
			Help: "Device handshakes in progress on this tier (at most --max-handshakes: past it, devices close with 4429).",
		}, func() float64 { return float64(len(t.handshakes)) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "okso_tier_streams",
			Help: "Metric streams this tier's devices serve.",
		}, func() float64 { return float64(t.Streams()) }),
	)
	return m
}

// event counts an audit event of the tier's.
func (m *tierMetrics) event(e *bus.AuditEvent) {
	if m == nil {
		return
	}
	short := "none"
	if e.Tool != "" {
		if n, ok := schemas.ParseToolName(e.Tool); ok {
			short = n.KindShort
		} else {
			short = "other"
		}
	}
	code := e.Code
	if code != "" && !schemas.KnownCode(code) {
		code = "other"
	}
	m.events.WithLabelValues(short, e.Decision, code).Inc()
}

// closed counts a session the tier closed with code.
func (m *tierMetrics) closed(code int) {
	if m == nil {
		return
	}
	m.closes.WithLabelValues(strconv.Itoa(code)).Inc()
}

// pendingCalls is the number of calls the tier's sessions wait on.
func (t *Tier) pendingCalls() int {
	return t.sumSessions(func(s *session) int { return len(s.pending) })
}
