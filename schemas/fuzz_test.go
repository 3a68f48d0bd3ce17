package schemas_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/okso-io/okso/schemas"
)

// FuzzValidateManifest feeds arbitrary bytes to the manifest schema. It must
// never panic, and a manifest it accepts must be plain JSON whose every
// capability names a kind and verbs of the Go kind table.
func FuzzValidateManifest(f *testing.F) {
	for _, kind := range []string{"valid", "invalid"} {
		files, _ := filepath.Glob(filepath.Join("testdata", kind, "manifest@1.0.0", "*.json"))
		for _, p := range files {
			b, err := os.ReadFile(p)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b)
		}
	}
	f.Add([]byte(""))
	f.Add([]byte("null"))
	f.Add([]byte(`{"node_id":1e999}`))
	f.Add([]byte(strings.Repeat("[", 20000)))
	f.Add([]byte(`{"capabilities":[{"kind":"system.echo","verbs":{"length":1}}]}`))

	s, err := schemas.Load()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		if err := s.ValidateJSON(schemas.Manifest, doc); err != nil {
			return
		}
		var m struct {
			NodeID       string `json:"node_id"`
			Capabilities []struct {
				Kind        string   `json:"kind"`
				Verbs       []string `json:"verbs"`
				SafetyClass string   `json:"safety_class"`
				SchemaRef   string   `json:"schema_ref"`
			} `json:"capabilities"`
		}
		if err := json.Unmarshal(doc, &m); err != nil {
			t.Fatalf("accepted manifest does not decode: %v\n%q", err, doc)
		}
		if len(m.Capabilities) == 0 {
			t.Fatalf("accepted manifest has no capability: %q", doc)
		}
		for _, c := range m.Capabilities {
			k, ok := schemas.LookupKind(c.Kind)
			if !ok {
				// The schema admits any kind's name; the kind table
				// is the closed set, and Project its gate.
				var caps []schemas.Capability
				if err := json.Unmarshal(doc, &struct {
					Caps *[]schemas.Capability `json:"capabilities"`
				}{&caps}); err != nil {
					t.Fatal(err)
				}
				if _, err := schemas.Project(m.NodeID, caps); err == nil {
					t.Fatalf("projected unknown kind %q", c.Kind)
				}
				return
			}
			var inputs []string
			for _, v := range k.Verbs {
				inputs = append(inputs, v.Input)
			}
			for _, v := range c.Verbs {
				if _, ok := k.Verb(v); !ok {
					t.Fatalf("accepted verb %q for kind %s", v, c.Kind)
				}
			}
			if !slices.Contains(inputs, c.SchemaRef) {
				t.Fatalf("accepted schema_ref %q for kind %s", c.SchemaRef, c.Kind)
			}
			if k.Safety != "" && c.SafetyClass != k.Safety { // local.tool clamps none
				t.Fatalf("accepted safety_class %q for kind %s", c.SafetyClass, c.Kind)
			}
		}
	})
}
