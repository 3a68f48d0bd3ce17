package interop

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// inspectorToolError is the exit code of the Inspector's CLI for a tool
// that returned isError (EXIT_CODES.TOOL_ERROR in its source).
const inspectorToolError = 5

// TestInspectorCLI runs the MCP Inspector's CLI against okso exactly as
// the README tells a user to: --cli URL --transport http --header
// "Authorization: Bearer T" --method ...
func TestInspectorCLI(t *testing.T) {
	o := startOkso(t, 2)
	inspector := func(t *testing.T, method ...string) (stdout, stderr string, code int) {
		t.Helper()
		args := append([]string{"--cli", o.mcpURL, "--transport", "http",
			"--header", "Authorization: Bearer " + o.token}, method...)
		out, errOut, err := runNode(t, nil, "inspector", args...)
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			code = ee.ExitCode()
		case err != nil:
			t.Fatalf("inspector %s: %v\n%s", strings.Join(method, " "), err, errOut)
		}
		return string(out), string(errOut), code
	}
	node := o.nodes[0]

	t.Run("tools/list", func(t *testing.T) {
		t.Parallel()
		out, errOut, code := inspector(t, "--method", "tools/list")
		if code != 0 {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
		}
		var l listed
		if err := json.Unmarshal([]byte(out), &l); err != nil {
			t.Fatalf("stdout is not the list (%v):\n%s", err, out)
		}
		want := readOnlyToolsOf(o.nodes)
		if got := slices.Sorted(slices.Values(l.names())); !slices.Equal(got, want) {
			t.Errorf("the Inspector lists %v, want %v", got, want)
		}
	})

	t.Run("tools/call", func(t *testing.T) {
		t.Parallel()
		out, errOut, code := inspector(t, "--method", "tools/call", "--tool-name", listedName(echoTool(node)), "--tool-arg", "message=ping")
		if code != 0 {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
		}
		var r callResult
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("stdout is not the result (%v):\n%s", err, out)
		}
		var echo struct {
			Message string `json:"message"`
			NodeID  string `json:"node_id"`
		}
		if wantResult(t, "echo", outcome{Result: &r}, &echo) && (echo.Message != "ping" || echo.NodeID != node) {
			t.Errorf("echo answered %+v, want ping from %s", echo, node)
		}
	})

	// The README says the Inspector, which asks for Node >= 22.19, lists
	// and calls all the same on an older Node (npx only warns): run it as
	// npx does, with the machine's own node, whichever it is.
	t.Run("tools/call on the machine's Node", func(t *testing.T) {
		t.Parallel()
		nodeBin, err := exec.LookPath("node")
		if err != nil {
			t.Fatalf("no node on PATH: %v", err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		version, err := exec.CommandContext(ctx, nodeBin, "--version").Output()
		if err != nil {
			t.Fatalf("node --version: %v", err)
		}
		cmd := exec.CommandContext(ctx, nodeBin, filepath.Join(nodeModules(t), ".bin", "inspector"), "--cli", o.mcpURL,
			"--transport", "http", "--header", "Authorization: Bearer "+o.token,
			"--method", "tools/call", "--tool-name", listedName(echoTool(node)), "--tool-arg", "message=ping")
		cmd.Env = append(os.Environ(), "HOME="+t.TempDir(), "NO_COLOR=1")
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		if err := cmd.Run(); err != nil {
			t.Fatalf("the Inspector on node %s: %v\nstdout:\n%s\nstderr:\n%s", bytes.TrimSpace(version), err, &out, &errOut)
		}
		var r callResult
		if err := json.Unmarshal(out.Bytes(), &r); err != nil {
			t.Fatalf("stdout is not the result (%v):\n%s", err, &out)
		}
		var echo struct {
			Message string `json:"message"`
		}
		if wantResult(t, "echo on node "+string(bytes.TrimSpace(version)), outcome{Result: &r}, &echo) && echo.Message != "ping" {
			t.Errorf("echo answered %q, want ping", echo.Message)
		}
	})

	t.Run("tools/call with a bad argument", func(t *testing.T) {
		t.Parallel()
		out, errOut, code := inspector(t, "--method", "tools/call", "--tool-name", listedName(echoTool(node)),
			"--tool-arg", "message=x", "zzz_secret=1")
		if !strings.Contains(out+errOut, "E_MANIFEST_INVALID") {
			t.Errorf("the Inspector's output does not show E_MANIFEST_INVALID (exit %d)\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
		}
		if code != inspectorToolError {
			t.Errorf("exit %d, want %d (the tool returned isError)\nstderr:\n%s", code, inspectorToolError, errOut)
		}
		var r callResult
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("stdout is not the result (%v):\n%s", err, out)
		}
		wantError(t, "echo with an undeclared argument", outcome{Result: &r}, "E_MANIFEST_INVALID")
	})
}
