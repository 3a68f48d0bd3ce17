package interop

import (
	"encoding/json"
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"
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
		var want []string
		for _, n := range o.nodes {
			want = append(want, readOnlyTools(n)...)
		}
		slices.Sort(want)
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
