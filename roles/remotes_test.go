package roles

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/mcp"
	"github.com/okso-io/okso/schemas"
)

// upstreamStand answers an upstream's call subject on NATS as the remote
// tier does (DESIGN.md §9.1): each call is counted, and answered with
// the CallToolResult its tool's function returns.
type upstreamStand struct {
	calls atomic.Int64
	sub   *nats.Subscription
}

func standUpstream(t *testing.T, nc *nats.Conn, upstream string, tools map[string]func(args json.RawMessage) string) *upstreamStand {
	t.Helper()
	s := &upstreamStand{}
	sub, err := nc.QueueSubscribe(bus.RemoteCall(upstream), bus.QueueRemote, func(m *nats.Msg) {
		s.calls.Add(1)
		call, err := bus.DecodeCall(m.Data)
		if err != nil {
			_ = m.Respond(bus.ErrorReply(schemas.CodeBadRequest, "bad call"))
			return
		}
		_, tool, _ := strings.Cut(call.Tool, ".")
		fn := tools[tool]
		if fn == nil {
			_ = m.Respond(bus.ErrorReply(schemas.CodeToolNotFound, "no such tool"))
			return
		}
		_ = m.Respond(bus.OKReply(json.RawMessage(fn(call.Arguments))))
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	s.sub = sub
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return s
}

// putRemote writes an upstream's record as the remote tier would and
// waits until the gateway lists (or, for an empty tool list, unlists) the
// tool named want for tenant.
func (f *fixture) putRemote(r *bus.Remotes, rec *bus.Remote, tenant, want string, listed bool) uint64 {
	f.t.Helper()
	if err := rec.Seal(); err != nil {
		f.t.Fatal(err)
	}
	rev, err := r.Put(f.t.Context(), rec)
	if err != nil {
		f.t.Fatal(err)
	}
	f.waitTool(tenant, want, listed)
	return rev
}

func (f *fixture) waitTool(tenant, name string, listed bool) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(f.t.Context(), 10*time.Second)
	defer cancel()
	gw := f.a.gw.gw
	if err := gw.Wait(ctx, func(map[string]int) bool { return gw.Catalog().Has(tenant, name) == listed }); err != nil {
		f.t.Fatalf("gateway never had tool %s for %s = %v", name, tenant, listed)
	}
}

const (
	echoInput  = `{"type":"object","properties":{"message":{"type":"string","maxLength":16}},"required":["message"],"additionalProperties":false}`
	echoOutput = `{"type":"object","properties":{"echo":{"type":"string"}},"required":["echo"]}`
)

func upstreamEcho(args json.RawMessage) string {
	var a struct{ Message string }
	_ = json.Unmarshal(args, &a)
	b, _ := json.Marshal(map[string]any{
		"content":           []any{map[string]string{"type": "text", "text": a.Message}},
		"structuredContent": map[string]string{"echo": a.Message},
	})
	return string(b)
}

// TestRemoteTools: an upstream's record in okso_remotes makes its allowed
// tools callable through the gateway, by every door, with the gateway's
// checks: tenants, scope, arguments before anything goes on NATS, the
// result against the output schema, and the upstream's own isError
// passed through unchanged.
func TestRemoteTools(t *testing.T) {
	for _, door := range []string{"fast path", "SDK"} {
		t.Run(door, func(t *testing.T) {
			f := startAllInOne(t, 0, func(c *AllInOneConfig) { c.Gateway.NoFastPath = door == "SDK" })
			remotes, err := bus.OpenRemotes(t.Context(), f.nc, bus.RemotesOptions{})
			if err != nil {
				t.Fatal(err)
			}
			stand := standUpstream(t, f.nc, "up", map[string]func(json.RawMessage) string{
				"echo": upstreamEcho,
				"fails": func(json.RawMessage) string {
					return `{"content":[{"type":"text","text":"the upstream says no"}],"isError":true}`
				},
				"liar": func(json.RawMessage) string { return `{"content":[],"structuredContent":{"echo":1}}` },
				"poke": func(json.RawMessage) string { return `{"content":[{"type":"text","text":"poked"}]}` },
			})
			obj := json.RawMessage(`{"type":"object"}`)
			rec := &bus.Remote{Upstream: "up", Transport: "stdio", Tenants: []string{DefaultTenant}, TimeoutMs: 2000,
				Tools: []bus.RemoteTool{
					{Name: "echo", Title: "Echo", Description: "Echoes.", InputSchema: json.RawMessage(echoInput),
						OutputSchema: json.RawMessage(echoOutput), Safety: schemas.SafetyReadOnly, Idempotent: true},
					{Name: "fails", InputSchema: obj, Safety: schemas.SafetyReadOnly},
					{Name: "liar", InputSchema: obj, OutputSchema: json.RawMessage(echoOutput), Safety: schemas.SafetyReadOnly},
					{Name: "poke", InputSchema: obj, Safety: schemas.SafetyMutating},
					{Name: "array", InputSchema: json.RawMessage(`{"type":"array"}`), Safety: schemas.SafetyReadOnly},
					// The SDK's AddTool panics on it: it must not take the gateway down.
					{Name: "header", InputSchema: json.RawMessage(`{"type":"object","properties":{"a":{"type":"array","x-mcp-header":"X"}}}`),
						Safety: schemas.SafetyReadOnly},
					{Name: "unclassed", InputSchema: obj},
					{Name: strings.Repeat("x", 62), InputSchema: obj, Safety: schemas.SafetyReadOnly},
				}}
			f.putRemote(remotes, rec, DefaultTenant, "up.echo", true)

			reader := f.client(f.token(auth.MintOptions{}), "2025-11-25")
			lt, err := reader.ListTools(t.Context(), nil)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, tl := range lt.Tools {
				if strings.HasPrefix(tl.Name, "fleet-") || strings.HasPrefix(tl.Name, "okso-") {
					continue // okso's own, which every tenant lists
				}
				names = append(names, tl.Name)
				if tl.Name == "up-echo" && (tl.Annotations == nil || !tl.Annotations.ReadOnlyHint || tl.OutputSchema == nil) {
					t.Errorf("up.echo listed as %+v", tl)
				}
			}
			slices.Sort(names)
			if want := []string{"up-echo", "up-fails", "up-liar"}; !slices.Equal(names, want) {
				t.Errorf("a read-only token lists %v, want %v (no mutating tool, none that cannot be listed)", names, want)
			}

			res, err := reader.CallTool(t.Context(), &sdk.CallToolParams{Name: "up.echo", Arguments: map[string]any{"message": "hi"}})
			if err != nil {
				t.Fatal(err)
			}
			if res.IsError || res.Meta[mcp.MetaRequestID] == nil {
				t.Fatalf("up.echo = %+v", res)
			}
			if b, _ := json.Marshal(res.StructuredContent); string(b) != `{"echo":"hi"}` {
				t.Errorf("structured content %s", b)
			}
			if txt, ok := res.Content[0].(*sdk.TextContent); !ok || txt.Text != "hi" {
				t.Errorf("content %+v, want the upstream's own", res.Content)
			}
			before := stand.calls.Load()
			for args, wantMsg := range map[string]string{
				`{"message":"far too long a message"}`: "argument message: longer than 16",
				`{}`:                                   "argument message: required",
			} {
				var a map[string]any
				_ = json.Unmarshal([]byte(args), &a)
				res, err := reader.CallTool(t.Context(), &sdk.CallToolParams{Name: "up.echo", Arguments: a})
				if err != nil {
					t.Fatal(err)
				}
				if e := envelope(t, res); e.Code != schemas.CodeManifestInvalid || e.Message != wantMsg {
					t.Errorf("up.echo %s = %+v, want E_MANIFEST_INVALID %q", args, e, wantMsg)
				}
			}
			if n := stand.calls.Load(); n != before {
				t.Errorf("invalid arguments reached the upstream %d times", n-before)
			}

			res, err = reader.CallTool(t.Context(), &sdk.CallToolParams{Name: "up.fails", Arguments: map[string]any{}})
			if err != nil {
				t.Fatal(err)
			}
			if !res.IsError || res.Meta[mcp.MetaError] != nil || len(res.Content) != 1 ||
				res.Content[0].(*sdk.TextContent).Text != "the upstream says no" {
				t.Errorf("up.fails = %+v, want the upstream's isError result unchanged", res)
			}
			res, err = reader.CallTool(t.Context(), &sdk.CallToolParams{Name: "up.liar", Arguments: map[string]any{}})
			if err != nil {
				t.Fatal(err)
			}
			if e := envelope(t, res); e.Code != schemas.CodeInternal {
				t.Errorf("a result failing the output schema = %+v, want E_INTERNAL", e)
			}
			res, err = reader.CallTool(t.Context(), &sdk.CallToolParams{Name: "up.poke", Arguments: map[string]any{}})
			if err != nil {
				t.Fatal(err)
			}
			if e := envelope(t, res); e.Code != schemas.CodeSafetyDenied {
				t.Errorf("a mutating tool with a read-only token = %+v, want E_SAFETY_DENIED", e)
			}
			writer := f.client(f.token(auth.MintOptions{Scopes: []string{auth.ScopeMutating}}), "2025-11-25")
			res, err = writer.CallTool(t.Context(), &sdk.CallToolParams{Name: "up.poke", Arguments: map[string]any{}})
			if err != nil || res.IsError {
				t.Fatalf("up.poke with a mutating token = %+v, %v", res, err)
			}

			// Another tenant neither lists nor calls the tools: it lists
			// okso's own three alone.
			other := f.client(f.token(auth.MintOptions{Tenant: "other"}), "2025-11-25")
			if lt, err := other.ListTools(t.Context(), nil); err != nil || len(lt.Tools) != 3 {
				t.Errorf("tenant other lists %v (%v)", lt, err)
			}
			res, err = other.CallTool(t.Context(), &sdk.CallToolParams{Name: "up.echo", Arguments: map[string]any{"message": "hi"}})
			if err != nil {
				t.Fatal(err)
			}
			if e := envelope(t, res); e.Code != schemas.CodeSafetyDenied {
				t.Errorf("another tenant's call = %+v, want E_SAFETY_DENIED", e)
			}
			// Configured for every tenant, it is every tenant's.
			rec.Tenants = []string{"*"}
			f.putRemote(remotes, rec, "other", "up.echo", true)
			res, err = other.CallTool(t.Context(), &sdk.CallToolParams{Name: "up.echo", Arguments: map[string]any{"message": "hi"}})
			if err != nil || res.IsError {
				t.Fatalf("a \"*\" upstream's tool for tenant other = %+v, %v", res, err)
			}

			// No remote tier serves the upstream: E_NODE_OFFLINE at once.
			if err := stand.sub.Unsubscribe(); err != nil {
				t.Fatal(err)
			}
			// Once flushed, the server has dropped the interest: a call
			// finds no responder rather than one that went away.
			if err := f.nc.Flush(); err != nil {
				t.Fatal(err)
			}
			res, err = reader.CallTool(t.Context(), &sdk.CallToolParams{Name: "up.echo", Arguments: map[string]any{"message": "hi"}})
			if err != nil {
				t.Fatal(err)
			}
			if e := envelope(t, res); e.Code != schemas.CodeNodeOffline {
				t.Errorf("an unserved upstream = %+v, want E_NODE_OFFLINE", e)
			}

			// The record goes: so do its tools.
			rev, err := remotes.Put(t.Context(), rec)
			if err != nil {
				t.Fatal(err)
			}
			if err := remotes.Release(t.Context(), "up", rev); err != nil {
				t.Fatal(err)
			}
			f.waitTool("other", "up.echo", false)
			if _, err := reader.CallTool(t.Context(), &sdk.CallToolParams{Name: "up.echo", Arguments: map[string]any{"message": "hi"}}); err == nil ||
				!strings.Contains(err.Error(), "unknown tool") {
				t.Errorf("a gone upstream's tool: %v, want unknown tool", err)
			}
		})
	}
}

// TestRemoteToolsListChanged: a change of an upstream's tools reaches the
// MCP clients that can hear of it, on every gateway replica: a stateful
// session and a stateless 2026-07-28 one get tools/list_changed when the
// record changes (the remote tier rewrites it on the upstream's own
// list_changed: TestTierFollowsListChanged) and when it goes.
func TestRemoteToolsListChanged(t *testing.T) {
	f := startAllInOne(t, 0, nil)
	second := f.secondGateway(gatewayConfig{Stateful: true})
	remotes, err := bus.OpenRemotes(t.Context(), f.nc, bus.RemotesOptions{})
	if err != nil {
		t.Fatal(err)
	}
	obj := json.RawMessage(`{"type":"object"}`)
	rec := &bus.Remote{Upstream: "up", Transport: "http", Tenants: []string{DefaultTenant}, TimeoutMs: 1000,
		Tools: []bus.RemoteTool{{Name: "one", InputSchema: obj, Safety: schemas.SafetyReadOnly}}}
	f.putRemote(remotes, rec, DefaultTenant, "up.one", true)
	waitSecond := func(name string, listed bool) {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		if err := second.gw.Wait(ctx, func(map[string]int) bool { return second.gw.Catalog().Has(DefaultTenant, name) == listed }); err != nil {
			t.Fatalf("the second gateway never had %s = %v", name, listed)
		}
	}
	waitSecond("up.one", true)
	tok := f.token(auth.MintOptions{})
	clients := map[string]struct {
		s       *sdk.ClientSession
		changed <-chan struct{}
	}{}
	for name, c := range map[string]struct{ url, version string }{
		"stateful 2025-11-25":  {second.url(), "2025-11-25"},
		"stateless 2026-07-28": {f.a.MCPURL(), "2026-07-28"},
	} {
		s, changed := f.listChangedClient(c.url, tok, c.version)
		clients[name] = struct {
			s       *sdk.ClientSession
			changed <-chan struct{}
		}{s, changed}
	}
	expect := func(what, tool string, listed bool) {
		t.Helper()
		for name, c := range clients {
			deadline := time.After(10 * time.Second)
			for {
				select {
				case <-c.changed:
				case <-deadline:
					t.Fatalf("%s: no tools/list_changed that %s", name, what)
				}
				lt, err := c.s.ListTools(t.Context(), nil)
				if err != nil {
					t.Fatal(err)
				}
				if slices.ContainsFunc(lt.Tools, func(tl *sdk.Tool) bool { return tl.Name == listedName(tool) }) == listed {
					break
				}
			}
		}
	}
	rec.Tools = append(rec.Tools, bus.RemoteTool{Name: "two", InputSchema: obj, Safety: schemas.SafetyReadOnly})
	f.putRemote(remotes, rec, DefaultTenant, "up.two", true)
	expect("lists up.two", "up.two", true)
	rev, err := remotes.Put(t.Context(), rec)
	if err != nil {
		t.Fatal(err)
	}
	if err := remotes.Release(t.Context(), "up", rev); err != nil {
		t.Fatal(err)
	}
	expect("drops up.two", "up.two", false)
}
