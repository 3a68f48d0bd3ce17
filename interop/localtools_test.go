package interop

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/device/wire"
)

// localToolsFile is a device's own tools, real commands reading their
// query from TOOL_QUERY.
const localToolsFile = `tools:
  - name: hello
    description: Says hello to the query.
    command: [sh, -c, 'printf "hello %s" "$TOOL_QUERY"']
    safety: read_only
  - name: restart
    description: Restarts the camera daemon.
    command: [sh, -c, 'echo restarted']
    safety: mutating
`

// startAgent runs `okso agent --tools file` as an operator does, on o's
// tier with a device token minted for a node of its own, until the test
// ends (SIGTERM, which it must obey), and returns the node id.
func startAgent(t *testing.T, o *okso, file string) string {
	t.Helper()
	node := wire.NewNodeID()
	devTok, err := exec.Command(binary, "token", "mint", "--device", "--node-id", node, "--data-dir", o.dataDir,
		"--tenant", tenant).Output()
	if err != nil {
		t.Fatalf("mint a device token: %v %s", err, stderrOf(err))
	}
	log := &tailBuffer{}
	cmd := exec.Command(binary, "agent", "--connect", o.deviceURL, "--token", strings.TrimSpace(string(devTok)),
		"--tools", file, "--data-dir", t.TempDir())
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		t.Fatalf("start okso agent: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("okso agent exited with %v on SIGTERM; its log ends:\n%s", err, log)
			}
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("okso agent did not stop within 20 s of SIGTERM")
		}
	})
	return node
}

// TestLocalToolsInClients: an `okso agent --tools` process, as an
// operator runs one, serves its own tools; the official TypeScript SDK's
// clients, v1 and v2 in each of its modes, list them (checking each
// result against its output schema) and call them: the query comes back,
// 4097 characters are refused by the gateway, and a read-only token may
// not run the mutating one.
func TestLocalToolsInClients(t *testing.T) {
	o := startOkso(t, 0)
	file := filepath.Join(t.TempDir(), "tools.yaml")
	if err := os.WriteFile(file, []byte(localToolsFile), 0o600); err != nil {
		t.Fatal(err)
	}
	node := startAgent(t, o, file)
	hello, restart := "local."+node+".hello.run", "local."+node+".restart.run"
	writer := o.mint(t, auth.ScopeReadOnly, auth.ScopeMutating)
	o.waitTools(t, writer, listedName(hello), listedName(restart))
	// And three simulated devices with the same tools (mock-fleet --tools).
	startFleet(t, o, 3, "--tools", file)

	t.Run("fleet.call over the agent and the mock devices", func(t *testing.T) {
		var run struct {
			Summary struct {
				Targeted int `json:"targeted"`
				OK       int `json:"ok"`
			} `json:"summary"`
		}
		hellos := 0
		o.waitUntilListed(t, o.token, func(tools map[string]*sdk.Tool) bool {
			hellos = 0
			for name := range tools {
				if strings.HasPrefix(name, "local-") && strings.HasSuffix(name, "-hello-run") {
					hellos++
				}
			}
			return hellos == 4
		}, func() string { return fmt.Sprintf("4 hello tools (%d)", hellos) })
		out := callTools(t, o, o.token, false, call{"fleet-call", map[string]any{"kind": "local.tool", "cap_id": "hello",
			"verb": "run", "arguments": map[string]any{"query": "fleet"}}})
		if wantResult(t, "fleet-call", out[0], &run) && (run.Summary.OK != 4 || run.Summary.Targeted != 4) {
			t.Errorf("fleet-call answered %+v, want 4 nodes ok", run)
		}
	})

	t.Run("v1", func(t *testing.T) {
		out := callTools(t, o, o.token, false,
			call{listedName(hello), map[string]any{"query": `"quoted" & 'more'`}},
			call{listedName(hello), map[string]any{"query": strings.Repeat("q", 4097)}},
			call{listedName(restart), nil})
		var r struct {
			NodeID   string `json:"node_id"`
			Stdout   string `json:"stdout"`
			ExitCode int    `json:"exit_code"`
		}
		if wantResult(t, "hello", out[0], &r) && (r.Stdout != `hello "quoted" & 'more'` || r.NodeID != node || r.ExitCode != 0) {
			t.Errorf("hello answered %+v", r)
		}
		wantError(t, "a 4097-character query", out[1], "E_MANIFEST_INVALID")
		wantError(t, "restart with a read-only token", out[2], "E_SAFETY_DENIED")
		out = callTools(t, o, writer, false, call{listedName(restart), nil})
		if wantResult(t, "restart", out[0], &r) && r.Stdout != "restarted\n" {
			t.Errorf("restart answered %+v", r)
		}
	})

	for _, m := range []v2Mode{
		{name: "legacy", negotiation: nil, version: "2025-11-25"},
		{name: "pinned 2026-07-28", negotiation: map[string]string{"pin": "2026-07-28"}, version: "2026-07-28", modern: true},
	} {
		t.Run("v2 "+m.name, func(t *testing.T) {
			p, _ := startV2(t, m, clientEnv(o.mcpURL, o.token), map[string]any{"scenario": "calls", "calls": []call{
				{hello, map[string]any{"query": "v2"}},
				{listedName(hello), map[string]any{"query": strings.Repeat("q", 4097)}},
			}})
			var l v2Line
			p.next(time.Minute, &l)
			p.finish()
			if len(l.Outcomes) != 2 {
				t.Fatalf("v2.mjs printed %d outcomes for 2 calls", len(l.Outcomes))
			}
			var r struct {
				Stdout string `json:"stdout"`
			}
			if wantResult(t, "hello", l.Outcomes[0], &r) && r.Stdout != "hello v2" {
				t.Errorf("hello answered %+v", r)
			}
			wantError(t, "a 4097-character query", l.Outcomes[1], "E_MANIFEST_INVALID")
		})
	}
}
