package roles

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device/agent"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/schemas"
)

// thermoKind is a kind definition and its schema files, as an operator
// writes them for okso kinds apply.
var thermoKind = map[string]string{
	"thermo.yaml": `name: acme.thermo
kind_short: thermo
safety: mutating
version: 1.0.0
verbs:
  - name: read
    title: Read the temperature
    input: read.input.json
    output: read.output.json
`,
	"read.input.json": `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "$id": "mcp://schemas/acme.thermo.read.input@1.0.0",
  "type": "object",
  "additionalProperties": false,
  "properties": {"unit": {"enum": ["C", "F"], "description": "Celsius or Fahrenheit"}}
}`,
	"read.output.json": `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "$id": "mcp://schemas/acme.thermo.read.output@1.0.0",
  "type": "object",
  "required": ["node_id", "temperature"],
  "properties": {"node_id": {"type": "string"}, "temperature": {"type": "number"}}
}`,
}

// writeKindDir writes files to a new directory, each edited by the
// replacer's pairs.
func writeKindDir(t *testing.T, files map[string]string, oldnew ...string) string {
	t.Helper()
	dir := t.TempDir()
	r := strings.NewReplacer(oldnew...)
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(r.Replace(body)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// thermoTools is a tools file whose boiler answers acme.thermo's read:
// sh reads the request on stdin, leaves it in RUNS, and answers.
const thermoTools = `tools:
  - name: boiler
    kind: acme.thermo
    verbs: [read]
    schema_ref: mcp://schemas/acme.thermo.read.input@1.0.0
    safety: mutating
    command: [sh, -c, 'cat >> "$RUNS"; echo; echo "{\"type\":\"result\",\"result\":{\"temperature\":21.5}}"']
    env: {RUNS: RUNS_FILE}
`

// TestRegisteredKinds: okso kinds apply registers a kind (the same
// content again does nothing, other content and a built-in kind are
// refused); a device announces it and is served through the gateway,
// which lists its tool with the registered schemas, serves them at
// /schemas/, and refuses a bad argument before the device; a device
// that announces a kind nobody registered is refused with 4400.
func TestRegisteredKinds(t *testing.T) {
	var dataDir string
	f := startAllInOne(t, 0, func(c *AllInOneConfig) { c.NATSListen, dataDir = "127.0.0.1:0", c.DataDir })
	apply := func(dir string) (string, error) {
		return oksoOut(t, "kinds", "apply", dir, "--nats-url", f.a.NATSURL(), "--data-dir", dataDir)
	}
	dir := writeKindDir(t, thermoKind)
	if out, err := apply(dir); err != nil || !strings.Contains(out, "applied acme.thermo.v1 (version 1.0.0)") {
		t.Fatalf("okso kinds apply: %q, %v", out, err)
	}
	t.Run("apply again", func(t *testing.T) {
		if out, err := apply(writeKindDir(t, thermoKind, `"description": "Celsius or Fahrenheit"`, `"description":"Celsius or Fahrenheit"`)); err != nil || !strings.Contains(out, "unchanged acme.thermo.v1") {
			t.Errorf("the same content again: %q, %v", out, err)
		}
		if _, err := apply(writeKindDir(t, thermoKind, `"F"]`, `"F", "K"]`)); err == nil || !strings.Contains(err.Error(), "applied already with other content") {
			t.Errorf("other schemas under the same major: %v", err)
		}
		builtin := writeKindDir(t, thermoKind, "acme.thermo", "system.echo")
		if _, err := apply(builtin); err == nil || !strings.Contains(err.Error(), "built in") {
			t.Errorf("a built-in kind: %v", err)
		}
		if _, err := apply(writeKindDir(t, thermoKind, "safety: mutating", "safety: harmless")); err == nil ||
			!strings.Contains(err.Error(), `thermo.yaml:3: safety: "harmless" is not one of read_only, mutating, destructive, any`) {
			t.Errorf("a bad definition: %v", err)
		}
		if _, err := apply(writeKindDir(t, thermoKind, `"required": ["node_id", "temperature"]`, `"required": ["temperature"]`)); err == nil ||
			!strings.Contains(err.Error(), "read.output.json: verb read output schema: must require node_id") {
			t.Errorf("an output schema without node_id: %v", err)
		}
		if out, err := oksoOut(t, "kinds", "list", "--nats-url", f.a.NATSURL(), "--data-dir", dataDir); err != nil ||
			!strings.Contains(out, "acme.thermo.v1 version 1.0.0: kind_short thermo, safety mutating") || !strings.Contains(out, "1 registered kinds") {
			t.Errorf("okso kinds list: %q, %v", out, err)
		}
	})

	f.waitKind(t, "acme.thermo")
	runs := filepath.Join(t.TempDir(), "runs")
	tools, err := agent.ParseTools([]byte(strings.ReplaceAll(thermoTools, "RUNS_FILE", runs)), "tools.yaml")
	if err != nil {
		t.Fatal(err)
	}
	node, _ := f.connectDevice(DefaultTenant, func(_ string, o *agent.Options) {
		if *o, err = agent.WithLocalTools(*o, tools); err != nil {
			t.Fatal(err)
		}
	})
	read := "thermo." + node + ".boiler.read"
	writer := f.client(f.token(auth.MintOptions{Scopes: []string{auth.ScopeMutating}}), "")
	ranTimes := func() int {
		b, _ := os.ReadFile(runs)
		return bytes.Count(b, []byte("call_tool"))
	}

	t.Run("listed with its registered schemas", func(t *testing.T) {
		res, err := writer.ListTools(t.Context(), nil)
		if err != nil {
			t.Fatal(err)
		}
		var got *sdk.Tool
		for _, tl := range res.Tools {
			if tl.Name == listedName(read) {
				got = tl
			}
		}
		if got == nil {
			t.Fatalf("%s not listed", listedName(read))
		}
		in, _ := json.Marshal(got.InputSchema)
		out, _ := json.Marshal(got.OutputSchema)
		if !strings.Contains(string(in), `"$id":"mcp://schemas/acme.thermo.read.input@1.0.0"`) || !strings.Contains(string(in), `"Celsius or Fahrenheit"`) ||
			!strings.Contains(string(out), `"$id":"mcp://schemas/acme.thermo.read.output@1.0.0"`) {
			t.Errorf("listed with input %s, output %s", in, out)
		}
		if got.Annotations == nil || got.Annotations.ReadOnlyHint || got.Title != "Read the temperature (node "+node+")" {
			t.Errorf("listed as %q, %+v", got.Title, got.Annotations)
		}
	})

	t.Run("called", func(t *testing.T) {
		res, err := writer.CallTool(t.Context(), &sdk.CallToolParams{Name: listedName(read), Arguments: map[string]any{"unit": "C"}})
		if err != nil || res.IsError {
			t.Fatalf("%v %+v", err, res)
		}
		b, _ := json.Marshal(res.StructuredContent)
		if string(b) != `{"node_id":"`+node+`","temperature":21.5}` {
			t.Errorf("result %s", b)
		}
		req, _ := os.ReadFile(runs)
		if !strings.Contains(string(req), `{"action":"call_tool","tool":"read","arguments":{"unit":"C"}}`) {
			t.Errorf("the command read %q", req)
		}
	})

	t.Run("a bad argument is refused before the device", func(t *testing.T) {
		before := ranTimes()
		res, err := writer.CallTool(t.Context(), &sdk.CallToolParams{Name: listedName(read), Arguments: map[string]any{"unit": "K"}})
		if err != nil {
			t.Fatal(err)
		}
		if e := envelope(t, res); e.Code != schemas.CodeManifestInvalid {
			t.Errorf("%+v, want %s", e, schemas.CodeManifestInvalid)
		}
		if n := ranTimes(); n != before {
			t.Errorf("the command ran %d times", n-before)
		}
	})

	t.Run("its class gates it", func(t *testing.T) {
		reader := f.client(f.token(auth.MintOptions{}), "")
		res, err := reader.CallTool(t.Context(), &sdk.CallToolParams{Name: listedName(read), Arguments: map[string]any{}})
		if err != nil {
			t.Fatal(err)
		}
		if e := envelope(t, res); e.Code != schemas.CodeSafetyDenied && e.Code != schemas.CodeToolNotFound {
			t.Errorf("%+v, want a refusal", e)
		}
	})

	t.Run("its schemas are served", func(t *testing.T) {
		url := strings.TrimSuffix(f.a.MCPURL(), "/mcp") + "/schemas/acme.thermo.read.output@1.0.0"
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"required":["node_id","temperature"]`) {
			t.Errorf("GET %s: %s %s", url, resp.Status, body)
		}
	})

	t.Run("an unregistered kind is refused with 4400", func(t *testing.T) {
		audit, err := f.nc.SubscribeSync(bus.Audit(DefaultTenant))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = audit.Unsubscribe() }()
		if err := f.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		other := tools[0]
		other.Kind, other.SchemaRef = "acme.other", "mcp://schemas/acme.other.read.input@1.0.0"
		refused := f.refusedDevice(t, func(o *agent.Options) {
			if *o, err = agent.WithLocalTools(*o, []agent.LocalTool{other}); err != nil {
				t.Fatal(err)
			}
		})
		deadline := time.After(10 * time.Second)
		for {
			msg, err := audit.NextMsg(10 * time.Second)
			if err != nil {
				t.Fatalf("no audit event of node %s refused: %v", refused, err)
			}
			var e bus.AuditEvent
			if json.Unmarshal(msg.Data, &e) == nil && e.NodeID == refused && e.Decision == bus.DecisionProtocol {
				if e.Code != "4400" {
					t.Errorf("node %s closed with %s, want 4400", refused, e.Code)
				}
				break
			}
			select {
			case <-deadline:
				t.Fatalf("node %s never refused", refused)
			default:
			}
		}
		if f.a.gw.gw.Devices().Listed(refused) {
			t.Errorf("node %s listed", refused)
		}
	})
}

// refusedDevice starts a device as connectDevice does, without waiting
// for the gateway to list it, and returns its node id.
func (f *fixture) refusedDevice(t *testing.T, edit func(o *agent.Options)) string {
	t.Helper()
	id := wire.NewNodeID()
	tok, err := f.a.Signer().Mint(auth.MintOptions{Subject: id, Tenant: DefaultTenant,
		Scopes: []string{auth.ScopeDeviceConnect}, Audience: auth.AudienceDevice})
	if err != nil {
		t.Fatal(err)
	}
	o := agent.MockOptions(id, f.a.c.schemas, 1)
	o.URLs, o.Token, o.TLS = []string{f.a.DeviceURL()}, tok, f.a.tier.ownTLS()
	edit(&o)
	d, err := agent.New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return id
}

// waitKind waits until the all-in-one's gateway and tier know a kind.
func (f *fixture) waitKind(t *testing.T, kind string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	known := func(kt *schemas.KindTable) bool { _, ok := kt.Lookup(kind); return ok }
	if err := f.a.tier.table.wait(ctx, known); err != nil {
		t.Fatalf("the tier never learnt kind %s: %v", kind, err)
	}
	if err := f.a.gw.gw.Wait(ctx, func(map[string]int) bool { return known(f.a.gw.gw.Kinds()) }); err != nil {
		t.Fatalf("the gateway never learnt kind %s: %v", kind, err)
	}
}

// TestSplitKinds: in split mode (a device tier exposing its embedded
// NATS, gateways and a mock fleet joined to it, each a process), the
// admin's okso kinds apply reaches every role: two gateway replicas, and
// one restarted, list a registered kind's tool with its schemas, and a
// mock device serves it from --tools.
func TestSplitKinds(t *testing.T) {
	bin := oksoBinary(t)
	data := t.TempDir()
	tier := startProc(t, bin, "device", "device", "--data-dir", data, "--device-addr", "127.0.0.1:0",
		"--nats-listen", "127.0.0.1:0")
	l := tier.wait(msgIs("listening"))
	natsURL, _ := l["nats_url"].(string)
	deviceURL, _ := l["device_url"].(string)
	startGW := func(name string) (*proc, string) {
		gw := startProc(t, bin, name, "gateway", "--data-dir", data, "--mcp-addr", "127.0.0.1:0", "--nats-url", natsURL, "--log-level", "debug")
		url, _ := gw.wait(msgIs("listening"))["mcp_url"].(string)
		return gw, url
	}
	gw1, url1 := startGW("gateway-1")
	gw2, url2 := startGW("gateway-2")

	out, err := exec.Command(bin, "kinds", "apply", writeKindDir(t, thermoKind), "--nats-url", natsURL, "--data-dir", data).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "applied acme.thermo.v1") {
		t.Fatalf("okso kinds apply: %v\n%s", err, out)
	}
	hasThermo := func(m map[string]any) bool {
		kinds, _ := m["kinds"].([]any)
		return m["msg"] == "registered kinds" && len(kinds) == 1 && kinds[0] == "acme.thermo.v1"
	}
	for _, p := range []*proc{tier, gw1, gw2} {
		p.wait(hasThermo)
	}

	tools := filepath.Join(t.TempDir(), "tools.yaml")
	file := strings.ReplaceAll(thermoTools, `cat >> "$RUNS"; echo;`, `cat > /dev/null;`)
	if err := os.WriteFile(tools, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	fleet := startProc(t, bin, "mock-fleet", "mock-fleet", "-n", "1", "--connect", deviceURL, "--data-dir", data, "--tools", tools)
	fleet.wait(msgIs("mock devices connected"))
	gw1.wait(msgIs("node online"))
	gw2.wait(msgIs("node online"))

	tok, err := exec.Command(bin, "token", "mint", "--data-dir", data, "--scope", auth.ScopeMutating).Output()
	if err != nil {
		t.Fatalf("okso token mint: %v", err)
	}
	token := strings.TrimSpace(string(tok))
	check := func(name, url string) {
		t.Helper()
		s := mcpSession(t, url, token)
		list, err := s.ListTools(t.Context(), nil)
		if err != nil {
			t.Fatal(err)
		}
		var read *sdk.Tool
		for _, tl := range list.Tools {
			if strings.HasPrefix(tl.Name, "thermo-") && strings.HasSuffix(tl.Name, "-boiler-read") {
				read = tl
			}
		}
		if read == nil {
			t.Fatalf("%s does not list the registered kind's tool", name)
		}
		if in, _ := json.Marshal(read.InputSchema); !strings.Contains(string(in), "acme.thermo.read.input@1.0.0") {
			t.Errorf("%s lists it with input %s", name, in)
		}
		res, err := s.CallTool(t.Context(), &sdk.CallToolParams{Name: read.Name, Arguments: map[string]any{"unit": "F"}})
		if err != nil || res.IsError {
			t.Fatalf("%s: call %s: %v %+v", name, read.Name, err, res)
		}
		b, _ := json.Marshal(res.StructuredContent)
		if string(b) != `{"node_id":"`+nodeOf(read)+`","temperature":21.5}` {
			t.Errorf("%s: result %s", name, b)
		}
	}
	check("gateway-1", url1)
	check("gateway-2", url2)

	gw1.stop()
	gw3, url3 := startGW("gateway-1 restarted")
	gw3.wait(hasThermo)
	check("the restarted gateway", url3)

	fleet.stop()
	gw2.stop()
	gw3.stop()
	tier.stop()
}
