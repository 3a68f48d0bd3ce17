package schemas_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/okso-io/okso/schemas"
)

func TestExplainEmbedded(t *testing.T) {
	s := load(t)
	for _, c := range []struct {
		id, args, want string
	}{
		{schemas.EchoInput, `{"message":"` + strings.Repeat("x", 1025) + `"}`, "argument message: longer than 1024"},
		{schemas.EchoInput, `{"message":"tab\there"}`, `argument message: does not match ^[\x20-\x7E]*$`},
		{schemas.EchoInput, `{"message":5}`, "argument message: want string"},
		{schemas.EchoInput, `{}`, "argument message: required"},
		{schemas.EchoInput, `{"message":"x","zzz_secret":1}`, "an argument the schema does not declare (it declares: message)"},
		{schemas.EchoInput, `{"message":"x","message":"y"}`, "arguments are not one JSON object without duplicate keys"},
		{schemas.EchoInput, `[]`, "arguments: want object"},
		{schemas.MetricsSubInput, `{"interval_ms":999}`, "argument interval_ms: below 1000"},
		{schemas.MetricsSubInput, `{"interval_ms":60001}`, "argument interval_ms: above 60000"},
		{schemas.MetricsSubInput, `{"interval_ms":1000.5}`, "argument interval_ms: want integer"},
		{schemas.GPIOWriteInput, `{"level":2}`, "argument level: not one of 0, 1"},
		{schemas.GPIOWriteInput, `{"level":1,"pin":"x","zzz":1}`, "an argument the schema does not declare (it declares: level)"},
		{"mcp://schemas/nope@1.0.0", `{}`, "arguments have no schema to check them"},
	} {
		err := s.ValidateJSON(c.id, []byte(c.args))
		if err == nil {
			t.Fatalf("%s %s: valid, want %q", c.id, c.args, c.want)
		}
		if got := s.Explain(c.id, err); got != c.want {
			t.Errorf("%s %s: %q, want %q", c.id, c.args, got, c.want)
		}
	}
}

// TestExplainNested: the path of a declared nested argument is named;
// undeclared names and the caller's values never are; the first failure
// by location is told, whatever order the validator found them in.
func TestExplainNested(t *testing.T) {
	sch := compile(t, `{
		"type": "object",
		"properties": {
			"a": {"type": "object", "properties": {"b": {"type": "string", "minLength": 3}}, "additionalProperties": {"type": "integer"}},
			"list": {"type": "array", "items": {"$ref": "#/$defs/item"}, "maxItems": 2},
			"z": {"type": "integer", "exclusiveMaximum": 10}
		},
		"additionalProperties": {"type": "string"},
		"$defs": {"item": {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 2}}, "required": ["n"]}}
	}`)
	for _, tc := range []struct{ args, want string }{
		{`{"a":{"b":"xy"}}`, "argument a.b: shorter than 3"},
		{`{"a":{"secret_name":"v"}}`, "argument a: a property the schema does not declare (declared: b) fails it"},
		{`{"secret_name":5}`, "an argument the schema does not declare (it declares: a, list, z) fails it"},
		{`{"list":[{"n":2},{"n":3}]}`, "argument list[1].n: not a multiple of 2"},
		{`{"list":[{"n":2},{}]}`, "argument list[1].n: required"},
		{`{"list":[{"n":2},{"n":2},{"n":2}]}`, "argument list: more than 2 items"},
		{`{"z":10,"a":{"b":"x"}}`, "argument a.b: shorter than 3"},
		{`{"z":10}`, "argument z: not below 10"},
	} {
		got := explainFor(t, sch, tc.args)
		if got != tc.want {
			t.Errorf("%s: %q, want %q", tc.args, got, tc.want)
		}
		if strings.Contains(got, "secret") {
			t.Errorf("%s: %q echoes an undeclared name", tc.args, got)
		}
	}
}

// TestExplainUndeclared: an argument the schema does not declare is told
// with the names the schema declares there (in properties, $ref
// followed), sorted, printable, at most 16; the caller's name never.
func TestExplainUndeclared(t *testing.T) {
	var many []string
	for i := range 20 {
		many = append(many, fmt.Sprintf(`"p%02d_%s": {}`, i, strings.Repeat("x", 100)))
	}
	var first16 []string
	for i := range 16 {
		first16 = append(first16, fmt.Sprintf("p%02d_%s", i, strings.Repeat("x", 60)))
	}
	for _, c := range []struct{ name, schema, args, want string }{
		{"top level",
			`{"type": "object", "properties": {"message": {}, "interval_ms": {}}, "additionalProperties": false}`,
			`{"message": "x", "secret": 1}`,
			"an argument the schema does not declare (it declares: interval_ms, message)"},
		{"nested, through $ref",
			`{"type": "object", "properties": {"opts": {"$ref": "#/$defs/opts"}},
			  "$defs": {"opts": {"type": "object", "properties": {"b": {}, "a": {}}, "additionalProperties": false}}}`,
			`{"opts": {"a": 1, "secret": 1}}`,
			"argument opts: a property the schema does not declare (declared: a, b)"},
		{"in an item",
			`{"type": "object", "properties": {"list": {"type": "array", "items": {"properties": {"n": {}}, "additionalProperties": false}}}}`,
			`{"list": [{"n": 1}, {"secret": 1}]}`,
			"argument list[1]: a property the schema does not declare (declared: n)"},
		{"none declared",
			`{"type": "object", "additionalProperties": false}`,
			`{"secret": 1}`,
			"an argument the schema does not declare (it declares none)"},
		{"none declared, nested",
			`{"type": "object", "properties": {"opts": {"type": "object", "additionalProperties": false}}}`,
			`{"opts": {"secret": 1}}`,
			"argument opts: a property the schema does not declare (declared: none)"},
		{"more than 16",
			`{"type": "object", "properties": {` + strings.Join(many, ", ") + `}, "additionalProperties": false}`,
			`{"secret": 1}`,
			"an argument the schema does not declare (it declares: " + strings.Join(first16, ", ") + ", …)"},
		{"unprintable declared names",
			`{"type": "object", "properties": {"ok\u0007na\nme": {}, "caf\u00e9": {}, "\u0007\u00e9": {}}, "additionalProperties": false}`,
			`{"secret": 1}`,
			"an argument the schema does not declare (it declares: caf, okname, …)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			sch := compile(t, c.schema)
			got := explainFor(t, sch, c.args)
			if got != c.want {
				t.Errorf("%s:\n%q\nwant\n%q", c.args, got, c.want)
			}
			if strings.Contains(got, "secret") {
				t.Errorf("%q echoes the caller's name", got)
			}
			if len(got) > 1200 {
				t.Errorf("%d bytes: a message is bounded", len(got))
			}
			for _, r := range strings.ReplaceAll(got, "…", "") {
				if r < 0x20 || r > 0x7e {
					t.Fatalf("%q: %q is not printable ASCII", got, r)
				}
			}
		})
	}
}

func compile(t *testing.T, schema string) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("mem://t.json", doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile("mem://t.json")
	if err != nil {
		t.Fatal(err)
	}
	return sch
}

// explainFor is Explain's words for args, which must fail sch.
func explainFor(t *testing.T, sch *jsonschema.Schema, args string) string {
	t.Helper()
	v, err := schemas.Decode([]byte(args))
	if err != nil {
		t.Fatal(err)
	}
	verr := sch.Validate(v)
	if verr == nil {
		t.Fatalf("%s: valid, want it refused", args)
	}
	return schemas.Explain(sch, verr)
}
