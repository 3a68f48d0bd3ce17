package schemas_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/okso-io/okso/schemas"
)

// at returns the value at a JSON pointer in the schema file name.
func at(t *testing.T, name, pointer string) any {
	t.Helper()
	raw, err := os.ReadFile(name + ".json")
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	for _, tok := range strings.Split(strings.TrimPrefix(pointer, "/"), "/") {
		m, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("%s#%s: no such value", name, pointer)
		}
		if v, ok = m[strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")]; !ok {
			t.Fatalf("%s#%s: no such value", name, pointer)
		}
	}
	return v
}

// TestCopiedRules: a rule the fleet schemas copy, rather than refer to
// (a reference would carry the manifest's descriptions and bounds, which
// are a device's, into an agent's tool schema), stays equal to the one
// it copies.
func TestCopiedRules(t *testing.T) {
	const (
		manifest = "manifest@1.0.0"
		selector = "fleet.selector@1.0.0"
		nodesOut = "fleet.nodes.output@1.0.0"
		callIn   = "fleet.call.input@1.0.0"
		callOut  = "fleet.call.output@1.0.0"
		nodesIn  = "fleet.nodes.input@1.0.0"
		findIn   = "okso.find_tools.input@1.0.0"
		findOut  = "okso.find_tools.output@1.0.0"
	)
	type place struct{ name, pointer string }
	for _, c := range []struct {
		copy, of place
	}{
		{place{selector, "/properties/cap_id/pattern"}, place{manifest, "/$defs/capability/properties/cap_id/pattern"}},
		{place{selector, "/properties/name/pattern"}, place{manifest, "/properties/name/pattern"}},
		{place{selector, "/properties/agent/pattern"}, place{manifest, "/properties/agent/properties/name/pattern"}},
		{place{selector, "/properties/agent/maxLength"}, place{manifest, "/properties/agent/properties/name/maxLength"}},
		{place{selector, "/properties/agent/minLength"}, place{manifest, "/properties/agent/properties/name/minLength"}},
		{place{selector, "/properties/labels/propertyNames"}, place{manifest, "/properties/labels/propertyNames"}},
		{place{selector, "/properties/labels/additionalProperties"}, place{manifest, "/properties/labels/additionalProperties"}},
		{place{selector, "/properties/node_ids/items/pattern"}, place{manifest, "/$defs/node_id/pattern"}},
		{place{nodesIn, "/properties/cursor/pattern"}, place{manifest, "/$defs/node_id/pattern"}},
		{place{nodesOut, "/properties/next_cursor/pattern"}, place{manifest, "/$defs/node_id/pattern"}},
		{place{nodesOut, "/$defs/node/properties/node_id/pattern"}, place{manifest, "/$defs/node_id/pattern"}},
		{place{nodesOut, "/$defs/node/properties/name/pattern"}, place{manifest, "/properties/name/pattern"}},
		{place{nodesOut, "/$defs/node/properties/labels/propertyNames"}, place{manifest, "/properties/labels/propertyNames"}},
		{place{nodesOut, "/$defs/node/properties/labels/additionalProperties"}, place{manifest, "/properties/labels/additionalProperties"}},
		{place{nodesOut, "/$defs/node/properties/labels/maxProperties"}, place{selector, "/properties/labels/maxProperties"}},
		{place{nodesOut, "/$defs/node/properties/agent/properties"}, place{manifest, "/properties/agent/properties"}},
		{place{nodesOut, "/$defs/node/properties/agent/required"}, place{manifest, "/properties/agent/required"}},
		{place{callIn, "/properties/plan_id/pattern"}, place{manifest, "/$defs/node_id/pattern"}},
		{place{callOut, "/$defs/node_id/pattern"}, place{manifest, "/$defs/node_id/pattern"}},
		{place{callOut, "/$defs/dry_run/properties/safety_class/enum"}, place{manifest, "/$defs/capability/properties/safety_class/enum"}},
		{place{callOut, "/$defs/dry_run/properties/expires_at/pattern"}, place{nodesOut, "/$defs/date_time/pattern"}},
		{place{callOut, "/$defs/dry_run/properties/expires_at/maxLength"}, place{nodesOut, "/$defs/date_time/maxLength"}},
		{place{callOut, "/$defs/row/properties/result_truncated/properties/limit/minimum"}, place{callIn, "/properties/max_result_bytes/minimum"}},
		{place{callOut, "/$defs/row/properties/result_truncated/properties/limit/maximum"}, place{callIn, "/properties/max_result_bytes/maximum"}},
		{place{callOut, "/$defs/dry_run/properties/targeted/maximum"}, place{callIn, "/properties/max_nodes/maximum"}},
		{place{callOut, "/$defs/summary/properties/targeted/maximum"}, place{callIn, "/properties/max_nodes/maximum"}},
		{place{callOut, "/$defs/run/properties/results/maxItems"}, place{callIn, "/properties/max_nodes/maximum"}},
		{place{nodesOut, "/properties/nodes/maxItems"}, place{nodesIn, "/properties/limit/maximum"}},
		{place{"okso.find_tools.output@1.0.0", "/properties/tools/maxItems"}, place{"okso.find_tools.input@1.0.0", "/properties/limit/maximum"}},
	} {
		if got, want := at(t, c.copy.name, c.copy.pointer), at(t, c.of.name, c.of.pointer); !reflect.DeepEqual(got, want) {
			t.Errorf("%s#%s = %v, but %s#%s = %v", c.copy.name, c.copy.pointer, got, c.of.name, c.of.pointer, want)
		}
	}
	// Whole rules copied where a tool's input schema would have referred
	// to them (TestHostSafe: no $ref in an input schema): equal but for
	// the words, which are each site's own.
	for _, c := range []struct {
		copy, of place
	}{
		{place{callIn, "/properties/kind"}, place{selector, "/properties/kind"}},
		{place{callIn, "/properties/cap_id"}, place{selector, "/properties/cap_id"}},
		{place{callIn, "/properties/verb"}, place{selector, "/properties/verb"}},
		{place{findIn, "/properties/kind"}, place{selector, "/properties/kind"}},
		{place{findIn, "/properties/cursor"}, place{findOut, "/$defs/cursor"}},
	} {
		got, want := rule(at(t, c.copy.name, c.copy.pointer)), rule(at(t, c.of.name, c.of.pointer))
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s#%s = %v, but %s#%s = %v", c.copy.name, c.copy.pointer, got, c.of.name, c.of.pointer, want)
		}
	}
	// The derived bounds, from the Go constants they come from.
	if got := at(t, selector, "/properties/labels/maxProperties"); got != float64(3*schemas.MaxLabels) {
		t.Errorf("selector labels maxProperties %v, want %d (three sources of MaxLabels)", got, 3*schemas.MaxLabels)
	}
	if got := at(t, "okso.find_tools.output@1.0.0", "/$defs/tool/properties/description/maxLength"); got != float64(schemas.MaxDescription+1) {
		t.Errorf("find_tools description maxLength %v, want %d (TrimDescription's bytes and an ellipsis)", got, schemas.MaxDescription+1)
	}
}

// rule returns a copy of the schema v without the keywords that only
// annotate it: what it accepts, not how it is told.
func rule(v any) any {
	m, ok := v.(map[string]any)
	if !ok {
		return v
	}
	out := make(map[string]any, len(m))
	for k, x := range m {
		switch k {
		case "title", "description", "$comment", "default", "examples":
		default:
			out[k] = x
		}
	}
	return out
}

// TestSelectorCopies: fleet.selector@1.0.0 is the one statement of the
// filters. fleet.nodes.input and fleet.call.input's selector copy its
// properties, since a tool's input schema may not refer to it
// (TestHostSafe); the copies are its properties exactly, words and all,
// and close them as it does.
func TestSelectorCopies(t *testing.T) {
	const (
		selector = "fleet.selector@1.0.0"
		nodesIn  = "fleet.nodes.input@1.0.0"
		callIn   = "fleet.call.input@1.0.0"
	)
	filters, ok := at(t, selector, "/properties").(map[string]any)
	if !ok || len(filters) == 0 {
		t.Fatalf("%s declares no filters", selector)
	}
	if got := at(t, selector, "/additionalProperties"); got != false {
		t.Errorf("%s: additionalProperties %v, want false", selector, got)
	}
	// fleet.nodes.input: the filters, and limit and cursor of its own.
	nodes := maps.Clone(at(t, nodesIn, "/properties").(map[string]any))
	for _, own := range []string{"limit", "cursor"} {
		if _, ok := nodes[own]; !ok {
			t.Errorf("%s: no %s", nodesIn, own)
		}
		if _, ok := filters[own]; ok {
			t.Errorf("%s: %s is a filter, and %s's own member", selector, own, nodesIn)
		}
		delete(nodes, own)
	}
	if !reflect.DeepEqual(nodes, filters) {
		t.Errorf("%s's filters differ from %s's properties:\n%s", nodesIn, selector, diffKeys(nodes, filters))
	}
	// fleet.call.input's selector: the filters, closed, and named in its
	// description so that an agent reading only the words knows them.
	sel := at(t, callIn, "/properties/selector").(map[string]any)
	if props, _ := sel["properties"].(map[string]any); !reflect.DeepEqual(props, filters) {
		t.Errorf("%s's selector differs from %s's properties:\n%s", callIn, selector, diffKeys(props, filters))
	}
	if sel["type"] != "object" || sel["additionalProperties"] != false {
		t.Errorf("%s's selector: type %v, additionalProperties %v; want object, false", callIn, sel["type"], sel["additionalProperties"])
	}
	desc, _ := sel["description"].(string)
	for name := range filters {
		if !strings.Contains(desc, name) {
			t.Errorf("%s's selector: its description does not name the filter %s", callIn, name)
		}
	}
}

// diffKeys names the members of got that differ from want's.
func diffKeys(got, want map[string]any) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if !reflect.DeepEqual(got[k], want[k]) {
			fmt.Fprintf(&b, "  %s: %v, want %v\n", k, got[k], want[k])
		}
	}
	for _, k := range slices.Sorted(maps.Keys(got)) {
		if _, ok := want[k]; !ok {
			fmt.Fprintf(&b, "  %s: not a filter\n", k)
		}
	}
	return b.String()
}

// TestFleetNames: the kinds, verbs and tool names okso makes are the ones
// the fleet schemas take, in both name forms.
func TestFleetNames(t *testing.T) {
	s := load(t)
	const node = "01hzx9k3m4p7q8r9s0t1v2w3xy"
	capID := strings.Repeat("c", 24)
	for _, name := range []string{schemas.KindEcho, schemas.KindMetrics, schemas.KindGPIO, "local.tool"} {
		var verbs []string
		short := "local"
		if k, ok := schemas.LookupKind(name); ok {
			short = k.Short
			for _, v := range k.Verbs {
				verbs = append(verbs, v.Name)
			}
		} else {
			verbs = []string{"run"}
		}
		for _, verb := range verbs {
			filter, _ := json.Marshal(map[string]any{"kind": name, "cap_id": capID, "verb": verb})
			if err := s.ValidateJSON(schemas.FleetSelector, filter); err != nil {
				t.Errorf("selector %s: %v", filter, err)
			}
			tool := schemas.ToolName{KindShort: short, NodeID: node, CapID: "c", Verb: verb}.String()
			if _, ok := schemas.ParseToolName(tool); !ok {
				t.Fatalf("%s: not a tool name", tool)
			}
			for _, form := range []string{tool, schemas.SafeToolName(tool)} {
				out, _ := json.Marshal(map[string]any{"nodes": []any{map[string]any{"node_id": node, "presence": "online",
					"agent": map[string]string{"name": "a", "version": "1"}, "tools": []string{form}}}, "total": 1})
				if err := s.ValidateJSON(schemas.FleetNodesOutput, out); err != nil {
					t.Errorf("fleet.nodes tool %s: %v", form, err)
				}
				pattern := strings.Replace(form, node, "*", 1)
				call, _ := json.Marshal(map[string]any{"tool": pattern})
				if err := s.ValidateJSON(schemas.FleetCallInput, call); err != nil {
					t.Errorf("fleet.call tool %s: %v", pattern, err)
				}
			}
		}
	}
	// The longest tool name (64 characters) fits, and so does its pattern.
	long := "sysecho." + node + "." + strings.Repeat("e", schemas.MaxToolName-len("sysecho."+node+"..invoke")) + ".invoke"
	out, _ := json.Marshal(map[string]any{"nodes": []any{map[string]any{"node_id": node, "presence": "online",
		"agent": map[string]string{"name": "a", "version": "1"}, "tools": []string{long}}}, "total": 1})
	if err := s.ValidateJSON(schemas.FleetNodesOutput, out); err != nil {
		t.Errorf("64-character tool: %v", err)
	}
	call, _ := json.Marshal(map[string]any{"tool": strings.Replace(long, node, "*", 1)})
	if err := s.ValidateJSON(schemas.FleetCallInput, call); err != nil {
		t.Errorf("64-character tool's pattern: %v", err)
	}
	// Every description TrimDescription leaves fits find_tools' bound.
	for _, d := range []string{strings.Repeat("x", 5000), strings.Repeat("é", 5000), strings.Repeat("€", 5000)} {
		res, _ := json.Marshal(map[string]any{"tools": []any{map[string]any{"name": "everything.echo",
			"description": schemas.TrimDescription(d), "inputSchema": map[string]string{"type": "object"}, "source": "upstream"}}})
		if err := s.ValidateJSON(schemas.FindToolsOutput, res); err != nil {
			t.Errorf("trimmed description: %v", err)
		}
	}
}

// TestExplainFleet: a refused fleet tool call says which argument and
// rule, through the shared selector too, and never echoes the caller's
// unknown names.
func TestExplainFleet(t *testing.T) {
	s := load(t)
	const filters = "agent, cap_id, kind, labels, name, node_id_prefix, node_ids, presence, verb"
	for _, c := range []struct{ id, args, want string }{
		{schemas.FleetNodesInput, `{"limit":0}`, "argument limit: below 1"},
		{schemas.FleetNodesInput, `{"cursor":"page-2"}`, "argument cursor: does not match ^[0-9a-hjkmnp-tv-z]{26}$"},
		{schemas.FleetNodesInput, `{"presence":"gone"}`, `argument presence: not one of "online", "offline", "any"`},
		{schemas.FleetNodesInput, `{"secret":1}`, "an argument the schema does not declare (it declares: agent, cap_id, cursor, kind, labels, limit, name, node_id_prefix, node_ids, presence, verb)"},
		{schemas.FleetCallInput, `{"tool":"sysecho.*.echo.invoke","selector":{"secret":1}}`, "argument selector: a property the schema does not declare (declared: " + filters + ")"},
		{schemas.FleetCallInput, `{"tool":"sysecho.*.echo.invoke","selector":{"node_ids":["x"]}}`, "argument selector.node_ids[0]: does not match ^[0-9a-hjkmnp-tv-z]{26}$"},
		{schemas.FleetCallInput, `{"kind":"system.echo","cap_id":"Echo","verb":"invoke"}`, "argument cap_id: does not match ^[a-z0-9_]{1,24}$"},
		{schemas.FleetCallInput, `{"tool":"sysecho.*.echo.invoke","max_nodes":10001}`, "argument max_nodes: above 10000"},
	} {
		err := s.ValidateJSON(c.id, []byte(c.args))
		if err == nil {
			t.Fatalf("%s %s: valid, want %q", c.id, c.args, c.want)
		}
		got := s.Explain(c.id, err)
		if got != c.want {
			t.Errorf("%s %s: %q, want %q", c.id, c.args, got, c.want)
		}
		if strings.Contains(got, "secret") {
			t.Errorf("%s %s: %q echoes an undeclared name", c.id, c.args, got)
		}
	}
}
