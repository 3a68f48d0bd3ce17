package roles

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device/agent"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/internal/bearer"
	"github.com/okso-io/okso/mcp"
	"github.com/okso-io/okso/schemas"
)

// syncBuffer is a log sink shared by the parts and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// fixture is a running all-in-one on ephemeral ports.
type fixture struct {
	t    *testing.T
	a    *AllInOne
	logs *syncBuffer
	nc   *nats.Conn // a test connection to the embedded NATS
	// stop stops the all-in-one and waits for it (at the end of the test
	// unless called before).
	stop func()
	// http, if set, is the HTTP client of post (default
	// http.DefaultClient).
	http *http.Client
}

func startAllInOne(t *testing.T, mock int, edit func(*AllInOneConfig)) *fixture {
	t.Helper()
	logs := &syncBuffer{}
	return startAllInOneLog(t, mock, edit, slog.New(slog.NewJSONHandler(logs, nil)), logs)
}

// startAllInOneLog is startAllInOne with the log given, which writes to
// logs.
func startAllInOneLog(t *testing.T, mock int, edit func(*AllInOneConfig), log *slog.Logger, logs *syncBuffer) *fixture {
	t.Helper()
	cfg := AllInOneConfig{
		Gateway: gatewayConfig{Addr: "127.0.0.1:0", Budget: 5 * time.Second},
		Tier:    tierConfig{Addr: "127.0.0.1:0"},
		DataDir: t.TempDir(),
		Mock:    mock,
		Tenant:  DefaultTenant,
	}
	if edit != nil {
		edit(&cfg)
	}
	a, err := NewAllInOne(t.Context(), log, cfg)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := a.nats.connect(bus.RoleAdmin, "test") // the test watches and forges as no role may
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	f := &fixture{t: t, a: a, logs: logs, nc: nc}
	f.stop = sync.OnceFunc(func() {
		nc.Close()
		// Keep-alive connections of the tests' clients would outlive the run.
		http.DefaultTransport.(*http.Transport).CloseIdleConnections()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("all-in-one stopped with %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("all-in-one did not stop")
		}
	})
	t.Cleanup(f.stop)
	f.waitNodes(cfg.Tenant, mock)
	return f
}

// waitNodes waits until the gateway sees n nodes of tenant.
func (f *fixture) waitNodes(tenant string, n int) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(f.t.Context(), 10*time.Second)
	defer cancel()
	err := f.a.gw.gw.Wait(ctx, func(m map[string]int) bool { return m[tenant] == n })
	if err != nil {
		f.t.Fatalf("gateway never saw %d nodes of tenant %s: %v", n, tenant, err)
	}
}

func (f *fixture) token(o auth.MintOptions) string {
	f.t.Helper()
	if o.Subject == "" {
		o.Subject = "test-agent"
	}
	if o.Tenant == "" {
		o.Tenant = DefaultTenant
	}
	if o.Scopes == nil {
		o.Scopes = []string{auth.ScopeReadOnly}
	}
	tok, err := f.a.Signer().Mint(o)
	if err != nil {
		f.t.Fatal(err)
	}
	return tok
}

func (f *fixture) client(token, version string) *sdk.ClientSession {
	f.t.Helper()
	c := sdk.NewClient(&sdk.Implementation{Name: "okso-test", Version: "1"}, nil)
	tr := &sdk.StreamableClientTransport{
		Endpoint:   f.a.MCPURL(),
		HTTPClient: &http.Client{Transport: bearer.Transport{Token: token, Base: http.DefaultTransport}},
		MaxRetries: -1,
	}
	s, err := c.Connect(f.t.Context(), tr, &sdk.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		f.t.Fatalf("connect MCP client: %v", err)
	}
	f.t.Cleanup(func() { _ = s.Close() })
	return s
}

// device connects a device with the given capability and handlers, and
// waits until the gateway lists it.
func (f *fixture) device(tenant string, caps []schemas.Capability, handlers map[string]agent.Handler) string {
	f.t.Helper()
	id, _ := f.connectDevice(tenant, func(_ string, o *agent.Options) {
		if caps != nil {
			o.Capabilities = caps
		}
		if handlers != nil {
			o.Handlers = handlers
		}
	})
	return id
}

// connectDevice runs a mock device of tenant (echo, metrics, GPIO pin),
// after edit (given the node id first) changed its options, until the test
// ends or stop is called; it returns once the gateway lists the node.
func (f *fixture) connectDevice(tenant string, edit func(id string, o *agent.Options)) (id string, stop func()) {
	f.t.Helper()
	id = wire.NewNodeID()
	tok, err := f.a.Signer().Mint(auth.MintOptions{Subject: id, Tenant: tenant,
		Scopes: []string{auth.ScopeDeviceConnect}, Audience: auth.AudienceDevice})
	if err != nil {
		f.t.Fatal(err)
	}
	o := agent.MockOptions(id, f.a.c.schemas, 1)
	o.URLs, o.Token, o.TLS = []string{f.a.DeviceURL()}, tok, f.a.tier.ownTLS()
	if edit != nil {
		edit(id, &o)
	}
	d, err := agent.New(o)
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = d.Run(ctx) }()
	stop = func() { cancel(); <-done }
	f.t.Cleanup(stop)
	wctx, wcancel := context.WithTimeout(f.t.Context(), 10*time.Second)
	defer wcancel()
	if err := f.a.gw.gw.Wait(wctx, func(map[string]int) bool { return f.a.gw.gw.Devices().Listed(id) }); err != nil {
		f.t.Fatalf("gateway never listed node %s", id)
	}
	return id, stop
}

func echoName(node string) string { return "sysecho." + node + ".echo.invoke" }

// listedName is how tools/list names a tool by default: its safe form.
func listedName(canonical string) string { return schemas.SafeToolName(canonical) }

// nodeOf is the node a device tool belongs to, as its _meta says (a
// listed name is never parsed).
func nodeOf(tl *sdk.Tool) string {
	id, _ := tl.Meta[schemas.MetaNodeID].(string)
	return id
}

// envelope returns the error envelope of a failed call, checking its
// form (DESIGN.md §5): isError, the envelope as the only text content and
// in _meta["io.okso/error"], and no structuredContent.
func envelope(t *testing.T, res *sdk.CallToolResult) schemas.Error {
	t.Helper()
	if !res.IsError {
		t.Fatalf("call succeeded, want an error: %+v", res.StructuredContent)
	}
	if res.StructuredContent != nil {
		t.Errorf("error result carries structuredContent %v", res.StructuredContent)
	}
	var e schemas.Error
	b, _ := json.Marshal(res.Meta[mcp.MetaError])
	if err := json.Unmarshal(b, &e); err != nil || e.Code == "" {
		t.Fatalf("error result's _meta %v has no envelope", res.Meta)
	}
	if len(res.Content) != 1 {
		t.Fatalf("error result has %d content items", len(res.Content))
	}
	if txt, ok := res.Content[0].(*sdk.TextContent); !ok || txt.Text != string(e.JSON()) {
		t.Errorf("text content %v differs from the envelope %s", res.Content[0], e.JSON())
	}
	return e
}

func TestEndToEndEcho(t *testing.T) {
	const mock = 3
	f := startAllInOne(t, mock, nil)
	for _, version := range []string{"2026-07-28", "2025-11-25"} {
		t.Run(version, func(t *testing.T) {
			s := f.client(f.token(auth.MintOptions{}), version)
			list, err := s.ListTools(t.Context(), nil)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			nodes := map[string]string{} // listed name → node id
			for _, tl := range list.Tools {
				if strings.HasPrefix(tl.Name, "sysecho-") && schemas.ValidListedName(tl.Name) {
					names = append(names, tl.Name)
					nodes[tl.Name] = nodeOf(tl)
				}
				// A read-only token's tools are read-only, but fleet.call,
				// which may be anything its verbs are (and is, with this
				// token, read-only fan-outs alone).
				readOnly := tl.Name != listedName(mcp.ToolFleetCall)
				if tl.Annotations == nil || tl.Annotations.ReadOnlyHint != readOnly || tl.Title == "" ||
					tl.InputSchema == nil || tl.OutputSchema == nil {
					t.Errorf("tool %s lacks title, readOnlyHint or schemas: %+v", tl.Name, tl)
				}
			}
			if len(names) != mock {
				t.Fatalf("listed %d sysecho tools, want %d: %v", len(names), mock, names)
			}
			for _, name := range names {
				res, err := s.CallTool(t.Context(), &sdk.CallToolParams{
					Name: name, Arguments: map[string]any{"message": "ping"},
				})
				if err != nil {
					t.Fatal(err)
				}
				if res.IsError {
					t.Fatalf("call %s failed: %v", name, res.StructuredContent)
				}
				b, _ := json.Marshal(res.StructuredContent)
				if err := f.a.c.schemas.ValidateJSON("mcp://schemas/system.echo.invoke.output@1.0.0", b); err != nil {
					t.Errorf("result %s fails the output schema: %v", b, err)
				}
				var out agent.EchoResult
				_ = json.Unmarshal(b, &out)
				if node := nodes[name]; out.Message != "ping" || out.NodeID != node {
					t.Errorf("result %s: want message ping from node %s", b, node)
				}
				var fromText agent.EchoResult
				txt := res.Content[0].(*sdk.TextContent).Text
				if json.Unmarshal([]byte(txt), &fromText) != nil || fromText != out {
					t.Errorf("text content %s differs from structuredContent %s", txt, b)
				}
				if id, _ := res.Meta["io.okso/request_id"].(string); id == "" {
					t.Error("result has no request id in _meta")
				}
			}
		})
	}
}

// TestAuditCarriesNoPayload checks that arguments and results never reach
// the logs, and that each call decision is logged once.
func TestAuditCarriesNoPayload(t *testing.T) {
	f := startAllInOne(t, 1, func(c *AllInOneConfig) { c.Gateway.AuditRetention = time.Hour })
	onBus, err := f.nc.SubscribeSync("okso.v1.audit.>")
	if err != nil {
		t.Fatal(err)
	}
	s := f.client(f.token(auth.MintOptions{}), "")
	node := f.device(DefaultTenant, nil, nil)
	const secret = "SECRET-ARGUMENT-7f3a"
	res, err := s.CallTool(t.Context(), &sdk.CallToolParams{
		Name: echoName(node), Arguments: map[string]any{"message": secret},
	})
	if err != nil || res.IsError {
		t.Fatalf("call: %v %+v\n%s", err, res, f.logs.String())
	}
	// On NATS: every event published (and kept in okso_audit) is free of it.
	var published int
	allowed := map[string]bool{}
	for !allowed["tier"] || !allowed["gateway"] {
		m, err := onBus.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("audit events of the call not published: %v (seen %v)", err, allowed)
		}
		published++
		if strings.Contains(string(m.Data), secret) {
			t.Fatalf("an argument or result reached the audit subject: %s", m.Data)
		}
		var e bus.AuditEvent
		if json.Unmarshal(m.Data, &e) == nil && e.Tool == echoName(node) && e.Decision == bus.DecisionAllowed {
			allowed[e.Actor] = true
		}
	}
	js, _ := jetstream.New(f.nc)
	st, err := js.Stream(t.Context(), bus.StreamAudit)
	if err != nil {
		t.Fatalf("audit stream: %v", err)
	}
	info, err := st.Info(t.Context())
	if err != nil || published == 0 || info.State.Msgs == 0 {
		t.Errorf("audit events: %d published, %v kept (%v)", published, info, err)
	}
	// Each event is logged before it is published: both are in the logs now.
	logs := f.logs.String()
	if strings.Contains(logs, secret) {
		t.Fatal("an argument or result reached the logs")
	}
	var decisions []string
	for _, line := range strings.Split(logs, "\n") {
		var e map[string]any
		if json.Unmarshal([]byte(line), &e) != nil || e["msg"] != "audit" || e["node_id"] != node {
			continue
		}
		if e["tool"] == echoName(node) {
			decisions = append(decisions, e["actor"].(string)+":"+e["decision"].(string))
		}
	}
	slices.Sort(decisions) // each role's auditor writes on its own goroutine
	want := []string{"gateway:allowed", "tier:allowed"}
	if strings.Join(decisions, ",") != strings.Join(want, ",") {
		t.Errorf("audit decisions %v, want %v", decisions, want)
	}
}

func TestCallFailures(t *testing.T) {
	f := startAllInOne(t, 0, func(c *AllInOneConfig) { c.Gateway.Budget = 400 * time.Millisecond })
	demo := f.token(auth.MintOptions{})
	s := f.client(demo, "")

	good := f.device(DefaultTenant, nil, nil)
	other := f.device("other", nil, nil)
	release := make(chan struct{})
	block := func(ctx context.Context, _ json.RawMessage) (any, error) {
		<-release
		return nil, errors.New("released")
	}
	silent := f.device(DefaultTenant, nil, map[string]agent.Handler{"echo.invoke": block})
	t.Cleanup(func() { close(release) }) // before the device's own cleanup waits for it
	wrongNode := f.device(DefaultTenant, nil, map[string]agent.Handler{"echo.invoke": func(context.Context, json.RawMessage) (any, error) {
		return agent.EchoResult{Message: "x", ReceivedAtMs: time.Now().UnixMilli(), NodeID: wire.NewNodeID()}, nil
	}})
	badOutput := f.device(DefaultTenant, nil, map[string]agent.Handler{"echo.invoke": func(context.Context, json.RawMessage) (any, error) {
		return map[string]any{"message": 5, "node_id": "x"}, nil
	}})

	// A node in the registry with no session behind it: no responders.
	reg, err := bus.OpenRegistry(t.Context(), f.nc, bus.RegistryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// It answers the gateway's probe (so it is listed), then its session
	// vanishes without cleanup, as with a tier killed mid-flight.
	ghost := wire.NewNodeID()
	probe, err := f.nc.Subscribe(bus.NodeCmd(ghost), func(m *nats.Msg) { _ = m.Respond(bus.OKReply([]byte("{}"))) })
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Claim(t.Context(), bus.Node{NodeID: ghost, Tenant: DefaultTenant, SessionID: "ghost",
		Capabilities: []schemas.Capability{agent.EchoCapability()}}); err != nil {
		t.Fatal(err)
	}
	f.waitNodes(DefaultTenant, 5)
	if err := probe.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if err := f.nc.Flush(); err != nil {
		t.Fatal(err)
	}

	long := strings.Repeat("a", 1025)
	cases := []struct {
		name  string
		token string
		tool  string
		args  any
		code  string
	}{
		{"non-ASCII argument", demo, echoName(good), map[string]any{"message": "pïng"}, schemas.CodeManifestInvalid},
		{"argument too long", demo, echoName(good), map[string]any{"message": long}, schemas.CodeManifestInvalid},
		{"extra property", demo, echoName(good), map[string]any{"message": "a", "x": 1}, schemas.CodeManifestInvalid},
		{"missing argument", demo, echoName(good), map[string]any{}, schemas.CodeManifestInvalid},
		{"missing scope", f.token(auth.MintOptions{Scopes: []string{auth.ScopeDeviceConnect}}), echoName(good),
			map[string]any{"message": "a"}, schemas.CodeSafetyDenied},
		{"other tenant", demo, echoName(other), map[string]any{"message": "a"}, schemas.CodeSafetyDenied},
		{"node offline", demo, echoName(ghost), map[string]any{"message": "a"}, schemas.CodeNodeOffline},
		{"device never answers", demo, echoName(silent), map[string]any{"message": "a"}, schemas.CodeDeadlineExceeded},
		{"wrong node_id in result", demo, echoName(wrongNode), map[string]any{"message": "a"}, schemas.CodeInternal},
		{"result fails output schema", demo, echoName(badOutput), map[string]any{"message": "a"}, schemas.CodeInternal},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cs := s
			if c.token != demo {
				cs = f.client(c.token, "")
			}
			res, err := cs.CallTool(t.Context(), &sdk.CallToolParams{Name: c.tool, Arguments: c.args})
			if err != nil {
				t.Fatalf("want an isError result, got %v", err)
			}
			e := envelope(t, res)
			if e.Code != c.code || e.Category != schemas.Category(c.code) {
				t.Errorf("got %s/%s (%s), want %s", e.Code, e.Category, e.Message, c.code)
			}
		})
	}

	// Other-tenant tools never appear in the list.
	list, err := s.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tl := range list.Tools {
		if strings.Contains(tl.Name, other) {
			t.Errorf("tenant demo sees %s of tenant other", tl.Name)
		}
	}

	// Names that are no tool of the caller's are JSON-RPC errors.
	for _, name := range []string{"not-a-tool", echoName(wire.NewNodeID()), "sysecho." + good + ".echo.nope",
		"sysecho." + good + ".echo.invoke.extra", strings.Repeat("a", 70)} {
		t.Run("unknown "+name[:min(len(name), 20)], func(t *testing.T) {
			_, err := s.CallTool(t.Context(), &sdk.CallToolParams{Name: name, Arguments: map[string]any{"message": "a"}})
			var rpcErr *jsonrpc.Error
			if !errors.As(err, &rpcErr) {
				t.Fatalf("want a JSON-RPC error, got %v", err)
			}
			var e schemas.Error
			if json.Unmarshal(rpcErr.Data, &e) != nil || e.Code != schemas.CodeToolNotFound {
				t.Errorf("JSON-RPC error data %s, want E_TOOL_NOT_FOUND", rpcErr.Data)
			}
		})
	}
}

// TestLateAck: a device that answers after its deadline gets the caller
// E_DEADLINE_EXCEEDED, and its late cmd_ack is dropped and audited.
func TestLateAck(t *testing.T) {
	f := startAllInOne(t, 0, nil)
	audit, err := f.nc.SubscribeSync(bus.Audit(DefaultTenant))
	if err != nil {
		t.Fatal(err)
	}
	caps := []schemas.Capability{agent.EchoCapability()}
	caps[0].Constraints.DeadlineMsDefault = 100
	answer := make(chan struct{})
	var id string
	late := f.device(DefaultTenant, caps, map[string]agent.Handler{
		"echo.invoke": func(ctx context.Context, args json.RawMessage) (any, error) {
			<-answer // only once the caller has had its E_DEADLINE_EXCEEDED
			return agent.EchoResult{Message: "a", ReceivedAtMs: time.Now().UnixMilli(), NodeID: id}, nil
		},
	})
	id = late
	s := f.client(f.token(auth.MintOptions{}), "")
	res, err := s.CallTool(t.Context(), &sdk.CallToolParams{Name: echoName(late), Arguments: map[string]any{"message": "a"}})
	close(answer)
	if err != nil {
		t.Fatal(err)
	}
	if e := envelope(t, res); e.Code != schemas.CodeDeadlineExceeded {
		t.Fatalf("got %s, want E_DEADLINE_EXCEEDED", e.Code)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		m, err := audit.NextMsg(time.Until(deadline))
		if err != nil {
			t.Fatalf("no late_ack_dropped audit event: %v", err)
		}
		var e bus.AuditEvent
		if json.Unmarshal(m.Data, &e) == nil && e.Decision == bus.DecisionLateAck && e.NodeID == late {
			return
		}
	}
}

func TestHTTPAuth(t *testing.T) {
	f := startAllInOne(t, 0, nil)
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`
	other, err := auth.LoadOrCreateSigner(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := other.Mint(auth.MintOptions{Subject: "agent", Tenant: DefaultTenant})
	if err != nil {
		t.Fatal(err)
	}
	// Each 401 says why in one sentence.
	cases := []struct {
		name  string
		token string
		body  string
	}{
		{"no token", "", "no bearer token"},
		{"expired", f.token(auth.MintOptions{Now: time.Now().Add(-2 * time.Hour), TTL: time.Hour}), "invalid token: it expired at "},
		{"wrong audience", f.token(auth.MintOptions{Audience: "someone-else"}), "invalid token: it is not meant for this server"},
		{"device token", f.token(auth.MintOptions{Audience: auth.AudienceDevice, Scopes: []string{auth.ScopeDeviceConnect}}),
			"invalid token: it is not meant for this server"},
		{"garbage", "not.a.token", "invalid token: it is not a well-formed JWT"},
		{"another data dir", foreign, "invalid token: it was signed with a key this server does not know (minted with another --data-dir"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(t.Context(), "POST", f.a.MCPURL(), strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			if c.token != "" {
				req.Header.Set("Authorization", "Bearer "+c.token)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			msg, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Fatalf("status %d, want 401", resp.StatusCode)
			}
			if !strings.HasPrefix(string(msg), c.body) || strings.Count(string(msg), "invalid token") > 1 {
				t.Errorf("401 says %q, want %q", msg, c.body)
			}
			h := resp.Header.Get("WWW-Authenticate")
			if !strings.HasPrefix(h, "Bearer ") || !strings.Contains(h, `resource_metadata="http://`) {
				t.Errorf("WWW-Authenticate %q lacks resource_metadata", h)
			}
		})
	}
	resp, err := http.Get(strings.TrimSuffix(f.a.MCPURL(), "/mcp") + "/.well-known/oauth-protected-resource/mcp")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var meta struct {
		Resource        string   `json:"resource"`
		ScopesSupported []string `json:"scopes_supported"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&meta); err != nil || meta.Resource != f.a.MCPURL() {
		t.Errorf("protected resource metadata: %+v, %v", meta, err)
	}

	// A cross-origin browser request is refused.
	req, _ := http.NewRequestWithContext(t.Context(), "POST", f.a.MCPURL(), strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+f.token(auth.MintOptions{}))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Origin", "http://evil.example")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("cross-origin request: status %d, want 403", resp.StatusCode)
	}
}

// TestToolsFollowDevices: a device that connects appears in its tenant's
// list, and disappears when it leaves.
func TestToolsFollowDevices(t *testing.T) {
	f := startAllInOne(t, 0, nil)
	s := f.client(f.token(auth.MintOptions{}), "")
	id := wire.NewNodeID()
	tok, _ := f.a.Signer().Mint(auth.MintOptions{Subject: id, Tenant: DefaultTenant,
		Scopes: []string{auth.ScopeDeviceConnect}, Audience: auth.AudienceDevice})
	o := agent.MockOptions(id, f.a.c.schemas, 1)
	o.URLs, o.Token = []string{f.a.DeviceURL()}, tok
	d, _ := agent.New(o)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); _ = d.Run(ctx) }()
	f.waitNodes(DefaultTenant, 1)
	list, err := s.ListTools(t.Context(), nil)
	// A read-only token sees the pin's read, not its write, and okso's
	// own read-only tools, listed for every tenant.
	want := map[string]bool{listedName(echoName(id)): true, "sys-" + id + "-metrics-snapshot": true,
		"sys-" + id + "-metrics-subscribe": true, "gpio-" + id + "-pin-read": true,
		listedName(mcp.ToolFleetCall): true, listedName(mcp.ToolFleetNodes): true, listedName(mcp.ToolFindTools): true}
	if err != nil || len(list.Tools) != len(want) {
		for _, tl := range list.Tools {
			t.Log(tl.Name)
		}
		t.Fatalf("list %+v, %v: want %v", list, err, want)
	}
	for _, tl := range list.Tools {
		if !want[tl.Name] {
			t.Errorf("unexpected tool %s", tl.Name)
		}
	}
	cancel()
	<-done
	f.waitNodes(DefaultTenant, 0)
	list, err = s.ListTools(t.Context(), nil)
	if err != nil || len(list.Tools) != 3 || list.Tools[0].Name != listedName(mcp.ToolFleetCall) ||
		list.Tools[1].Name != listedName(mcp.ToolFleetNodes) || list.Tools[2].Name != listedName(mcp.ToolFindTools) {
		t.Fatalf("list after disconnect %d tools, %v: want okso's own three alone", len(list.Tools), err)
	}
}

type tokenClient struct{ http.Client }

func httpClientWithToken(token string) *tokenClient {
	return &tokenClient{http.Client{Transport: bearer.Transport{Token: token, Base: http.DefaultTransport}}}
}

func verifierFor(c *common) *auth.Verifier {
	return auth.NewVerifier(c.signer.Public(), auth.AudienceGateway)
}
