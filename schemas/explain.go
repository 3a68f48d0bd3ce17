package schemas

import (
	"cmp"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
)

// Explain says why arguments failed the schema with the given $id, in
// words a caller can act on: the failing argument and the rule, as in
// "argument message: longer than 1024" or "argument interval_ms: below
// 1000". err is what [Set.ValidateJSON] returned for them.
//
// An argument is named only when the schema declares it: a name the
// caller made up is never echoed, nor is any value the caller sent. In
// its place the message lists what the schema declares there, so the
// caller can correct itself: "an argument the schema does not declare
// (it declares: interval_ms, message)". What is named comes from the
// schema, in printable ASCII, and is bounded (at most [maxDeclared]
// names). When several rules fail, the first by location is told.
func (s *Set) Explain(id string, err error) string {
	return Explain(s.compiled[id], err)
}

// Explain is [Set.Explain] for any compiled schema.
func Explain(root *jsonschema.Schema, err error) string {
	var past *ValueError
	if errors.As(err, &past) {
		where, at, declared := argumentPath(root, past.Location)
		switch {
		case len(past.Location) == 0:
			return "arguments: " + past.Why
		case !declared:
			return undeclared(where, at) + ": " + past.Why
		}
		return "argument " + where + ": " + past.Why
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		if errors.Is(err, ErrUnknownSchema) {
			return "arguments have no schema to check them"
		}
		return "arguments are not one JSON object without duplicate keys"
	}
	leaf := firstLeaf(ve)
	where, at, declared := argumentPath(root, leaf.InstanceLocation)
	if !declared {
		if unevaluated(leaf) { // unevaluatedProperties: false, as additionalProperties: false
			return undeclared(where, at)
		}
		return undeclared(where, at) + " fails it"
	}
	rule := ruleOf(leaf.ErrorKind)
	switch k := leaf.ErrorKind.(type) {
	case *kind.AdditionalProperties:
		return undeclared(where, at)
	case *kind.Required:
		// The missing names are the schema's own.
		missing := slices.Sorted(slices.Values(k.Missing))
		name := printable(missing[0], 64)
		if where != "" {
			name = where + "." + name
		}
		return "argument " + name + ": required"
	case *kind.DependentRequired:
		// The names, missing and present, are the schema's own.
		missing := slices.Sorted(slices.Values(k.Missing))
		name := printable(missing[0], 64)
		if where != "" {
			name = where + "." + name
		}
		return "argument " + name + ": required with " + printable(k.Prop, 64)
	}
	if where == "" {
		return "arguments: " + rule
	}
	return "argument " + where + ": " + rule
}

// firstLeaf returns the innermost error, the first by instance location
// (then by keyword) when there are several: the validator reports the
// members of an object in no fixed order. A member refused by
// unevaluatedProperties is told only when nothing else failed: a declared
// member that fails its own schema is unevaluated too, and its own
// failure is the one to tell.
func firstLeaf(ve *jsonschema.ValidationError) *jsonschema.ValidationError {
	var leaves, others []*jsonschema.ValidationError
	var walk func(*jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) == 0 {
			leaves = append(leaves, e)
			if !unevaluated(e) {
				others = append(others, e)
			}
			return
		}
		for _, c := range e.Causes {
			walk(c)
		}
	}
	walk(ve)
	if len(others) > 0 {
		leaves = others
	}
	return slices.MinFunc(leaves, func(a, b *jsonschema.ValidationError) int {
		return cmp.Or(
			slices.Compare(a.InstanceLocation, b.InstanceLocation),
			strings.Compare(strings.Join(a.ErrorKind.KeywordPath(), "/"), strings.Join(b.ErrorKind.KeywordPath(), "/")),
		)
	})
}

// unevaluated reports whether e refuses a member by unevaluatedProperties:
// false (the validator reports the false schema, at the member).
func unevaluated(e *jsonschema.ValidationError) bool {
	_, ok := e.ErrorKind.(*kind.FalseSchema)
	return ok && strings.HasSuffix(e.SchemaURL, "/unevaluatedProperties")
}

// undeclared words a member the schema does not declare in the object
// at where (the top level when where is empty), whose schema is at, and
// lists the members it does declare; never the caller's name.
func undeclared(where string, at *jsonschema.Schema) string {
	names := declaredNames(at)
	switch {
	case where == "" && names == "":
		return "an argument the schema does not declare (it declares none)"
	case where == "":
		return "an argument the schema does not declare (it declares: " + names + ")"
	case names == "":
		names = "none"
	}
	return "argument " + where + ": a property the schema does not declare (declared: " + names + ")"
}

// maxDeclared bounds how many declared names a message lists.
const maxDeclared = 16

// declaredNames lists the names s declares in properties ($ref
// followed: a schema's own and those of the schemas its $ref reaches),
// sorted, in printable ASCII, at most maxDeclared of them; "…" stands for
// the rest, and for names with nothing printable. It is "" when s
// declares none.
func declaredNames(s *jsonschema.Schema) string {
	var all []string
	for _, c := range refChain(s) {
		for name := range c.Properties {
			if !slices.Contains(all, name) {
				all = append(all, name)
			}
		}
	}
	if len(all) == 0 {
		return ""
	}
	names := make([]string, 0, len(all))
	for _, name := range all {
		if p := printable(name, 64); p != "" {
			names = append(names, p)
		}
	}
	slices.Sort(names)
	if len(names) > maxDeclared || len(names) < len(all) {
		return strings.Join(append(names[:min(len(names), maxDeclared)], "…"), ", ")
	}
	return strings.Join(names, ", ")
}

// argumentPath follows an instance location through the schema: it
// returns the location as "a.b[2]" while each member is one the schema
// declares in properties (and each index one of a declared array), and
// reports false, with the declared part only, where it stops being so.
// It also returns the schema it reached: that of the whole location, or
// of the declared part where it stopped.
func argumentPath(root *jsonschema.Schema, loc []string) (string, *jsonschema.Schema, bool) {
	var b strings.Builder
	s := root
	for _, seg := range loc {
		chain := refChain(s)
		if len(chain) == 0 {
			return b.String(), nil, false
		}
		if p := property(chain, seg); p != nil {
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(printable(seg, 64))
			s = p
			continue
		}
		if i, err := strconv.Atoi(seg); err == nil && i >= 0 {
			if item := itemOf(chain, i); item != nil {
				fmt.Fprintf(&b, "[%d]", i)
				s = item
				continue
			}
		}
		return b.String(), s, false
	}
	return b.String(), s, true
}

// refChain returns s and the schemas its $ref reaches, in order: in draft
// 2020-12 a schema with a $ref may declare properties of its own beside
// it (fleet.nodes.input adds limit and cursor to fleet.selector's).
func refChain(s *jsonschema.Schema) []*jsonschema.Schema {
	var chain []*jsonschema.Schema
	for range 16 { // a bound: references are compiled, but may loop
		if s == nil {
			break
		}
		chain = append(chain, s)
		s = s.Ref
	}
	return chain
}

// property returns the schema the first schema of chain that declares
// name declares for it, nil if none does.
func property(chain []*jsonschema.Schema, name string) *jsonschema.Schema {
	for _, c := range chain {
		if p, ok := c.Properties[name]; ok {
			return p
		}
	}
	return nil
}

// itemOf returns the schema of item i that the first schema of chain
// declaring items declares, nil if none does.
func itemOf(chain []*jsonschema.Schema, i int) *jsonschema.Schema {
	for _, c := range chain {
		if item := itemSchema(c, i); item != nil {
			return item
		}
	}
	return nil
}

// itemSchema returns the schema of item i of an array schema, nil if the
// schema declares no items.
func itemSchema(s *jsonschema.Schema, i int) *jsonschema.Schema {
	if i < len(s.PrefixItems) {
		return s.PrefixItems[i]
	}
	if s.Items2020 != nil {
		return s.Items2020
	}
	switch items := s.Items.(type) {
	case *jsonschema.Schema:
		return items
	case []*jsonschema.Schema:
		if i < len(items) {
			return items[i]
		}
	}
	return nil
}

// ruleOf words the rule a value broke, from what the schema wants; never
// from the value itself.
func ruleOf(k jsonschema.ErrorKind) string {
	switch k := k.(type) {
	case *kind.Type:
		return "want " + printable(strings.Join(k.Want, " or "), 64)
	case *kind.MinLength:
		return fmt.Sprintf("shorter than %d", k.Want)
	case *kind.MaxLength:
		return fmt.Sprintf("longer than %d", k.Want)
	case *kind.Minimum:
		return "below " + number(k.Want)
	case *kind.Maximum:
		return "above " + number(k.Want)
	case *kind.ExclusiveMinimum:
		return "not above " + number(k.Want)
	case *kind.ExclusiveMaximum:
		return "not below " + number(k.Want)
	case *kind.MultipleOf:
		return "not a multiple of " + number(k.Want)
	case *kind.Pattern:
		return "does not match " + printable(k.Want, 128)
	case *kind.Enum:
		return "not one of " + printable(enumList(k.Want), 128)
	case *kind.Const:
		return "not the one value allowed"
	case *kind.Format:
		return "not a valid " + printable(k.Want, 64)
	case *kind.MinItems:
		return fmt.Sprintf("fewer than %d items", k.Want)
	case *kind.MaxItems:
		return fmt.Sprintf("more than %d items", k.Want)
	case *kind.UniqueItems:
		return "items not unique"
	case *kind.MinProperties:
		return fmt.Sprintf("fewer than %d properties", k.Want)
	case *kind.MaxProperties:
		return fmt.Sprintf("more than %d properties", k.Want)
	case *kind.FalseSchema:
		return "not allowed"
	case *kind.OneOf: // a leaf only when more than one alternative matched
		return "matches more than one of its alternatives (oneOf)"
	}
	if kw := k.KeywordPath(); len(kw) > 0 {
		return "fails " + printable(kw[0], 64)
	}
	return "fails its schema"
}

func number(r *big.Rat) string {
	if r.IsInt() {
		return r.Num().String()
	}
	f, _ := r.Float64()
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// enumList lists the allowed values of an enum, or says there are too
// many (or too complex ones) to list.
func enumList(want []any) string {
	var parts []string
	for _, v := range want {
		switch v := v.(type) {
		case string:
			parts = append(parts, strconv.Quote(v))
		case bool, nil:
			parts = append(parts, fmt.Sprint(v))
		default:
			if n, ok := v.(fmt.Stringer); ok {
				parts = append(parts, n.String())
			} else if _, compound := v.([]any); compound {
				return "the allowed values"
			} else if _, compound := v.(map[string]any); compound {
				return "the allowed values"
			} else {
				parts = append(parts, fmt.Sprint(v))
			}
		}
		if len(parts) > 8 {
			return "the allowed values"
		}
	}
	return strings.Join(parts, ", ")
}

// printable keeps the printable ASCII of s, at most max bytes of it.
func printable(s string, max int) string {
	var b strings.Builder
	for i := 0; i < len(s) && b.Len() < max; i++ {
		if c := s[i]; c >= 0x20 && c <= 0x7e {
			b.WriteByte(c)
		}
	}
	return b.String()
}
