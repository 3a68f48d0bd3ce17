package schemas

import (
	"encoding/json"
	"fmt"
	"math/big"
	"regexp"
	"regexp/syntax"
	"slices"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
)

// A schema okso did not write could cost any amount of work to check a
// value against: allOf of two $refs to the level below, N levels deep, is
// 1.4 KB at N = 21 and doubles the cost of checking {} at every level. So
// a foreign schema is compiled within bounds, and one past a bound is
// refused where it is declared (a caller tool's declaration, an
// upstream's listing) instead of being checked at all:
//
//   - its document: its size (MaxForeignSchema bytes), values
//     (MaxForeignValues), nesting (MaxForeignDepth), the pointers to its
//     values (MaxForeignPointer), its lists of arrays or objects, and its
//     numbers (as a value's, below), so that compiling it costs little;
//   - its expansion: how many subschemas apply to any one place in a
//     value, counting every path through $ref, allOf, anyOf, oneOf, not,
//     if/then/else, dependentSchemas and the applicators that descend into
//     the value (MaxForeignExpansion); a cycle of references that never
//     descends is refused, and so are $dynamicRef and $recursiveRef, whose
//     cost grows with the depth of the value;
//   - its regular expressions: each compiled program (MaxPatternProgram),
//     and all of them (MaxPatternTotal);
//   - its work at any one place of a value (MaxForeignWork), in steps of
//     about 10 ns, as measured on the validator: see [limits].
//
// A schema's format keywords are annotations only, whatever its draft:
// drafts 4 to 7 would check formats by default, at a cost per byte that
// okso cannot bound (a "regex" format compiles the value).
//
// The validator takes no context and cannot be stopped, so a check's
// cost is bounded before it starts: the schema's work per value, per byte
// of text and per number, times the value's size, must stay within
// ForeignBudget (about 0.7 s of a core); a larger value is refused
// unchecked, with a message that says so. The budget is static, decided
// when the schema is compiled, whatever the value. A trivial schema checks
// the largest request the gateway reads (1 MiB) of text, and several
// hundred thousand small numbers; a schema of more work checks smaller
// values only.
//
// Two properties of a value are bounded for every schema, the embedded
// ones included, because the validator's cost on them does not depend on
// the schema's shape: a number is compared exactly, as a fraction, so one
// of more than MaxNumberLength characters or with an exponent beyond
// ±MaxNumberExponent is refused (1e999999 takes 22 ms to read as a
// fraction); and a value nested deeper than MaxValueDepth is refused by a
// schema that descends that deep (a recursive one).

// Bounds on a foreign schema and on the values it checks.
const (
	// MaxForeignDepth bounds the nesting of a foreign schema's document,
	// MaxForeignValues its values, and MaxForeignPointer the JSON
	// pointer to any of them, in bytes: the largest of the common public
	// servers' has 265 values, and pointers of 99 bytes.
	MaxForeignDepth   = 64
	MaxForeignValues  = 4096
	MaxForeignPointer = 256
	// MaxForeignExpansion bounds the subschemas that apply to any one
	// place in a value: at 512, checking {} against the worst schema
	// admitted costs well under a millisecond.
	MaxForeignExpansion = 512
	// MaxPatternProgram bounds the compiled program of each regular
	// expression in a foreign schema, in instructions; MaxPatternTotal
	// those of all its expressions together.
	MaxPatternProgram = 2000
	MaxPatternTotal   = 1 << 16
	// MaxForeignWork bounds the work of a foreign schema at any one place
	// in a value, in steps: per value there, per byte of its text, and
	// per number (at the cost of the cheapest), together.
	MaxForeignWork = 1 << 17
	// ForeignBudget is what checking one value may cost at most, in
	// steps.
	ForeignBudget = 1 << 26
	// MaxValueDepth bounds the nesting of a value checked against a
	// schema that descends deeper (a recursive one).
	MaxValueDepth = 64
	// MaxNumberLength bounds the characters of a number in a checked
	// value or a schema; MaxNumberExponent its exponent.
	MaxNumberLength   = 100
	MaxNumberExponent = 400
)

// The costs of the validator's work, in steps of about 10 ns, measured
// with the bounds' benchmarks (bounds_test.go) and set above them.
const (
	// evalSteps is the cost of evaluating one subschema at one place:
	// about 0.4 to 1 µs.
	evalSteps = 100
	// depthSteps: evaluating deeper costs more (each error the
	// validator builds copies its location): a place at depth d costs
	// evalSteps × (depthSteps + d) / depthSteps.
	depthSteps = 32
	// memberSteps is the cost, per member or item of a value, of each
	// subschema that scans the value's members or items.
	memberSteps = 3
	// numberSteps is the least cost of reading a number as a fraction;
	// a number costs numberSteps + its length + its exponent's magnitude.
	numberSteps = 40
	// uniqueSteps weighs what uniqueItems costs per unit of the array's
	// contents: each item written once as a key (okso's own check, not
	// the validator's, whose hash lets crafted items collide).
	uniqueSteps = 4
	// patternSteps is the cost of running one pattern instruction on one
	// byte: 10 to 25 ns (Unicode classes and case folding the dearest).
	patternSteps = 2
	// nameSteps is the cost of each name a required, dependentRequired
	// or dependencies list looks up (and keeps, when it is missing).
	nameSteps = 6
)

// maxListContainers bounds a list of a schema (other than a list of
// schemas) that has arrays or objects among its values: the metaschemas
// check enum (drafts 4 to 7), required and type lists unique with the
// validator's own hash, in which crafted values collide, before okso can
// look at the schema.
const maxListContainers = 20

// exploreSteps bounds the work of finding a schema's expansion: a schema
// whose places are too many to visit is refused as too complex.
const exploreSteps = 1 << 16

// BoundError says that a foreign schema is past one of okso's bounds.
type BoundError struct {
	// Bound is "size", "values", "depth", "pointer", "number", "list",
	// "cycle", "dynamic", "expansion", "pattern", "work" or "complexity".
	Bound string
	Limit int
}

func (e *BoundError) Error() string {
	var what string
	switch e.Bound {
	case "size":
		what = fmt.Sprintf("is larger than %d bytes", e.Limit)
	case "depth":
		what = fmt.Sprintf("is nested deeper than %d levels", e.Limit)
	case "number":
		what = fmt.Sprintf("has a number of more than %d characters or with an exponent beyond ±%d", MaxNumberLength, MaxNumberExponent)
	case "expansion":
		what = fmt.Sprintf("applies more than %d subschemas to one place in a value (through $ref, allOf, anyOf, oneOf, if, ...)", e.Limit)
	case "cycle":
		what = "refers to itself without descending into the value"
	case "dynamic":
		what = "uses $dynamicRef or $recursiveRef"
	case "list":
		what = fmt.Sprintf("has a list of more than %d values with arrays or objects among them (an enum, say)", e.Limit)
	case "values":
		what = fmt.Sprintf("has more than %d values in its document", e.Limit)
	case "pointer":
		what = fmt.Sprintf("has a value whose JSON pointer is longer than %d bytes", e.Limit)
	case "pattern":
		what = fmt.Sprintf("has patterns that compile to more than %d instructions", e.Limit)
	case "work":
		what = fmt.Sprintf("costs more than %d steps at one place in a value (subschemas, enum values, numbers and pattern instructions together)", e.Limit)
	default:
		what = fmt.Sprintf("has more than %d places to check", e.Limit)
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

// limits are what checking a value against a compiled foreign schema
// costs at most, and what it lets through. Each work is the most at any
// one place of a value (the places are told apart as the explorer
// does): the cost of a value of size s is at most
//
//	perValue·s.values + perByte·s.bytes + perNumber·s.numbers + uniqueSteps·unique·(5·s.values + s.bytes + 2·s.numbers)
//
// steps. perValue counts each subschema that applies at the place, by its
// depth, with its enum and const values and the numbers among them, and
// the subschemas of the place above that scan its members; perByte, each
// subschema (the validator copies a string it checks), its pattern's
// instructions, the enum and const strings it compares, and the
// patternProperties the place above matches names against; perNumber,
// the readings of a number as a fraction: for integer type, a bound,
// multipleOf, and each enum or const number; unique, the uniqueItems on
// the way down to the place.
type limits struct {
	perValue, perByte, perNumber, unique int
	// deep: the schema descends MaxValueDepth levels into a value, so a
	// deeper value is refused.
	deep bool
}

// size is a value's size: its values (members, items and itself), the
// bytes of its strings, names and numbers, and the cost of reading its
// numbers as fractions.
type size struct{ values, bytes, numbers int }

// cost is the most checking a value of size s costs, in steps.
func (l limits) cost(s size) int {
	return l.perValue*s.values + l.perByte*s.bytes + l.perNumber*s.numbers +
		uniqueSteps*l.unique*(5*s.values+s.bytes+2*s.numbers)
}

// patternSizer is the compiler's regexp engine: it refuses a program past
// MaxPatternProgram or, all together, past MaxPatternTotal, and keeps
// each one's size for the work. It is used while the schema compiles
// only: the checks of values never compile patterns (formats are
// annotations), and it refuses to once the schema is compiled.
type patternSizer struct {
	size  map[string]int
	total int
	past  *BoundError // the bound a pattern was past (the compiler's error hides it)
	done  bool
}

// errCompiled refuses a pattern to compile once the schema is compiled.
var errCompiled = fmt.Errorf("no pattern compiles after the schema")

func (p *patternSizer) compile(s string) (jsonschema.Regexp, error) {
	if p.done {
		return nil, errCompiled
	}
	size, seen := p.size[s]
	if !seen {
		re, err := syntax.Parse(s, syntax.Perl)
		if err != nil {
			return nil, err
		}
		prog, err := syntax.Compile(re.Simplify())
		if err != nil {
			return nil, err
		}
		size = len(prog.Inst)
		if size > MaxPatternProgram {
			p.past = &BoundError{Bound: "pattern", Limit: MaxPatternProgram}
			return nil, p.past
		}
		p.size[s] = size
	}
	// Each pattern the compiler asks for is compiled and kept, the same
	// one again included.
	if p.total += size; p.total > MaxPatternTotal {
		p.past = &BoundError{Bound: "pattern", Limit: MaxPatternTotal}
		return nil, p.past
	}
	return regexp.Compile(s)
}

// checkDoc checks a foreign schema's document, before the compiler sees
// it, for the bounds on its nesting, its values and the pointers to them,
// its lists and its numbers (an enum's or a const's are read as fractions
// on every check, as a value's are). The compiler's own work grows faster
// than the document: it checks the document against its draft's
// metaschema building each subschema's pointer anew, looks each one up
// in a list, and checks lists such as enum, required and type unique
// with a hash in which crafted values collide.
func checkDoc(doc any) error {
	var w docWalk
	return w.walk(doc, 1, 0, false)
}

// docWalk is a walk of a schema's document.
type docWalk struct{ values int }

// walk checks v, at depth, with a pointer of ptr bytes to it; schemas:
// v is a list of schemas (allOf, anyOf, oneOf, prefixItems, items).
func (w *docWalk) walk(v any, depth, ptr int, schemas bool) error {
	if w.values++; w.values > MaxForeignValues {
		return &BoundError{Bound: "values", Limit: MaxForeignValues}
	}
	if depth > MaxForeignDepth {
		return &BoundError{Bound: "depth", Limit: MaxForeignDepth}
	}
	if ptr > MaxForeignPointer {
		return &BoundError{Bound: "pointer", Limit: MaxForeignPointer}
	}
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if err := w.walk(x, depth+1, ptr+1+len(k)+strings.Count(k, "~")+strings.Count(k, "/"), schemaList(k)); err != nil {
				return err
			}
		}
	case []any:
		if !schemas && len(v) > maxListContainers && slices.ContainsFunc(v, isContainer) {
			return &BoundError{Bound: "list", Limit: maxListContainers}
		}
		for i, x := range v {
			if err := w.walk(x, depth+1, ptr+1+len(strconv.Itoa(i)), false); err != nil {
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

// schemaList reports whether a keyword's array holds schemas.
func schemaList(keyword string) bool {
	switch keyword {
	case "allOf", "anyOf", "oneOf", "prefixItems", "items":
		return true
	}
	return false
}

func isContainer(v any) bool {
	switch v.(type) {
	case map[string]any, []any:
		return true
	}
	return false
}

// graph is a compiled schema's subschemas as numbered nodes.
type graph struct {
	nodes []*jsonschema.Schema
	index map[*jsonschema.Schema]int
	// inPlace are the subschemas that apply to the same place of the
	// value, with repeats.
	inPlace [][]int
	// What one evaluation of a node costs (limits): per value, per byte,
	// per number; and the cost of scanning the value's members or items,
	// per member (scan) and per byte of its name (scanText).
	evalW, textW, numW, scanW, scanText []int
}

// analyse finds the limits of a compiled foreign schema, or the bound it
// is past.
func analyse(root *jsonschema.Schema, patterns *patternSizer) (limits, error) {
	g := &graph{index: map[*jsonschema.Schema]int{}}
	g.add(root)
	for i := 0; i < len(g.nodes); i++ {
		s := g.nodes[i]
		if s.DynamicRef != nil || s.RecursiveRef != nil {
			return limits{}, &BoundError{Bound: "dynamic"}
		}
		for _, sub := range all(s) {
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
	e := explorer{g: g, closures: closures, seen: map[string]bool{}, onPath: map[string]bool{}}
	if err := e.place(closures[0], 0, inherited{}); err != nil {
		return limits{}, err
	}
	return e.lim, nil
}

func (g *graph) add(s *jsonschema.Schema) int {
	if i, ok := g.index[s]; ok {
		return i
	}
	i := len(g.nodes)
	g.index[s] = i
	g.nodes = append(g.nodes, s)
	return i
}

// link finds node i's in-place subschemas and its costs.
func (g *graph) link(i int, patterns *patternSizer) {
	if g.inPlace == nil {
		n := len(g.nodes)
		g.inPlace = make([][]int, n)
		g.evalW, g.textW, g.numW = make([]int, n), make([]int, n), make([]int, n)
		g.scanW, g.scanText = make([]int, n), make([]int, n)
	}
	s := g.nodes[i]
	var in []int
	inPlace := func(subs ...*jsonschema.Schema) {
		for _, sub := range subs {
			if sub != nil {
				in = append(in, g.index[sub])
			}
		}
	}
	inPlace(s.Ref, s.Not, s.If, s.Then, s.Else)
	inPlace(s.AllOf...)
	inPlace(s.AnyOf...)
	inPlace(s.OneOf...)
	for _, k := range slices.Sorted(mapKeys(s.DependentSchemas)) {
		inPlace(s.DependentSchemas[k])
	}
	for _, k := range slices.Sorted(mapKeys(s.Dependencies)) {
		if sub, ok := s.Dependencies[k].(*jsonschema.Schema); ok {
			inPlace(sub)
		}
	}
	g.inPlace[i] = in

	eval, text, num := evalSteps, 1, 0 // the validator copies every string it checks
	compared := func(v any) {
		c := docCost(v)
		eval += c.values + c.numbers // the other side of each comparison
		text += c.strings
		num += c.numberNodes
	}
	if s.Enum != nil {
		for _, v := range s.Enum.Values {
			compared(v)
		}
	}
	if s.Const != nil {
		compared(*s.Const)
	}
	eval += nameSteps*len(s.Required) + len(s.DependentRequired) + len(s.Dependencies) + len(s.DependentSchemas)
	for _, req := range s.DependentRequired {
		eval += nameSteps * len(req)
	}
	for _, d := range s.Dependencies {
		if req, ok := d.([]string); ok {
			eval += nameSteps * len(req)
		}
	}
	if s.Types != nil && slices.Contains(s.Types.ToStrings(), "integer") {
		num++
	}
	if s.Minimum != nil || s.Maximum != nil || s.ExclusiveMinimum != nil || s.ExclusiveMaximum != nil {
		num++
	}
	if s.MultipleOf != nil {
		num += 2
	}
	if s.Pattern != nil {
		text += patternSteps * patterns.size[s.Pattern.String()]
	}
	scanText := 0
	for re := range s.PatternProperties {
		scanText += patternSteps * patterns.size[re.String()] // on each name
	}
	g.evalW[i], g.textW[i], g.numW[i] = eval, text, num
	g.scanW[i], g.scanText[i] = memberSteps+len(s.PatternProperties), scanText
}

// constCost is what comparing with a schema's enum or const value costs.
type constCost struct {
	values, strings, numberNodes, numbers int
}

// docCost counts a decoded document: its values, its strings, its
// numbers and the cost of reading them.
func docCost(v any) constCost {
	c := constCost{values: 1}
	switch v := v.(type) {
	case map[string]any:
		for _, x := range v {
			d := docCost(x)
			c.values, c.strings, c.numberNodes, c.numbers = c.values+d.values, c.strings+d.strings, c.numberNodes+d.numberNodes, c.numbers+d.numbers
		}
	case []any:
		for _, x := range v {
			d := docCost(x)
			c.values, c.strings, c.numberNodes, c.numbers = c.values+d.values, c.strings+d.strings, c.numberNodes+d.numberNodes, c.numbers+d.numbers
		}
	case string:
		c.strings = 1
	case json.Number:
		c.numberNodes, c.numbers = 1, numberCost(string(v))
	}
	return c
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
	out := []*jsonschema.Schema{s.Ref, s.Not, s.If, s.Then, s.Else}
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

// closure is the multiset of nodes that apply in place, as node → count.
type closure map[int]int

// closures finds, for each node, the nodes that apply in place when it
// does, with how many paths lead to each. A node whose closure is past
// the expansion bound is refused at once (every node applies at some
// place), which keeps each closure small; so is a cycle of in-place
// references (it would never descend into the value).
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
			return &BoundError{Bound: "cycle"}
		case done:
			return nil
		}
		state[i] = visiting
		c, paths := closure{i: 1}, 1
		for _, j := range g.inPlace[i] {
			if err := visit(j); err != nil {
				return err
			}
			for k, n := range out[j] {
				c[k] += n
				paths += n
			}
			if paths > MaxForeignExpansion {
				return &BoundError{Bound: "expansion", Limit: MaxForeignExpansion}
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
	seen     map[string]bool // places visited, by their multiset, what they inherit, and their depth
	onPath   map[string]bool // the places being visited (by multiset and inheritance): one met again is recursion
	steps    int
	lim      limits
}

// inherited is what a place gets from the places above it: the cost of
// the subschemas above that scan its members or items, per member and
// per byte of its name; and the uniqueItems on the way down.
type inherited struct{ scan, scanText, unique int }

// key names a multiset and what its place inherits.
func (c closure) key(in inherited) string {
	ids := make([]int, 0, len(c))
	for k := range c {
		ids = append(ids, k)
	}
	slices.Sort(ids)
	var b strings.Builder
	fmt.Fprintf(&b, "%d,%d,%d|", in.scan, in.scanText, in.unique)
	for _, id := range ids {
		fmt.Fprintf(&b, "%d:%d,", id, c[id])
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

func (e *explorer) place(c closure, depth int, in inherited) error {
	if len(c) == 0 {
		return nil
	}
	g := e.g
	paths, eval, text, num, unique := 0, 0, in.scanText, 0, in.unique
	var scan, scanText int
	for k, n := range c {
		paths += n
		eval += n * g.evalW[k]
		text += n * g.textW[k]
		num += n * g.numW[k]
		scan += n * g.scanW[k]
		scanText += n * g.scanText[k]
		if g.nodes[k].UniqueItems {
			unique += n
		}
	}
	if paths > MaxForeignExpansion {
		return &BoundError{Bound: "expansion", Limit: MaxForeignExpansion}
	}
	// at is the work of the place at a depth.
	at := func(depth int) error {
		eval := in.scan + eval*(depthSteps+depth)/depthSteps
		if eval+text+num*numberSteps+uniqueSteps*unique*5 > MaxForeignWork {
			return &BoundError{Bound: "work", Limit: MaxForeignWork}
		}
		l := &e.lim
		l.perValue, l.perByte, l.perNumber, l.unique = max(l.perValue, eval), max(l.perByte, text), max(l.perNumber, num), max(l.unique, unique)
		return nil
	}
	if err := at(depth); err != nil {
		return err
	}
	e.steps += len(c)
	if e.steps > exploreSteps {
		return &BoundError{Bound: "complexity", Limit: exploreSteps}
	}
	if depth >= MaxValueDepth {
		e.lim.deep = true
		return nil
	}
	names := e.names(c)
	// Each member's name is checked at the names' place too: its cost
	// is each member's.
	scan += e.work(names, depth+1, inherited{})
	scanText += e.text(names)
	below := inherited{scan: scan, scanText: scanText, unique: unique}
	key := c.key(below)
	if e.onPath[key] {
		// Recursion: the same subschemas again, deeper, down to the
		// deepest place a value may have.
		e.lim.deep = true
		return at(MaxValueDepth)
	}
	// A place's work grows with its depth, and the places below it are
	// cut at MaxValueDepth: one met again at another depth is visited
	// again (exploreSteps bounds the visits).
	visit := key + "@" + strconv.Itoa(depth)
	if e.seen[visit] {
		return nil
	}
	e.onPath[key] = true
	defer delete(e.onPath, key)
	for _, child := range append(e.children(c), names) {
		if err := e.place(child, depth+1, below); err != nil {
			return err
		}
	}
	e.seen[visit] = true
	return nil
}

// work is what one value at a place of multiset c costs per value, at a
// depth, with what it inherits.
func (e *explorer) work(c closure, depth int, in inherited) int {
	eval := 0
	for k, n := range c {
		eval += n * e.g.evalW[k]
	}
	return in.scan + eval*(depthSteps+depth)/depthSteps
}

// text is what a place of multiset c costs per byte.
func (e *explorer) text(c closure) int {
	t := 0
	for k, n := range c {
		t += n * e.g.textW[k]
	}
	return t
}

// names is the multiset of subschemas that check the property names (and
// a string's content) of the value at a place of multiset c: values of
// their own, one level down.
func (e *explorer) names(c closure) closure {
	names := closure{}
	for k, n := range c {
		for _, x := range []*jsonschema.Schema{e.g.nodes[k].PropertyNames, e.g.nodes[k].ContentSchema} {
			if x != nil {
				e.expand(names, e.g.index[x], n)
			}
		}
	}
	return names
}

// children are the multisets of subschemas at each place one level down:
// each member a subschema names, any other member, each item a prefix
// names, and any other item.
func (e *explorer) children(c closure) []closure {
	nodes := e.g.nodes
	// Members: each name some subschema declares, and any other.
	declared := map[string]bool{}
	var prefix int
	for k := range c {
		for name := range nodes[k].Properties {
			declared[name] = true
		}
		prefix = max(prefix, len(nodes[k].PrefixItems))
		if items, ok := nodes[k].Items.([]*jsonschema.Schema); ok {
			prefix = max(prefix, len(items))
		}
	}
	var out []closure
	member := func(name string, declared bool) closure {
		m := closure{}
		e.steps += len(c)
		for k, n := range c {
			s := nodes[k]
			matched := false
			if declared {
				e.steps += e.g.scanText[k] * (len(name) + 1) // its patterns, run on the name
			}
			if sub, ok := s.Properties[name]; ok && declared {
				e.expand(m, e.g.index[sub], n)
				matched = true
			}
			for re, sub := range s.PatternProperties {
				// Any other name may match any pattern.
				if !declared {
					e.expand(m, e.g.index[sub], n)
					matched = true
					continue
				}
				if re.MatchString(name) {
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
	for _, name := range slices.Sorted(mapKeys(declared)) {
		if e.steps > exploreSteps {
			break // place says so
		}
		out = append(out, member(name, true))
	}
	out = append(out, member("", false))
	item := func(i int, rest bool) closure {
		m := closure{}
		e.steps += len(c)
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
		if e.steps > exploreSteps {
			break
		}
		out = append(out, item(i, false))
	}
	out = append(out, item(prefix, true))
	return out
}

// tame makes every format of a compiled schema an annotation (see
// above), and checks its uniqueItems with okso's own check: the
// validator's hashes crafted items alike (no lengths, no ends), and then
// compares every pair.
func tame(root *jsonschema.Schema) {
	seen := map[*jsonschema.Schema]bool{}
	var walk func(*jsonschema.Schema)
	walk = func(s *jsonschema.Schema) {
		if s == nil || seen[s] {
			return
		}
		seen[s] = true
		s.Format = nil
		if s.UniqueItems {
			s.UniqueItems = false
			s.Extensions = append(s.Extensions, uniqueItems{})
		}
		for _, sub := range all(s) {
			walk(sub)
		}
	}
	walk(root)
}

// uniqueItems checks that an array's items are unique as JSON Schema
// means it (numbers equal by value, objects whatever their order), with
// one exact key per item: linear in the array's contents.
type uniqueItems struct{}

func (uniqueItems) Validate(ctx *jsonschema.ValidatorContext, v any) {
	arr, ok := v.([]any)
	if !ok || len(arr) < 2 {
		return
	}
	seen := make(map[string]int, len(arr))
	var b []byte
	for i, item := range arr {
		b = uniqueKey(b[:0], item)
		if j, dup := seen[string(b)]; dup {
			ctx.AddError(&kind.UniqueItems{Duplicates: [2]int{j, i}})
			return
		}
		seen[string(b)] = i
	}
}

// uniqueKey appends an exact encoding of v: two values have the same
// key exactly when JSON Schema deems them equal.
func uniqueKey(b []byte, v any) []byte {
	switch v := v.(type) {
	case nil:
		return append(b, 'n')
	case bool:
		if v {
			return append(b, 't')
		}
		return append(b, 'f')
	case string:
		b = append(b, 's')
		b = strconv.AppendInt(b, int64(len(v)), 10)
		b = append(b, ':')
		return append(b, v...)
	case json.Number:
		r, ok := new(big.Rat).SetString(string(v))
		if !ok {
			b = append(b, 'x')
			b = strconv.AppendInt(b, int64(len(v)), 10)
			b = append(b, ':')
			return append(b, v...)
		}
		s := r.RatString()
		b = append(b, 'd')
		b = strconv.AppendInt(b, int64(len(s)), 10)
		b = append(b, ':')
		return append(b, s...)
	case []any:
		b = append(b, 'a')
		b = strconv.AppendInt(b, int64(len(v)), 10)
		b = append(b, ':')
		for _, x := range v {
			b = uniqueKey(b, x)
		}
		return b
	case map[string]any:
		b = append(b, 'o')
		b = strconv.AppendInt(b, int64(len(v)), 10)
		b = append(b, ':')
		for _, k := range slices.Sorted(mapKeys(v)) {
			b = uniqueKey(b, k)
			b = uniqueKey(b, v[k])
		}
		return b
	}
	return append(b, '?') // no value Decode makes
}

// checkValue walks a decoded value for the bounds every check keeps (its
// numbers, its depth when deep) and returns its size. It runs before
// every general check, so it walks without keeping where it is; a value
// past a bound is walked again to say where.
func checkValue(v any, deep bool) (size, error) {
	var s size
	if s.walk(v, 0, deep) {
		return s, nil
	}
	var loc []string
	return size{}, locate(v, 0, deep, &loc)
}

// walk adds v's size, and reports whether v is within the bounds.
func (s *size) walk(v any, depth int, deep bool) bool {
	s.values++
	if deep && depth > MaxValueDepth {
		return false
	}
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			s.bytes += len(k)
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
		s.bytes += len(v)
	case json.Number:
		if numberPastBounds(string(v)) != "" {
			return false
		}
		s.bytes += len(v)
		s.numbers += numberCost(string(v))
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
	if exp, ok := exponent(s); !ok || exp > MaxNumberExponent || exp < -MaxNumberExponent {
		return fmt.Sprintf("a number with an exponent beyond ±%d", MaxNumberExponent)
	}
	return ""
}

// exponent is a JSON number's exponent (0 when it has none); ok is false
// when it does not read as an int.
func exponent(s string) (int, bool) {
	i := strings.IndexAny(s, "eE")
	if i < 0 {
		return 0, true
	}
	exp, err := strconv.Atoi(strings.TrimPrefix(s[i+1:], "+"))
	return exp, err == nil
}

// numberCost is what reading a number within the bounds as a fraction
// costs, in steps: about numberSteps, plus its length and its exponent's
// magnitude (1e400 takes about 4 µs).
func numberCost(s string) int {
	exp, _ := exponent(s)
	if exp < 0 {
		exp = -exp
	}
	return numberSteps + len(s) + exp
}
