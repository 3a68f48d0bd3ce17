package schemas

import (
	"encoding/json"
	"math/big"
	"regexp"
	"slices"
	"strconv"
	"unicode/utf8"
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

	minLen, maxLen int // -1: none
	min, max       *bound
	pattern        *regexp.Regexp
	enum           bool // the value must be one of enumStr or enumInt
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
			q.pattern = re
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
	return q
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
	if q.pattern != nil && !q.pattern.MatchString(s) {
		return false
	}
	return !q.enum || slices.Contains(q.enumStr, s)
}

func (q *quick) number(n json.Number) bool {
	x, isInt := plainInt(n)
	if q.enum && !(isInt && slices.Contains(q.enumInt, x)) {
		return false
	}
	switch {
	case q.types == 0:
	case q.types&typeNumber != 0:
	case q.types&typeInteger != 0 && isInt:
	default:
		return false
	}
	if q.min == nil && q.max == nil {
		return true
	}
	if !isInt {
		return q.ratInBounds(string(n))
	}
	return (q.min == nil || x >= q.min.n) && (q.max == nil || x <= q.max.n)
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
