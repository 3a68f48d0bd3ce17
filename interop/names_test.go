package interop

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/mcp"
	"github.com/okso-io/okso/schemas"
)

// TestToolNamesInClients: the official TypeScript SDK's client and the
// Inspector's CLI list okso's tools by names every agent host accepts
// (^[A-Za-z0-9_-]{1,64}$), list them by seed 000's dotted names for a
// token minted with --tool-names seed, and call a tool by the name they
// were given (the SDK's client by either name, whichever form it was
// given; the Inspector calls only what it lists).
func TestToolNamesInClients(t *testing.T) {
	o := startOkso(t, 2)
	seedToken := o.mintWith(t, []string{"--tool-names", auth.ToolNamesSeed}, auth.ScopeReadOnly)
	safe := readOnlyToolsOf(o.nodes)
	seed := []string{mcp.ToolFleetCall, mcp.ToolFleetNodes, mcp.ToolFindTools}
	for _, n := range o.nodes {
		seed = append(seed, echoTool(n), snapshotTool(n), subscribeTool(n), pinReadTool(n))
	}
	slices.Sort(seed)
	node := o.nodes[0]

	t.Run("TypeScript SDK", func(t *testing.T) {
		t.Parallel()
		for _, c := range []struct {
			token string
			want  []string
		}{{o.token, safe}, {seedToken, seed}} {
			var l listed
			runScript(t, clientEnv(o.mcpURL, c.token), &l, "list.mjs")
			if got := slices.Sorted(slices.Values(l.names())); !slices.Equal(got, c.want) {
				t.Errorf("lists %v, want %v", got, c.want)
			}
		}
		for _, name := range safe {
			if !schemas.ValidListedName(name) {
				t.Errorf("%q is no name agent hosts accept", name)
			}
		}
		for _, token := range []string{o.token, seedToken} {
			out := callTools(t, o, token, false,
				call{listedName(echoTool(node)), map[string]any{"message": "safe"}},
				call{echoTool(node), map[string]any{"message": "seed"}})
			for i, want := range []string{"safe", "seed"} {
				var echo struct {
					Message string `json:"message"`
				}
				if wantResult(t, "echo by its "+want+" name", out[i], &echo) && echo.Message != want {
					t.Errorf("echo by its %s name answered %q", want, echo.Message)
				}
			}
		}
	})

	t.Run("Inspector", func(t *testing.T) {
		t.Parallel()
		inspect := func(token string, method ...string) string {
			t.Helper()
			args := append([]string{"--cli", o.mcpURL, "--transport", "http", "--header", "Authorization: Bearer " + token}, method...)
			out, errOut, err := runNode(t, nil, "inspector", args...)
			if err != nil {
				t.Fatalf("inspector %v: %v\n%s", method, err, errOut)
			}
			return string(out)
		}
		for _, c := range []struct {
			token string
			want  []string
		}{{o.token, safe}, {seedToken, seed}} {
			var l listed
			if err := json.Unmarshal([]byte(inspect(c.token, "--method", "tools/list")), &l); err != nil {
				t.Fatal(err)
			}
			if got := slices.Sorted(slices.Values(l.names())); !slices.Equal(got, c.want) {
				t.Errorf("the Inspector lists %v, want %v", got, c.want)
			}
		}
		// The Inspector calls only a tool it finds in the list: each
		// token by the form it lists.
		for _, c := range []struct{ token, name string }{
			{o.token, listedName(echoTool(node))}, {seedToken, echoTool(node)},
		} {
			var r callResult
			if err := json.Unmarshal([]byte(inspect(c.token, "--method", "tools/call", "--tool-name", c.name, "--tool-arg", "message=ping")), &r); err != nil {
				t.Fatal(err)
			}
			var echo struct {
				NodeID string `json:"node_id"`
			}
			if wantResult(t, "echo by "+c.name, outcome{Result: &r}, &echo) && echo.NodeID != node {
				t.Errorf("echo by %s answered from %s", c.name, echo.NodeID)
			}
		}
	})
}

// TestLeanListInClients: for a token minted with okso token mint
// --no-node-tools, the official TypeScript SDK's client lists okso's own
// tools and no per-node tool, and still calls a per-node tool by either
// of its names.
func TestLeanListInClients(t *testing.T) {
	o := startOkso(t, 2)
	lean := o.mintWith(t, []string{"--no-node-tools"}, auth.ScopeReadOnly)
	var l listed
	runScript(t, clientEnv(o.mcpURL, lean), &l, "list.mjs")
	if got, want := slices.Sorted(slices.Values(l.names())), oksoTools(); !slices.Equal(got, want) {
		t.Errorf("lists %v for a --no-node-tools token, want %v", got, want)
	}
	// The same gateway lists them all for a token without the claim.
	var full listed
	runScript(t, clientEnv(o.mcpURL, o.token), &full, "list.mjs")
	if got, want := slices.Sorted(slices.Values(full.names())), readOnlyToolsOf(o.nodes); !slices.Equal(got, want) {
		t.Errorf("lists %v for a plain token, want %v", got, want)
	}
	node := o.nodes[0]
	out := callTools(t, o, lean, false,
		call{listedName(echoTool(node)), map[string]any{"message": "safe"}},
		call{echoTool(node), map[string]any{"message": "seed"}})
	for i, want := range []string{"safe", "seed"} {
		var echo struct {
			Message string `json:"message"`
		}
		if wantResult(t, "unlisted echo by its "+want+" name", out[i], &echo) && echo.Message != want {
			t.Errorf("unlisted echo by its %s name answered %q", want, echo.Message)
		}
	}
}
