package roles

import (
	"encoding/json"
	"slices"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device/agent"
	"github.com/okso-io/okso/mcp"
	"github.com/okso-io/okso/schemas"
)

// fleetPage is the part of fleet.nodes' answer the tests read.
type fleetPage struct {
	Nodes []struct {
		NodeID   string            `json:"node_id"`
		Presence string            `json:"presence"`
		Name     string            `json:"name"`
		Labels   map[string]string `json:"labels"`
		Agent    struct {
			Name string `json:"name"`
		} `json:"agent"`
		LastSeen string   `json:"last_seen"`
		Tools    []string `json:"tools"`
	} `json:"nodes"`
	Total      int    `json:"total"`
	NextCursor string `json:"next_cursor"`
}

// ids are the page's node ids.
func (p fleetPage) ids() []string {
	var ids []string
	for _, n := range p.Nodes {
		ids = append(ids, n.NodeID)
	}
	return ids
}

// callFleet calls a fleet tool by its listed name and decodes its
// structured result into out; it fails the test on an error result.
func callFleet(t *testing.T, s *sdk.ClientSession, canonical string, args map[string]any, out any) {
	t.Helper()
	res, err := s.CallTool(t.Context(), &sdk.CallToolParams{Name: listedName(canonical), Arguments: args})
	if err != nil {
		t.Fatalf("%s %v: %v", canonical, args, err)
	}
	if res.IsError {
		e := envelope(t, res)
		t.Fatalf("%s %v: %s %s", canonical, args, e.Code, e.Message)
	}
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("%s: structured content %s: %v", canonical, b, err)
	}
	if txt, ok := res.Content[0].(*sdk.TextContent); !ok || !json.Valid([]byte(txt.Text)) {
		t.Errorf("%s: text content %v is not the JSON result", canonical, res.Content[0])
	}
}

// TestFleetNodes: fleet.nodes finds the nodes of the caller's tenant by
// each filter, names and labels included, from the gateway's memory;
// a page is continued on another replica; nodes that left are listed
// offline; another tenant sees only its own; a bad argument answers
// E_MANIFEST_INVALID.
func TestFleetNodes(t *testing.T) {
	const mocks = 12 // mock-0…mock-11, labels fleet=mock and zone=a|b|c
	f := startAllInOne(t, mocks, nil)
	host, _ := f.connectDevice(DefaultTenant, func(_ string, o *agent.Options) {
		o.Name, o.Labels = "kitchen-pi", map[string]string{"zone": "b", "site": "lyon"}
		o.Agent.Name = "okso-agent"
		o.Capabilities = o.Capabilities[:1] // echo alone
	})
	gone, stop := f.connectDevice(DefaultTenant, nil)
	theirs, _ := f.connectDevice("other", nil)
	stop()
	replica := f.secondGateway(gatewayConfig{})
	for _, gw := range []*mcp.Gateway{f.a.gw.gw, replica.gw} {
		waitGateway(t, gw, "the fleet", func() bool {
			return gw.Devices().Offline(gone) && gw.Devices().Listed(host) && gw.Devices().Listed(theirs) && !gw.Devices().Listed(gone)
		})
	}
	s := f.clientAt(f.a.MCPURL(), f.token(auth.MintOptions{}))

	var all fleetPage
	callFleet(t, s, mcp.ToolFleetNodes, nil, &all)
	if all.Total != mocks+1 || len(all.Nodes) != mocks+1 || !slices.IsSorted(all.ids()) || slices.Contains(all.ids(), gone) {
		t.Fatalf("every online node: %d of total %d, %v", len(all.Nodes), all.Total, all.ids())
	}
	for _, n := range all.Nodes {
		if n.Presence != "online" || len(n.Tools) == 0 || n.Agent.Name == "" {
			t.Errorf("node %+v", n)
		}
		for _, tool := range n.Tools {
			if !schemas.ValidListedName(tool) {
				t.Errorf("node %s: tool %s not in the safe form", n.NodeID, tool)
			}
		}
	}

	for _, c := range []struct {
		name  string
		args  map[string]any
		count int
		check func(p fleetPage) bool
	}{
		{"a label", map[string]any{"labels": map[string]any{"zone": "b"}}, 4 + 1, nil}, // mock-1, -4, -7, -10 and kitchen-pi
		{"two labels", map[string]any{"labels": map[string]any{"zone": "b", "fleet": "mock"}}, 4, nil},
		{"a name", map[string]any{"name": "kitchen-pi"}, 1, func(p fleetPage) bool {
			return p.Nodes[0].NodeID == host && p.Nodes[0].Labels["site"] == "lyon" && len(p.Nodes[0].Tools) == 1 &&
				p.Nodes[0].Tools[0] == listedName(echoName(host))
		}},
		{"a mock's name", map[string]any{"name": "mock-3"}, 1, func(p fleetPage) bool { return p.Nodes[0].Name == "mock-3" }},
		{"an agent", map[string]any{"agent": "okso-agent"}, 1, func(p fleetPage) bool { return p.Nodes[0].NodeID == host }},
		{"a kind", map[string]any{"kind": schemas.KindGPIO}, mocks, nil},
		{"a kind and a verb", map[string]any{"kind": schemas.KindEcho, "verb": "invoke"}, mocks + 1, nil},
		{"a prefix and ids", map[string]any{"node_ids": []string{host, gone, theirs}, "node_id_prefix": host[:10]}, 1, nil},
		{"offline", map[string]any{"presence": "offline"}, 1, func(p fleetPage) bool {
			return p.Nodes[0].NodeID == gone && p.Nodes[0].Presence == "offline" && p.Nodes[0].LastSeen != ""
		}},
		{"any", map[string]any{"presence": "any"}, mocks + 2, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			var p fleetPage
			callFleet(t, s, mcp.ToolFleetNodes, c.args, &p)
			if p.Total != c.count || len(p.Nodes) != c.count || c.check != nil && !c.check(p) {
				t.Errorf("%d nodes of total %d, want %d: %+v", len(p.Nodes), p.Total, c.count, p.Nodes)
			}
		})
	}

	t.Run("a page continued on another replica", func(t *testing.T) {
		var first, rest fleetPage
		callFleet(t, s, mcp.ToolFleetNodes, map[string]any{"limit": 5}, &first)
		if len(first.Nodes) != 5 || first.NextCursor != first.Nodes[4].NodeID || first.Total != mocks+1 {
			t.Fatalf("first page: %v, cursor %q, total %d", first.ids(), first.NextCursor, first.Total)
		}
		other := f.clientAt(replica.url(), f.token(auth.MintOptions{}))
		callFleet(t, other, mcp.ToolFleetNodes, map[string]any{"limit": 1000, "cursor": first.NextCursor}, &rest)
		if got := append(first.ids(), rest.ids()...); !slices.Equal(got, all.ids()) || rest.NextCursor != "" {
			t.Errorf("pages %v then %v (cursor %q), want %v", first.ids(), rest.ids(), rest.NextCursor, all.ids())
		}
	})

	t.Run("tenant isolation", func(t *testing.T) {
		var p fleetPage
		callFleet(t, f.clientAt(replica.url(), f.token(auth.MintOptions{Tenant: "other"})), mcp.ToolFleetNodes,
			map[string]any{"presence": "any"}, &p)
		if p.Total != 1 || p.Nodes[0].NodeID != theirs {
			t.Errorf("tenant other sees %v", p.ids())
		}
	})

	t.Run("a bad argument", func(t *testing.T) {
		for _, args := range []map[string]any{{"limit": 0}, {"limit": 1001}, {"presence": "gone"}, {"labels": map[string]any{"zone": 1}}} {
			res, err := s.CallTool(t.Context(), &sdk.CallToolParams{Name: listedName(mcp.ToolFleetNodes), Arguments: args})
			if err != nil {
				t.Fatal(err)
			}
			if e := envelope(t, res); e.Code != schemas.CodeManifestInvalid {
				t.Errorf("%v: %s %s, want E_MANIFEST_INVALID", args, e.Code, e.Message)
			}
		}
	})
}

// findPage is the part of okso.find_tools' answer the tests read.
type findPage struct {
	Tools []struct {
		Name        string         `json:"name"`
		Source      string         `json:"source"`
		Description string         `json:"description"`
		InputSchema map[string]any `json:"inputSchema"`
		Template    *struct {
			Pattern string `json:"pattern"`
			Nodes   int    `json:"nodes"`
			Via     string `json:"via"`
		} `json:"template"`
	} `json:"tools"`
	Total      int    `json:"total"`
	NextCursor string `json:"next_cursor"`
}

// TestFindTools: okso.find_tools groups the same tool of N nodes into
// one hit, finds a tool by a word of its description, searches every
// source of the caller's view, and never another tenant's tools.
func TestFindTools(t *testing.T) {
	const mocks = 6
	f := startAllInOne(t, mocks, nil)
	theirs, _ := f.connectDevice("other", nil)
	s := f.clientAt(f.a.MCPURL(), f.token(auth.MintOptions{}))

	var echo findPage
	callFleet(t, s, mcp.ToolFindTools, map[string]any{"query": "echo", "source": "device"}, &echo)
	if echo.Total != 1 || len(echo.Tools) != 1 {
		t.Fatalf("echo: %+v", echo)
	}
	if h := echo.Tools[0]; h.Template == nil || h.Template.Pattern != "sysecho-*-echo-invoke" || h.Template.Nodes != mocks ||
		h.Template.Via != "fleet-call" || h.InputSchema["type"] != "object" {
		t.Errorf("echo template: %+v %+v", h, h.Template)
	}

	var byWord findPage // "message" is in the echo tool's description alone
	callFleet(t, s, mcp.ToolFindTools, map[string]any{"query": "MESSAGE"}, &byWord)
	if len(byWord.Tools) == 0 || byWord.Tools[0].Template == nil || byWord.Tools[0].Template.Pattern != "sysecho-*-echo-invoke" {
		t.Errorf("by a word of its description: %+v", byWord.Tools)
	}

	// A federated upstream's tool, by a word of its description alone.
	remotes, err := bus.OpenRemotes(t.Context(), f.nc, bus.RemotesOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f.putRemote(remotes, &bus.Remote{Upstream: "web", Transport: "stdio", Tenants: []string{DefaultTenant}, TimeoutMs: 2000,
		Tools: []bus.RemoteTool{{Name: "lookup", Description: "Finds the timetable of a zeppelin line.",
			InputSchema: json.RawMessage(echoInput), Safety: schemas.SafetyReadOnly}}}, DefaultTenant, "web.lookup", true)
	var upstream findPage
	callFleet(t, s, mcp.ToolFindTools, map[string]any{"query": "Zeppelin"}, &upstream)
	if len(upstream.Tools) != 1 || upstream.Tools[0].Name != "web-lookup" || upstream.Tools[0].Source != "upstream" ||
		upstream.Tools[0].Template != nil {
		t.Errorf("a federated tool by a word of its description: %+v", upstream.Tools)
	}

	var own findPage
	callFleet(t, s, mcp.ToolFindTools, map[string]any{"source": "okso"}, &own)
	var names []string
	for _, h := range own.Tools {
		names = append(names, h.Name)
	}
	if !slices.Contains(names, "fleet-nodes") || !slices.Contains(names, "okso-find_tools") {
		t.Errorf("okso's own tools: %v", names)
	}

	var other findPage
	callFleet(t, f.clientAt(f.a.MCPURL(), f.token(auth.MintOptions{Tenant: "other"})), mcp.ToolFindTools,
		map[string]any{"query": "echo", "source": "device"}, &other)
	if len(other.Tools) != 1 || other.Tools[0].Template.Nodes != 1 || other.Tools[0].Name != listedName(echoName(theirs)) {
		t.Errorf("tenant other: %+v", other.Tools)
	}
}
