package mcp

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/okso-io/okso/schemas"
)

// The gateway's metrics of tools/call (DESIGN.md §11): OpenTelemetry's
// MCP operation duration in its Prometheus form, and the calls by source
// and code. Their labels are bounded: a tool is named by its template,
// never by a node id (sysecho.*.echo.invoke), an upstream's tools by the
// upstream ({upstream}.*), an agent's by caller.*; at most
// maxToolTemplates templates get series of their own, the others share
// "other". A call costs a map lookup and an observation: its series are
// made the first time a template has an outcome.

// durationBuckets are the OpenTelemetry MCP conventions' buckets of
// mcp.server.operation.duration, in seconds.
var durationBuckets = []float64{0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 120, 300}

// maxToolTemplates bounds the templates with series of their own: a
// fleet of devices announcing capabilities of made-up names must not
// make a series each.
const maxToolTemplates = 1000

// codes are the outcomes a call's series are kept for: success, the
// closed set of DESIGN.md §5, and any other code an audit event may
// carry (a stream's quota).
var codes = [...]string{"", schemas.CodeBadRequest, schemas.CodeManifestInvalid, schemas.CodeToolNotFound,
	schemas.CodeSafetyDenied, schemas.CodeNodeOffline, schemas.CodeDeadlineExceeded, schemas.CodeRateLimited,
	schemas.CodeInternal, "other"}

func codeIndex(code string) int {
	for i, c := range codes[:len(codes)-1] {
		if c == code {
			return i
		}
	}
	return len(codes) - 1
}

// callMetrics are a gateway's tools/call series. The zero of a nil
// *callMetrics records nothing.
type callMetrics struct {
	duration *prometheus.HistogramVec
	calls    *prometheus.CounterVec

	mu    sync.RWMutex
	tools map[toolKey]*toolSeries
	other *toolSeries // beyond maxToolTemplates
}

// toolKey names a template: a device tool's kind_short, cap_id and verb
// (substrings of its name, so that a lookup allocates nothing), or an
// upstream's, a caller's or okso's own tool by its first part alone.
type toolKey struct{ short, capID, verb string }

// toolSeries are one template's series, by outcome, each made the first
// time a call has that outcome (a series of zeros is noise).
type toolSeries struct {
	tool, source string
	outcomes     [len(codes)]atomic.Pointer[outcome]
}

// outcome is one template's series of one outcome.
type outcome struct {
	duration prometheus.Observer
	calls    prometheus.Counter
}

// newCallMetrics registers a gateway's call metrics on reg; nil records
// nothing.
func newCallMetrics(reg prometheus.Registerer) *callMetrics {
	if reg == nil {
		return nil
	}
	m := &callMetrics{
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "mcp_server_operation_duration_seconds",
			Help:    "MCP operations (tools/call) as the gateway answered them: OpenTelemetry's mcp.server.operation.duration; gen_ai_tool_name is the tool's template, never a node id.",
			Buckets: durationBuckets,
		}, []string{"mcp_method_name", "gen_ai_tool_name", "error_type"}),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "okso_gateway_calls_total",
			Help: "Tool calls the gateway answered, by the source of the tool (device, upstream, caller, fleet, okso) and the outcome (ok or the error code).",
		}, []string{"source", "code"}),
		tools: map[toolKey]*toolSeries{},
	}
	reg.MustRegister(m.duration, m.calls)
	return m
}

// observe records one call of e (nil: no such tool) that ended with code
// ("" for success) after d.
func (m *callMetrics) observe(e *entry, code string, d time.Duration) {
	if m == nil {
		return
	}
	s := m.series(e)
	i := codeIndex(code)
	o := s.outcomes[i].Load()
	if o == nil {
		o = m.outcome(s, i)
	}
	o.duration.Observe(d.Seconds())
	o.calls.Inc()
}

// outcome makes the series of s's outcome i, once.
func (m *callMetrics) outcome(s *toolSeries, i int) *outcome {
	m.mu.Lock()
	defer m.mu.Unlock()
	if o := s.outcomes[i].Load(); o != nil {
		return o
	}
	code := codes[i]
	result := code
	if result == "" {
		result = "ok"
	}
	// OpenTelemetry's error.type: only on a failure (empty, no label).
	o := &outcome{duration: m.duration.WithLabelValues("tools/call", s.tool, code), calls: m.calls.WithLabelValues(s.source, result)}
	s.outcomes[i].Store(o)
	return o
}

// series returns e's template's series, making them the first time.
func (m *callMetrics) series(e *entry) *toolSeries {
	key, source := templateOf(e)
	m.mu.RLock()
	s := m.tools[key]
	m.mu.RUnlock()
	if s != nil {
		return s
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if s = m.tools[key]; s != nil {
		return s
	}
	if len(m.tools) >= maxToolTemplates {
		if m.other == nil {
			m.other = &toolSeries{tool: "other", source: "other"}
		}
		return m.other
	}
	s = &toolSeries{tool: key.label(), source: source}
	m.tools[toolKey{strings.Clone(key.short), strings.Clone(key.capID), strings.Clone(key.verb)}] = s
	return s
}

// templateOf is e's template and source.
func templateOf(e *entry) (toolKey, string) {
	if e == nil {
		return toolKey{short: "unknown"}, "none"
	}
	switch e.origin.source {
	case sourceNameDevice:
		if n, ok := schemas.ParseToolName(e.name); ok {
			return toolKey{n.KindShort, n.CapID, n.Verb}, sourceNameDevice
		}
	case sourceNameUpstream:
		return toolKey{short: e.origin.upstream, capID: "*"}, sourceNameUpstream
	case sourceNameCaller:
		return toolKey{short: "caller", capID: "*"}, sourceNameCaller
	case sourceNameOkso:
		if strings.HasPrefix(e.name, "fleet.") {
			return toolKey{short: e.name}, "fleet"
		}
		return toolKey{short: e.name}, sourceNameOkso
	}
	return toolKey{short: "other"}, e.origin.source
}

// label writes a template as gen_ai.tool.name: sysecho.*.echo.invoke,
// everything.*, caller.*, fleet.call.
func (k toolKey) label() string {
	switch {
	case k.verb != "":
		return k.short + ".*." + k.capID + "." + k.verb
	case k.capID != "":
		return k.short + "." + k.capID
	}
	return k.short
}

// registerState registers the gauges of what the gateway holds, read at
// scrape time: nodes by presence, upstreams listed, agents' declared
// tools, open streams and the frames they dropped.
func (g *Gateway) registerState(reg prometheus.Registerer) {
	if reg == nil {
		return
	}
	g.gate.refusals = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "okso_gateway_auth_refusals_total",
		Help: "Requests the gateway refused a bearer token (401), by reason: missing, invalid_token (bad, expired, another audience), revoked."},
		[]string{"reason"})
	reg.MustRegister(g.gate.refusals)
	nodes := func(offline bool) func() float64 {
		return func() float64 {
			g.devices.mu.RLock()
			defer g.devices.mu.RUnlock()
			if offline {
				return float64(len(g.devices.offline))
			}
			return float64(len(g.devices.nodes))
		}
	}
	const nodesHelp = "Nodes the gateway knows, by presence: online (listed) or offline (left, kept --offline-retention)."
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "okso_gateway_nodes", Help: nodesHelp,
			ConstLabels: prometheus.Labels{"presence": "online"}}, nodes(false)),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "okso_gateway_nodes", Help: nodesHelp,
			ConstLabels: prometheus.Labels{"presence": "offline"}}, nodes(true)),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "okso_gateway_streams_open",
			Help: "Metric streams the gateway holds open."}, func() float64 { return float64(g.streams.open()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "okso_gateway_stream_frames_dropped_total",
			Help: "Stream frames dropped for a client that did not keep up."}, func() float64 { return float64(g.streams.dropped.Load()) }),
	)
	for _, s := range g.sources {
		switch s := s.(type) {
		case *upstreams:
			reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "okso_gateway_upstreams",
				Help: "Upstreams (federated MCP servers and action endpoints) whose tools the gateway lists."}, func() float64 {
				s.mu.Lock()
				defer s.mu.Unlock()
				return float64(len(s.listed))
			}))
		case *callers:
			reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "okso_gateway_caller_listens",
				Help: "Agents' listens whose tools the gateway lists (the caller-tool relay)."}, func() float64 {
				s.mu.Lock()
				defer s.mu.Unlock()
				return float64(len(s.decls))
			}))
		}
	}
}
