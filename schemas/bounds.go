package schemas

import (
	"encoding/json"
	"fmt"
	"regexp"
	"regexp/syntax"
	"slices"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// A schema okso did not write could cost any amount of work to check a
// value against: allOf of two $refs to the level below, N levels deep, is
// 1.4 KB at N = 21 and doubles the cost of checking {} at every level. So
// a foreign schema is compiled with bounds, and one that is past a bound
// is refused where it is declared (a caller tool's declaration, an
// upstream's listing) instead of being checked at all:
//
//   - its size (MaxForeignSchema bytes), the nesting of its document
//     (MaxForeignDepth), and its numbers (as a value's, below);
//   - its expansion: how many subschemas apply to any one place in a
//     value, counting every path through $ref, allOf, anyOf, oneOf, not,
//     if/then/else, dependentSchemas and the applicators that descend into
//     the value (MaxForeignExpansion);
//   - each regular expression's compiled program (MaxPatternProgram);
//   - its work at any one place (MaxForeignWork): the sum, over the
//     subschemas that apply there, of what each costs in steps of about
//     10 ns (measured): evalSteps to evaluate, one per enum value or const
//     node to compare, and one per pattern instruction for each byte of a
//     string there.
//
// The validator takes no context and cannot be stopped, so its cost is
// bounded before it starts: checking a value of n members and items and
// b bytes of strings and names costs at most evalWork × n + textWork × b
// steps, the two most a place costs per value and per byte, and a value
// that would cost more than ForeignBudget is refused unchecked with a
// message that says so. The budget is static: decided when the schema is
// compiled, whatever the value. It is what a trivial schema costs on the
// largest request the gateway reads (1 MiB): a schema of more work checks
// smaller values only.
//
// Two properties of a value are bounded too, for every schema (the
// embedded ones included), because the validator's cost on them does not
// depend on the schema's shape: a number is compared exactly, as a
// fraction, so one of more than MaxNumberLength characters or with an
// exponent beyond ±MaxNumberExponent is refused (1e999999 takes 22 ms to
// read as a fraction); and a value nested deeper than MaxValueDepth is
// refused by a schema that descends that deep (a recursive one).

// Bounds on a foreign schema and on the values it checks.
const (
	// MaxForeignDepth bounds the nesting of a foreign schema's document.
	MaxForeignDepth = 64
	// MaxForeignExpansion bounds the subschemas that apply to any one
	// place in a value: at 512, checking {} against the worst schema
	// admitted costs well under a millisecond.
	MaxForeignExpansion = 512
	// MaxPatternProgram bounds the compiled program of each regular
	// expression in a foreign schema, in instructions.
	MaxPatternProgram = 2000
	// MaxForeignWork bounds the work of a foreign schema at any one place
	// in a value, in steps (see above).
	MaxForeignWork = 1 << 17
	// ForeignBudget is what checking one value may cost at most, in
	// steps (about 1.3 s of a core).
	ForeignBudget = 1 << 27
	// MaxValueDepth bounds the nesting of a value checked against a
	// schema that descends deeper (a recursive one).
	MaxValueDepth = 64
	// MaxNumberLength bounds the characters of a number in a checked
	// value; MaxNumberExponent its exponent.
	MaxNumberLength   = 100
	MaxNumberExponent = 400
)

// evalSteps is the cost of evaluating one subschema at one place, in
// steps: about 1 µs, where a step (an enum value compared, a pattern
// instruction run on a byte) is about 10 ns.
const evalSteps = 100

// exploreSteps bounds the work of finding a schema's expansion: a schema
// whose places are too many to visit is refused as too complex.
const exploreSteps = 1 << 21

// BoundError says that a foreign schema is past one of okso's bounds.
type BoundError struct {
	Bound string // "size", "depth", "number", "cycle", "expansion", "pattern", "work" or "complexity"
	Limit int
	Where string // the schema's location past the bound, when known
}

func (e *BoundError) Error() string {
	var what string
	switch e.Bound {
	case "size":
		what = fmt.Sprintf("is larger than %d bytes", e.Limit)
	case "depth":
		what = fmt.Sprintf("is nested deeper than %d levels", e.Limit)
	case "expansion":
		what = fmt.Sprintf("applies more than %d subschemas to one place in a value (through $ref, allOf, anyOf, oneOf, if, ...)", e.Limit)
	case "number":
		what = fmt.Sprintf("has a number of more than %d characters or with an exponent beyond ±%d", MaxNumberLength, MaxNumberExponent)
	case "cycle":
		what = "refers to itself without descending into the value"
	case "pattern":
		what = fmt.Sprintf("has a pattern that compiles to more than %d instructions", e.Limit)
	case "work":
		what = fmt.Sprintf("costs more than %d steps at one place in a value (subschemas, enum values and pattern instructions together)", e.Limit)
	default:
		what = fmt.Sprintf("has more than %d places to check", e.Limit)
	}
	if e.Where != "" {
		what += " at " + printable(e.Where, 80)
	}
	return "schema " + what + " (okso's " + e.Bound + " bound)"
}

// ValueError says that a value is past a bound of the schema that checks
// it; it is never checked. Explain words it.
type ValueError struct {
	Location []string // where in the value, as the validator's locations
	Why      string   // server-written words: "a number of more than 100 characters"
}

func (e *ValueError) Error() string {
	return "value past a bound at /" + strings.Join(e.Location, "/") + ": " + e.Why
}

// limits are what a compiled foreign schema costs, and lets through.
type limits struct {
	// evalWork and textWork are the most steps one place of a value
	// costs: per member or item there, and per byte of its string or
	// name.
	evalWork, textWork int
	// deep: the schema descends MaxValueDepth levels into a value, so a
	// deeper value is refused.
	deep bool
}

// cost is the most a value of n members and items and b bytes of text
// costs to check.
func (l limits) cost(n, b int) int { return l.evalWork*n + l.textWork*b }

// patternSizer is a regexp engine for the compiler that refuses programs
// past MaxPatternProgram and keeps each one's size for the work. Its
// zero value is not usable.
type patternSizer struct {
	size map[string]int
	past *BoundError // the bound a pattern was past (the compiler's error hides it)
}

func (p *patternSizer) compile(s string) (jsonschema.Regexp, error) {
	re, err := syntax.Parse(s, syntax.Perl)
	if err != nil {
		return nil, err
	}
	prog, err := syntax.Compile(re.Simplify())
	if err != nil {
		return nil, err
	}
	if len(prog.Inst) > MaxPatternProgram {
		p.past = &BoundError{Bound: "pattern", Limit: MaxPatternProgram}
		return nil, p.past
	}
	p.size[s] = len(prog.Inst)
	return regexp.Compile(s)
}

// checkDoc checks a foreign schema's document for the bounds on its
// nesting and on its numbers (an enum's or a const's are compared as
// fractions on every check, as a value's are).
func checkDoc(v any, depth int) error {
	if depth > MaxForeignDepth {
		return &BoundError{Bound: "depth", Limit: MaxForeignDepth}
	}
	switch v := v.(type) {
	case map[string]any:
		for _, x := range v {
			if err := checkDoc(x, depth+1); err != nil {
				return err
			}
		}
	case []any:
		for _, x := range v {
			if err := checkDoc(x, depth+1); err != nil {
				return err
			}
		}
	case json.Number:
		if numberPastBounds(string(v)) != "" {
			return &BoundError{Bound: "number", Limit: MaxNumberLength}
		}
	}
	return nil
}

// graph is a compiled schema's subschemas as numbered nodes.
type graph struct {
	nodes []*jsonschema.Schema
	index map[*jsonschema.Schema]int
	// inPlace are the subschemas that apply to the same place of the
	// value, with repeats.
	inPlace [][]int
	// evalW and textW are what one evaluation of a node costs, in steps:
	// once, and per byte of text.
	evalW, textW []int
	// byAnchor are the anchors by name ("": the recursive ones), once
	// asked for.
	byAnchor map[string][]*jsonschema.Schema
}

// analyse finds the limits of a compiled foreign schema, or the bound it
// is past.
func analyse(root *jsonschema.Schema, patterns *patternSizer) (limits, error) {
	g := &graph{index: map[*jsonschema.Schema]int{}}
	g.add(root)
	for i := 0; i < len(g.nodes); i++ {
		for _, sub := range all(g.nodes[i]) {
			if sub != nil {
				g.add(sub)
			}
		}
	}
	for i := range g.nodes {
		g.link(i, patterns)
	}
	closures, err := g.closures()
	if err != nil {
		return limits{}, err
	}
	e := explorer{g: g, closures: closures, seen: map[string]int{}, onPath: map[string]bool{}}
	if err := e.place(closures[0], 0); err != nil {
		return limits{}, err
	}
	return limits{evalWork: e.evalWork, textWork: e.textWork, deep: e.deep}, nil
}

func (g *graph) add(s *jsonschema.Schema) int {
	if i, ok := g.index[s]; ok {
		return i
	}
	i := len(g.nodes)
	g.index[s] = i
	g.nodes = append(g.nodes, s)
	g.inPlace = append(g.inPlace, nil)
	g.evalW = append(g.evalW, 0)
	g.textW = append(g.textW, 0)
	return i
}

// link numbers the subschemas of node i, and its in-place edges and
// weight.
func (g *graph) link(i int, patterns *patternSizer) {
	s := g.nodes[i]
	var in []int
	inPlace := func(subs ...*jsonschema.Schema) {
		for _, sub := range subs {
			if sub != nil {
				in = append(in, g.add(sub))
			}
		}
	}
	inPlace(s.Ref, s.Not, s.If, s.Then, s.Else)
	inPlace(s.AllOf...)
	inPlace(s.AnyOf...)
	inPlace(s.OneOf...)
	if s.RecursiveRef != nil {
		// $recursiveRef may resolve to any resource root that is a
		// recursive anchor: count it as each of them.
		inPlace(s.RecursiveRef)
		inPlace(g.anchors("")...)
	}
	if d := s.DynamicRef; d != nil {
		inPlace(d.Ref)
		if d.Anchor != "" {
			inPlace(g.anchors(d.Anchor)...)
		}
	}
	for _, k := range slices.Sorted(mapKeys(s.DependentSchemas)) {
		inPlace(s.DependentSchemas[k])
	}
	for _, k := range slices.Sorted(mapKeys(s.Dependencies)) {
		if sub, ok := s.Dependencies[k].(*jsonschema.Schema); ok {
			inPlace(sub)
		}
	}
	g.inPlace[i] = in
	w := evalSteps
	if s.Enum != nil {
		for _, v := range s.Enum.Values {
			w += docNodes(v)
		}
	}
	if s.Const != nil {
		w += docNodes(*s.Const)
	}
	t := 0
	if s.Pattern != nil {
		t += patterns.size[s.Pattern.String()]
	}
	for re := range s.PatternProperties {
		t += patterns.size[re.String()] // on each name
	}
	g.evalW[i], g.textW[i] = w, t
}

// anchors are the nodes that are recursive anchors (name "") or dynamic
// anchors of a name: $recursiveRef and $dynamicRef resolve at run time to
// any of them.
func (g *graph) anchors(name string) []*jsonschema.Schema {
	if g.byAnchor == nil {
		g.byAnchor = map[string][]*jsonschema.Schema{}
		for _, n := range g.nodes {
			if n.RecursiveAnchor {
				g.byAnchor[""] = append(g.byAnchor[""], n)
			}
			if n.DynamicAnchor != "" {
				g.byAnchor[n.DynamicAnchor] = append(g.byAnchor[n.DynamicAnchor], n)
			}
		}
	}
	return g.byAnchor[name]
}

// docNodes counts the nodes of a decoded document.
func docNodes(v any) int {
	n := 1
	switch v := v.(type) {
	case map[string]any:
		for _, x := range v {
			n += docNodes(x)
		}
	case []any:
		for _, x := range v {
			n += docNodes(x)
		}
	}
	return n
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// descendants are the subschemas of s that apply to the members, items
// or property names of the value s applies to.
func descendants(s *jsonschema.Schema) []*jsonschema.Schema {
	var out []*jsonschema.Schema
	add := func(subs ...*jsonschema.Schema) {
		for _, sub := range subs {
			if sub != nil {
				out = append(out, sub)
			}
		}
	}
	for _, k := range slices.Sorted(mapKeys(s.Properties)) {
		add(s.Properties[k])
	}
	for _, sub := range s.PatternProperties {
		add(sub)
	}
	if sub, ok := s.AdditionalProperties.(*jsonschema.Schema); ok {
		add(sub)
	}
	add(s.PropertyNames, s.UnevaluatedProperties, s.Contains, s.Items2020, s.UnevaluatedItems, s.ContentSchema)
	add(s.PrefixItems...)
	switch items := s.Items.(type) {
	case *jsonschema.Schema:
		add(items)
	case []*jsonschema.Schema:
		add(items...)
	}
	if sub, ok := s.AdditionalItems.(*jsonschema.Schema); ok {
		add(sub)
	}
	return out
}

// all are every subschema of s, in place or descending.
func all(s *jsonschema.Schema) []*jsonschema.Schema {
	out := []*jsonschema.Schema{s.Ref, s.Not, s.If, s.Then, s.Else, s.RecursiveRef}
	if s.DynamicRef != nil {
		out = append(out, s.DynamicRef.Ref)
	}
	out = append(out, s.AllOf...)
	out = append(out, s.AnyOf...)
	out = append(out, s.OneOf...)
	for _, sub := range s.DependentSchemas {
		out = append(out, sub)
	}
	for _, d := range s.Dependencies {
		if sub, ok := d.(*jsonschema.Schema); ok {
			out = append(out, sub)
		}
	}
	return append(out, descendants(s)...)
}

// closure is the multiset of nodes that apply in place, as node → count
// (counts saturate past MaxForeignExpansion).
type closure map[int]int

// closures finds, for each node, the nodes that apply in place when it
// does, with how many paths lead to each; a cycle of in-place references
// is refused (it would never descend into the value).
func (g *graph) closures() ([]closure, error) {
	const (
		unvisited = iota
		visiting
		done
	)
	state := make([]int, len(g.nodes))
	out := make([]closure, len(g.nodes))
	var visit func(i int) error
	visit = func(i int) error {
		switch state[i] {
		case visiting:
			return &BoundError{Bound: "cycle", Where: g.nodes[i].Location}
		case done:
			return nil
		}
		state[i] = visiting
		c := closure{i: 1}
		for _, j := range g.inPlace[i] {
			if err := visit(j); err != nil {
				return err
			}
			for k, n := range out[j] {
				c[k] = min(c[k]+n, MaxForeignExpansion+1)
			}
		}
		state[i], out[i] = done, c
		return nil
	}
	for i := range g.nodes {
		if err := visit(i); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// explorer visits the places of a value a schema can tell apart: the
// root, each member a subschema names, any other member, each item a
// prefix names, any other item, and property names; at each, the
// multiset of subschemas that apply must stay within the bounds.
type explorer struct {
	g        *graph
	closures []closure
	seen     map[string]int  // places visited, by their multiset: the least depth
	onPath   map[string]bool // the places being visited: one met again is recursion
	steps    int
	// the most work at one place, per member or item and per byte
	evalWork, textWork int
	deep               bool
}

// key names a multiset: its nodes and counts, in order.
func (c closure) key() string {
	ids := slices.Sorted(func(yield func(int) bool) {
		for k := range c {
			if !yield(k) {
				return
			}
		}
	})
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(strconv.Itoa(id))
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(c[id]))
		b.WriteByte(',')
	}
	return b.String()
}

// expand adds to c the in-place closure of node i, n times over.
func (e *explorer) expand(c closure, i, n int) {
	for k, m := range e.closures[i] {
		c[k] = min(c[k]+n*m, MaxForeignExpansion+1)
		e.steps++
	}
}

func (e *explorer) place(c closure, depth int) error {
	if len(c) == 0 {
		return nil
	}
	paths, eval, text := 0, 0, 0
	for k, n := range c {
		paths += n
		eval += n * e.g.evalW[k]
		text += n * e.g.textW[k]
	}
	if paths > MaxForeignExpansion {
		return &BoundError{Bound: "expansion", Limit: MaxForeignExpansion}
	}
	if eval+text > MaxForeignWork {
		return &BoundError{Bound: "work", Limit: MaxForeignWork}
	}
	e.evalWork, e.textWork = max(e.evalWork, eval), max(e.textWork, text)
	if e.steps > exploreSteps {
		return &BoundError{Bound: "complexity", Limit: exploreSteps}
	}
	if depth >= MaxValueDepth {
		e.deep = true
		return nil
	}
	key := c.key()
	if e.onPath[key] {
		e.deep = true // recursion: the same subschemas again, deeper
		return nil
	}
	if d, ok := e.seen[key]; ok && d <= depth {
		return nil
	}
	e.onPath[key] = true
	defer delete(e.onPath, key)
	for _, child := range e.children(c) {
		if err := e.place(child, depth+1); err != nil {
			return err
		}
	}
	e.seen[key] = depth
	return nil
}

// children are the multisets of subschemas at each place one level down.
func (e *explorer) children(c closure) []closure {
	nodes := e.g.nodes
	// Members: each name some subschema declares, and any other.
	names := map[string]bool{}
	var prefix int
	for k := range c {
		for name := range nodes[k].Properties {
			names[name] = true
		}
		prefix = max(prefix, len(nodes[k].PrefixItems))
		if items, ok := nodes[k].Items.([]*jsonschema.Schema); ok {
			prefix = max(prefix, len(items))
		}
	}
	var out []closure
	member := func(name string, declared bool) closure {
		m := closure{}
		for k, n := range c {
			s := nodes[k]
			matched := false
			if sub, ok := s.Properties[name]; ok && declared {
				e.expand(m, e.g.index[sub], n)
				matched = true
			}
			for re, sub := range s.PatternProperties {
				// Any other name may match any pattern.
				if !declared || re.MatchString(name) {
					e.expand(m, e.g.index[sub], n)
					matched = true
				}
			}
			if sub, ok := s.AdditionalProperties.(*jsonschema.Schema); ok && (!matched || !declared) {
				e.expand(m, e.g.index[sub], n)
			}
			if s.UnevaluatedProperties != nil {
				e.expand(m, e.g.index[s.UnevaluatedProperties], n)
			}
		}
		return m
	}
	for _, name := range slices.Sorted(mapKeys(names)) {
		out = append(out, member(name, true))
	}
	out = append(out, member("", false))
	item := func(i int, rest bool) closure {
		m := closure{}
		for k, n := range c {
			s := nodes[k]
			var sub *jsonschema.Schema
			switch items := s.Items.(type) {
			case *jsonschema.Schema:
				sub = items
			case []*jsonschema.Schema:
				if !rest && i < len(items) {
					sub = items[i]
				} else if a, ok := s.AdditionalItems.(*jsonschema.Schema); ok {
					sub = a
				}
			}
			if !rest && i < len(s.PrefixItems) {
				sub = s.PrefixItems[i]
			} else if s.Items2020 != nil {
				sub = s.Items2020
			}
			for _, x := range []*jsonschema.Schema{sub, s.Contains, s.UnevaluatedItems} {
				if x != nil {
					e.expand(m, e.g.index[x], n)
				}
			}
		}
		return m
	}
	for i := range prefix {
		out = append(out, item(i, false))
	}
	out = append(out, item(prefix, true))
	// Property names, and a string's content schema, are checked as
	// values of their own.
	names2 := closure{}
	for k, n := range c {
		for _, x := range []*jsonschema.Schema{nodes[k].PropertyNames, nodes[k].ContentSchema} {
			if x != nil {
				e.expand(names2, e.g.index[x], n)
			}
		}
	}
	return append(out, names2)
}

// checkValue walks a decoded value for the bounds every check keeps (its
// numbers, its depth when deep) and returns its size: its members and
// items (the value itself counts one), and the bytes of its strings,
// names and numbers. It runs before every general check, so it walks
// without keeping where it is; a value past a bound is walked again to
// say where.
func checkValue(v any, deep bool) (n, b int, err error) {
	var s valueSize
	if s.walk(v, 0, deep) {
		return s.n, s.b, nil
	}
	var loc []string
	return 0, 0, locate(v, 0, deep, &loc)
}

// valueSize is the size of a value walked so far.
type valueSize struct{ n, b int }

// walk adds v's size, and reports whether v is within the bounds.
func (s *valueSize) walk(v any, depth int, deep bool) bool {
	s.n++
	if deep && depth > MaxValueDepth {
		return false
	}
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			s.b += len(k)
			if !s.walk(x, depth+1, deep) {
				return false
			}
		}
	case []any:
		for _, x := range v {
			if !s.walk(x, depth+1, deep) {
				return false
			}
		}
	case string:
		s.b += len(v)
	case json.Number:
		if numberPastBounds(string(v)) != "" {
			return false
		}
		s.b += len(v)
	}
	return true
}

// locate finds where v is past a bound, as a [*ValueError]; loc is the
// location of v.
func locate(v any, depth int, deep bool, loc *[]string) error {
	if deep && depth > MaxValueDepth {
		return &ValueError{Location: slices.Clone(*loc), Why: fmt.Sprintf("nested deeper than %d levels", MaxValueDepth)}
	}
	step := func(key string, x any) error {
		*loc = append(*loc, key)
		err := locate(x, depth+1, deep, loc)
		*loc = (*loc)[:len(*loc)-1]
		return err
	}
	switch v := v.(type) {
	case map[string]any:
		for _, k := range slices.Sorted(mapKeys(v)) {
			if err := step(k, v[k]); err != nil {
				return err
			}
		}
	case []any:
		for i, x := range v {
			if err := step(strconv.Itoa(i), x); err != nil {
				return err
			}
		}
	case json.Number:
		if why := numberPastBounds(string(v)); why != "" {
			return &ValueError{Location: slices.Clone(*loc), Why: why}
		}
	}
	return nil
}

// numberPastBounds says why a JSON number is too costly to compare
// exactly, or "" when it is not.
func numberPastBounds(s string) string {
	if len(s) > MaxNumberLength {
		return fmt.Sprintf("a number of more than %d characters", MaxNumberLength)
	}
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		exp, err := strconv.Atoi(strings.TrimPrefix(s[i+1:], "+"))
		if err != nil || exp > MaxNumberExponent || exp < -MaxNumberExponent {
			return fmt.Sprintf("a number with an exponent beyond ±%d", MaxNumberExponent)
		}
	}
	return ""
}
