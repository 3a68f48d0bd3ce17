package roles

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/okso-io/okso/action"
	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/mcp"
	"github.com/okso-io/okso/remote"
)

// endpointAnswer runs okso endpoint's work on one request.
type endpointAnswer struct {
	Type   string              `json:"type"`
	Tools  []action.Descriptor `json:"tools"`
	Tool   json.RawMessage     `json:"tool"`
	Result json.RawMessage     `json:"result"`
	Error  *action.Error       `json:"error"`
}

func askEndpoint(t *testing.T, url, token, request string) endpointAnswer {
	t.Helper()
	var out bytes.Buffer
	o := remote.EndpointOptions{URL: url, Token: token}
	if err := remote.ServeEndpoint(t.Context(), o, strings.NewReader(request), &out); err != nil {
		t.Fatal(err)
	}
	var a endpointAnswer
	if err := json.Unmarshal(out.Bytes(), &a); err != nil || strings.Count(out.String(), "\n") != 1 {
		t.Fatalf("answer %q is not one JSON object on one line: %v", out.String(), err)
	}
	return a
}

// TestEndpoint: okso endpoint speaks seed 002's action protocol for the
// tools a token may call through the gateway (DESIGN.md §9.2).
func TestEndpoint(t *testing.T) {
	f := startAllInOne(t, 0, nil)
	node := f.device(DefaultTenant, nil, nil)
	url, reader := f.a.MCPURL(), f.token(auth.MintOptions{})
	echo := echoName(node)

	a := askEndpoint(t, url, reader, `{"action":"list_tools"}`)
	var found *action.Descriptor
	for i, d := range a.Tools {
		if d.Name == listedName(echo) {
			found = &a.Tools[i]
		}
	}
	if a.Type != "result" || found == nil {
		t.Fatalf("list_tools = %+v, want %s among the tools", a, echo)
	}
	if found.Origin != "remote" || !strings.HasPrefix(found.Safety, "read_only") || found.Command == "" ||
		!json.Valid(found.InputSchema) || !json.Valid(found.ResultSchema) || found.Description == "" {
		t.Errorf("descriptor %+v", found)
	}
	mixed := strings.Replace(echo, ".echo.", "-echo.", 1) // neither name: no tool
	if a := askEndpoint(t, url, reader, `{"action":"describe_tool","tool":"`+mixed+`"}`); a.Type != "error" {
		t.Errorf("describe_tool %s = %+v, want an error", mixed, a)
	}
	for _, name := range []string{echo, listedName(echo)} { // either form
		a = askEndpoint(t, url, reader, `{"action":"describe_tool","tool":"`+name+`"}`)
		var d action.Descriptor
		if a.Type != "result" || json.Unmarshal(a.Tool, &d) != nil || d.Name != listedName(echo) {
			t.Errorf("describe_tool %s = %+v", name, a)
		}
	}
	a = askEndpoint(t, url, reader, `{"action":"call_tool","tool":"`+echo+`","arguments":{"message":"hi"}}`)
	var res struct {
		Message string `json:"message"`
		NodeID  string `json:"node_id"`
	}
	if a.Type != "result" || string(a.Tool) != `"`+echo+`"` || json.Unmarshal(a.Result, &res) != nil ||
		res.Message != "hi" || res.NodeID != node {
		t.Errorf("call_tool = %+v (%s)", a, a.Result)
	}

	// Errors, each with DESIGN.md §5's category.
	for _, tc := range []struct {
		name, url, token, request, category string
	}{
		{"argument out of bounds", url, reader, `{"action":"call_tool","tool":"` + echo + `","arguments":{"message":"` + strings.Repeat("x", 1025) + `"}}`, "invalid_arguments"},
		{"unknown tool", url, reader, `{"action":"call_tool","tool":"sysecho.` + node + `.nope.invoke","arguments":{}}`, "tool_not_found"},
		{"unknown tool described", url, reader, `{"action":"describe_tool","tool":"nope"}`, "tool_not_found"},
		{"bad token", url, "not-a-token", `{"action":"list_tools"}`, "unauthorized"},
		{"gateway unreachable", "http://127.0.0.1:1/mcp", reader, `{"action":"list_tools"}`, "fatal"},
		// Refused before anything is sent: an unreachable gateway is not
		// what they report.
		{"not JSON", "http://127.0.0.1:1/mcp", reader, `list_tools`, "usage"},
		{"two objects", "http://127.0.0.1:1/mcp", reader, `{"action":"list_tools"} {}`, "usage"},
		{"arguments not an object", "http://127.0.0.1:1/mcp", reader, `{"action":"call_tool","tool":"x","arguments":[1]}`, "usage"},
		{"payload not an object", "http://127.0.0.1:1/mcp", reader, `["list_tools"]`, "usage"},
		{"unknown action", "http://127.0.0.1:1/mcp", reader, `{"action":"delete_tool"}`, "usage"},
		{"no tool", "http://127.0.0.1:1/mcp", reader, `{"action":"call_tool","arguments":{}}`, "usage"},
		{"unknown member", "http://127.0.0.1:1/mcp", reader, `{"action":"list_tools","x":1}`, "usage"},
		{"duplicate key", "http://127.0.0.1:1/mcp", reader, `{"action":"list_tools","action":"call_tool"}`, "usage"},
	} {
		a := askEndpoint(t, tc.url, tc.token, tc.request)
		if a.Type != "error" || a.Error == nil || a.Error.Name != "okso" || a.Error.Category != tc.category || a.Error.Message == "" {
			t.Errorf("%s: %+v (error %+v), want category %s", tc.name, a, a.Error, tc.category)
		}
	}
}

// TestEndpointRoundTrip: seed 002 both ways. okso federates the
// reference endpoint scripts/mcp_echo.sh as ext, and okso endpoint lists
// and calls ext.echo_external through the gateway.
func TestEndpointRoundTrip(t *testing.T) {
	script, err := filepath.Abs(filepath.Join("..", "scripts", "mcp_echo.sh"))
	if err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(t.TempDir(), "remotes.yaml")
	if err := os.WriteFile(config, []byte("upstreams:\n  - name: ext\n    transport: action\n    command: ["+strconv.Quote(script)+
		"]\n    tenants: [demo]\n    allow: [echo_external]\n    safety: {echo_external: read_only}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f := startAllInOne(t, 0, func(c *AllInOneConfig) { c.Remote.Config = config })
	f.waitTool(DefaultTenant, "ext.echo_external", true)
	url, reader := f.a.MCPURL(), f.token(auth.MintOptions{})

	a := askEndpoint(t, url, reader, `{"action":"list_tools"}`)
	// ext's tool, beside okso's own tools (fleet.call, fleet.nodes,
	// okso.find_tools), which every tenant lists.
	var ext []string
	for _, tl := range a.Tools {
		if !strings.HasPrefix(tl.Name, "fleet-") && !strings.HasPrefix(tl.Name, "okso-") {
			ext = append(ext, tl.Name+" "+tl.Safety)
		}
	}
	if len(a.Tools) != 4 || len(ext) != 1 || !strings.HasPrefix(ext[0], "ext-echo_external read_only") {
		t.Fatalf("list_tools = %+v", a)
	}
	// Called by its listed name and by its seed name alike.
	for _, name := range []string{"ext-echo_external", "ext.echo_external"} {
		a = askEndpoint(t, url, reader, `{"action":"call_tool","tool":"`+name+`","arguments":{"message":"round trip"}}`)
		if a.Type != "result" || string(a.Result) != `{"echo":"round trip"}` {
			t.Errorf("call_tool %s = %+v (%s)", name, a, a.Result)
		}
	}
	a = askEndpoint(t, url, reader, `{"action":"call_tool","tool":"ext.echo_external","arguments":{"message":1}}`)
	if a.Type != "error" || a.Error.Category != "invalid_arguments" {
		t.Errorf("a number for message = %+v (%+v), want invalid_arguments", a, a.Error)
	}

	// A tenant the upstream is not configured for neither lists nor calls
	// it: it lists okso's own three tools alone.
	other := f.token(auth.MintOptions{Tenant: "other"})
	if a := askEndpoint(t, url, other, `{"action":"list_tools"}`); a.Type != "result" || len(a.Tools) != 3 ||
		a.Tools[0].Name != listedName(mcp.ToolFleetCall) || a.Tools[1].Name != listedName(mcp.ToolFleetNodes) ||
		a.Tools[2].Name != listedName(mcp.ToolFindTools) {
		t.Errorf("tenant other lists %d tools (%s)", len(a.Tools), a.Type)
	}
	a = askEndpoint(t, url, other, `{"action":"call_tool","tool":"ext.echo_external","arguments":{"message":"x"}}`)
	if a.Type != "error" || a.Error.Category != "unauthorized" {
		t.Errorf("tenant other calls ext.echo_external: %+v (%+v), want unauthorized", a, a.Error)
	}
}
