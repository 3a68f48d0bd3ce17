package mcp

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/schemas"
)

// The calls the schema's golden files mark refused (the verb named both
// ways, neither way, or by part of kind, cap_id and verb) pass the flat
// schema and are refused by the gateway with E_MANIFEST_INVALID before
// anything else; the others name a verb.
func TestFleetCallVerbRule(t *testing.T) {
	f, _ := testFleet(t, 4)
	e, _ := f.cat.lookup("demo", ToolFleetCall)
	files, err := filepath.Glob("../schemas/testdata/valid/" + strings.TrimPrefix(schemas.FleetCallInput, "mcp://schemas/") + "/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("golden calls: %v", err)
	}
	for _, file := range files {
		doc, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.input.validate(doc); err != nil {
			t.Fatalf("%s fails the schema: %s", file, e.input.explain(err))
		}
		var a callArgs
		if err := json.Unmarshal(doc, &a); err != nil {
			t.Fatal(err)
		}
		_, env := verbOf(nil, &a)
		refused := strings.HasSuffix(file, ".refused.json")
		if refused != (env != nil) || env != nil && env.Code != schemas.CodeManifestInvalid {
			t.Errorf("%s: %+v, refused %v", filepath.Base(file), env, refused)
		}
	}
}

// A verb is named the same by tool in either form and by kind, cap_id
// and verb.
func TestFleetCallVerbForms(t *testing.T) {
	for _, a := range []callArgs{
		{Tool: "sysecho.*.echo.invoke"}, {Tool: "sysecho-*-echo-invoke"}, {Kind: "system.echo", CapID: "echo", Verb: "invoke"},
	} {
		if ref, e := verbOf(nil, &a); e != nil || ref.pattern() != "sysecho.*.echo.invoke" || ref.name("n") != "sysecho.n.echo.invoke" {
			t.Errorf("%+v: %+v %v", a, ref, e)
		}
	}
	if _, e := verbOf(nil, &callArgs{Kind: "no.such", CapID: "echo", Verb: "invoke"}); e == nil || e.Code != schemas.CodeToolNotFound {
		t.Errorf("an unknown kind: %v", e)
	}
}

// Two calls agree on their arguments whatever the order of their
// members; any other difference is another digest.
func TestDigest(t *testing.T) {
	a := digest(json.RawMessage(`{"b":1,"a":{"y":[1,2],"x":"s"}}`))
	if b := digest(json.RawMessage(` { "a" : {"x":"s","y":[1,2]}, "b":1 }`)); a != b {
		t.Errorf("member order changes the digest: %s %s", a, b)
	}
	for _, other := range []string{`{"b":2,"a":{"y":[1,2],"x":"s"}}`, `{"b":1,"a":{"y":[2,1],"x":"s"}}`, `{"b":1.0,"a":{"y":[1,2],"x":"s"}}`} {
		if digest(json.RawMessage(other)) == a {
			t.Errorf("%s has the digest of another document", other)
		}
	}
	if digest(nil) != "" || digest(json.RawMessage("null")) != "" {
		t.Error("no document has a digest")
	}
}

// A selector resolves to the tenant's nodes that have the verb; a node
// named by id is a target whatever its presence, and one of another
// tenant, or that lacks the verb, too (its row will say why); a
// streaming verb is refused.
func TestFleetCallResolve(t *testing.T) {
	f, _ := testFleet(t, 6) // nodes 0 and 1 offline; metrics on even nodes; 6 and 7 are tenant other's
	echo := verbRef{"sysecho", "echo", "invoke"}
	ids := func(ts []target) []string {
		var out []string
		for _, t := range ts {
			out = append(out, t.nodeID)
		}
		return out
	}
	got, e := f.resolve("demo", &nodesArgs{}, echo)
	if e != nil || strings.Join(ids(got), ",") != strings.Join([]string{fleetNodeID(2), fleetNodeID(3), fleetNodeID(4), fleetNodeID(5)}, ",") {
		t.Errorf("every online node: %v %v", ids(got), e)
	}
	snap := verbRef{"sys", "sys", "snapshot"}
	got, e = f.resolve("demo", &nodesArgs{NodeIDs: []string{fleetNodeID(0), fleetNodeID(3), fleetNodeID(4), fleetNodeID(6)}}, snap)
	want := []string{fleetNodeID(0), fleetNodeID(3), fleetNodeID(4), fleetNodeID(6)} // 0 offline, 3 lacks it, 6 not demo's
	if e != nil || strings.Join(ids(got), ",") != strings.Join(want, ",") {
		t.Errorf("named nodes: %v %v, want %v", ids(got), e, want)
	}
	if _, e := f.resolve("demo", &nodesArgs{}, verbRef{"sys", "sys", "subscribe"}); e == nil || e.Code != schemas.CodeManifestInvalid {
		t.Errorf("a streaming verb: %v", e)
	}
	// The strictest class decides the scope; none is read_only.
	if c := strictest([]target{{class: schemas.SafetyReadOnly}, {class: schemas.SafetyDestructive}, {class: schemas.SafetyMutating}, {}}); c != schemas.SafetyDestructive {
		t.Errorf("strictest = %s", c)
	}
	if c := strictest(nil); c != schemas.SafetyReadOnly || auth.ScopeFor(c) != auth.ScopeReadOnly {
		t.Errorf("strictest of none = %s", c)
	}
}

// A run's answer holds max_total_bytes of rows at most, the failures
// kept before the successes, the rest counted as omitted, and passes
// fleet.call's output schema.
func TestFleetCallAnswerBounds(t *testing.T) {
	f, _ := testFleet(t, 1)
	e, _ := f.cat.lookup("demo", ToolFleetCall)
	big := json.RawMessage(`{"message":"` + strings.Repeat("x", 1000) + `","node_id":"` + fleetNodeID(0) + `","received_at_ms":1795000000000}`)
	var okRows, failRows [][]byte
	for i := range 100 {
		okRows = append(okRows, []byte(`{"node_id":"`+fleetNodeID(i)+`","ok":true,"result":`+string(big)+`}`))
	}
	for i := 100; i < 110; i++ {
		failRows = append(failRows, failedRow(fleetNodeID(i), schemas.NewError(schemas.CodeNodeOffline, "node is offline"), false).doc)
	}
	sum := summaryDoc{Targeted: 110, OK: 100, Failed: map[string]int{schemas.CodeNodeOffline: 10}}
	out := fanAnswer(failRows, okRows, sum, 64<<10, fleetNodeID(999))
	if err := e.output.validate(out); err != nil {
		t.Fatalf("the answer fails fleet.call's output schema: %s", e.output.explain(err))
	}
	var got struct {
		Results []struct {
			OK bool `json:"ok"`
		} `json:"results"`
		Summary summaryDoc `json:"summary"`
		PlanID  string     `json:"plan_id"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	kept := len(got.Results)
	if kept >= 110 || got.Summary.Omitted != 110-kept || got.PlanID != fleetNodeID(999) {
		t.Errorf("%d rows kept, %d omitted, plan %q", kept, got.Summary.Omitted, got.PlanID)
	}
	for i := range 10 {
		if got.Results[i].OK {
			t.Fatalf("row %d succeeded: the failures come first", i)
		}
	}
	var whole struct{ Results []json.RawMessage }
	_ = json.Unmarshal(out, &whole)
	size := 0
	for _, r := range whole.Results {
		size += len(r) + 1
	}
	if size > 64<<10 {
		t.Errorf("rows of %d bytes, over max_total_bytes (%d)", size, 64<<10)
	}
}
