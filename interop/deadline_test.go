package interop

import "testing"

// TestDeadlineExceeded runs a gateway whose budget for a call is 1 ns: it
// runs out before any device can answer, and the TypeScript client reads
// E_DEADLINE_EXCEEDED as a result.
func TestDeadlineExceeded(t *testing.T) {
	o := startOkso(t, 1, "--budget", "1ns")
	out := callTools(t, o, o.token, false, call{echoTool(o.nodes[0]), map[string]any{"message": "late"}})
	wantError(t, "echo within 1 ns", out[0], "E_DEADLINE_EXCEEDED")
}
