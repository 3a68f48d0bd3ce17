package schemas_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/okso-io/okso/schemas"
)

// Agent hosts send a tool's inputSchema to model APIs, and those refuse
// composition at its top level: Anthropic refuses oneOf, allOf and anyOf
// there; OpenAI's function calling refuses oneOf, anyOf, allOf, enum and
// not there and wants type object with properties; Gemini handles $ref
// and allOf poorly; and hosts that render a tool's arguments list only
// its top-level properties. So every tool input schema okso embeds is
// host-safe:
//
//   - its top level has only the keywords of hostTop: type "object",
//     properties, additionalProperties false, an optional required that
//     names declared properties, and words ($schema, $id, title,
//     description, $comment);
//   - nowhere in it a reference ($ref, $dynamicRef, $defs) or a rule
//     that combines schemas or members (hostRefused): a rule no flat form
//     says is told in a description and enforced by the gateway.
//
// A nested alternative that no flat form can say would be the one
// exception worth arguing for here; there is none today.

// hostTop are the keywords a host-safe input schema may have at its top level.
const hostTop = "$schema $id $comment title description type properties required additionalProperties"

// hostRefused are the keywords a host-safe input schema has nowhere.
const hostRefused = "$ref $dynamicRef $defs definitions allOf anyOf oneOf not if then else " +
	"dependentRequired dependentSchemas dependencies unevaluatedProperties unevaluatedItems"

// hostProblems says why the input schema doc is not host-safe; nil if it is.
func hostProblems(doc any) []string {
	root, ok := doc.(map[string]any)
	if !ok {
		return []string{"not an object schema"}
	}
	var out []string
	for _, k := range slices.Sorted(maps.Keys(root)) {
		if !slices.Contains(strings.Fields(hostTop), k) && !slices.Contains(strings.Fields(hostRefused), k) {
			out = append(out, "top level: "+k)
		}
	}
	if root["type"] != "object" {
		out = append(out, fmt.Sprintf("top level: type %v, want object", root["type"]))
	}
	props, ok := root["properties"].(map[string]any)
	if !ok {
		out = append(out, "top level: no properties")
	}
	if root["additionalProperties"] != false {
		out = append(out, fmt.Sprintf("top level: additionalProperties %v, want false", root["additionalProperties"]))
	}
	if req, ok := root["required"]; ok {
		names, _ := req.([]any)
		for _, n := range names {
			if s, _ := n.(string); props[s] == nil {
				out = append(out, fmt.Sprintf("top level: required %v is not a property", n))
			}
		}
	}
	walkSchema(root, "", func(at, k string) {
		if slices.Contains(strings.Fields(hostRefused), k) {
			out = append(out, at+"/"+k)
		}
	})
	return out
}

// walkSchema calls f with every keyword of the schema v and of its
// subschemas, and where it is (a JSON pointer); never with the names of
// properties, nor with what enum, const, default or examples hold.
func walkSchema(v any, at string, f func(at, keyword string)) {
	m, ok := v.(map[string]any)
	if !ok {
		return // true, false
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		f(at, k)
		switch x := m[k]; k {
		case "properties", "patternProperties", "dependentSchemas", "$defs", "definitions":
			subs, _ := x.(map[string]any)
			for _, name := range slices.Sorted(maps.Keys(subs)) {
				walkSchema(subs[name], at+"/"+k+"/"+name, f)
			}
		case "allOf", "anyOf", "oneOf", "prefixItems":
			subs, _ := x.([]any)
			for i, sub := range subs {
				walkSchema(sub, fmt.Sprintf("%s/%s/%d", at, k, i), f)
			}
		case "items", "additionalProperties", "unevaluatedProperties", "propertyNames", "contains",
			"not", "if", "then", "else", "unevaluatedItems", "additionalItems", "contentSchema":
			walkSchema(x, at+"/"+k, f)
		}
	}
}

// toolSchemas returns the names of the embedded tool input schemas
// (<tool>.input@<version>) and output schemas (.output@, and a stream's
// .frame@), and checks that every verb of the kind table and every fleet
// tool is among them, so that the naming rule leaves no tool out.
func toolSchemas(t *testing.T) (inputs, outputs []string) {
	t.Helper()
	for _, name := range embeddedNames(t) {
		switch {
		case strings.Contains(name, ".input@"):
			inputs = append(inputs, schemas.IDPrefix+name)
		case strings.Contains(name, ".output@"), strings.Contains(name, ".frame@"):
			outputs = append(outputs, schemas.IDPrefix+name)
		}
	}
	wantIn := []string{schemas.FleetNodesInput, schemas.FleetCallInput, schemas.FindToolsInput}
	wantOut := []string{schemas.FleetNodesOutput, schemas.FleetCallOutput, schemas.FindToolsOutput}
	for _, name := range []string{schemas.KindEcho, schemas.KindMetrics, schemas.KindGPIO} {
		k, ok := schemas.LookupKind(name)
		if !ok {
			t.Fatalf("LookupKind(%s): not found", name)
		}
		for _, v := range k.Verbs {
			wantIn = append(wantIn, v.Input)
			wantOut = append(wantOut, v.Output)
			if v.Result != "" {
				wantOut = append(wantOut, v.Result)
			}
		}
	}
	for _, id := range wantIn {
		if !slices.Contains(inputs, id) {
			t.Errorf("tool input schema %s is not named <tool>.input@<version>", id)
		}
	}
	for _, id := range wantOut {
		if !slices.Contains(outputs, id) {
			t.Errorf("tool output schema %s is not named <tool>.output@ or .frame@<version>", id)
		}
	}
	return inputs, outputs
}

// TestHostSafe: every tool input schema of the embedded set, as a file
// and in the standalone form a tool carries, is host-safe; every tool
// output schema has type object at its top level (MCP's rule, and the
// TypeScript SDK's), and a top-level oneOf or anyOf only of objects.
func TestHostSafe(t *testing.T) {
	s := load(t)
	inputs, outputs := toolSchemas(t)
	for _, id := range inputs {
		file, _ := s.Raw(id)
		alone, _ := s.Standalone(id)
		for form, b := range map[string][]byte{"file": file, "standalone form": alone} {
			var doc any
			if err := json.Unmarshal(b, &doc); err != nil {
				t.Fatalf("%s %s: %v", id, form, err)
			}
			if p := hostProblems(doc); p != nil {
				t.Errorf("%s %s: not host-safe: %s", id, form, strings.Join(p, "; "))
			}
		}
	}
	for _, id := range outputs {
		alone, _ := s.Standalone(id)
		var doc map[string]any
		if err := json.Unmarshal(alone, &doc); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		if doc["type"] != "object" {
			t.Errorf("%s: top-level type %v, want object", id, doc["type"])
		}
		for _, k := range []string{"$ref", "allOf", "not", "if"} {
			if _, ok := doc[k]; ok {
				t.Errorf("%s: top-level %s", id, k)
			}
		}
		for _, k := range []string{"oneOf", "anyOf"} {
			branches, _ := doc[k].([]any)
			for i, b := range branches {
				if m, _ := b.(map[string]any); m["type"] != "object" {
					t.Errorf("%s: top-level %s/%d is not an object schema", id, k, i)
				}
			}
		}
	}
}

// TestHostProblems: the check refuses what model APIs and hosts refuse,
// so a new input schema that breaks the rule fails TestHostSafe.
func TestHostProblems(t *testing.T) {
	for _, c := range []struct {
		name, doc string
		want      string // a problem it must name; "" for none
	}{
		{"flat", `{"type":"object","additionalProperties":false,"required":["a"],"properties":{"a":{"type":"string"},"not":{"enum":["oneOf"]}}}`, ""},
		{"empty", `{"type":"object","additionalProperties":false,"properties":{}}`, ""},
		{"top oneOf", `{"type":"object","additionalProperties":false,"properties":{"a":{}},"oneOf":[{"required":["a"]}]}`, "/oneOf"},
		{"top anyOf", `{"type":"object","additionalProperties":false,"properties":{},"anyOf":[{}]}`, "/anyOf"},
		{"top allOf", `{"type":"object","additionalProperties":false,"properties":{},"allOf":[{}]}`, "/allOf"},
		{"top enum", `{"type":"object","additionalProperties":false,"properties":{},"enum":[{}]}`, "top level: enum"},
		{"top not", `{"type":"object","additionalProperties":false,"properties":{},"not":{}}`, "/not"},
		{"top if", `{"type":"object","additionalProperties":false,"properties":{},"if":{},"then":{}}`, "/if"},
		{"top ref", `{"$ref":"mcp://schemas/fleet.selector@1.0.0","type":"object","additionalProperties":false,"properties":{}}`, "/$ref"},
		{"dependentRequired", `{"type":"object","additionalProperties":false,"properties":{"a":{}},"dependentRequired":{"a":["b"]}}`, "/dependentRequired"},
		{"unevaluated", `{"type":"object","unevaluatedProperties":false,"properties":{}}`, "/unevaluatedProperties"},
		{"no type", `{"additionalProperties":false,"properties":{}}`, "top level: type <nil>, want object"},
		{"array", `{"type":"array","additionalProperties":false,"properties":{}}`, "top level: type array, want object"},
		{"no properties", `{"type":"object","additionalProperties":false}`, "top level: no properties"},
		{"open", `{"type":"object","properties":{}}`, "top level: additionalProperties <nil>, want false"},
		{"required undeclared", `{"type":"object","additionalProperties":false,"properties":{},"required":["a"]}`, "top level: required a is not a property"},
		{"nested ref", `{"type":"object","additionalProperties":false,"properties":{"a":{"$ref":"#/$defs/a"}},"$defs":{"a":{}}}`, "/properties/a/$ref"},
		{"nested anyOf", `{"type":"object","additionalProperties":false,"properties":{"a":{"type":"array","items":{"anyOf":[{"type":"string"},{"type":"integer"}]}}}}`, "/properties/a/items/anyOf"},
		{"nested in selector", `{"type":"object","additionalProperties":false,"properties":{"s":{"type":"object","properties":{"k":{"oneOf":[{},{}]}}}}}`, "/properties/s/properties/k/oneOf"},
	} {
		var doc any
		if err := json.Unmarshal([]byte(c.doc), &doc); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got := hostProblems(doc)
		if c.want == "" && got != nil {
			t.Errorf("%s: %q, want host-safe", c.name, got)
		}
		if c.want != "" && !slices.Contains(got, c.want) {
			t.Errorf("%s: %q, want %q among them", c.name, got, c.want)
		}
	}
}

// TestRunTimeRules: the rules fleet.call.input can no longer say as
// schema (TestHostSafe) are in its words, and the golden calls that
// break them, which the schema takes, are under valid/ as
// <case>.refused.json for the gateway's run-time check.
func TestRunTimeRules(t *testing.T) {
	desc, _ := at(t, "fleet.call.input@1.0.0", "/description").(string)
	for _, words := range []string{"exactly one way", "kind, cap_id and verb all three together", "E_MANIFEST_INVALID",
		"both ways", "neither way", "only one or two of kind, cap_id and verb"} {
		if !strings.Contains(desc, words) {
			t.Errorf("fleet.call.input's description does not say %q", words)
		}
	}
	for _, p := range []string{"tool", "kind", "cap_id", "verb"} {
		if d, _ := at(t, "fleet.call.input@1.0.0", "/properties/"+p+"/description").(string); !strings.Contains(d, "refused beside") &&
			!strings.Contains(d, "Refused beside") {
			t.Errorf("fleet.call.input's %s: its description does not say what it is refused beside", p)
		}
	}
	files, err := os.ReadDir("testdata/valid/fleet.call.input@1.0.0")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range files {
		if strings.HasSuffix(f.Name(), ".refused.json") {
			n++
		}
	}
	if n == 0 {
		t.Error("no golden fleet.call.input@1.0.0/*.refused.json for the gateway's run-time check")
	}
}
