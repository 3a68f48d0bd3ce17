package interop

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/okso-io/okso/auth"
)

// thermoKindFiles are a kind definition and its schema files, as an
// operator writes them for okso kinds apply.
var thermoKindFiles = map[string]string{
	"thermo.yaml": "name: acme.thermo\nkind_short: thermo\nsafety: mutating\nversion: 1.0.0\nverbs:\n" +
		"  - {name: read, title: Read the temperature, input: read.input.json, output: read.output.json}\n",
	"read.input.json": `{"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "mcp://schemas/acme.thermo.read.input@1.0.0",
 "type": "object", "additionalProperties": false, "properties": {"unit": {"enum": ["C", "F"]}}}`,
	"read.output.json": `{"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "mcp://schemas/acme.thermo.read.output@1.0.0",
 "type": "object", "required": ["node_id", "temperature"], "properties": {"node_id": {"type": "string"}, "temperature": {"type": "number"}}}`,
}

// thermoToolsFile serves acme.thermo's read with a command speaking seed
// 002's action protocol; it leaves each request in RUNS.
const thermoToolsFile = `tools:
  - name: boiler
    kind: acme.thermo
    verbs: [read]
    schema_ref: mcp://schemas/acme.thermo.read.input@1.0.0
    safety: mutating
    command: [sh, -c, 'cat >> "$RUNS"; echo; echo "{\"type\":\"result\",\"result\":{\"temperature\":21.5}}"']
    env: {RUNS: RUNS_FILE}
`

// TestRegisteredKindInClients: a kind applied with okso kinds apply, a
// real okso agent serving it from its tools file, and the official
// TypeScript SDK's client listing its tool (checking the result against
// the registered output schema) and calling it; a bad argument is
// refused by the gateway before the device runs anything.
func TestRegisteredKindInClients(t *testing.T) {
	o := startOkso(t, 0)
	dir := t.TempDir()
	for name, body := range thermoKindFiles {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command(binary, "kinds", "apply", dir, "--nats-url", o.natsURL, "--data-dir", o.dataDir).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "applied acme.thermo.v1") {
		t.Fatalf("okso kinds apply: %v\n%s", err, out)
	}
	// The gateway and the tier each say when they know it: a device that
	// announced it before the tier knew it would be refused for good.
	o.stderr.waitFor(t, "all-in-one learns acme.thermo", 30*time.Second, func(log string) bool {
		return strings.Count(log, "acme.thermo.v1") >= 2
	})

	runs := filepath.Join(t.TempDir(), "runs")
	file := filepath.Join(t.TempDir(), "tools.yaml")
	if err := os.WriteFile(file, []byte(strings.ReplaceAll(thermoToolsFile, "RUNS_FILE", runs)), 0o600); err != nil {
		t.Fatal(err)
	}
	node := startAgent(t, o, file)
	read := "thermo." + node + ".boiler.read"
	writer := o.mint(t, auth.ScopeReadOnly, auth.ScopeMutating)
	tools := o.waitTools(t, writer, listedName(read))
	if in := tools[listedName(read)].InputSchema; in == nil {
		t.Fatalf("%s listed without an input schema", read)
	}

	res := callTools(t, o, writer, false,
		call{listedName(read), map[string]any{"unit": "F"}},
		call{listedName(read), map[string]any{"unit": "K"}})
	var r struct {
		NodeID      string  `json:"node_id"`
		Temperature float64 `json:"temperature"`
	}
	if wantResult(t, "read", res[0], &r) && (r.NodeID != node || r.Temperature != 21.5) {
		t.Errorf("read answered %+v", r)
	}
	wantError(t, "unit K", res[1], "E_MANIFEST_INVALID")
	b, _ := os.ReadFile(runs)
	if n := strings.Count(string(b), "call_tool"); n != 1 {
		t.Errorf("the command ran %d times, want once: %s", n, b)
	}
	if !strings.Contains(string(b), `{"action":"call_tool","tool":"read","arguments":{"unit":"F"}}`) {
		t.Errorf("the command read %q", b)
	}
}
