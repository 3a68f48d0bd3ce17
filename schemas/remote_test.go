package schemas_test

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/okso-io/okso/schemas"
)

func TestValidUpstream(t *testing.T) {
	for name, want := range map[string]bool{
		"everything":               true,
		"ext":                      true,
		"a":                        true,
		"web_2":                    true,
		strings.Repeat("a", 16):    true,
		strings.Repeat("a", 17):    false,
		"":                         false,
		"2web":                     false,
		"_web":                     false,
		"Web":                      false,
		"web-2":                    false,
		"web.2":                    false,
		"fleet":                    false,
		"okso":                     false,
		"caller":                   false,
		"fleet2":                   true,
		"sysecho":                  false, // a kind_short
		"sys":                      false,
		"gpio":                     false,
		"local":                    false,
		"system":                   true,
		"web\n":                    false,
		"wéb":                      false,
		strings.Repeat("é", 3)[:2]: false,
	} {
		if got := schemas.ValidUpstream(name); got != want {
			t.Errorf("ValidUpstream(%q) = %v, want %v", name, got, want)
		}
	}
}

// FuzzValidUpstream: the hand check is DESIGN.md §9.1's regexp, less the
// reserved names and the kind_shorts.
func FuzzValidUpstream(f *testing.F) {
	re := regexp.MustCompile(`^[a-z][a-z0-9_]{0,15}$`)
	for _, s := range []string{"everything", "", "fleet", "a_1", "A", strings.Repeat("a", 17), "é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want := re.MatchString(s) && !schemas.IsReserved(s) && !schemas.IsKindShort(s)
		if got := schemas.ValidUpstream(s); got != want {
			t.Fatalf("ValidUpstream(%q) = %v, the rule says %v", s, got, want)
		}
	})
}

func TestRemoteToolName(t *testing.T) {
	ok := map[[2]string]string{
		{"everything", "echo"}:           "everything.echo",
		{"everything", "get-sum"}:        "everything.get-sum",
		{"ext", "echo_external"}:         "ext.echo_external",
		{"web", "Search_V2"}:             "web.Search_V2",
		{"web", strings.Repeat("x", 60)}: "web." + strings.Repeat("x", 60), // 64
		{"web", "a.b"}:                   "web.a.b",                        // listed as web-a-b
		{"web", "v1.search-all"}:         "web.v1.search-all",
	}
	for in, want := range ok {
		got, err := schemas.RemoteToolName(in[0], in[1])
		if err != nil || got != want {
			t.Errorf("RemoteToolName(%q, %q) = %q, %v; want %q", in[0], in[1], got, err, want)
		}
		u, tool, parsed := schemas.ParseRemoteToolName(got)
		if !parsed || u != in[0] || tool != in[1] {
			t.Errorf("ParseRemoteToolName(%q) = %q, %q, %v", got, u, tool, parsed)
		}
	}
	for in, wantErr := range map[[2]string]string{
		{"web", strings.Repeat("x", 61)}: "projected tool name would be 65 characters, over 64",
		{"web", "a b"}:                   "tool name has a character outside [A-Za-z0-9_.-]",
		{"web", "a/b"}:                   "tool name has a character outside [A-Za-z0-9_.-]",
		{"web", "é"}:                     "tool name has a character outside [A-Za-z0-9_.-]",
		{"sys", "x"}:                     "upstream name is not valid",
		{"web", ""}:                      "tool name is empty",
		{"fleet", "nodes"}:               "upstream name is not valid",
		{"Web", "x"}:                     "upstream name is not valid",
	} {
		got, err := schemas.RemoteToolName(in[0], in[1])
		if err == nil || err.Error() != wantErr {
			t.Errorf("RemoteToolName(%q, %q) = %q, %v; want the error %q", in[0], in[1], got, err, wantErr)
		}
	}
	for _, name := range []string{"", "web", "web.", ".x", "fleet.nodes", "sys.snapshot", "sysecho.01hzx9k3m4p7q8r9s0t1v2w3xy.echo.invoke"} {
		if u, tool, ok := schemas.ParseRemoteToolName(name); ok {
			t.Errorf("ParseRemoteToolName(%q) = %q, %q", name, u, tool)
		}
	}
}

func TestValidToolSchema(t *testing.T) {
	for raw, ok := range map[string]bool{
		`{"type":"object"}`:                       true,
		`{"type":"object","properties":{"a":{}}}`: true,
		`{"type":"array"}`:                        false,
		`{"properties":{}}`:                       false,
		`{"type":["object","null"]}`:              false,
		`{"TYPE":"object"}`:                       false,
		`{"type":"object","type":"object"}`:       false,
		`[]`:                                      false,
		`null`:                                    false,
		`{"type":"object"} {}`:                    false,
		``:                                        false,
	} {
		if err := schemas.ValidToolSchema(json.RawMessage(raw)); (err == nil) != ok {
			t.Errorf("ValidToolSchema(%s) = %v, want ok=%v", raw, err, ok)
		}
	}
}

// TestForeign: an upstream's schema is compiled once and checks
// documents as the embedded ones do, under the draft it names, and never
// reaches outside itself.
func TestForeign(t *testing.T) {
	draft7 := `{"$schema":"http://json-schema.org/draft-07/schema#","type":"object",
		"properties":{"a":{"type":"number"},"b":{"type":"number"}},"required":["a","b"],"additionalProperties":false}`
	f, err := schemas.CompileForeign(json.RawMessage(draft7))
	if err != nil {
		t.Fatal(err)
	}
	for doc, ok := range map[string]bool{
		`{"a":1,"b":2}`:       true,
		`{"a":1}`:             false,
		`{"a":"1","b":2}`:     false,
		`{"a":1,"b":2,"c":3}`: false,
		`{"a":1,"a":1,"b":2}`: false,
		`{"a":1,"b":2} x`:     false,
	} {
		if err := f.ValidateJSON([]byte(doc)); (err == nil) != ok {
			t.Errorf("ValidateJSON(%s) = %v, want ok=%v", doc, err, ok)
		}
	}
	err = f.ValidateJSON([]byte(`{"a":"x","b":2}`))
	if got := f.Explain(err); got != "argument a: not a number" && !strings.HasPrefix(got, "argument a:") {
		t.Errorf("Explain = %q, want the argument named", got)
	}
	err = f.ValidateJSON([]byte(`{"a":1,"b":2,"secret_name":3}`))
	if got := f.Explain(err); strings.Contains(got, "secret_name") {
		t.Errorf("Explain echoes an undeclared name: %q", got)
	}

	for name, raw := range map[string]string{
		"remote ref":     `{"type":"object","properties":{"a":{"$ref":"https://example.com/s.json"}}}`,
		"file ref":       `{"$ref":"file:///etc/passwd"}`,
		"not an object":  `[]`,
		"not JSON":       `{`,
		"bad keyword":    `{"type":"objet"}`,
		"too large":      `{"description":"` + strings.Repeat("x", schemas.MaxForeignSchema) + `"}`,
		"bad regex":      `{"type":"string","pattern":"("}`,
		"bad draft name": `{"$schema":"https://example.com/my-draft","type":"object"}`,
	} {
		if _, err := schemas.CompileForeign(json.RawMessage(raw)); err == nil {
			t.Errorf("%s: compiled", name)
		}
	}
	// A local $ref is fine.
	local := `{"type":"object","$defs":{"n":{"type":"number"}},"properties":{"a":{"$ref":"#/$defs/n"}}}`
	f, err = schemas.CompileForeign(json.RawMessage(local))
	if err != nil {
		t.Fatal(err)
	}
	if f.ValidateJSON([]byte(`{"a":"x"}`)) == nil {
		t.Error("a local $ref was not followed")
	}
}

// TestValidToolSchemaRefusesHeaderRouting: a schema that would make the
// SDK route an argument into a request header (and, malformed, panic in
// AddTool) is refused wherever it hides.
func TestValidToolSchemaRefusesHeaderRouting(t *testing.T) {
	for _, raw := range []string{
		`{"type":"object","properties":{"a":{"type":"array","x-mcp-header":"X"}}}`,
		`{"type":"object","properties":{"a":{"type":"string","x-mcp-header":"X-A"}}}`,
		`{"type":"object","$defs":{"d":{"anyOf":[{"x-mcp-header":"Y"}]}}}`,
	} {
		if err := schemas.ValidToolSchema(json.RawMessage(raw)); err == nil {
			t.Errorf("ValidToolSchema(%s) accepted", raw)
		}
	}
}

func TestTrimDescription(t *testing.T) {
	short := "Echoes."
	if got := schemas.TrimDescription(short); got != short {
		t.Errorf("TrimDescription(%q) = %q", short, got)
	}
	long := strings.Repeat("é", schemas.MaxDescription) // 2 bytes each
	got := schemas.TrimDescription(long)
	if len(got) > schemas.MaxDescription+len("…") || !strings.HasSuffix(got, "…") || !utf8.ValidString(got) {
		t.Errorf("TrimDescription of %d bytes = %d bytes, valid UTF-8 %v", len(long), len(got), utf8.ValidString(got))
	}
}
