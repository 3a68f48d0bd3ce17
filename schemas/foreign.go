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
// input or output schema, a caller tool's declaration. It is compiled
// once, when the tool is listed, within okso's bounds (bounds.go), and
// checks documents as the embedded schemas do (strict JSON, no duplicate
// keys), under the draft its $schema names (2020-12 when it names none).
// It never fetches anything: a $ref outside the document is a compile
// error. It is safe for concurrent use.
type Foreign struct {
	root *jsonschema.Schema
	// quick accepts, without the general validator, the documents of a
	// schema of the plain shape under draft 2020-12; nil: none.
	quick *quick
	lim   limits
}

// draft2020 is the $schema of JSON Schema 2020-12, the draft of a foreign
// schema that names none.
const draft2020 = "https://json-schema.org/draft/2020-12/schema"

// foreignURL names a foreign schema inside its own compiler.
const foreignURL = "mcp://foreign/schema.json"

// CompileForeign compiles a schema okso did not write.
func CompileForeign(raw json.RawMessage) (*Foreign, error) {
	if len(raw) > MaxForeignSchema {
		return nil, &BoundError{Bound: "size", Limit: MaxForeignSchema}
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("schema is not JSON: %w", err)
	}
	if _, ok := doc.(map[string]any); !ok {
		return nil, errors.New("schema is not a JSON object")
	}
	if err := checkDoc(doc, 1); err != nil {
		return nil, err
	}
	patterns := &patternSizer{size: map[string]int{}}
	c := jsonschema.NewCompiler()
	c.UseLoader(refuseLoader{})
	c.UseRegexpEngine(patterns.compile)
	c.DefaultDraft(jsonschema.Draft2020)
	if err := c.AddResource(foreignURL, doc); err != nil {
		return nil, fmt.Errorf("schema: %w", err)
	}
	root, err := c.Compile(foreignURL)
	if err != nil {
		if patterns.past != nil {
			return nil, patterns.past
		}
		return nil, fmt.Errorf("schema does not compile: %w", err)
	}
	lim, err := analyse(root, patterns)
	if err != nil {
		return nil, err
	}
	f := &Foreign{root: root, lim: lim}
	// The quick form reads its keywords as 2020-12 does: a schema that
	// names another draft is left to the general validator.
	if d, named := doc.(map[string]any)["$schema"]; !named || d == draft2020 || d == draft2020+"#" {
		f.quick = compileQuick(doc)
	}
	return f, nil
}

// ValidateJSON decodes one JSON document (strictly: duplicate keys and
// trailing data are errors) and validates it, within the schema's
// bounds as [Foreign.Validate] does.
func (f *Foreign) ValidateJSON(doc []byte) error {
	// A document has at most as many values, and bytes of text, as it
	// has bytes: one that cannot cost more than the budget is checked
	// at once; another is decoded, and sized, first.
	if f.quick != nil && f.lim.cost(len(doc), len(doc)) <= ForeignBudget && f.quick.acceptsJSON(doc) {
		return nil
	}
	v, err := Decode(doc)
	if err != nil {
		return err
	}
	return f.Validate(v)
}

// Validate validates a value decoded by [Decode], within the schema's
// bounds: a value past one (a number too long to compare, a value
// nested too deep for a recursive schema, or one that would cost more
// than [ForeignBudget] to check) is refused unchecked, with a
// [*ValueError].
func (f *Foreign) Validate(v any) error {
	n, b, err := checkValue(v, f.lim.deep)
	if err != nil {
		return err
	}
	if cost := f.lim.cost(n, b); cost > ForeignBudget {
		return &ValueError{Why: fmt.Sprintf("too large for this schema to check: %d values and %d bytes of text would cost %d steps, over %d", n, b, cost, ForeignBudget)}
	}
	if f.quick != nil && f.quick.accepts(v) {
		return nil
	}
	return f.root.Validate(v)
}

// Work is the most checking one value costs, in steps of about 10 ns:
// per member or item, and per byte of text (bounds.go).
func (f *Foreign) Work() (perValue, perByte int) { return f.lim.evalWork, f.lim.textWork }

// Explain says why arguments failed, as [Explain] does for embedded
// schemas: the failing argument when the schema declares it, never what
// the caller sent.
func (f *Foreign) Explain(err error) string { return Explain(f.root, err) }
