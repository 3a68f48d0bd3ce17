package schemas

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// quickIDs are the schemas with a quick form, in a fixed order.
func quickIDs(s *Set) []string {
	var ids []string
	for id := range s.quick {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// golden returns the golden documents of a schema: kind is valid or
// invalid.
func golden(t testing.TB, kind, id string) [][]byte {
	files, err := filepath.Glob(filepath.Join("testdata", kind, strings.TrimPrefix(id, IDPrefix), "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	var docs [][]byte
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, b)
	}
	return docs
}

// FuzzQuick: a document a quick schema accepts is one the general
// validator accepts.
func FuzzQuick(f *testing.F) {
	s, err := Load()
	if err != nil {
		f.Fatal(err)
	}
	ids := seedQuick(f, s,
		`{"message":"é","received_at_ms":1.7e12,"node_id":"01m80hetn3a3x84z368v26yy0p","cpu_pct":100.0000001}`,
		`{"ts_ms":-1,"level":"high","pin":1.0,"interval_ms":0.5e3}`)
	f.Fuzz(func(t *testing.T, i uint8, doc []byte) {
		id := ids[int(i)%len(ids)]
		v, err := Decode(doc)
		if err != nil || !s.quick[id].accepts(v) {
			return
		}
		if err := s.compiled[id].Validate(v); err != nil {
			t.Fatalf("%s: quick accepts %s, the validator refuses it: %v", id, doc, err)
		}
	})
}

// FuzzQuickJSON: a document in its text that a quick schema accepts
// decodes, and is one the general validator accepts.
func FuzzQuickJSON(f *testing.F) {
	s, err := Load()
	if err != nil {
		f.Fatal(err)
	}
	ids := seedQuick(f, s,
		`{"message":"ping","received_at_ms":1745236800012,"node_id":"01hzx9k3m4p7q8r9s0t1v2w3xy"}`,
		`{"message":"p","message":"q"}`, ` {"message" : "p"} `, `{"message":"p"} x`, `"p"`, `{"message":"\u0070"}`,
		`{"interval_ms":1000}`, `{"interval_ms":1000.0}`, `{"interval_ms":1e3}`, `{"interval_ms":-0}`, `{"interval_ms":01000}`,
		`{"level":1}`, `{"level":true}`, `{"level":null}`, `{"ts_ms":123456789012345678901}`, `{"cpu_pct":-.5}`, `{"cpu_pct":1.}`)
	f.Fuzz(func(t *testing.T, i uint8, doc []byte) {
		id := ids[int(i)%len(ids)]
		if !s.quick[id].acceptsJSON(doc) {
			return
		}
		v, err := Decode(doc)
		if err != nil {
			t.Fatalf("%s: quick accepts %s, which does not decode: %v", id, doc, err)
		}
		if err := s.compiled[id].Validate(v); err != nil {
			t.Fatalf("%s: quick accepts %s, the validator refuses it: %v", id, doc, err)
		}
	})
}

// seedQuick adds to f's corpus, for each schema with a quick form, its
// golden documents and extra, and returns those schemas' ids.
func seedQuick(f *testing.F, s *Set, extra ...string) []string {
	ids := quickIDs(s)
	for i, id := range ids {
		for _, kind := range []string{"valid", "invalid"} {
			for _, doc := range golden(f, kind, id) {
				f.Add(uint8(i), doc)
			}
		}
		for _, doc := range extra {
			f.Add(uint8(i), []byte(doc))
		}
	}
	return ids
}

// ownTools are the schemas of okso's own tools (the fleet tools) that no
// quick form covers: not a device verb's, checked once per fan-out or
// search rather than on every call, and beyond the plain shape a quick
// form takes (arrays of filters, label maps, fleet.call.output's oneOf).
// okso.find_tools.input, flat since the host rules (TestHostSafe), has one.
var ownTools = []string{FleetSelector, FleetNodesInput, FleetNodesOutput, FleetCallInput, FleetCallOutput,
	FindToolsOutput}

// TestQuickCovers: every verb schema has a quick form, which accepts the
// golden valid documents (so calls take it) and declines the invalid ones.
func TestQuickCovers(t *testing.T) {
	s, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	for id := range s.compiled {
		if id == Manifest || id == Envelope || id == ErrorEnvelope ||
			id == IDPrefix+"remotes.config@1.0.0" || id == IDPrefix+"oauth.issuers@1.0.0" || id == AgentTools || id == KindDefinition { // config files, read once at start
			continue
		}
		if slices.Contains(ownTools, id) {
			continue
		}
		q := s.quick[id]
		if q == nil {
			t.Errorf("%s: no quick form", id)
			continue
		}
		for _, doc := range golden(t, "valid", id) {
			if v, err := Decode(doc); err != nil || !q.accepts(v) {
				t.Errorf("%s: quick declines the valid %s", id, doc)
			}
			if !q.acceptsJSON(bytes.TrimSpace(doc)) && plainJSON(doc) {
				t.Errorf("%s: quick declines the valid %s in its text", id, doc)
			}
		}
		for _, doc := range golden(t, "invalid", id) {
			if v, err := Decode(doc); err == nil && q.accepts(v) {
				t.Errorf("%s: quick accepts the invalid %s", id, doc)
			}
			if q.acceptsJSON(doc) {
				t.Errorf("%s: quick accepts the invalid %s in its text", id, doc)
			}
		}
	}
}

// plainJSON reports whether a document is written the plain way the text
// path takes (no escapes, nothing outside printable ASCII, no arrays).
func plainJSON(doc []byte) bool {
	for _, c := range bytes.TrimSpace(doc) {
		if c == '\\' || c == '[' || c < 0x20 && c != '\n' && c != '\t' && c != '\r' || c >= 0x7f {
			return false
		}
	}
	return true
}

// FuzzClassRun: a pattern compiled to a class run matches exactly what Go's
// regexp engine matches.
func FuzzClassRun(f *testing.F) {
	patterns := []string{`^[0-9a-hjkmnp-tv-z]{26}$`, `^[\x20-\x7E]*$`, `^[\x21-\x7E]+$`, `^[a-z0-9_]{1,24}$`,
		`^[0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{26}$`, `^[a-c]{2,}$`, `^[\x00-\x7f]{0,3}$`}
	for i := range patterns {
		for _, s := range []string{"", "a", "01hzx9k3m4p7q8r9s0t1v2w3xy", "01hzx9k3m4p7q8r9s0t1v2w3xu", "ab c", "é", "a\n", "_"} {
			f.Add(uint8(i), s)
		}
	}
	f.Fuzz(func(t *testing.T, i uint8, s string) {
		p := patterns[int(i)%len(patterns)]
		c := compileClassRun(p)
		if c == nil {
			t.Fatalf("%s: no class run", p)
		}
		if got, want := c.match(s), regexp.MustCompile(p).MatchString(s); got != want {
			t.Fatalf("%s on %q: class run %v, regexp %v", p, s, got, want)
		}
	})
}

// foreignQuick are foreign schemas of the plain shape, for the fuzz
// targets: caller_tool_response's input schema (as mcp declares it) and
// tools' input schemas as clients declare them.
var foreignQuick = []string{
	`{"type":"object","properties":{"listen_id":{"type":"string","minLength":1,"maxLength":64},` +
		`"request_id":{"type":"string","minLength":1,"maxLength":64},"result":{"description":"the tool's result"},` +
		`"error":{"type":"string","maxLength":4096}},"required":["listen_id","request_id"],"additionalProperties":false,` +
		`"oneOf":[{"required":["result"]},{"required":["error"]}]}`,
	`{"type":"object","properties":{"message":{"type":"string"}},"required":["message"]}`,
	`{"type":"object","properties":{"a":{"type":"integer","minimum":0},"b":{"enum":["x","y"]}},"additionalProperties":false,` +
		`"oneOf":[{"required":["a"]},{"required":["b"]},{"required":["a","b"]}]}`,
	`{"oneOf":[{"required":["a"]},{"required":[]}],"properties":{"a":{}}}`,
	`{"oneOf":[{"required":["z"]}],"properties":{"a":{}},"additionalProperties":false}`,
}

// FuzzQuickForeign: a document that the quick form of a foreign schema
// accepts, decoded or in its text, is one the general validator accepts.
func FuzzQuickForeign(f *testing.F) {
	var fs []*Foreign
	for _, s := range foreignQuick {
		c, err := CompileForeign(json.RawMessage(s))
		if err != nil || c.quick == nil {
			f.Fatalf("%s: no quick form (%v)", s, err)
		}
		fs = append(fs, c)
	}
	for i := range fs {
		for _, doc := range []string{
			`{"listen_id":"l","request_id":"r","result":{"message":"1"}}`, `{"listen_id":"l","request_id":"r","error":"e"}`,
			`{"listen_id":"l","request_id":"r","result":1,"error":"e"}`, `{"listen_id":"l","request_id":"r"}`,
			`{"listen_id":"","request_id":"r","result":null}`, `{"message":"x"}`, `{"message":1}`, `{"a":1}`, `{"b":"x"}`,
			`{"a":1,"b":"y"}`, `{"a":-1}`, `{}`, `[]`, `"s"`, `{"a":1,"a":2}`, ` {"a":1} `, `{"a":1}x`,
		} {
			f.Add(uint8(i), []byte(doc))
		}
	}
	f.Fuzz(func(t *testing.T, i uint8, doc []byte) {
		c := fs[int(i)%len(fs)]
		text := c.quick.acceptsJSON(doc)
		v, err := Decode(doc)
		if err != nil {
			if text {
				t.Fatalf("%s: quick accepts %s, which does not decode: %v", foreignQuick[int(i)%len(fs)], doc, err)
			}
			return
		}
		if (text || c.quick.accepts(v)) && c.root.Validate(v) != nil {
			t.Fatalf("%s: quick accepts %s, the validator refuses it: %v", foreignQuick[int(i)%len(fs)], doc, c.root.Validate(v))
		}
	})
}

// TestQuickForeignCovers: an answer to a relayed call, and the arguments
// of a declared tool, take the quick form (an error answer even in its
// text; a result is any value, which only its decoded form can show
// free of duplicate keys); a foreign schema naming another draft has
// none.
func TestQuickForeignCovers(t *testing.T) {
	for i, doc := range []string{
		`{"listen_id":"01kbx5q3m8v1f7r2p4w6y9z0ab","request_id":"01kbx5q3m9v1f7r2p4w6y9z0ac","result":{"message":"1"}}`,
		`{"message":"1"}`,
	} {
		c, err := CompileForeign(json.RawMessage(foreignQuick[i]))
		if err != nil {
			t.Fatal(err)
		}
		if v, err := Decode([]byte(doc)); err != nil || !c.quick.accepts(v) {
			t.Errorf("%s: quick declines %s decoded", foreignQuick[i], doc)
		}
	}
	c, err := CompileForeign(json.RawMessage(foreignQuick[0]))
	if err != nil {
		t.Fatal(err)
	}
	if doc := `{"listen_id":"01kbx5q3m8v1f7r2p4w6y9z0ab","request_id":"01kbx5q3m9v1f7r2p4w6y9z0ac","error":"failed"}`; !c.quick.acceptsJSON([]byte(doc)) {
		t.Errorf("quick declines %s in its text", doc)
	}
	c, err = CompileForeign(json.RawMessage(`{"$schema":"http://json-schema.org/draft-07/schema#","type":"object"}`))
	if err != nil || c.quick != nil {
		t.Errorf("draft-07: quick form %v (%v)", c.quick, err)
	}
}

// BenchmarkForeignValidate is the check of a relayed call's answer, a
// caller_tool_response, against its schema (a foreign one, with oneOf).
func BenchmarkForeignValidate(b *testing.B) {
	f, err := CompileForeign(json.RawMessage(foreignQuick[0]))
	if err != nil {
		b.Fatal(err)
	}
	doc := []byte(`{"listen_id":"01kbx5q3m8v1f7r2p4w6y9z0ab","request_id":"01kbx5q3m9v1f7r2p4w6y9z0ac","result":{"message":"1"}}`)
	b.ReportAllocs()
	for b.Loop() {
		if err := f.ValidateJSON(doc); err != nil {
			b.Fatal(err)
		}
	}
}
