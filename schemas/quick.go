package schemas

import (
	"encoding/json"
	"math/big"
	"regexp"
	"regexp/syntax"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/okso-io/okso/internal/jsonscan"
)

// The verb schemas take one plain shape: objects of typed properties with
// required keys, no others, and bounds, patterns or enums. A
// general validator walks such a schema for about 2.5 µs and 30
// allocations per document, and every call checks three documents. A
// quick schema is compiled from the same document for those keywords only
// and can do one thing: accept a document. Whenever it cannot tell (a
// keyword it does not know, a number it would have to compare exactly,
// any failure) it declines, and the general validator gives the verdict
// and its error. FuzzQuick checks that a document it accepts is one the
// general validator accepts.

// quick is one schema, or subschema, of that shape.
type quick struct {
	types    uint8 // allowed types (typeObject|...); 0: any
	props    map[string]*quick
	required []string
	closed   bool // additionalProperties: false
	// oneOf holds, for a oneOf whose branches each only require keys,
	// the keys of each branch: an object must have all of exactly one.
	oneOf [][]string

	// For documents still in their text (acceptsJSON): each property's
	// number, and the bits of the required ones; nil index when there are
	// too many properties to count in a word.
	index    map[string]int
	byIndex  []*quick
	requires uint64
	oneOfs   []uint64 // the bits of each oneOf branch's keys

	minLen, maxLen int // -1: none
	min, max       *bound
	pattern        *regexp.Regexp
	run            *classRun // the pattern, when it is one ASCII class repeated
	enum           bool      // the value must be one of enumStr or enumInt
	enumStr        []string
	enumInt        []int64
}

const (
	typeObject uint8 = 1 << iota
	typeString
	typeInteger // also set with typeNumber: an integer is a number
	typeNumber
	typeBoolean
	typeNull
)

// bound is an inclusive minimum or maximum that is an integer.
type bound struct{ n int64 }

// compileQuick compiles a decoded schema document, or returns nil when it
// uses anything beyond the plain shape.
func compileQuick(doc any) *quick {
	m, ok := doc.(map[string]any)
	if !ok {
		return nil
	}
	q := &quick{minLen: -1, maxLen: -1}
	for k, v := range m {
		switch k {
		case "$id", "$schema", "title", "description", "default", "examples", "$comment":
			// annotations
		case "type":
			if q.types = typeBits(v); q.types == 0 {
				return nil
			}
		case "properties":
			ps, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			q.props = make(map[string]*quick, len(ps))
			for name, p := range ps {
				if q.props[name] = compileQuick(p); q.props[name] == nil {
					return nil
				}
			}
		case "required":
			rs, ok := v.([]any)
			if !ok {
				return nil
			}
			for _, r := range rs {
				s, ok := r.(string)
				if !ok {
					return nil
				}
				q.required = append(q.required, s)
			}
		case "additionalProperties":
			b, ok := v.(bool)
			if !ok {
				return nil
			}
			q.closed = !b
		case "minLength", "maxLength":
			n, ok := count(v)
			if !ok {
				return nil
			}
			if k == "minLength" {
				q.minLen = n
			} else {
				q.maxLen = n
			}
		case "minimum", "maximum":
			n, ok := plainInt(v)
			if !ok {
				return nil
			}
			if k == "minimum" {
				q.min = &bound{n}
			} else {
				q.max = &bound{n}
			}
		case "pattern":
			s, ok := v.(string)
			if !ok {
				return nil
			}
			re, err := regexp.Compile(s) // the general validator's engine too
			if err != nil {
				return nil
			}
			q.pattern, q.run = re, compileClassRun(s)
		case "oneOf":
			if q.oneOf = requiredOnly(v); q.oneOf == nil {
				return nil
			}
		case "enum":
			es, ok := v.([]any)
			if !ok {
				return nil
			}
			q.enum = true
			for _, e := range es {
				if s, ok := e.(string); ok {
					q.enumStr = append(q.enumStr, s)
				} else if n, ok := plainInt(e); ok {
					q.enumInt = append(q.enumInt, n)
				} else {
					return nil
				}
			}
		default:
			return nil
		}
	}
	if len(q.props) <= 64 {
		q.index = make(map[string]int, len(q.props))
		for name, p := range q.props {
			q.index[name] = len(q.byIndex)
			q.byIndex = append(q.byIndex, p)
		}
		bits := func(keys []string) (uint64, bool) {
			var b uint64
			for _, k := range keys {
				i, ok := q.index[k]
				if !ok {
					return 0, false
				}
				b |= 1 << i
			}
			return b, true
		}
		requires, ok := bits(q.required)
		q.requires = requires
		for _, branch := range q.oneOf {
			var b uint64
			if b, ok = bits(branch); !ok {
				break
			}
			q.oneOfs = append(q.oneOfs, b)
		}
		if !ok {
			q.index = nil // a key no property names: the decoded path's
		}
	}
	return q
}

// requiredOnly reads the branches of a oneOf that each have one keyword,
// required (so that quick can tell whether each branch holds, not only
// when it does), or returns nil.
func requiredOnly(v any) [][]string {
	bs, ok := v.([]any)
	if !ok || len(bs) == 0 {
		return nil
	}
	var out [][]string
	for _, b := range bs {
		m, ok := b.(map[string]any)
		if !ok || len(m) != 1 {
			return nil
		}
		rs, ok := m["required"].([]any)
		if !ok {
			return nil
		}
		keys := []string{}
		for _, r := range rs {
			s, ok := r.(string)
			if !ok {
				return nil
			}
			keys = append(keys, s)
		}
		out = append(out, keys)
	}
	return out
}

func typeBits(v any) uint8 {
	names, ok := v.([]any)
	if !ok {
		names = []any{v}
	}
	var bits uint8
	for _, n := range names {
		switch n {
		case "object":
			bits |= typeObject
		case "string":
			bits |= typeString
		case "integer":
			bits |= typeInteger
		case "number":
			bits |= typeNumber | typeInteger
		case "boolean":
			bits |= typeBoolean
		case "null":
			bits |= typeNull
		default:
			return 0 // array, or not a type
		}
	}
	return bits
}

// count reads a keyword's non-negative integer.
func count(v any) (int, bool) {
	n, ok := plainInt(v)
	if !ok || n < 0 || n > 1<<30 {
		return 0, false
	}
	return int(n), true
}

// plainInt reads a json.Number written as a plain integer (digits, maybe
// a minus) that fits an int64; 1.0 or 1e3 it leaves to the general
// validator.
func plainInt(v any) (int64, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	s := string(n)
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && !(i == 0 && c == '-') {
			return 0, false
		}
	}
	x, err := strconv.ParseInt(s, 10, 64)
	return x, err == nil
}

// accepts reports whether v is valid for q; false means only that q
// cannot tell.
func (q *quick) accepts(v any) bool {
	if _, isObject := v.(map[string]any); q.oneOf != nil && !isObject {
		return false // every branch holds of a non-object: the general validator's
	}
	switch v := v.(type) {
	case map[string]any:
		return (q.types == 0 || q.types&typeObject != 0) && q.object(v)
	case string:
		return (q.types == 0 || q.types&typeString != 0) && q.str(v)
	case json.Number:
		return q.number(v)
	case bool:
		return (q.types == 0 || q.types&typeBoolean != 0) && !q.enum
	case nil:
		return (q.types == 0 || q.types&typeNull != 0) && !q.enum
	}
	return false // arrays and any other Go value: the general validator's
}

func (q *quick) object(m map[string]any) bool {
	if q.enum {
		return false
	}
	for _, r := range q.required {
		if _, ok := m[r]; !ok {
			return false
		}
	}
	if q.oneOf != nil {
		holding := 0
		for _, branch := range q.oneOf {
			if !slices.ContainsFunc(branch, func(k string) bool { _, ok := m[k]; return !ok }) {
				holding++
			}
		}
		if holding != 1 {
			return false
		}
	}
	for k, v := range m {
		p, ok := q.props[k]
		if !ok {
			if q.closed {
				return false
			}
			continue
		}
		if !p.accepts(v) {
			return false
		}
	}
	return true
}

func (q *quick) str(s string) bool {
	if q.minLen >= 0 || q.maxLen >= 0 {
		n := utf8.RuneCountInString(s)
		if q.minLen >= 0 && n < q.minLen || q.maxLen >= 0 && n > q.maxLen {
			return false
		}
	}
	switch {
	case q.run != nil:
		if !q.run.match(s) {
			return false
		}
	case q.pattern != nil:
		if !q.pattern.MatchString(s) {
			return false
		}
	}
	return !q.enum || slices.Contains(q.enumStr, s)
}

func (q *quick) number(n json.Number) bool {
	x, isInt := plainInt(n)
	if isInt {
		return q.integer(x)
	}
	if q.enum || q.types != 0 && q.types&typeNumber == 0 || numberPastBounds(string(n)) != "" {
		return false
	}
	return q.min == nil && q.max == nil || q.ratInBounds(string(n))
}

func (q *quick) integer(x int64) bool {
	if q.enum && !slices.Contains(q.enumInt, x) {
		return false
	}
	return (q.types == 0 || q.types&(typeNumber|typeInteger) != 0) &&
		(q.min == nil || x >= q.min.n) && (q.max == nil || x <= q.max.n)
}

// ratInBounds compares a number that is not a plain integer with the
// bounds exactly.
func (q *quick) ratInBounds(s string) bool {
	if s == "" || s[0] != '-' && (s[0] < '0' || s[0] > '9') || !json.Valid([]byte(s)) {
		return false // not a JSON number: the general validator's
	}
	r, ok := new(big.Rat).SetString(s)
	if !ok {
		return false
	}
	if q.min != nil && r.Cmp(new(big.Rat).SetInt64(q.min.n)) < 0 {
		return false
	}
	return q.max == nil || r.Cmp(new(big.Rat).SetInt64(q.max.n)) <= 0
}

// acceptsJSON is accepts for a document still in its JSON text: one pass
// over the bytes, where decoding first costs more than the check. It
// knows the plain forms only (objects whose keys are written once each,
// printable ASCII strings without escapes, integers of up to 18 digits,
// numbers, booleans, null); on anything else, arrays and white space
// around a value that is not an object among them, it declines, and the
// decoded path decides.
func (q *quick) acceptsJSON(v []byte) bool {
	if len(v) == 0 {
		return false
	}
	switch c := v[0]; {
	case c == '{' || c == ' ' || c == '\t' || c == '\n' || c == '\r':
		return (q.types == 0 || q.types&typeObject != 0) && q.objectJSON(v)
	case q.oneOf != nil:
		return false // as accepts
	case c == '"':
		s, ok := jsonscan.StringBytes(v)
		return ok && (q.types == 0 || q.types&typeString != 0) && q.strJSON(s)
	case c == '-' || c >= '0' && c <= '9':
		if x, ok := jsonscan.Int64(v); ok {
			return q.integer(x)
		}
		return jsonscan.Number(v) && q.number(json.Number(v))
	case c == 't' || c == 'f':
		_, ok := jsonscan.Bool(v)
		return ok && (q.types == 0 || q.types&typeBoolean != 0) && !q.enum
	case c == 'n':
		return string(v) == "null" && (q.types == 0 || q.types&typeNull != 0) && !q.enum
	}
	return false
}

func (q *quick) objectJSON(b []byte) bool {
	if q.enum || q.index == nil || !q.closed {
		return false // an open object could repeat a key it does not know
	}
	var seen uint64
	ok := jsonscan.Members(b, func(k, v []byte) bool {
		i, known := q.index[string(k)]
		if !known || seen&(1<<i) != 0 {
			return false
		}
		seen |= 1 << i
		return q.byIndex[i].acceptsJSON(v)
	})
	if !ok || seen&q.requires != q.requires {
		return false
	}
	if q.oneOf != nil {
		holding := 0
		for _, b := range q.oneOfs {
			if seen&b == b {
				holding++
			}
		}
		return holding == 1
	}
	return true
}

// strJSON is str for a plain string's bytes: ASCII, so a byte is a rune.
func (q *quick) strJSON(s []byte) bool {
	if q.minLen >= 0 && len(s) < q.minLen || q.maxLen >= 0 && len(s) > q.maxLen {
		return false
	}
	switch {
	case q.run != nil:
		if !q.run.match(string(s)) {
			return false
		}
	case q.pattern != nil:
		if !q.pattern.Match(s) {
			return false
		}
	}
	return !q.enum || slices.ContainsFunc(q.enumStr, func(e string) bool { return e == string(s) })
}

// classRun is a pattern that is one character class of ASCII, repeated,
// and anchored at both ends: ^[...]{m,n}$, ^[...]*$ or ^[...]+$, the
// shape of every identifier and text pattern in the verb schemas. Go's
// regexp engine takes about a microsecond to match one; this checks the
// bytes against a table, with exactly the same verdict (FuzzClassRun).
type classRun struct {
	in       [128]bool
	min, max int // max -1: no bound
}

func compileClassRun(pattern string) *classRun {
	re, err := syntax.Parse(pattern, syntax.Perl) // as regexp.Compile parses it
	if err != nil || re.Op != syntax.OpConcat || len(re.Sub) != 3 ||
		re.Sub[0].Op != syntax.OpBeginText || re.Sub[2].Op != syntax.OpEndText {
		return nil
	}
	rep := re.Sub[1]
	c := &classRun{}
	switch rep.Op {
	case syntax.OpStar:
		c.min, c.max = 0, -1
	case syntax.OpPlus:
		c.min, c.max = 1, -1
	case syntax.OpRepeat:
		c.min, c.max = rep.Min, rep.Max
	default:
		return nil
	}
	if len(rep.Sub) != 1 || rep.Sub[0].Op != syntax.OpCharClass {
		return nil
	}
	r := rep.Sub[0].Rune
	for i := 0; i+1 < len(r); i += 2 {
		if r[i] < 0 || r[i+1] >= 128 {
			return nil
		}
		for x := r[i]; x <= r[i+1]; x++ {
			c.in[x] = true
		}
	}
	return c
}

// match reports whether s matches the pattern. A byte outside ASCII is in
// no class (and no rune it starts is either); with every byte in the
// class, bytes are runes, so the length bounds count bytes.
func (c *classRun) match(s string) bool {
	return len(s) >= c.min && (c.max < 0 || len(s) <= c.max) && c.ascii(s)
}

// ascii reports whether every byte of s is in the class.
func (c *classRun) ascii(s string) bool {
	for i := 0; i < len(s); i++ {
		if b := s[i]; b >= 128 || !c.in[b] {
			return false
		}
	}
	return true
}
