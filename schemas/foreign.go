package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// MaxForeignSchema bounds the size of a schema okso did not write, such
// as a federated upstream's inputSchema: ten times the largest of the
// common public MCP servers' (testdata/servers). Compiling costs more
// than in proportion to the size (a schema of 10,000 properties, 100 KB,
// takes 0.5 s; of 20,000, 1.6 s), and each gateway compiles every
// listing and declaration.
const MaxForeignSchema = 64 << 10

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
	if err := checkDoc(doc); err != nil {
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
		return nil, compileError(err)
	}
	patterns.done = true
	lim, err := analyse(root, patterns)
	if err != nil {
		return nil, err
	}
	tame(root)
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
	// A document of n bytes has at most n values and n bytes of text,
	// and its numbers cost at most maxNumberCost per two bytes: one that
	// cannot cost more than the budget is checked at once; another is
	// decoded, and sized, first.
	n := len(doc)
	if f.quick != nil && f.lim.cost(size{values: n, bytes: n, numbers: n / 2 * maxNumberCost}) <= ForeignBudget && f.quick.acceptsJSON(doc) {
		return nil
	}
	v, err := Decode(doc)
	if err != nil {
		return err
	}
	return f.Validate(v)
}

// maxNumberCost is the most reading one number within the bounds costs.
const maxNumberCost = numberSteps + MaxNumberLength + MaxNumberExponent

// Validate validates a value decoded by [Decode], within the schema's
// bounds: a value past one (a number too long to compare, a value
// nested too deep for a recursive schema, or one that would cost more
// than [ForeignBudget] to check) is refused unchecked, with a
// [*ValueError].
func (f *Foreign) Validate(v any) error {
	s, err := checkValue(v, f.lim.deep)
	if err != nil {
		return err
	}
	if cost := f.lim.cost(s); cost > ForeignBudget {
		return &ValueError{Why: fmt.Sprintf("too large for this schema to check: %d values, %d bytes of text and numbers that cost %d would cost %d steps, over %d",
			s.values, s.bytes, s.numbers, cost, ForeignBudget)}
	}
	if f.quick != nil && f.quick.accepts(v) {
		return nil
	}
	if err := f.root.Validate(v); err != nil {
		return &checkError{root: f.root, err: err}
	}
	return nil
}

// checkError is a value's failure of a foreign schema. Its text is
// short, and never the value's: the validator's own says every failure
// of every subschema, as long as the value times the schema.
type checkError struct {
	root *jsonschema.Schema
	err  error
}

func (e *checkError) Error() string { return "fails its schema: " + Explain(e.root, e.err) }
func (e *checkError) Unwrap() error { return e.err }

// compileError says why the compiler refused a schema, briefly: its
// error for a schema that fails its metaschema lists every failure.
func compileError(err error) error {
	var meta *jsonschema.SchemaValidationError
	if errors.As(err, &meta) {
		var ve *jsonschema.ValidationError
		if errors.As(meta.Err, &ve) {
			leaf := firstLeaf(ve)
			return fmt.Errorf("schema is not valid against its draft's metaschema at %q (%s)",
				printable("/"+strings.Join(leaf.InstanceLocation, "/"), 80), printable(strings.Join(leaf.ErrorKind.KeywordPath(), "/"), 40))
		}
		return errors.New("schema is not valid against its draft's metaschema")
	}
	msg := err.Error()
	if len(msg) > 300 {
		msg = msg[:300] + "…"
	}
	return errors.New("schema does not compile: " + msg)
}

// Work is the most checking a value against the schema costs, in steps
// of about 10 ns (bounds.go).
type Work struct {
	PerValue  int // per value (member, item or the value itself)
	PerByte   int // per byte of its strings, names and numbers
	PerNumber int // per unit of its numbers' cost (NumberCost)
	Unique    int // uniqueItems on the way to a place
}

// Work is what checking a value against the schema costs at most.
func (f *Foreign) Work() Work {
	return Work{PerValue: f.lim.perValue, PerByte: f.lim.perByte, PerNumber: f.lim.perNumber, Unique: f.lim.unique}
}

// Cost is what checking a value of the given values, bytes and numbers
// (their NumberCost summed) costs at most; ForeignBudget bounds it.
func (w Work) Cost(values, bytes, numbers int) int {
	return limits{perValue: w.PerValue, perByte: w.PerByte, perNumber: w.PerNumber, unique: w.Unique}.cost(size{values, bytes, numbers})
}

// NumberCost is what reading a JSON number within the bounds as a
// fraction costs, in steps.
func NumberCost(n string) int { return numberCost(n) }

// Explain says why arguments failed, as [Explain] does for embedded
// schemas: the failing argument when the schema declares it, never what
// the caller sent.
func (f *Foreign) Explain(err error) string { return Explain(f.root, err) }
