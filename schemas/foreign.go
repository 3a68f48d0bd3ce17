package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// MaxForeignSchema bounds the size of a schema okso did not write, such
// as a federated upstream's inputSchema.
const MaxForeignSchema = 256 << 10

// Foreign is a compiled schema that okso did not write: an upstream's
// input or output schema. It is compiled once, when the tool is listed,
// and checks documents as the embedded schemas do (strict JSON, no
// duplicate keys), under the draft its $schema names (2020-12 when it
// names none). It never fetches anything: a $ref outside the document is
// a compile error. It is safe for concurrent use.
type Foreign struct {
	root *jsonschema.Schema
	// quick accepts, without the general validator, the documents of a
	// schema of the plain shape under draft 2020-12; nil: none.
	quick *quick
}

// draft2020 is the $schema of JSON Schema 2020-12, the draft of a foreign
// schema that names none.
const draft2020 = "https://json-schema.org/draft/2020-12/schema"

// foreignURL names a foreign schema inside its own compiler.
const foreignURL = "mcp://foreign/schema.json"

// CompileForeign compiles a schema okso did not write.
func CompileForeign(raw json.RawMessage) (*Foreign, error) {
	if len(raw) > MaxForeignSchema {
		return nil, fmt.Errorf("schema of %d bytes, over %d", len(raw), MaxForeignSchema)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("schema is not JSON: %w", err)
	}
	if _, ok := doc.(map[string]any); !ok {
		return nil, errors.New("schema is not a JSON object")
	}
	c := jsonschema.NewCompiler()
	c.UseLoader(refuseLoader{})
	c.DefaultDraft(jsonschema.Draft2020)
	if err := c.AddResource(foreignURL, doc); err != nil {
		return nil, fmt.Errorf("schema: %w", err)
	}
	root, err := c.Compile(foreignURL)
	if err != nil {
		return nil, fmt.Errorf("schema does not compile: %w", err)
	}
	f := &Foreign{root: root}
	// The quick form reads its keywords as 2020-12 does: a schema that
	// names another draft is left to the general validator.
	if d, named := doc.(map[string]any)["$schema"]; !named || d == draft2020 || d == draft2020+"#" {
		f.quick = compileQuick(doc)
	}
	return f, nil
}

// ValidateJSON decodes one JSON document (strictly: duplicate keys and
// trailing data are errors) and validates it.
func (f *Foreign) ValidateJSON(doc []byte) error {
	if f.quick != nil && f.quick.acceptsJSON(doc) {
		return nil
	}
	v, err := Decode(doc)
	if err != nil {
		return err
	}
	return f.Validate(v)
}

// Validate validates a value decoded by [Decode].
func (f *Foreign) Validate(v any) error {
	if f.quick != nil && f.quick.accepts(v) {
		return nil
	}
	return f.root.Validate(v)
}

// Explain says why arguments failed, as [Explain] does for embedded
// schemas: the failing argument when the schema declares it, never what
// the caller sent.
func (f *Foreign) Explain(err error) string { return Explain(f.root, err) }
