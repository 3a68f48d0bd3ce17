package schemas_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/okso-io/okso/schemas"
)

type noLoader struct{}

func (noLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("%s: standalone form refers out", url)
}

// TestStandalone: every schema's standalone form refers to nothing, and
// takes and refuses exactly the golden documents the set's schema does.
func TestStandalone(t *testing.T) {
	s := load(t)
	for _, name := range embeddedNames(t) {
		id := schemas.IDPrefix + name
		doc, ok := s.Standalone(id)
		if !ok {
			t.Errorf("%s: no standalone form", id)
			continue
		}
		if bytes.Contains(doc, []byte(`"$ref"`)) || bytes.Contains(doc, []byte(`"$defs"`)) ||
			bytes.Contains(doc, []byte(`"$comment"`)) {
			t.Errorf("%s: standalone form still refers or comments: %s", id, doc)
		}
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		c := jsonschema.NewCompiler()
		c.UseLoader(noLoader{})
		if err := c.AddResource("mem://standalone/"+name, v); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		alone, err := c.Compile("mem://standalone/" + name)
		if err != nil {
			t.Errorf("%s: standalone form does not compile alone: %v", id, err)
			continue
		}
		files, _ := filepath.Glob(filepath.Join("testdata", "*", name, "*.json"))
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			want := s.ValidateJSON(id, b) == nil
			x, err := schemas.Decode(b)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if got := alone.Validate(x) == nil; got != want {
				t.Errorf("%s: standalone valid %v, the set's schema %v", f, got, want)
			}
			if strings.Contains(f, "/valid/") != want {
				t.Errorf("%s: the set's schema says valid %v", f, want)
			}
		}
	}
	if _, ok := s.Standalone(schemas.IDPrefix + "nope@1.0.0"); ok {
		t.Error("Standalone returns an unknown schema")
	}
}
