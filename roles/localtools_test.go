package roles

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/action"
	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/device/agent"
	"github.com/okso-io/okso/mcp"
	"github.com/okso-io/okso/schemas"
)

// localTools is a tools file of real commands: sh, reading the query
// from TOOL_QUERY (inside double quotes a shell expands a variable once
// and never runs what it holds). Each run of hello and restart leaves a
// line in RUNS.
const localTools = `tools:
  - name: hello
    description: Says hello to the query.
    command: [sh, -c, 'echo run >> "$RUNS"; printf "hello %s" "$TOOL_QUERY"']
    safety: read_only
    env: {RUNS: RUNS_FILE}
  - name: restart
    description: Restarts the camera daemon.
    command: [sh, -c, 'echo run >> "$RUNS"; echo restarted']
    safety: mutating
    env: {RUNS: RUNS_FILE}
  - name: slow
    description: Takes longer than the gateway's budget.
    command: [sh, -c, 'sleep 1.5; echo done']
    safety: read_only
    timeout: 4s
`

// TestLocalTools: devices' own tools through the whole system and the Go
// SDK client: listed with their operator's words quoted, called with
// their query, refused by the gateway past 4096 characters before any
// device runs them, gated by their class, given their own timeout past
// the gateway's budget, and fanned out with fleet.call, whose budget
// grows to the tool's timeout too.
func TestLocalTools(t *testing.T) {
	runs := filepath.Join(t.TempDir(), "runs")
	file := strings.ReplaceAll(localTools, "RUNS_FILE", runs)
	tools, err := agent.ParseTools([]byte(file), "tools.yaml")
	if err != nil {
		t.Fatal(err)
	}
	f := startAllInOne(t, 0, func(c *AllInOneConfig) { c.Gateway.Budget, c.Gateway.FleetBudget = time.Second, time.Second })
	nodes := make([]string, 3)
	for i := range nodes {
		nodes[i], _ = f.connectDevice(DefaultTenant, func(_ string, o *agent.Options) {
			if *o, err = agent.WithLocalTools(*o, tools); err != nil {
				t.Fatal(err)
			}
		})
	}
	reader := f.client(f.token(auth.MintOptions{}), "")
	writer := f.client(f.token(auth.MintOptions{Scopes: []string{auth.ScopeReadOnly, auth.ScopeMutating}}), "")
	ranTimes := func() int {
		b, _ := os.ReadFile(runs)
		return bytes.Count(b, []byte("run"))
	}
	hello := "local." + nodes[0] + ".hello.run"

	t.Run("listed", func(t *testing.T) {
		res, err := reader.ListTools(t.Context(), nil)
		if err != nil {
			t.Fatal(err)
		}
		var got *sdk.Tool
		for _, tl := range res.Tools {
			if tl.Name == listedName(hello) {
				got = tl
			}
		}
		if got == nil {
			t.Fatalf("%s not listed", listedName(hello))
		}
		if !strings.Contains(got.Description, "«Says hello to the query.»") || got.Annotations == nil || !got.Annotations.ReadOnlyHint {
			t.Errorf("listed as %q, %+v", got.Description, got.Annotations)
		}
	})

	t.Run("called with its query", func(t *testing.T) {
		res, err := reader.CallTool(t.Context(), &sdk.CallToolParams{Name: listedName(hello),
			Arguments: map[string]any{"query": `"you" & me`}})
		if err != nil || res.IsError {
			t.Fatalf("%v %+v", err, res)
		}
		b, _ := json.Marshal(res.StructuredContent)
		var r agent.LocalResult
		if err := json.Unmarshal(b, &r); err != nil || r != (agent.LocalResult{NodeID: nodes[0], Stdout: `hello "you" & me`}) {
			t.Errorf("result %s", b)
		}
	})

	t.Run("a query too long is refused before the device", func(t *testing.T) {
		before := ranTimes()
		res, err := reader.CallTool(t.Context(), &sdk.CallToolParams{Name: listedName(hello),
			Arguments: map[string]any{"query": strings.Repeat("q", 4097)}})
		if err != nil || !res.IsError {
			t.Fatalf("%v %+v", err, res)
		}
		if e := envelope(t, res); e.Code != schemas.CodeManifestInvalid {
			t.Errorf("%+v, want %s", e, schemas.CodeManifestInvalid)
		}
		if n := ranTimes(); n != before {
			t.Errorf("the tool ran %d times", n-before)
		}
	})

	t.Run("its class gates it", func(t *testing.T) {
		restart := listedName("local." + nodes[1] + ".restart.run")
		before := ranTimes()
		res, err := reader.CallTool(t.Context(), &sdk.CallToolParams{Name: restart})
		if err != nil || !res.IsError || envelope(t, res).Code != schemas.CodeSafetyDenied {
			t.Fatalf("a read-only token ran a mutating tool: %v %+v", err, res)
		}
		if n := ranTimes(); n != before {
			t.Errorf("the tool ran %d times", n-before)
		}
		if res, err := writer.CallTool(t.Context(), &sdk.CallToolParams{Name: restart}); err != nil || res.IsError {
			t.Errorf("the writer: %v %+v", err, res)
		}
	})

	t.Run("its own timeout, past the gateway's budget", func(t *testing.T) {
		res, err := reader.CallTool(t.Context(), &sdk.CallToolParams{Name: listedName("local." + nodes[2] + ".slow.run")})
		if err != nil || res.IsError {
			t.Fatalf("a 1.5 s tool with a 4 s timeout, behind a 1 s budget: %v %+v", err, res)
		}
	})

	t.Run("fleet.call", func(t *testing.T) {
		run, e := fanOut(t, reader, map[string]any{"kind": schemas.KindLocal, "cap_id": "hello", "verb": "run",
			"arguments": map[string]any{"query": "fleet"}})
		if e != nil || run.Summary.OK != len(nodes) {
			t.Fatalf("%+v %v", run.Summary, e)
		}
		// A 1.5 s tool with a 4 s timeout on each node, behind a 1 s fleet budget.
		if run, e := fanOut(t, reader, map[string]any{"tool": "local-*-slow-run"}); e != nil || run.Summary.OK != len(nodes) {
			t.Errorf("slow on every node: %+v %v %v", run.Summary, e, run.errors())
		}
		if _, e := fanOut(t, writer, map[string]any{"tool": "local-*-restart-run"}); e == nil || e.Code != schemas.CodeSafetyDenied {
			t.Errorf("a mutating fan-out without a plan: %+v", e)
		}
		found, err := writer.CallTool(t.Context(), &sdk.CallToolParams{Name: listedName(mcp.ToolFindTools),
			Arguments: map[string]any{"query": "camera"}})
		if err != nil || found.IsError {
			t.Fatalf("%v %+v", err, found)
		}
		b, _ := json.Marshal(found.StructuredContent)
		if !strings.Contains(string(b), "local-*-restart-run") || !strings.Contains(string(b), "Restarts the camera daemon.") {
			t.Errorf("find_tools camera: %s", b)
		}
	})
}

// TestToolsFlags: okso agent --tools --describe prints the descriptors
// and exits; a bad tools file stops okso agent and mock-fleet at start,
// naming its line.
func TestToolsFlags(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "tools.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(good, []byte(strings.ReplaceAll(localTools, "RUNS_FILE", "/dev/null")), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("tools:\n  - name: x\n    description: d\n    command: [ls]\n    safety: harmless\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	exec := func(out, errOut *syncBuffer, args ...string) error {
		root := NewRoot(out, errOut)
		root.SetArgs(args)
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		return root.ExecuteContext(ctx)
	}
	var out, errOut syncBuffer
	if err := exec(&out, &errOut, "agent", "--tools", good, "--describe"); err != nil {
		t.Fatalf("--describe: %v (%s)", err, errOut.String())
	}
	var ds []action.Descriptor
	if err := json.Unmarshal([]byte(out.String()), &ds); err != nil || len(ds) != 3 {
		t.Fatalf("--describe printed %s (%v)", out.String(), err)
	}
	if d := ds[0]; d.Name != "hello" || d.Origin != "local" || !strings.HasPrefix(d.Command, "sh -c 'echo run") ||
		!strings.HasPrefix(d.Safety, "read_only") || !strings.Contains(string(d.InputSchema), `"query"`) {
		t.Errorf("descriptor %+v", d)
	}
	const want = `bad.yaml:5: tools[0].safety: "harmless" is not one of read_only, mutating, destructive`
	for _, args := range [][]string{
		{"agent", "--tools", bad, "--connect", "ws://127.0.0.1:1/v1/device/ws", "--data-dir", dir},
		{"mock-fleet", "-n", "1", "--tools", bad, "--connect", "ws://127.0.0.1:1/v1/device/ws", "--data-dir", dir},
		{"agent", "--tools", bad, "--describe"},
	} {
		var out, errOut syncBuffer
		err := exec(&out, &errOut, args...)
		if err == nil || !strings.Contains(err.Error()+errOut.String(), want) {
			t.Errorf("okso %s: %v, stderr %s; want %s", strings.Join(args, " "), err, errOut.String(), want)
		}
	}
}
