package roles

import (
	"bytes"
	"encoding/json"
	"io"
	"slices"
	"strings"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/pflag"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/mcp"
	"github.com/okso-io/okso/schemas"
)

// TestLeanLists: a token minted with node_tools false lists no per-node
// tool but okso's own, an upstream's and a caller's; each per-node tool
// stays callable by either name on every door (fast path, SDK, REST),
// and fleet.nodes and okso.find_tools still see every node and tool. A
// gateway with --node-tools=false makes every list lean by itself, and a
// token's node_tools true wins over it.
func TestLeanLists(t *testing.T) {
	f := startAllInOne(t, 0, nil)
	node := f.device(DefaultTenant, nil, nil)
	remotes, err := bus.OpenRemotes(t.Context(), f.nc, bus.RemotesOptions{})
	if err != nil {
		t.Fatal(err)
	}
	standUpstream(t, f.nc, "web", map[string]func(json.RawMessage) string{"search": upstreamEcho})
	rec := &bus.Remote{Upstream: "web", Transport: "stdio", Tenants: []string{DefaultTenant}, TimeoutMs: 2000,
		Tools: []bus.RemoteTool{{Name: "search", InputSchema: json.RawMessage(echoInput), Safety: schemas.SafetyReadOnly}}}
	f.putRemote(remotes, rec, DefaultTenant, "web-search", true)
	mutating := []string{auth.ScopeMutating}
	f.listen(f.a.MCPURL(), f.token(auth.MintOptions{Subject: "caller", Scopes: mutating}),
		`{"caller_id":"ant","tools":[{"name":"send_note","inputSchema":{"type":"object"}}]}`)
	f.waitTool(DefaultTenant, "ant_send_note", true)

	no, yes := false, true
	lean := f.token(auth.MintOptions{Scopes: mutating, NodeTools: &no})
	full := f.token(auth.MintOptions{Scopes: mutating})
	echo := echoName(node)
	perNode := []string{"gpio-" + node + "-pin-read", "gpio-" + node + "-pin-write", "sys-" + node + "-metrics-snapshot",
		"sys-" + node + "-metrics-subscribe", listedName(echo)}
	leanWant := []string{"ant_send_note", "caller_tool_response", "caller_tools_listen",
		listedName(mcp.ToolFleetCall), listedName(mcp.ToolFleetNodes), listedName(mcp.ToolFindTools), "web-search"}
	slices.Sort(leanWant)
	fullWant := slices.Sorted(slices.Values(append(slices.Clone(leanWant), perNode...)))
	list := func(s *sdk.ClientSession) []string { return listedNames(t, s) }

	leanSession := f.client(lean, "")
	if got := list(leanSession); !slices.Equal(got, leanWant) {
		t.Errorf("listed for a node_tools false token:\n%v\nwant\n%v", got, leanWant)
	}
	if got := list(f.client(full, "")); !slices.Equal(got, fullWant) {
		t.Errorf("listed for a token without the claim:\n%v\nwant\n%v", got, fullWant)
	}

	// Callable by either name, by every door: MCP's fast path, MCP
	// through the SDK (a gateway with --no-fast-path), REST.
	sdkDoor := mcpSession(t, f.secondGateway(gatewayConfig{NoFastPath: true}).url(), lean)
	for _, name := range []string{echo, listedName(echo)} {
		for door, s := range map[string]*sdk.ClientSession{"fast path": leanSession, "SDK": sdkDoor} {
			res, err := s.CallTool(t.Context(), &sdk.CallToolParams{Name: name, Arguments: map[string]any{"message": "hi"}})
			if err != nil || res.IsError {
				t.Errorf("%s: call %s with a lean token: %v %+v", door, name, err, res)
			}
		}
		resp := f.post(t.Context(), lean, "application/json", `{"tool":"`+name+`","arguments":{"message":"hi"}}`)
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), `"hi"`) {
			t.Errorf("REST: call %s with a lean token: %d %s", name, resp.StatusCode, b)
		}
	}

	// The fleet tools see what a lean list leaves out.
	var nodes fleetPage
	callFleet(t, leanSession, mcp.ToolFleetNodes, map[string]any{"node_ids": []string{node}}, &nodes)
	if len(nodes.Nodes) != 1 || !slices.Contains(nodes.Nodes[0].Tools, listedName(echo)) {
		t.Errorf("fleet.nodes for a lean token: %+v", nodes.Nodes)
	}
	var found struct {
		Tools []struct {
			Name   string `json:"name"`
			Source string `json:"source"`
		} `json:"tools"`
	}
	callFleet(t, leanSession, mcp.ToolFindTools, map[string]any{"source": "device"}, &found)
	if len(found.Tools) == 0 {
		t.Error("okso.find_tools finds no device tool for a lean token")
	}
	if run, e := fanOut(t, leanSession, map[string]any{"tool": "sysecho-*-echo-invoke", "arguments": map[string]any{"message": "lean"}}); e != nil ||
		run.Summary.OK != 1 || run.codes()[node] != "ok" {
		t.Errorf("fleet.call for a lean token: %+v %v", run, e)
	}

	// The gateway's flag alone, and a claim that wins over it.
	leanGateway := f.secondGateway(gatewayConfig{NoNodeTools: true})
	if got := list(mcpSession(t, leanGateway.url(), full)); !slices.Equal(got, leanWant) {
		t.Errorf("listed by a --node-tools=false gateway:\n%v\nwant\n%v", got, leanWant)
	}
	if got := list(mcpSession(t, leanGateway.url(), f.token(auth.MintOptions{Scopes: mutating, NodeTools: &yes}))); !slices.Equal(got, fullWant) {
		t.Errorf("listed for a node_tools true token by a --node-tools=false gateway:\n%v\nwant\n%v", got, fullWant)
	}
}

// TestNodeToolsFlags: --node-tools is true by default and takes false;
// okso token mint --no-node-tools mints the claim node_tools false, and
// only in an agent token.
func TestNodeToolsFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		lean bool
	}{{nil, false}, {[]string{"--node-tools"}, false}, {[]string{"--node-tools=true"}, false}, {[]string{"--node-tools=false"}, true}} {
		var cfg gatewayConfig
		fs := pflag.NewFlagSet("gateway", pflag.ContinueOnError)
		addGatewayFlags(fs, &cfg)
		if err := fs.Parse(c.args); err != nil || cfg.NoNodeTools != c.lean {
			t.Errorf("%v: NoNodeTools %v, %v; want %v", c.args, cfg.NoNodeTools, err, c.lean)
		}
	}
	var cfg gatewayConfig
	fs := pflag.NewFlagSet("gateway", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	addGatewayFlags(fs, &cfg)
	if err := fs.Parse([]string{"--node-tools=some"}); err == nil {
		t.Error("--node-tools=some accepted")
	}

	dir := t.TempDir()
	mint := func(args ...string) (*auth.Claims, error) {
		var out bytes.Buffer
		root := NewRoot(&out, io.Discard)
		root.SetArgs(append([]string{"token", "mint", "--data-dir", dir}, args...))
		if err := root.Execute(); err != nil {
			return nil, err
		}
		return auth.UnverifiedClaims(strings.TrimSpace(out.String()))
	}
	if c, err := mint("--no-node-tools"); err != nil || c.NodeTools == nil || *c.NodeTools {
		t.Errorf("--no-node-tools minted %+v, %v; want node_tools false", c, err)
	}
	if c, err := mint(); err != nil || c.NodeTools != nil {
		t.Errorf("a plain mint: %+v, %v; want no node_tools claim", c, err)
	}
	if _, err := mint("--no-node-tools", "--device", "--node-id", "01hzx9k3m4p7q8r9s0t1v2w3xy"); err == nil ||
		!strings.Contains(err.Error(), "--no-node-tools is an agent token's") {
		t.Errorf("--no-node-tools on a device token: %v", err)
	}
}
