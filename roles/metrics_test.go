package roles

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/mcp"
)

// scrape reads a registry as Prometheus does, over HTTP in the text
// format, and parses it.
func scrape(t *testing.T, h http.Handler) map[string]*dto.MetricFamily {
	t.Helper()
	srv := httptest.NewServer(h)
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(string(b)))
	if err != nil {
		t.Fatalf("the scrape does not parse: %v\n%s", err, b)
	}
	return families
}

// counter is the value of the family's series with the labels, 0 if none.
func counter(f *dto.MetricFamily, labels map[string]string) float64 {
	if f == nil {
		return 0
	}
series:
	for _, m := range f.Metric {
		for _, l := range m.Label {
			if want, ok := labels[l.GetName()]; ok && want != l.GetValue() {
				continue series
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	return 0
}

// TestMetrics: an all-in-one's /metrics, scraped and parsed as
// Prometheus does, counts real calls by template and outcome, and a
// fan-out over many nodes adds no series per node.
func TestMetrics(t *testing.T) {
	reg := newProcessRegistry()
	rec := &recorder{Registerer: reg, names: map[string]bool{}}
	const mocks = 20
	f := startAllInOne(t, mocks, func(c *AllInOneConfig) { c.Metrics = rec })
	s := f.client(f.token(auth.MintOptions{}), "")
	h := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})

	before := scrape(t, h)
	if before["go_goroutines"] == nil || before["process_cpu_seconds_total"] == nil {
		t.Errorf("no Go or process metrics: %v", keys(before))
	}
	var one string
	for id := range f.a.gw.gw.Devices().IDs() {
		one = id
		break
	}
	echo := listedName("sysecho." + one + ".echo.invoke")
	for range 3 {
		if res, err := s.CallTool(t.Context(), &sdk.CallToolParams{Name: echo, Arguments: map[string]any{"message": "m"}}); err != nil || res.IsError {
			t.Fatalf("%v %+v", err, res)
		}
	}
	if res, err := s.CallTool(t.Context(), &sdk.CallToolParams{Name: echo, Arguments: map[string]any{"nope": 1}}); err != nil || !res.IsError {
		t.Fatalf("%v %+v", err, res)
	}
	if _, e := fanOut(t, s, map[string]any{"tool": "sysecho.*.echo.invoke", "arguments": map[string]any{"message": "fan"}}); e != nil {
		t.Fatalf("fleet.call: %+v", e)
	}

	for _, auth := range []string{"", "Bearer not-a-token"} {
		req, _ := http.NewRequest(http.MethodPost, f.a.MCPURL(), strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
		req.Header.Set("Content-Type", "application/json")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("a request with Authorization %q: %d, want 401", auth, resp.StatusCode)
		}
	}

	after := scrape(t, h)
	for _, reason := range []string{"missing", "invalid_token"} {
		if got := counter(after["okso_gateway_auth_refusals_total"], map[string]string{"reason": reason}); got != 1 {
			t.Errorf("auth refusals %s = %v, want 1", reason, got)
		}
	}
	calls, dur := after["okso_gateway_calls_total"], after["mcp_server_operation_duration_seconds"]
	for _, c := range []struct {
		f      *dto.MetricFamily
		labels map[string]string
		want   float64
	}{
		{calls, map[string]string{"source": "device", "code": "ok"}, 3 + mocks},
		{calls, map[string]string{"source": "device", "code": "E_MANIFEST_INVALID"}, 1},
		{calls, map[string]string{"source": "fleet", "code": "ok"}, 1},
		{dur, map[string]string{"gen_ai_tool_name": "sysecho.*.echo.invoke", "error_type": ""}, 3 + mocks},
		{dur, map[string]string{"gen_ai_tool_name": mcp.ToolFleetCall, "error_type": ""}, 1},
	} {
		if got := counter(c.f, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.f.GetName(), c.labels, got, c.want)
		}
	}
	// The tier's, in the same process.
	events := after["okso_tier_events_total"]
	if got := counter(events, map[string]string{"kind_short": "sysecho", "decision": "allowed"}); got != 3+mocks {
		t.Errorf("tier events of echo calls allowed = %v, want %d", got, 3+mocks)
	}
	if g := after["okso_tier_sessions"]; g == nil || len(g.Metric) != 1 || g.Metric[0].GetGauge().GetValue() != mocks {
		t.Errorf("okso_tier_sessions = %v, want %d", g, mocks)
	}
	var online float64
	for _, m := range after["okso_gateway_nodes"].GetMetric() {
		if labelsAre(m, "presence", "online") {
			online = m.GetGauge().GetValue()
		}
	}
	if online != mocks {
		t.Errorf("okso_gateway_nodes{presence=online} = %v, want %d", online, mocks)
	}
	if after["okso_gateway_streams_open"] == nil || after["okso_gateway_caller_listens"] == nil {
		t.Errorf("no gauge of streams or listens: %v", keys(after))
	}
	for _, part := range []string{"gateway", "tier"} {
		connected, published := 0.0, 0.0
		for _, m := range after["okso_nats_connected"].GetMetric() {
			if labelsAre(m, "part", part) {
				connected = m.GetGauge().GetValue()
			}
		}
		for _, m := range after["okso_audit_events_published_total"].GetMetric() {
			if labelsAre(m, "part", part) {
				published = m.GetCounter().GetValue()
			}
		}
		if connected != 1 || published < 3+mocks {
			t.Errorf("part %s: okso_nats_connected %v, okso_audit_events_published_total %v; want 1 and at least %d",
				part, connected, published, 3+mocks)
		}
	}
	// Every bucket each part reads answers, with its replicas current.
	for _, m := range after["okso_jetstream_bucket_up"].GetMetric() {
		if m.GetGauge().GetValue() != 1 {
			t.Errorf("okso_jetstream_bucket_up %v = %v, want 1", m.Label, m.GetGauge().GetValue())
		}
	}
	if n := len(after["okso_jetstream_bucket_up"].GetMetric()); n != 12 {
		t.Errorf("%d buckets' health, want 12 (7 the gateway's, 5 the tier's)", n)
	}
	if after["okso_tier_pending_calls"] == nil {
		t.Error("no okso_tier_pending_calls")
	}
	if n := len(dur.GetMetric()); n != 3 { // echo ok, echo E_MANIFEST_INVALID, fleet.call ok
		t.Errorf("%d duration series after calls of %d nodes, want 3", n, mocks)
	}
	for _, m := range dur.GetMetric() {
		for _, l := range m.Label {
			if strings.Contains(l.GetValue(), one) {
				t.Errorf("a series names a node id: %v", m.Label)
			}
		}
	}
}

func keys(m map[string]*dto.MetricFamily) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// labelsAre reports whether m has the label name with value.
func labelsAre(m *dto.Metric, name, value string) bool {
	for _, l := range m.Label {
		if l.GetName() == name {
			return l.GetValue() == value
		}
	}
	return false
}

// recorder is a Registerer that notes the name of every metric
// registered through it, whether or not it has a series yet.
type recorder struct {
	prometheus.Registerer
	mu    sync.Mutex
	names map[string]bool
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (r *recorder) note(c prometheus.Collector) {
	ch := make(chan *prometheus.Desc, 16)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			r.mu.Lock()
			r.names[m[1]] = true
			r.mu.Unlock()
		}
	}
}

func (r *recorder) Register(c prometheus.Collector) error {
	r.note(c)
	return r.Registerer.Register(c)
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		r.note(c)
	}
	r.Registerer.MustRegister(cs...)
}

// TestDashboard: every query of the Grafana dashboard in deploy/ names
// metrics an okso role exports (an all-in-one's parts, and Go's and the
// process's), so that no panel is empty for a misspelt name.
func TestDashboard(t *testing.T) {
	reg := newProcessRegistry()
	rec := &recorder{Registerer: reg, names: map[string]bool{}}
	startAllInOne(t, 1, func(c *AllInOneConfig) { c.Metrics, c.Remote.Config = rec, echoRemotes(t) }) // the remote tier's metrics too
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		rec.names[f.GetName()] = true
	}
	b, err := os.ReadFile("../deploy/grafana/okso.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	metric := regexp.MustCompile(`\b(?:okso|mcp|process|go)_[a-z0-9_]+`)
	queries := 0
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			queries++
			names := metric.FindAllString(q.Expr, -1)
			if len(names) == 0 {
				t.Errorf("panel %q: query %q names no metric of okso's", p.Title, q.Expr)
			}
			for _, n := range names {
				base := n
				for _, suffix := range []string{"_bucket", "_count", "_sum"} {
					if b, ok := strings.CutSuffix(n, suffix); ok && rec.names[b] {
						base = b
					}
				}
				if !rec.names[base] {
					t.Errorf("panel %q: query %q names %s, which okso does not export", p.Title, q.Expr, n)
				}
			}
		}
	}
	if queries < 10 {
		t.Errorf("the dashboard has %d queries", queries)
	}
}
