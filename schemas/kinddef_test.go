package schemas_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/okso-io/okso/schemas"
)

// thermo returns the golden thermo definition with its text edited by
// the replacer's pairs.
func thermo(t *testing.T, oldnew ...string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/valid/kind@1.0.0/thermo.json")
	if err != nil {
		t.Fatal(err)
	}
	return []byte(strings.NewReplacer(oldnew...).Replace(string(b)))
}

func thermoCap(id, ref, class string) schemas.Capability {
	return schemas.Capability{CapID: id, Kind: "acme.thermo", SchemaRef: ref, Verbs: []string{"read"}, SafetyClass: class}
}

const thermoRead = "mcp://schemas/acme.thermo.read.input@1.0.0"

func TestCompileKind(t *testing.T) {
	s := load(t)
	d, err := s.CompileKind(thermo(t))
	if err != nil {
		t.Fatal(err)
	}
	if d.Key() != "acme.thermo.v1" || d.Short != "thermo" || d.Major != 1 || d.Safety != schemas.SafetyMutating || !d.Registered() {
		t.Errorf("definition = %+v", d.Kind)
	}
	v, ok := d.Verb("read")
	if !ok || v.Input != thermoRead || v.Output != "mcp://schemas/acme.thermo.read.output@1.0.0" || v.Title != "Read the temperature" {
		t.Errorf("verb read = %+v, %v", v, ok)
	}
	if len(d.Schemas) != 2 || d.Schemas[v.Input].Foreign.ValidateJSON([]byte(`{"unit":"K"}`)) == nil {
		t.Errorf("input schema does not refuse unit K")
	}
	// The same content, written otherwise, is the same definition.
	var v2 any
	_ = json.Unmarshal(thermo(t), &v2)
	again, _ := json.MarshalIndent(v2, "", "    ")
	d2, err := s.CompileKind(again)
	if err != nil || string(d2.Doc) != string(d.Doc) {
		t.Errorf("the same definition re-encoded: %v, doc %s; want %s", err, d2.Doc, d.Doc)
	}
	// Any: the device's word.
	if d, err := s.CompileKind(thermo(t, `"safety": "mutating"`, `"safety": "any"`)); err != nil || d.Safety != "" {
		t.Errorf("safety any: %+v, %v", d, err)
	}
}

func TestCompileKindRefuses(t *testing.T) {
	s := load(t)
	deep := `{"type":"object","properties":{"a":` + strings.Repeat(`{"items":`, 200) + `{}` + strings.Repeat(`}`, 200) + `}}`
	for name, tc := range map[string]struct {
		doc  []byte
		want string
	}{
		"built-in kind":  {thermo(t, "acme.thermo", "system.echo"), "built in"},
		"built-in short": {thermo(t, `"kind_short": "thermo"`, `"kind_short": "sysecho"`), "built-in kind's"},
		"local short":    {thermo(t, `"kind_short": "thermo"`, `"kind_short": "local"`), "built-in kind's"},
		"reserved short": {thermo(t, `"kind_short": "thermo"`, `"kind_short": "fleet"`), "reserved"},
		"too long":       {thermo(t, `"kind_short": "thermo"`, `"kind_short": "thermometer"`), "at most 11"},
		"major 0":        {thermo(t, `"version": "1.0.0"`, `"version": "0.9.0"`, "@1.0.0", "@0.9.0"), "at least 1"},
		"id of another":  {thermo(t, "acme.thermo.read.input@", "acme.thermo.set.input@"), "$id must be"},
		"id of no major": {thermo(t, "read.output@1.0.0", "read.output@2.0.0"), "major 1"},
		"no node_id":     {thermo(t, `"required": ["node_id", "temperature"]`, `"required": ["temperature"]`), "node_id"},
		"input not obj": {thermo(t, `"type": "object",
        "additionalProperties"`, `"type": "array",
        "additionalProperties"`), "type object"},
		"a file name":     {thermo(t, `"input": {`, `"input": "read.input.json", "x": {`), "fails"},
		"schema's bounds": {thermo(t, `"properties": {"unit": {"enum": ["C", "F"]}}`, `"properties": {"unit": `+deep+`}`), "verb read input schema"},
		"verb twice": {thermo(t, `"verbs": [`, `"verbs": [{"name": "read", "title": "t", "input": {"$id": "mcp://schemas/acme.thermo.read.input@1.0.1", "type": "object"},
			"output": {"$id": "mcp://schemas/acme.thermo.read.output@1.0.1", "type": "object", "required": ["node_id"]}},`), "defined twice"},
		"not the contract": {[]byte(`{"name":"acme.thermo"}`), "fails mcp://schemas/kind@1.0.0"},
	} {
		_, err := s.CompileKind(tc.doc)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: CompileKind = %v, want an error with %q", name, err, tc.want)
		}
	}
}

func TestKindTableProject(t *testing.T) {
	s := load(t)
	d, err := s.CompileKind(thermo(t))
	if err != nil {
		t.Fatal(err)
	}
	kt, errs := schemas.NewKindTable([]*schemas.KindDef{d})
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	caps := []schemas.Capability{echoCap("echo"), thermoCap(strings.Repeat("b", 24), thermoRead, schemas.SafetyMutating)}
	tools, err := kt.Project(node, caps)
	if err != nil {
		t.Fatal(err)
	}
	if len(tools) != 2 || tools[1].Name != "thermo."+node+"."+strings.Repeat("b", 24)+".read" || tools[1].Class != schemas.SafetyMutating || len(tools[1].Name) > schemas.MaxToolName {
		t.Errorf("tools = %+v", tools)
	}
	if _, err := schemas.Project(node, caps); err == nil || err.Error() != "unknown kind" {
		t.Errorf("built-ins alone project a registered kind: %v", err)
	}
	for name, tc := range map[string]struct {
		c    schemas.Capability
		want string
	}{
		"clamp":      {thermoCap("b", thermoRead, schemas.SafetyReadOnly), "safety_class is not its kind's"},
		"major 2":    {thermoCap("b", "mcp://schemas/acme.thermo.read.input@2.0.0", schemas.SafetyMutating), "version of its kind not registered"},
		"output ref": {thermoCap("b", "mcp://schemas/acme.thermo.read.output@1.0.0", schemas.SafetyMutating), "schema_ref is not an input schema of its kind"},
		"other kind": {schemas.Capability{CapID: "b", Kind: "acme.other", SchemaRef: thermoRead, Verbs: []string{"read"}, SafetyClass: schemas.SafetyMutating}, "unknown kind"},
		"verb":       {schemas.Capability{CapID: "b", Kind: "acme.thermo", SchemaRef: thermoRead, Verbs: []string{"set"}, SafetyClass: schemas.SafetyMutating}, "verb not allowed for its kind"},
	} {
		if _, err := kt.Project(node, []schemas.Capability{tc.c}); err == nil || err.Error() != tc.want {
			t.Errorf("%s: Project = %v, want %q", name, err, tc.want)
		}
	}
	if !kt.IsKindShort("thermo") || !kt.IsKindShort("sys") || schemas.IsKindShort("thermo") {
		t.Error("IsKindShort: the table's kind_shorts are the built-ins' and thermo, the package's the built-ins' alone")
	}
	if k, ok := kt.Lookup("acme.thermo"); !ok || k.Major != 1 {
		t.Errorf("Lookup = %+v, %v", k, ok)
	}
	if sc, ok := kt.Schema(thermoRead); !ok || !strings.Contains(string(sc.Doc), `"$id":"`+thermoRead+`"`) {
		t.Errorf("Schema(%s) = %v, %v", thermoRead, sc, ok)
	}
}

// TestKindTableConflicts: a kind_short is one kind's; a kind's majors
// share theirs; a key is applied once.
func TestKindTableConflicts(t *testing.T) {
	s := load(t)
	mk := func(oldnew ...string) *schemas.KindDef {
		d, err := s.CompileKind(thermo(t, oldnew...))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	v1 := mk()
	v2 := mk(`"version": "1.0.0"`, `"version": "2.0.0"`, "@1.0.0", "@2.0.0")
	other := mk("acme.thermo", "zeta.boiler")
	renamed := mk(`"version": "1.0.0"`, `"version": "3.0.0"`, "@1.0.0", "@3.0.0", `"kind_short": "thermo"`, `"kind_short": "thermo3"`)
	kt, errs := schemas.NewKindTable([]*schemas.KindDef{v2, v1, other, renamed})
	if len(errs) != 2 {
		t.Fatalf("errors %v, want 2: acme.boiler's kind_short is acme.thermo's; v3 renames it", errs)
	}
	if k, _ := kt.Lookup("acme.thermo"); k.Major != 2 {
		t.Errorf("Lookup gives major %d, want the latest, 2", k.Major)
	}
	if len(kt.Defs()) != 2 {
		t.Errorf("table holds %d definitions, want 2", len(kt.Defs()))
	}
	if err := kt.Conflict(v1); err == nil {
		t.Error("Conflict: acme.thermo.v1 again is no conflict")
	}
	if err := kt.Conflict(other); err == nil {
		t.Error("Conflict: another kind with thermo's kind_short is no conflict")
	}
	if err := kt.Conflict(mk(`"version": "1.0.0"`, `"version": "4.0.0"`, "@1.0.0", "@4.0.0")); err != nil {
		t.Errorf("Conflict: a new major: %v", err)
	}
}

// TestHandlerWithKinds: a registered kind's schemas are served beside the
// embedded ones, once the table has them.
func TestHandlerWithKinds(t *testing.T) {
	s := load(t)
	d, err := s.CompileKind(thermo(t))
	if err != nil {
		t.Fatal(err)
	}
	var kt *schemas.KindTable
	h := s.HandlerWith(func() *schemas.KindTable { return kt })
	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code, rec.Body.String()
	}
	if code, _ := get("/schemas/acme.thermo.read.input@1.0.0"); code != http.StatusNotFound {
		t.Errorf("before the kind is known: %d", code)
	}
	kt, _ = schemas.NewKindTable([]*schemas.KindDef{d})
	if code, body := get("/schemas/acme.thermo.read.input@1.0.0"); code != http.StatusOK || !strings.Contains(body, thermoRead) {
		t.Errorf("registered schema: %d %s", code, body)
	}
	if code, _ := get("/schemas/system.echo.invoke.input@1.0.0"); code != http.StatusOK {
		t.Errorf("embedded schema: %d", code)
	}
}
