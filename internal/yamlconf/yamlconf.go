// Package yamlconf reads okso's YAML config files as JSON Schema
// documents whose errors name the file, the line and the field: the
// machinery both the remote tier's config and the gateway's trusted
// issuers use. A [Form] says what one kind of file calls its parts; Read
// it, validate the value against the file's schema, and turn a
// validation error into one line with Explain.
package yamlconf

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"go.yaml.in/yaml/v3"
)

// MaxValues bounds the values a config may expand to through YAML aliases.
const MaxValues = 100_000

// Form is one kind of config file. Its zero value is not usable: every
// field is needed.
type Form struct {
	// Empty is what an empty file is told it lacks ("want upstreams:
	// followed by a list").
	Empty string
	// IsIndex reports whether loc[i] indexes a list (rather than being a
	// key that looks like a number).
	IsIndex func(loc []string, i int) bool
	// Describe words one broken rule: the location to name, the location
	// whose line to give, and what is wrong, in the operator's terms.
	Describe func(root *yaml.Node, doc any, e *jsonschema.ValidationError) (field, at []string, msg string)
}

// Read decodes a config file's one YAML document and returns its tree
// (for lines) and its value as the schema validator takes it.
func (f *Form) Read(data []byte, file string) (root *yaml.Node, v any, err error) {
	root, err = f.decode(data, file)
	if err != nil {
		return nil, nil, err
	}
	v, err = (&converter{form: f, file: file}).value(root, nil)
	if err != nil {
		return nil, nil, err
	}
	return root, v, nil
}

var plainKey = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_-]*$`)

// Checked reads a document as Read does, then checks it with validate
// (a schema of the caller's, named schema in an error that is no
// schema failure), and explains a failure as Explain does: one line
// naming the file, the line and the field.
func (f *Form) Checked(data []byte, file, schema string, validate func(any) error) (root *yaml.Node, v any, err error) {
	root, v, err = f.Read(data, file)
	if err != nil {
		return nil, nil, err
	}
	if err := validate(v); err != nil {
		var ve *jsonschema.ValidationError
		if !errors.As(err, &ve) {
			return nil, nil, fmt.Errorf("%s: check against %s: %w", file, schema, err)
		}
		return nil, nil, f.Explain(file, root, v, ve)
	}
	return root, v, nil
}

// FieldPath writes an instance location as upstreams[1].headers.Authorization.
func (f *Form) FieldPath(loc []string) string {
	var b strings.Builder
	for i, seg := range loc {
		switch {
		case i > 0 && f.IsIndex(loc, i):
			b.WriteString("[" + seg + "]")
		case plainKey.MatchString(seg):
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(seg)
		default:
			b.WriteString("[" + Quote(seg) + "]")
		}
	}
	return b.String()
}

// PlainKey reports whether s can be written as a bare YAML key.
func PlainKey(s string) bool { return plainKey.MatchString(s) }

// decode decodes the one YAML document of a config file.
func (f *Form) decode(data []byte, file string) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s: the file is empty; %s", file, f.Empty)
		}
		return nil, yamlError(file, err)
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case errors.Is(err, io.EOF):
	case err != nil:
		return nil, yamlError(file, err)
	default:
		return nil, &Error{File: file, Line: extra.Line, Msg: "a second YAML document; the config is one"}
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return nil, fmt.Errorf("%s: not one YAML document", file)
	}
	return doc.Content[0], nil
}

var yamlLine = regexp.MustCompile(`^yaml: line ([0-9]+): (.*)$`)

// parserProblems are the YAML library's parser errors (as opposed to its
// scanner errors): it gives their line counting from 0.
var parserProblems = []string{
	"did not find expected <stream-start>",
	"did not find expected <document start>",
	"did not find expected node content",
	"did not find expected '-' indicator",
	"did not find expected key",
	"did not find expected ',' or ']'",
	"did not find expected ',' or '}'",
	"found undefined tag handle",
	"found duplicate %YAML directive",
	"found incompatible YAML document",
	"found duplicate %TAG directive",
}

// yamlError rewrites a YAML syntax error in the config's form, with the
// line the YAML library gives: that of the error, or where the list or
// mapping it could not finish begins. For some errors it gives none, and
// neither does the message then.
func yamlError(file string, err error) error {
	msg := strings.ReplaceAll(err.Error(), "\n", " ")
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		if slices.Contains(parserProblems, m[2]) {
			line++
		}
		return &Error{File: file, Line: line, Msg: "not YAML: " + m[2]}
	}
	return &Error{File: file, Msg: "not YAML: " + strings.TrimPrefix(msg, "yaml: ")}
}

// converter turns a YAML tree into the values the schema validator takes
// (map[string]any, []any, string, bool, numbers, nil), refusing what JSON
// cannot say or says twice.
type converter struct {
	form   *Form
	file   string
	values int
}

func (c *converter) value(n *yaml.Node, loc []string) (any, error) {
	fail := func(line int, msg string) error {
		return &Error{File: c.file, Line: line, Field: c.form.FieldPath(loc), Msg: msg}
	}
	if c.values++; c.values > MaxValues {
		return nil, &Error{File: c.file, Msg: fmt.Sprintf("the config expands to more than %d values (through aliases?)", MaxValues)}
	}
	switch n.Kind {
	case yaml.AliasNode:
		return c.value(n.Alias, loc)
	case yaml.MappingNode:
		m := make(map[string]any, len(n.Content)/2)
		lines := make(map[string]int, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode {
				return nil, fail(k.Line, "a key must be a plain name, not a list or a mapping")
			}
			if k.Tag == "!!merge" {
				return nil, fail(k.Line, "merge keys (<<) are not supported; write the keys out")
			}
			at := append(slices.Clone(loc), k.Value)
			if l, dup := lines[k.Value]; dup {
				return nil, &Error{File: c.file, Line: k.Line, Field: c.form.FieldPath(at), Msg: fmt.Sprintf("given twice, first at line %d", l)}
			}
			lines[k.Value] = k.Line
			x, err := c.value(v, at)
			if err != nil {
				return nil, err
			}
			m[k.Value] = x
		}
		return m, nil
	case yaml.SequenceNode:
		l := make([]any, 0, len(n.Content))
		for i, e := range n.Content {
			x, err := c.value(e, append(slices.Clone(loc), strconv.Itoa(i)))
			if err != nil {
				return nil, err
			}
			l = append(l, x)
		}
		return l, nil
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return nil, nil
		case "!!bool", "!!int", "!!float":
			var x any
			if err := n.Decode(&x); err != nil {
				return nil, fail(n.Line, "a value YAML cannot read: "+Printable(err.Error()))
			}
			return x, nil
		}
		return n.Value, nil // strings, and timestamps or binary as written
	}
	return nil, fail(n.Line, "a YAML node the config cannot hold")
}

// Find returns the key and value nodes at an instance location (mapping
// keys and sequence indexes), following aliases; key is nil for the root
// and for sequence items, and both are nil when the location is not in
// the tree.
func Find(root *yaml.Node, loc []string) (key, val *yaml.Node) {
	val = root
	for _, seg := range loc {
		for val != nil && val.Kind == yaml.AliasNode {
			val = val.Alias
		}
		if val == nil {
			return nil, nil
		}
		key = nil
		switch val.Kind {
		case yaml.MappingNode:
			var next *yaml.Node
			for i := 0; i+1 < len(val.Content); i += 2 {
				if val.Content[i].Value == seg {
					key, next = val.Content[i], val.Content[i+1]
					break
				}
			}
			val = next
		case yaml.SequenceNode:
			j, err := strconv.Atoi(seg)
			if err != nil || j < 0 || j >= len(val.Content) {
				return nil, nil
			}
			val = val.Content[j]
		default:
			return nil, nil
		}
	}
	for val != nil && val.Kind == yaml.AliasNode {
		val = val.Alias
	}
	return key, val
}

// LineOf returns the line of a location: its key's for a mapping member
// (a block value starts on the next line), else its value's; 0 if unknown.
func LineOf(root *yaml.Node, loc []string) int {
	l, _ := Position(root, loc)
	return l
}

func Position(root *yaml.Node, loc []string) (line, col int) {
	k, v := Find(root, loc)
	switch {
	case k != nil:
		return k.Line, k.Column
	case v != nil:
		return v.Line, v.Column
	}
	return 0, 0
}

// KeysByLine returns the keys of the mapping at loc in the file's order.
func KeysByLine(root *yaml.Node, loc []string) []string {
	_, m := Find(root, loc)
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	var keys []string
	for i := 0; i+1 < len(m.Content); i += 2 {
		keys = append(keys, m.Content[i].Value)
	}
	return keys
}

// Error is one config error: file:line: field: msg.
type Error struct {
	File  string
	Line  int // 0: unknown
	Field string
	Msg   string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(e.Line))
	}
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// ErrAt is an error at a location of the file, named by its line and field.
func (f *Form) ErrAt(file string, root *yaml.Node, loc []string, format string, args ...any) error {
	return &Error{File: file, Line: LineOf(root, loc), Field: f.FieldPath(loc), Msg: fmt.Sprintf(format, args...)}
}

// Quote quotes an operator's string for a message, in ASCII and bounded.
func Quote(s string) string {
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	return strconv.QuoteToASCII(s)
}

// Printable keeps the printable ASCII of s, at most 64 bytes of it.
func Printable(s string) string {
	var b strings.Builder
	for i := 0; i < len(s) && b.Len() < 64; i++ {
		if c := s[i]; c >= 0x20 && c <= 0x7e {
			b.WriteByte(c)
		}
	}
	return b.String()
}

// Explain turns the schema's verdict into one [Error]: of all the
// rules broken, the one earliest in the file, and a wrong value before a
// missing one (a misspelt key is told as unknown rather than its right
// spelling as missing).
func (f *Form) Explain(file string, root *yaml.Node, doc any, ve *jsonschema.ValidationError) error {
	type found struct {
		err       *Error
		missing   int // 1 for a missing key
		line, col int
	}
	var all []found
	var walk func(*jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) > 0 {
			for _, c := range e.Causes {
				walk(c)
			}
			return
		}
		field, at, msg := f.Describe(root, doc, e)
		line, col := Position(root, at)
		fd := found{err: &Error{File: file, Line: line, Field: f.FieldPath(field), Msg: msg}, line: line, col: col}
		if _, ok := e.ErrorKind.(*kind.Required); ok {
			fd.missing = 1
		}
		all = append(all, fd)
	}
	walk(ve)
	best := slices.MinFunc(all, func(a, b found) int {
		return cmp.Or(cmp.Compare(a.missing, b.missing), cmp.Compare(a.line, b.line), cmp.Compare(a.col, b.col),
			strings.Compare(a.err.Field, b.err.Field), strings.Compare(a.err.Msg, b.err.Msg))
	})
	return best.err
}

// TypeWords names JSON types as a YAML file shows them.
func TypeWords(types ...string) string {
	var w []string
	for _, t := range types {
		switch t {
		case "object":
			w = append(w, "a mapping")
		case "array":
			w = append(w, "a list")
		case "string":
			w = append(w, "a string")
		case "number", "integer":
			w = append(w, "a number")
		case "boolean":
			w = append(w, "true or false")
		case "null":
			w = append(w, "nothing")
		default:
			w = append(w, t)
		}
	}
	return strings.Join(w, " or ")
}

// ValueAt returns the value at an instance location, nil if none.
func ValueAt(doc any, loc []string) any {
	v := doc
	for _, seg := range loc {
		switch x := v.(type) {
		case map[string]any:
			v = x[seg]
		case []any:
			i, err := strconv.Atoi(seg)
			if err != nil || i < 0 || i >= len(x) {
				return nil
			}
			v = x[i]
		default:
			return nil
		}
	}
	return v
}

// Shown is a value of the file as an error quotes it: a string quoted, a
// number or boolean as written, anything else (or a secret's value)
// "the value".
func Shown(v any, secret bool) string {
	if !secret {
		switch v := v.(type) {
		case string:
			return Quote(v)
		case bool, int, uint64, float64:
			return fmt.Sprint(v)
		}
	}
	return "the value"
}

// FirstByLine is, of the keys of the mapping at loc, the one the file
// writes first (by name when two share a line): the unknown key an
// error names.
func FirstByLine(root *yaml.Node, loc, keys []string) string {
	line := func(k string) int { return LineOf(root, append(slices.Clone(loc), k)) }
	return slices.MinFunc(keys, func(a, b string) int { return cmp.Or(cmp.Compare(line(a), line(b)), strings.Compare(a, b)) })
}

// TypeMismatch words a value of type got where want is asked, with a hint
// to quote a number or boolean given for a string.
func TypeMismatch(want []string, got string) string {
	m := "want " + TypeWords(want...) + ", not " + TypeWords(got)
	if slices.Contains(want, "string") && (got == "number" || got == "integer" || got == "boolean") {
		m += " (quote it)"
	}
	return m
}

// Plain words a broken rule whose words need nothing of the file's own:
// a value not among those allowed, of the wrong type, too short or too
// long, out of range, or repeated. shown is the value as the message may
// quote it ([Shown]). ok is false for any other rule, which the file's
// Describe words itself.
func Plain(e *jsonschema.ValidationError, shown string) (msg string, ok bool) {
	switch k := e.ErrorKind.(type) {
	case *kind.Enum:
		want := make([]string, len(k.Want))
		for i, w := range k.Want {
			want[i] = fmt.Sprint(w)
		}
		return shown + " is not one of " + strings.Join(want, ", "), true
	case *kind.Type:
		return TypeMismatch(k.Want, k.Got), true
	case *kind.MinLength:
		return "empty", true
	case *kind.MaxLength:
		return fmt.Sprintf("longer than %d characters", k.Want), true
	case *kind.MinItems:
		if k.Want == 1 {
			return "empty", true
		}
		return fmt.Sprintf("fewer than %d items", k.Want), true
	case *kind.MaxItems:
		return fmt.Sprintf("more than %d items", k.Want), true
	case *kind.UniqueItems:
		return "holds the same value twice", true
	case *kind.Maximum:
		return shown + " is above " + k.Want.RatString(), true
	case *kind.Minimum:
		return shown + " is below " + k.Want.RatString(), true
	case *kind.ExclusiveMinimum:
		return shown + " is not above " + k.Want.RatString(), true
	case *kind.MinProperties:
		return "empty", true
	case *kind.MaxProperties:
		return fmt.Sprintf("more than %d entries", k.Want), true
	}
	return "", false
}
