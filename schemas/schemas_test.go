package schemas_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"

	"github.com/okso-io/okso/schemas"
)

func load(t testing.TB) *schemas.Set {
	t.Helper()
	s, err := schemas.Load()
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return s
}

// embeddedNames returns the names (file name without .json) of the schema
// files in the package directory, which are the files that are embedded.
func embeddedNames(t testing.TB) []string {
	t.Helper()
	paths, err := filepath.Glob("*.json")
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) == 0 {
		t.Fatal("no schema files found")
	}
	var names []string
	for _, p := range paths {
		names = append(names, strings.TrimSuffix(p, ".json"))
	}
	return names
}

// The golden data lives in testdata/{valid,invalid}/<schema name>/*.json.
// An invalid file is named <case>.<keyword>.json: it must fail validation
// (not decoding), and some error in the result must come from <keyword>,
// so an invalid file cannot pass for the wrong reason.
func TestGolden(t *testing.T) {
	s := load(t)
	// Schemas that must have both valid and invalid golden data.
	required := []string{
		"system.echo.invoke.input@1.0.0",
		"system.echo.invoke.output@1.0.0",
		"manifest@1.0.0",
		"system.metrics.subscribe.input@1.0.0",
		"system.metrics.subscribe.frame@1.0.0",
		"envelope@1.0.0",
		"error@1.0.0",
		"fleet.selector@1.0.0",
		"fleet.nodes.input@1.0.0",
		"fleet.nodes.output@1.0.0",
		"fleet.call.input@1.0.0",
		"fleet.call.output@1.0.0",
		"okso.find_tools.input@1.0.0",
		"okso.find_tools.output@1.0.0",
		"local.tool.run.input@1.0.0",
		"local.tool.run.output@1.0.0",
		"agent.tools@1.0.0",
	}
	seen := map[string]map[string]int{"valid": {}, "invalid": {}}
	for _, kind := range []string{"valid", "invalid"} {
		dirs, err := os.ReadDir(filepath.Join("testdata", kind))
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range dirs {
			if !d.IsDir() {
				t.Errorf("testdata/%s/%s: want only schema directories", kind, d.Name())
				continue
			}
			name := d.Name()
			id := schemas.IDPrefix + name
			if !s.Has(id) {
				t.Errorf("testdata/%s/%s: no embedded schema %s", kind, name, id)
				continue
			}
			files, err := filepath.Glob(filepath.Join("testdata", kind, name, "*.json"))
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range files {
				seen[kind][name]++
				t.Run(kind+"/"+name+"/"+filepath.Base(f), func(t *testing.T) {
					doc, err := os.ReadFile(f)
					if err != nil {
						t.Fatal(err)
					}
					err = s.ValidateJSON(id, doc)
					if kind == "valid" {
						if err != nil {
							t.Fatalf("want valid, got %v", err)
						}
						return
					}
					if err == nil {
						t.Fatal("want invalid, got valid")
					}
					var verr *jsonschema.ValidationError
					if !errors.As(err, &verr) {
						t.Fatalf("want a validation error, got %T: %v", err, err)
					}
					base := strings.TrimSuffix(filepath.Base(f), ".json")
					dot := strings.LastIndexByte(base, '.')
					if dot < 0 {
						t.Fatalf("invalid file %s must be named <case>.<keyword>.json", f)
					}
					want := base[dot+1:]
					if kws := keywords(verr); !slices.Contains(kws, want) {
						t.Fatalf("want a %q error, got keywords %v: %v", want, kws, err)
					}
				})
			}
		}
	}
	for _, name := range required {
		for _, kind := range []string{"valid", "invalid"} {
			if seen[kind][name] == 0 {
				t.Errorf("no %s golden data for %s", kind, name)
			}
		}
	}
	for _, name := range embeddedNames(t) {
		if seen["valid"][name] == 0 {
			t.Errorf("no valid golden data for embedded schema %s", name)
		}
	}
}

// keywords returns the last keyword of every error in the tree.
func keywords(e *jsonschema.ValidationError) []string {
	var out []string
	if p := e.ErrorKind.KeywordPath(); len(p) > 0 {
		out = append(out, p[len(p)-1])
	}
	switch e.ErrorKind.(type) {
	case *kind.Not: // its KeywordPath is empty
		out = append(out, "not")
	case *kind.DependentRequired: // its KeywordPath ends with the property
		out = append(out, "dependentRequired")
	case *kind.FalseSchema:
		// Its KeywordPath is empty; the schema that failed is the false
		// one at the end of SchemaURL, e.g. .../unevaluatedProperties.
		if i := strings.LastIndexByte(e.SchemaURL, '/'); i >= 0 {
			out = append(out, e.SchemaURL[i+1:])
		}
	}
	for _, c := range e.Causes {
		out = append(out, keywords(c)...)
	}
	return out
}

func TestEverySchemaCompiles(t *testing.T) {
	s := load(t)
	names := embeddedNames(t)
	for _, name := range names {
		id := schemas.IDPrefix + name
		if !s.Has(id) {
			t.Errorf("%s.json: not loaded as %s", name, id)
			continue
		}
		raw, ok := s.Raw(id)
		if !ok {
			t.Errorf("Raw(%s): missing", id)
			continue
		}
		file, err := os.ReadFile(name + ".json")
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(raw, file) {
			t.Errorf("Raw(%s) differs from %s.json", id, name)
		}
		var doc struct {
			Schema string `json:"$schema"`
			ID     string `json:"$id"`
		}
		if err := json.Unmarshal(file, &doc); err != nil {
			t.Errorf("%s.json: %v", name, err)
			continue
		}
		if doc.ID != id {
			t.Errorf("%s.json: $id %q, want %q", name, doc.ID, id)
		}
		if doc.Schema != "https://json-schema.org/draft/2020-12/schema" {
			t.Errorf("%s.json: $schema %q, want draft 2020-12", name, doc.Schema)
		}
	}
	for _, id := range []string{
		schemas.EchoInput, schemas.EchoOutput, schemas.MetricsSnapInput, schemas.MetricsSnapshot,
		schemas.MetricsSubInput, schemas.MetricsFrame, schemas.Manifest, schemas.Envelope,
		schemas.ErrorEnvelope, schemas.FleetSelector, schemas.FleetNodesInput, schemas.FleetNodesOutput,
		schemas.FleetCallInput, schemas.FleetCallOutput, schemas.FindToolsInput, schemas.FindToolsOutput,
	} {
		if !s.Has(id) {
			t.Errorf("well-known schema %s is not embedded", id)
		}
	}
	if s.Has(schemas.IDPrefix + "nope@1.0.0") {
		t.Error("Has reports an unknown schema")
	}
	if _, ok := s.Raw(schemas.IDPrefix + "nope@1.0.0"); ok {
		t.Error("Raw returns an unknown schema")
	}
}

func TestValidateErrors(t *testing.T) {
	s := load(t)
	if err := s.ValidateJSON(schemas.IDPrefix+"nope@1.0.0", []byte(`{}`)); !errors.Is(err, schemas.ErrUnknownSchema) {
		t.Errorf("unknown schema: got %v, want ErrUnknownSchema", err)
	}
	for _, doc := range []string{"", "   \n", `{"message":`, `{"message":"a"} {"message":"b"}`, `{"message":"a"} x`, "\xff"} {
		if err := s.ValidateJSON(schemas.EchoInput, []byte(doc)); err == nil {
			t.Errorf("ValidateJSON(%q): want an error", doc)
		}
	}
	// Validate takes values made of the types jsonschema.UnmarshalJSON returns.
	if err := s.Validate(schemas.EchoInput, map[string]any{"message": "ping"}); err != nil {
		t.Errorf("Validate: %v", err)
	}
	if err := s.Validate(schemas.EchoInput, map[string]any{"message": "ping", "x": json.Number("1")}); err == nil {
		t.Error("Validate: extra property accepted")
	}
}

// A document with a duplicate member name is refused: the validator would
// check the last value while a first-wins consumer of the forwarded raw
// document would use the first.
func TestDuplicateKeys(t *testing.T) {
	s := load(t)
	for _, tc := range []struct {
		id, doc string
		ok      bool
	}{
		{schemas.EchoInput, `{"message":"ping"}`, true},
		{schemas.EchoInput, `{"message":"café","message":"ping"}`, false},
		{schemas.EchoInput, `{"message":"ping","message":"ping"}`, false},
		{schemas.EchoInput, `{"message":"ping","\u006dessage":"x"}`, false},
		{schemas.Manifest, `{"node_id":"01hzx9k3m4p7q8r9s0t1v2w3xy","agent":{"name":"a","version":"1"},` +
			`"capabilities":[{"cap_id":"echo","kind":"system.shell","kind":"system.echo",` +
			`"schema_ref":"mcp://schemas/system.echo.invoke.input@1.0.0","verbs":["invoke"],"safety_class":"read_only"}]}`, false},
		{schemas.Manifest, `{"node_id":"01hzx9k3m4p7q8r9s0t1v2w3xy","agent":{"name":"a","version":"1"},` +
			`"capabilities":[{"cap_id":"echo","kind":"system.echo",` +
			`"schema_ref":"mcp://schemas/system.echo.invoke.input@1.0.0","verbs":["invoke"],"safety_class":"read_only"},` +
			`{"cap_id":"echo2","kind":"system.echo",` +
			`"schema_ref":"mcp://schemas/system.echo.invoke.input@1.0.0","verbs":["invoke"],"safety_class":"read_only"}]}`, true},
		{schemas.Envelope, `{"type":"cmd","msg_id":"01HZXC0000000000000000SRV0","payload":{"type":"x","payload":{"type":1}}}`, true},
		{schemas.Envelope, `{"type":"cmd","msg_id":"01HZXC0000000000000000SRV0","payload":{"a":[{"b":1},{"b":2}],"c":{}}}`, true},
		{schemas.Envelope, `{"type":"cmd","msg_id":"01HZXC0000000000000000SRV0","payload":{"a":[{"b":1,"b":2}]}}`, false},
		{schemas.Envelope, `{"type":"cmd","msg_id":"01HZXC0000000000000000SRV0","payload":{"a":{},"a":[]}}`, false},
	} {
		err := s.ValidateJSON(tc.id, []byte(tc.doc))
		if (err == nil) != tc.ok {
			t.Errorf("ValidateJSON(%s, %s) = %v, want ok %v", tc.id, tc.doc, err, tc.ok)
		}
		if _, err := schemas.Decode([]byte(tc.doc)); (err == nil) != tc.ok {
			t.Errorf("Decode(%s) = %v, want ok %v", tc.doc, err, tc.ok)
		}
	}
}

func TestHandler(t *testing.T) {
	s := load(t)
	h := s.Handler()
	want, err := os.ReadFile("system.echo.invoke.input@1.0.0.json")
	if err != nil {
		t.Fatal(err)
	}

	// Through a real server, mounted as the gateway mounts it.
	mux := http.NewServeMux()
	mux.Handle("/schemas/", h)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	res, err := http.Get(srv.URL + "/schemas/system.echo.invoke.input@1.0.0")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want 200", res.StatusCode)
	}
	if ct := res.Header.Get("Content-Type"); ct != "application/schema+json" {
		t.Errorf("Content-Type %q, want application/schema+json", ct)
	}
	if !bytes.Equal(body, want) {
		t.Errorf("body differs from the embedded file:\n%s", body)
	}

	// Every embedded schema is served under its name.
	for _, name := range embeddedNames(t) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/schemas/"+name, nil))
		file, _ := os.ReadFile(name + ".json")
		if rec.Code != http.StatusOK || !bytes.Equal(rec.Body.Bytes(), file) {
			t.Errorf("GET /schemas/%s: status %d, body equal %v", name, rec.Code, bytes.Equal(rec.Body.Bytes(), file))
		}
	}

	// Directly, so the handler itself sees the raw paths (no ServeMux cleaning).
	for _, tc := range []struct {
		method, target string
		code           int
	}{
		{http.MethodHead, "/schemas/system.echo.invoke.input@1.0.0", http.StatusOK},
		{http.MethodGet, "/schemas/nope@1.0.0", http.StatusNotFound},
		{http.MethodGet, "/schemas/system.echo.invoke.input@1.0.0.json", http.StatusNotFound},
		{http.MethodGet, "/schemas/system.echo.invoke.input@2.0.0", http.StatusNotFound},
		{http.MethodGet, "/schemas/system.echo.invoke.input", http.StatusNotFound},
		{http.MethodGet, "/schemas/", http.StatusNotFound},
		{http.MethodGet, "/schemas/../go.mod", http.StatusNotFound},
		{http.MethodGet, "/schemas/..%2fgo.mod", http.StatusNotFound},
		{http.MethodGet, "/schemas/../schemas.go", http.StatusNotFound},
		{http.MethodGet, "/schemas/./system.echo.invoke.input@1.0.0", http.StatusNotFound},
		{http.MethodGet, "/schemas//system.echo.invoke.input@1.0.0", http.StatusNotFound},
		{http.MethodGet, "/schemas/mcp://schemas/system.echo.invoke.input@1.0.0", http.StatusNotFound},
		{http.MethodGet, "/system.echo.invoke.input@1.0.0", http.StatusNotFound},
		{http.MethodGet, "/schemas/kinds.go", http.StatusNotFound},
		{http.MethodPost, "/schemas/system.echo.invoke.input@1.0.0", http.StatusMethodNotAllowed},
		{http.MethodPut, "/schemas/system.echo.invoke.input@1.0.0", http.StatusMethodNotAllowed},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(tc.method, tc.target, nil))
		if rec.Code != tc.code {
			t.Errorf("%s %s: status %d, want %d", tc.method, tc.target, rec.Code, tc.code)
		}
		if tc.code != http.StatusOK && bytes.Contains(rec.Body.Bytes(), []byte("module ")) {
			t.Errorf("%s %s: leaked a file: %s", tc.method, tc.target, rec.Body.Bytes())
		}
	}
	// Through the mux, path tricks never reach a file either.
	for _, p := range []string{"/schemas/../go.mod", "/schemas/%2e%2e/go.mod", "/schemas/..%2fgo.mod"} {
		req, err := http.NewRequest(http.MethodGet, srv.URL+p, nil)
		if err != nil {
			t.Fatal(err)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s via mux: status %d, want 404", p, res.StatusCode)
		}
		if bytes.Contains(b, []byte("module ")) {
			t.Errorf("GET %s via mux: leaked go.mod", p)
		}
	}
}

func TestLookupKind(t *testing.T) {
	s := load(t)
	for _, tc := range []struct {
		kind, short string
		verbs       []string
	}{
		{schemas.KindEcho, "sysecho", []string{"invoke"}},
		{schemas.KindMetrics, "sys", []string{"snapshot", "subscribe"}},
	} {
		k, ok := schemas.LookupKind(tc.kind)
		if !ok {
			t.Errorf("LookupKind(%s): not found", tc.kind)
			continue
		}
		if k.Name != tc.kind || k.Short != tc.short {
			t.Errorf("LookupKind(%s) = %s/%s, want %s/%s", tc.kind, k.Name, k.Short, tc.kind, tc.short)
		}
		var names []string
		for _, v := range k.Verbs {
			names = append(names, v.Name)
			if !s.Has(v.Input) || !s.Has(v.Output) {
				t.Errorf("%s %s: schemas %s / %s not embedded", tc.kind, v.Name, v.Input, v.Output)
			}
			if got, ok := k.Verb(v.Name); !ok || got != v {
				t.Errorf("%s.Verb(%s) = %v, %v", tc.kind, v.Name, got, ok)
			}
		}
		if !slices.Equal(names, tc.verbs) {
			t.Errorf("%s verbs %v, want %v", tc.kind, names, tc.verbs)
		}
		if _, ok := k.Verb("delete"); ok {
			t.Errorf("%s has verb delete", tc.kind)
		}
	}
	if v, _ := mustKind(t, schemas.KindEcho).Verb("invoke"); v.Input != schemas.EchoInput || v.Output != schemas.EchoOutput || v.Stream {
		t.Errorf("echo invoke = %+v", v)
	}
	if v, _ := mustKind(t, schemas.KindMetrics).Verb("subscribe"); v.Input != schemas.MetricsSubInput || v.Output != schemas.MetricsFrame || !v.Stream {
		t.Errorf("metrics subscribe = %+v", v)
	}
	for _, name := range []string{"", "system", "system.echo ", "System.Echo", "sysecho", "system.shell"} {
		if _, ok := schemas.LookupKind(name); ok {
			t.Errorf("LookupKind(%q) found", name)
		}
	}
}

func mustKind(t *testing.T, name string) schemas.Kind {
	t.Helper()
	k, ok := schemas.LookupKind(name)
	if !ok {
		t.Fatalf("LookupKind(%s): not found", name)
	}
	return k
}

// The manifest's kind is a pattern (the kind table is the closed set,
// and Project its gate): it must admit every built-in kind and verb, and
// every built-in kind must have its clamp in the manifest, each
// schema_ref it allows an input schema of one of that kind's verbs.
func TestManifestMatchesKindTable(t *testing.T) {
	raw, err := os.ReadFile("manifest@1.0.0.json")
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Defs struct {
			Capability struct {
				Properties struct {
					Kind struct {
						Pattern string `json:"pattern"`
					} `json:"kind"`
					Verbs struct {
						Items struct {
							Pattern string `json:"pattern"`
						} `json:"items"`
					} `json:"verbs"`
				} `json:"properties"`
				AllOf []struct {
					If struct {
						Properties struct {
							Kind struct {
								Const string `json:"const"`
							} `json:"kind"`
						} `json:"properties"`
					} `json:"if"`
					Then struct {
						Properties struct {
							SchemaRef struct {
								Const string   `json:"const"`
								Enum  []string `json:"enum"`
							} `json:"schema_ref"`
							Verbs struct {
								Items struct {
									Enum []string `json:"enum"`
								} `json:"items"`
							} `json:"verbs"`
						} `json:"properties"`
					} `json:"then"`
				} `json:"allOf"`
			} `json:"capability"`
		} `json:"$defs"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	kindRe := regexp.MustCompile(m.Defs.Capability.Properties.Kind.Pattern)
	verbRe := regexp.MustCompile(m.Defs.Capability.Properties.Verbs.Items.Pattern)
	clamped := map[string]bool{}
	for _, c := range m.Defs.Capability.AllOf {
		name := c.If.Properties.Kind.Const
		clamped[name] = true
		k, ok := schemas.LookupKind(name)
		if !ok {
			t.Errorf("clamp for kind %q not in the kind table", name)
			continue
		}
		var verbs, inputs []string
		for _, v := range k.Verbs {
			verbs = append(verbs, v.Name)
			inputs = append(inputs, v.Input)
		}
		if got := c.Then.Properties.Verbs.Items.Enum; !sameSet(got, verbs) {
			t.Errorf("kind %s: manifest verbs %v, table verbs %v", name, got, verbs)
		}
		refs := c.Then.Properties.SchemaRef.Enum
		if cst := c.Then.Properties.SchemaRef.Const; cst != "" {
			refs = append(refs, cst)
		}
		for _, ref := range refs {
			if !slices.Contains(inputs, ref) {
				t.Errorf("kind %s: manifest allows schema_ref %s, not an input of the kind", name, ref)
			}
		}
	}
	for _, name := range []string{schemas.KindEcho, schemas.KindMetrics, schemas.KindGPIO, schemas.KindLocal} {
		k, ok := schemas.LookupKind(name)
		if !ok {
			t.Fatalf("built-in kind %s not in the kind table", name)
		}
		if !kindRe.MatchString(name) {
			t.Errorf("the manifest's kind pattern refuses built-in kind %s", name)
		}
		for _, v := range k.Verbs {
			if !verbRe.MatchString(v.Name) {
				t.Errorf("the manifest's verb pattern refuses %s's verb %s", name, v.Name)
			}
		}
		if !clamped[name] {
			t.Errorf("built-in kind %q has no clamp in the manifest", name)
		}
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
