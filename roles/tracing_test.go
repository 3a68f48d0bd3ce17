package roles

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/device/agent"
	"github.com/okso-io/okso/internal/bearer"
	"github.com/okso-io/okso/internal/tracing"
	"github.com/okso-io/okso/mcp"
)

// receivedSpan is a span as an OTLP/HTTP receiver got it.
type receivedSpan struct {
	name, traceID, spanID, parentID string
	attrs                           map[string]string
}

// otlpReceiver is an OTLP/HTTP trace receiver, in the test's process.
type otlpReceiver struct {
	*httptest.Server
	mu      sync.Mutex
	spans   []receivedSpan
	changed chan struct{}
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	r := &otlpReceiver{changed: make(chan struct{}, 1)}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, err := io.ReadAll(req.Body)
		var msg coltracepb.ExportTraceServiceRequest
		if err != nil || req.URL.Path != "/v1/traces" || proto.Unmarshal(b, &msg) != nil {
			t.Errorf("the receiver got %s %s (%d bytes, %v)", req.Method, req.URL.Path, len(b), err)
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		for _, rs := range msg.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					got := receivedSpan{name: s.Name, traceID: hex.EncodeToString(s.TraceId), spanID: hex.EncodeToString(s.SpanId),
						parentID: hex.EncodeToString(s.ParentSpanId), attrs: map[string]string{}}
					for _, a := range s.Attributes {
						got.attrs[a.Key] = a.Value.GetStringValue()
					}
					r.spans = append(r.spans, got)
				}
			}
		}
		r.mu.Unlock()
		select {
		case r.changed <- struct{}{}:
		default:
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(nil)
	}))
	t.Cleanup(r.Close)
	return r
}

// newTestTracer is a tracer exporting to a receiver of its own, shut
// down (its last spans sent) when the test ends.
func newTestTracer(t *testing.T) (*otlpReceiver, *tracing.Tracer) {
	recv := newOTLPReceiver(t)
	tracer, err := tracing.New(t.Context(), recv.URL, "okso-test", "dev")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := tracer.Shutdown(ctx); err != nil {
			t.Errorf("tracer shutdown: %v", err)
		}
	})
	return recv, tracer
}

// wait returns the spans of trace traceID once there are n, waiting at
// most a minute for them.
func (r *otlpReceiver) wait(t *testing.T, traceID string, n int) []receivedSpan {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		r.mu.Lock()
		var of []receivedSpan
		for _, s := range r.spans {
			if s.traceID == traceID {
				of = append(of, s)
			}
		}
		r.mu.Unlock()
		if len(of) >= n {
			return of
		}
		select {
		case <-r.changed:
		case <-timeout:
			t.Fatalf("%d spans of trace %s, want %d: %+v", len(of), traceID, n, of)
		}
	}
}

// echoRemotes is a remotes file of one upstream, ext, an action-protocol
// echo (scripts/mcp_echo.sh) whose tool echo_external tenant demo calls.
func echoRemotes(t *testing.T) string {
	t.Helper()
	script, err := filepath.Abs(filepath.Join("..", "scripts", "mcp_echo.sh"))
	if err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(t.TempDir(), "remotes.yaml")
	if err := os.WriteFile(config, []byte("upstreams:\n  - name: ext\n    transport: action\n    command: ["+strconv.Quote(script)+
		"]\n    tenants: [demo]\n    allow: [echo_external]\n    safety: {echo_external: read_only}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return config
}

// TestTracing: a call with a known trace context gets a span at the
// gateway, one at the device tier and, for an upstream's tool, one at the
// remote tier, all of that trace, each the child of the hop before it,
// named and attributed as the MCP conventions say; and a device's local
// tool runs with the tier's span as its TRACEPARENT (cmd.traceparent, the
// feature trace).
func TestTracing(t *testing.T) {
	recv, tracer := newTestTracer(t)
	reg := newProcessRegistry()
	f := startAllInOne(t, 0, func(c *AllInOneConfig) { c.Tracer, c.Metrics, c.Remote.Config = tracer, reg, echoRemotes(t) })
	f.waitTool(DefaultTenant, "ext.echo_external", true)
	tools, err := agent.ParseTools([]byte("tools:\n  - name: trace\n    description: Prints the trace context it runs in.\n"+
		"    command: [sh, -c, 'printf %s \"$TRACEPARENT\"']\n    safety: read_only\n"), "tools.yaml")
	if err != nil {
		t.Fatal(err)
	}
	node, _ := f.connectDevice(DefaultTenant, func(_ string, o *agent.Options) {
		if *o, err = agent.WithLocalTools(*o, tools); err != nil {
			t.Fatal(err)
		}
	})

	const parent = "00f067aa0ba902b7" // the caller's span
	for _, c := range []struct {
		tool     string
		args     map[string]any
		template string
		traceID  string
	}{
		{"sysecho." + node + ".echo.invoke", map[string]any{"message": "traced"}, "sysecho.*.echo.invoke", "4bf92f3577b34da6a3ce929d0e0e4736"},
		{"ext.echo_external", map[string]any{"message": "traced"}, "ext.*", "4bf92f3577b34da6a3ce929d0e0e4737"},
		{"local." + node + ".trace.run", map[string]any{}, "local.*.trace.run", "4bf92f3577b34da6a3ce929d0e0e4738"},
	} {
		t.Run(c.template, func(t *testing.T) {
			traceID := c.traceID
			tr := &http.Transport{}
			defer tr.CloseIdleConnections()
			client := sdk.NewClient(&sdk.Implementation{Name: "okso-test", Version: "1"}, nil)
			s, err := client.Connect(t.Context(), &sdk.StreamableClientTransport{Endpoint: f.a.MCPURL(), MaxRetries: -1,
				HTTPClient: &http.Client{Transport: traceTransport{"00-" + traceID + "-" + parent + "-01",
					bearer.Transport{Token: f.token(auth.MintOptions{}), Base: tr}}}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			res, err := s.CallTool(t.Context(), &sdk.CallToolParams{Name: listedName(c.tool), Arguments: c.args})
			if err != nil || res.IsError {
				t.Fatalf("%v %+v", err, res)
			}
			if err := tracer.ForceFlush(t.Context()); err != nil {
				t.Fatal(err)
			}
			spans := recv.wait(t, traceID, 2) // the gateway's, and the tier's or the remote tier's
			var gw *receivedSpan
			for i := range spans {
				if spans[i].parentID == parent {
					gw = &spans[i]
				}
			}
			if gw == nil {
				t.Fatalf("no span is the child of the caller's %s: %+v", parent, spans)
			}
			if gw.name != "tools/call "+c.template || gw.attrs["mcp.method.name"] != "tools/call" || gw.attrs["mcp.protocol.version"] == "" ||
				gw.attrs["gen_ai.tool.name"] != c.template || gw.attrs["gen_ai.operation.name"] != "execute_tool" ||
				gw.attrs["jsonrpc.request.id"] == "" {
				t.Errorf("the gateway's span: %+v", *gw)
			}
			children := 0
			for _, sp := range spans {
				if sp.parentID == gw.spanID {
					children++
					if sp.name != "tools/call "+c.template || sp.attrs["gen_ai.tool.name"] != c.template {
						t.Errorf("the next hop's span: %+v", sp)
					}
				}
			}
			if children != 1 {
				t.Errorf("%d spans are the gateway span's children, want 1: %+v", children, spans)
			}
			if c.template == "local.*.trace.run" {
				// The device's tool ran in the tier's span: TRACEPARENT, from cmd.traceparent.
				var out struct {
					Stdout string `json:"stdout"`
				}
				b, _ := json.Marshal(res.StructuredContent)
				_ = json.Unmarshal(b, &out)
				var tier string
				for _, sp := range spans {
					if sp.parentID == gw.spanID {
						tier = sp.spanID
					}
				}
				if want := "00-" + traceID + "-" + tier + "-01"; out.Stdout != want {
					t.Errorf("the local tool ran with TRACEPARENT %q, want the tier's span %q", out.Stdout, want)
				}
			}
		})
	}
	checkRemoteMetrics(t, reg)
}

// TestTracingRoots: tracing on, a call that brings no trace context is
// the root of a trace of its own, sampled and exported; one that brings
// it in _meta (MCP 2026-07-28) is continued like the header.
func TestTracingRoots(t *testing.T) {
	recv, tracer := newTestTracer(t)
	f := startAllInOne(t, 1, func(c *AllInOneConfig) { c.Tracer = tracer })
	var node string
	for id := range f.a.gw.gw.Devices().IDs() {
		node = id
	}
	s := f.client(f.token(auth.MintOptions{}), "")
	echo := listedName("sysecho." + node + ".echo.invoke")

	const traceID, parent = "4bf92f3577b34da6a3ce929d0e0e4740", "00f067aa0ba902b7"
	if res, err := s.CallTool(t.Context(), &sdk.CallToolParams{Name: echo, Arguments: map[string]any{"message": "meta"},
		Meta: sdk.Meta{"traceparent": "00-" + traceID + "-" + parent + "-01"}}); err != nil || res.IsError {
		t.Fatalf("%v %+v", err, res)
	}
	if res, err := s.CallTool(t.Context(), &sdk.CallToolParams{Name: echo, Arguments: map[string]any{"message": "root"}}); err != nil || res.IsError {
		t.Fatalf("%v %+v", err, res)
	}
	if err := tracer.ForceFlush(t.Context()); err != nil {
		t.Fatal(err)
	}
	spans := recv.wait(t, traceID, 2)
	continued := false
	for _, sp := range spans {
		continued = continued || sp.parentID == parent
	}
	if !continued {
		t.Errorf("no span continues the _meta traceparent: %+v", spans)
	}
	// The root: a gateway span without a parent, and its tier child.
	timeout := time.After(time.Minute)
	for {
		recv.mu.Lock()
		roots := 0
		for _, sp := range recv.spans {
			if sp.parentID == "" && sp.traceID != traceID && sp.name == "tools/call sysecho.*.echo.invoke" {
				roots++
			}
		}
		recv.mu.Unlock()
		if roots == 1 {
			break
		}
		select {
		case <-recv.changed:
		case <-timeout:
			t.Fatalf("%d root spans of the call without a trace context, want 1", roots)
		}
	}
}

// TestTracingRelay: a caller tool's call is one trace across the relay:
// the calling gateway's span (a child of the caller's), the span of the
// replica holding the listen (its child), whose trace context the
// listener gets in the request event's _meta and continues in its
// caller_tool_response; each span carries its JSON-RPC id.
func TestTracingRelay(t *testing.T) {
	recv, tracer := newTestTracer(t)
	f := startAllInOne(t, 0, func(c *AllInOneConfig) { c.Tracer = tracer })
	other := f.secondGateway(gatewayConfig{}) // traced as the first: the process's tracer
	mutating := []string{auth.ScopeMutating}
	tokA := f.token(auth.MintOptions{Subject: "agent-a", Scopes: mutating})
	a := f.listen(f.a.MCPURL(), tokA, twoTools) // held by the first replica
	waitTool(t, other.gw, DefaultTenant, "a_send", true)

	const traceID, parent = "4bf92f3577b34da6a3ce929d0e0e4750", "00f067aa0ba902b7"
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := sdk.NewClient(&sdk.Implementation{Name: "okso-test", Version: "1"}, nil)
	b, err := client.Connect(t.Context(), &sdk.StreamableClientTransport{Endpoint: other.url(), MaxRetries: -1,
		HTTPClient: &http.Client{Transport: traceTransport{"00-" + traceID + "-" + parent + "-01",
			bearer.Transport{Token: f.token(auth.MintOptions{Subject: "agent-b", Scopes: mutating}), Base: tr}}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	out := make(chan *sdk.CallToolResult, 1)
	go func() {
		res, err := b.CallTool(t.Context(), &sdk.CallToolParams{Name: "a_send", Arguments: map[string]any{"text": "traced"}})
		if err != nil {
			res = &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{Text: err.Error()}}}
		}
		out <- res
	}()
	ev := a.next(t)
	held, ok := strings.CutPrefix(ev.Meta.Traceparent, "00-"+traceID+"-")
	if !ok || len(held) != len(parent)+3 {
		t.Fatalf("the request event's _meta.traceparent is %q, want one of trace %s", ev.Meta.Traceparent, traceID)
	}
	held = held[:len(parent)]
	answerer := f.relayClient(f.a.MCPURL(), tokA, nil)
	args := fmt.Sprintf(`{"listen_id":%q,"request_id":%q,"result":{"sent":true}}`, a.id, ev.RequestID)
	if res, err := answerer.CallTool(t.Context(), &sdk.CallToolParams{Name: mcp.ToolCallerResponse, Arguments: json.RawMessage(args),
		Meta: sdk.Meta{"traceparent": ev.Meta.Traceparent}}); err != nil || res.IsError {
		t.Fatalf("caller_tool_response: %v %+v", err, res)
	}
	select {
	case res := <-out:
		if res.IsError {
			t.Fatalf("the relayed call: %+v", res.Content)
		}
	case <-time.After(time.Minute):
		t.Fatal("the relayed call never ended")
	}
	if err := tracer.ForceFlush(t.Context()); err != nil {
		t.Fatal(err)
	}
	spans := recv.wait(t, traceID, 3)
	byID := map[string]receivedSpan{}
	for _, sp := range spans {
		byID[sp.spanID] = sp
	}
	hold, ok := byID[held]
	if !ok {
		t.Fatalf("no span %s, the holder's: %+v", held, spans)
	}
	if hold.name != "tools/call caller.*" || hold.attrs["gen_ai.tool.name"] != "caller.*" || hold.attrs["error.type"] != "" {
		t.Errorf("the holder's span: %+v", hold)
	}
	gw, ok := byID[hold.parentID]
	if !ok || gw.parentID != parent || gw.name != "tools/call caller.*" || gw.attrs["jsonrpc.request.id"] == "" {
		t.Errorf("the calling gateway's span %+v, the holder's parent, is not the caller's child with its JSON-RPC id", gw)
	}
	answered := false
	for _, sp := range spans {
		if sp.parentID == held {
			answered = sp.name == "tools/call "+mcp.ToolCallerResponse && sp.attrs["jsonrpc.request.id"] != ""
		}
	}
	if !answered {
		t.Errorf("no caller_tool_response span is the holder's child: %+v", spans)
	}
}

// The remote tier's metrics, in the same run: the upstream served, its
// call counted.
func checkRemoteMetrics(t *testing.T, reg *prometheus.Registry) {
	t.Helper()
	if _, err := reg.Gather(); err != nil {
		t.Errorf("gather: %v", err)
	}
	families := scrape(t, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	if got := counter(families["okso_remote_calls_total"], map[string]string{"upstream": "ext", "code": "ok"}); got != 1 {
		t.Errorf("okso_remote_calls_total{upstream=ext,code=ok} = %v, want 1", got)
	}
	up := families["okso_remote_upstream_up"]
	if up == nil || len(up.Metric) != 1 || up.Metric[0].GetGauge().GetValue() != 1 {
		t.Errorf("okso_remote_upstream_up = %v, want ext at 1", up)
	}
}

// traceTransport sends a traceparent header on every request.
type traceTransport struct {
	traceparent string
	base        http.RoundTripper
}

func (t traceTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("traceparent", t.traceparent)
	return t.base.RoundTrip(r)
}
