package roles

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/schemas"
)

// TestToolNames: by default every name tools/list gives, from every
// source (a device, upstreams whose tools have a dot or a dash, a caller's
// own tools, okso's), is one every agent host accepts; the seed form
// lists the dotted names instead, chosen by the gateway's --tool-names or
// a token's tool_names claim (which wins); a call by either form works
// by every door, whatever the form listed, and audit events name the
// canonical form; an upstream's two tools of one safe name are not both
// listed, and the refusal is said.
func TestToolNames(t *testing.T) {
	f := startAllInOne(t, 0, func(c *AllInOneConfig) { c.Gateway.AuditRetention = time.Hour })
	node := f.device(DefaultTenant, nil, nil)
	remotes, err := bus.OpenRemotes(t.Context(), f.nc, bus.RemotesOptions{})
	if err != nil {
		t.Fatal(err)
	}
	standUpstream(t, f.nc, "web", map[string]func(json.RawMessage) string{
		"v1.search": upstreamEcho, "get-sum": upstreamEcho,
	})
	in := json.RawMessage(echoInput)
	tool := func(name string) bus.RemoteTool {
		return bus.RemoteTool{Name: name, InputSchema: in, Safety: schemas.SafetyReadOnly}
	}
	rec := &bus.Remote{Upstream: "web", Transport: "stdio", Tenants: []string{DefaultTenant}, TimeoutMs: 2000,
		Tools: []bus.RemoteTool{tool("v1.search"), tool("get-sum"), tool("a.b"), tool("a-b")}}
	f.putRemote(remotes, rec, DefaultTenant, "web-v1-search", true)

	mutating := []string{auth.ScopeMutating}
	f.listen(f.a.MCPURL(), f.token(auth.MintOptions{Subject: "caller", Scopes: mutating}),
		`{"caller_id":"ant","tools":[{"name":"send_note","inputSchema":{"type":"object"}}]}`)
	f.waitTool(DefaultTenant, "ant_send_note", true)

	list := func(s *sdk.ClientSession) []string { return listedNames(t, s) }
	echo := echoName(node)
	safe := []string{"ant_send_note", "caller_tool_response", "caller_tools_listen", "gpio-" + node + "-pin-read",
		"gpio-" + node + "-pin-write", "sys-" + node + "-metrics-snapshot", "sys-" + node + "-metrics-subscribe",
		listedName(echo), "web-a-b", "web-get-sum", "web-v1-search", "fleet-call", "fleet-nodes", "okso-find_tools"}
	slices.Sort(safe)
	seed := []string{"ant_send_note", "caller_tool_response", "caller_tools_listen", "gpio." + node + ".pin.read",
		"gpio." + node + ".pin.write", "sys." + node + ".metrics.snapshot", "sys." + node + ".metrics.subscribe",
		echo, "web.a-b", "web.get-sum", "web.v1.search", "fleet.call", "fleet.nodes", "okso.find_tools"}
	slices.Sort(seed)

	byDefault := f.client(f.token(auth.MintOptions{Scopes: mutating}), "")
	got := list(byDefault)
	if !slices.Equal(got, safe) {
		t.Errorf("listed by default:\n%v\nwant\n%v", got, safe)
	}
	for _, name := range got {
		if !schemas.ValidListedName(name) {
			t.Errorf("listed %q, which agent hosts refuse (^[A-Za-z0-9_-]{1,64}$)", name)
		}
	}
	// web.a.b's safe name is web.a-b's, which comes first in the record
	// (sorted): refused, and said.
	if !strings.Contains(f.logs.String(), `"msg":"upstream tools unlisted: a tool was refused"`) ||
		!strings.Contains(f.logs.String(), `its name web-a-b is another tool's`) {
		t.Errorf("the refusal of web.a.b was not logged:\n%s", f.logs.String())
	}

	bySeedClaim := f.client(f.token(auth.MintOptions{Scopes: mutating, ToolNames: auth.ToolNamesSeed}), "")
	if got := list(bySeedClaim); !slices.Equal(got, seed) {
		t.Errorf("listed for a tool_names seed token:\n%v\nwant\n%v", got, seed)
	}
	seedGateway := f.secondGateway(gatewayConfig{ToolNames: auth.ToolNamesSeed})
	bySeedGateway := mcpSession(t, seedGateway.url(), f.token(auth.MintOptions{Scopes: mutating}))
	if got := list(bySeedGateway); !slices.Equal(got, seed) {
		t.Errorf("listed by a --tool-names seed gateway:\n%v\nwant\n%v", got, seed)
	}
	bySafeClaim := mcpSession(t, seedGateway.url(), f.token(auth.MintOptions{Scopes: mutating, ToolNames: auth.ToolNamesSafe}))
	if got := list(bySafeClaim); !slices.Equal(got, safe) {
		t.Errorf("listed for a tool_names safe token by a seed gateway:\n%v\nwant\n%v", got, safe)
	}

	onBus, err := f.nc.SubscribeSync("okso.v1.audit.>")
	if err != nil {
		t.Fatal(err)
	}
	// Either form, by each door: MCP's fast path (the Go SDK's client
	// asks for JSON), MCP through the SDK (a seed gateway with
	// --no-fast-path answers over SSE), and REST.
	sdkDoor := mcpSession(t, f.secondGateway(gatewayConfig{NoFastPath: true}).url(), f.token(auth.MintOptions{Scopes: mutating}))
	calls := []struct{ listed, canonical string }{{listedName(echo), echo}, {"web-v1-search", "web.v1.search"}, {"web-get-sum", "web.get-sum"}}
	for _, c := range calls {
		for _, name := range []string{c.listed, c.canonical} {
			for door, s := range map[string]*sdk.ClientSession{"fast path": byDefault, "SDK": sdkDoor, "seed lister": bySeedClaim} {
				res, err := s.CallTool(t.Context(), &sdk.CallToolParams{Name: name, Arguments: map[string]any{"message": "hi"}})
				if err != nil || res.IsError {
					t.Errorf("%s: call %s: %v %+v", door, name, err, res)
				}
			}
			resp := f.post(t.Context(), f.token(auth.MintOptions{}), "application/json",
				`{"tool":"`+name+`","arguments":{"message":"hi"}}`)
			b, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != 200 || !strings.Contains(string(b), `"hi"`) {
				t.Errorf("REST: call %s: %d %s", name, resp.StatusCode, b)
			}
		}
	}
	// Every allowed call's gateway event names the canonical form.
	want := 3 * 2 * 4 // tools × forms × doors
	for seen := 0; seen < want; {
		m, err := onBus.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("saw %d of %d allowed calls' audit events: %v", seen, want, err)
		}
		var e bus.AuditEvent
		if json.Unmarshal(m.Data, &e) != nil || e.Actor != "gateway" || e.Decision != bus.DecisionAllowed {
			continue
		}
		if !slices.ContainsFunc(calls, func(c struct{ listed, canonical string }) bool { return c.canonical == e.Tool }) {
			t.Errorf("an audit event names the tool %q, not its canonical form", e.Tool)
		}
		seen++
	}
	// The refused tool is callable by neither form.
	for _, name := range []string{"web.a.b"} {
		res, err := byDefault.CallTool(t.Context(), &sdk.CallToolParams{Name: name, Arguments: map[string]any{"message": "hi"}})
		if err == nil || !strings.Contains(err.Error(), "unknown tool") {
			t.Errorf("call of the refused %s: %v %+v, want unknown tool", name, err, res)
		}
	}
}

// TestListMatchesSDKEachRevision: okso answers tools/list from its own
// lists (no SDK server holds its tools); on every revision the answer is
// the one a bare SDK server, introduced as the gateway introduces itself
// and holding the same tools, writes, member by member.
func TestListMatchesSDKEachRevision(t *testing.T) {
	f := startAllInOne(t, 0, nil)
	f.device(DefaultTenant, nil, nil)
	remotes, err := bus.OpenRemotes(t.Context(), f.nc, bus.RemotesOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f.putRemote(remotes, &bus.Remote{Upstream: "up", Transport: "stdio", Tenants: []string{DefaultTenant}, TimeoutMs: 2000,
		Tools: []bus.RemoteTool{{Name: "v1.echo", Title: "Echo", Description: "Echoes.", InputSchema: json.RawMessage(echoInput),
			OutputSchema: json.RawMessage(echoOutput), Safety: schemas.SafetyReadOnly, Idempotent: true}}},
		DefaultTenant, "up.v1.echo", true)
	tok := f.token(auth.MintOptions{Scopes: []string{auth.ScopeMutating}})
	for _, v := range sdk.SupportedProtocolVersions() {
		t.Run(v, func(t *testing.T) {
			hdr := map[string]string{"Mcp-Protocol-Version": v}
			meta := ""
			if v >= "2026-07-28" {
				hdr["Mcp-Method"] = "tools/list"
				meta = `"_meta":{"io.modelcontextprotocol/protocolVersion":"` + v + `","io.modelcontextprotocol/clientCapabilities":{},` +
					`"io.modelcontextprotocol/clientInfo":{"name":"okso-test","version":"1"}}`
			}
			body := `{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{` + meta + `}}`
			got := postMCP(t, f.a.MCPURL(), tok, hdr, body)
			var answer struct {
				Result struct {
					Tools []*sdk.Tool `json:"tools"`
				} `json:"result"`
			}
			if err := json.Unmarshal(got.raw, &answer); err != nil || len(answer.Result.Tools) < 8 {
				t.Fatalf("tools/list: %d %s %v", got.status, got.raw, err)
			}
			srv := sdk.NewServer(&sdk.Implementation{Name: "okso", Title: "okso fleet gateway", Version: Version},
				&sdk.ServerOptions{SetCacheable: func(_ context.Context, _ sdk.Request, c *sdk.Cacheable) {
					c.CacheScope, c.TTLMs = "private", 0
				}})
			for _, tl := range answer.Result.Tools {
				srv.AddTool(tl, func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) { return nil, nil })
			}
			ref := httptest.NewServer(sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return srv },
				&sdk.StreamableHTTPOptions{Stateless: true}))
			defer ref.Close()
			want := postMCP(t, ref.URL, "", hdr, body)
			sameAnswer(t, got, want, true) // the fast path writes the cached page
		})
	}
}

// listedNames is every name a session's tools/list gives (following its
// pages), sorted.
func listedNames(t *testing.T, s *sdk.ClientSession) []string {
	t.Helper()
	var names []string
	for tl, err := range s.Tools(t.Context(), nil) {
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, tl.Name)
	}
	slices.Sort(names)
	return names
}
