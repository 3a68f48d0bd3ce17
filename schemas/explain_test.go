package schemas_test

import (
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
		{schemas.EchoInput, `{"message":"x","zzz_secret":1}`, "an argument the schema does not declare"},
		{schemas.EchoInput, `{"message":"x","message":"y"}`, "arguments are not one JSON object without duplicate keys"},
		{schemas.EchoInput, `[]`, "arguments: want object"},
		{schemas.MetricsSubInput, `{"interval_ms":999}`, "argument interval_ms: below 1000"},
		{schemas.MetricsSubInput, `{"interval_ms":60001}`, "argument interval_ms: above 60000"},
		{schemas.MetricsSubInput, `{"interval_ms":1000.5}`, "argument interval_ms: want integer"},
		{schemas.GPIOWriteInput, `{"level":2}`, "argument level: not one of 0, 1"},
		{schemas.GPIOWriteInput, `{"level":1,"pin":"x","zzz":1}`, "an argument the schema does not declare"},
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
	c := jsonschema.NewCompiler()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(`{
		"type": "object",
		"properties": {
			"a": {"type": "object", "properties": {"b": {"type": "string", "minLength": 3}}, "additionalProperties": {"type": "integer"}},
			"list": {"type": "array", "items": {"$ref": "#/$defs/item"}, "maxItems": 2},
			"z": {"type": "integer", "exclusiveMaximum": 10}
		},
		"additionalProperties": {"type": "string"},
		"$defs": {"item": {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 2}}, "required": ["n"]}}
	}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.AddResource("mem://t.json", doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile("mem://t.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ args, want string }{
		{`{"a":{"b":"xy"}}`, "argument a.b: shorter than 3"},
		{`{"a":{"secret_name":"v"}}`, "argument a: a property the schema does not declare fails it"},
		{`{"secret_name":5}`, "an argument the schema does not declare fails it"},
		{`{"list":[{"n":2},{"n":3}]}`, "argument list[1].n: not a multiple of 2"},
		{`{"list":[{"n":2},{}]}`, "argument list[1].n: required"},
		{`{"list":[{"n":2},{"n":2},{"n":2}]}`, "argument list: more than 2 items"},
		{`{"z":10,"a":{"b":"x"}}`, "argument a.b: shorter than 3"},
		{`{"z":10}`, "argument z: not below 10"},
	} {
		v, err := schemas.Decode([]byte(tc.args))
		if err != nil {
			t.Fatal(err)
		}
		verr := sch.Validate(v)
		if verr == nil {
			t.Fatalf("%s: valid, want %q", tc.args, tc.want)
		}
		got := schemas.Explain(sch, verr)
		if got != tc.want {
			t.Errorf("%s: %q, want %q", tc.args, got, tc.want)
		}
		if strings.Contains(got, "secret") {
			t.Errorf("%s: %q echoes an undeclared name", tc.args, got)
		}
	}
}
