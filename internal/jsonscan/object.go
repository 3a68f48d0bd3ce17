package jsonscan

import (
	"bytes"
	"strconv"
)

// Bounds of the objects Object reads; beyond them it declines.
const (
	maxDepth      = 32 // nesting of objects and arrays
	maxOpenKeys   = 64 // keys of the objects open at once
	maxObjectKeys = 16 // keys of one object: each is compared with those before it
)

// Object is [Members] for an object read whole: it reports whether b is
// exactly one JSON object (RFC 8259), with nothing but white space around
// it, whose keys, at every depth, are plain (see [String]) and each
// written once in their object, within small bounds of nesting and size,
// and whether f accepted each of its own members. Unlike Members it
// checks every value, so f need not; f sees the top level only. What
// Object accepts, encoding/json and the schemas' strict decoder both read
// (valid JSON, no key written twice); false means only that it cannot
// tell.
func Object(b []byte, f func(key, val []byte) bool) bool {
	s := objectScan{b: b, i: skipSpace(b, 0)}
	if s.i >= len(b) || b[s.i] != '{' {
		return false
	}
	return s.object(1, f) && skipSpace(b, s.i) == len(b)
}

// Value is [Object] for any JSON value: it reports whether b is exactly
// one JSON value, with nothing but white space around it, whose objects'
// keys, at every depth, are plain and each written once in their object,
// within the same bounds. A raw value it accepts is one that encoding/json
// and the schemas' strict decoder both read, where [Raw] answers only for
// encoding/json, which keeps the last of duplicate keys.
func Value(b []byte) bool {
	s := objectScan{b: b}
	return s.value(0) && skipSpace(b, s.i) == len(b)
}

// objectScan is the state of one Object or Value: the input, the offset, and the
// keys of the objects being read, innermost last.
type objectScan struct {
	b    []byte
	i    int
	keys [maxOpenKeys][2]int // [start, end) of each key in b
	n    int
}

// value reads the value at s.i, after any white space, at depth depth.
func (s *objectScan) value(depth int) bool {
	s.i = skipSpace(s.b, s.i)
	if s.i >= len(s.b) {
		return false
	}
	switch c := s.b[s.i]; {
	case c == '{':
		return s.object(depth+1, nil)
	case c == '[':
		return s.array(depth + 1)
	case c == '"':
		return s.str()
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	case c == '-' || isDigit(c):
		start := s.i
		end, ok := NumberEnd(s.b, s.i)
		s.i = end
		return ok && fitsFloat(s.b[start:end])
	}
	return false
}

// fitsFloat reports whether the JSON number v is within float64's range,
// as encoding/json needs to read it into an any (it refuses 1e400). Only
// one with an exponent, or longer than 308 bytes, can be beyond it.
func fitsFloat(v []byte) bool {
	if len(v) <= 308 && !bytes.ContainsAny(v, "eE") {
		return true
	}
	_, err := strconv.ParseFloat(string(v), 64)
	return err == nil
}

// object reads the object at s.i; f, when not nil, must accept each
// member.
func (s *objectScan) object(depth int, f func(key, val []byte) bool) bool {
	if depth > maxDepth {
		return false
	}
	s.i = skipSpace(s.b, s.i+1) // {
	if s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		return true
	}
	base := s.n
	for {
		end, ok := plainEnd(s.b, s.i)
		if !ok {
			return false
		}
		key := s.b[s.i+1 : end-1]
		if s.n-base >= maxObjectKeys || s.n >= len(s.keys) {
			return false
		}
		for _, k := range s.keys[base:s.n] {
			if string(s.b[k[0]:k[1]]) == string(key) {
				return false // a duplicate: the schemas' decoder refuses it
			}
		}
		s.keys[s.n] = [2]int{s.i + 1, end - 1}
		s.n++
		s.i = skipSpace(s.b, end)
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return false
		}
		s.i = skipSpace(s.b, s.i+1)
		start := s.i
		if !s.value(depth) || f != nil && !f(key, s.b[start:s.i]) {
			return false
		}
		s.i = skipSpace(s.b, s.i)
		if s.i >= len(s.b) {
			return false
		}
		switch s.b[s.i] {
		case ',':
			s.i = skipSpace(s.b, s.i+1)
		case '}':
			s.i++
			s.n = base
			return true
		default:
			return false
		}
	}
}

func (s *objectScan) array(depth int) bool {
	if depth > maxDepth {
		return false
	}
	s.i = skipSpace(s.b, s.i+1) // [
	if s.i < len(s.b) && s.b[s.i] == ']' {
		s.i++
		return true
	}
	for {
		if !s.value(depth) {
			return false
		}
		s.i = skipSpace(s.b, s.i)
		if s.i >= len(s.b) {
			return false
		}
		switch s.b[s.i] {
		case ',':
			s.i++
		case ']':
			s.i++
			return true
		default:
			return false
		}
	}
}

// str reads a string value. Bytes that are not valid UTF-8 are accepted,
// as every JSON decoder of okso accepts them (each becomes U+FFFD).
func (s *objectScan) str() bool {
	for i := s.i + 1; i < len(s.b); {
		switch c := s.b[i]; {
		case c == '"':
			s.i = i + 1
			return true
		case c < 0x20:
			return false
		case c == '\\':
			if i+1 >= len(s.b) {
				return false
			}
			switch s.b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(s.b) || !isHex(s.b[i+2]) || !isHex(s.b[i+3]) || !isHex(s.b[i+4]) || !isHex(s.b[i+5]) {
					return false
				}
				i += 6
			default:
				return false
			}
		default:
			i++
		}
	}
	return false
}

func isHex(c byte) bool { return isDigit(c) || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

func (s *objectScan) literal(lit string) bool {
	if len(s.b)-s.i < len(lit) || string(s.b[s.i:s.i+len(lit)]) != lit {
		return false
	}
	s.i += len(lit)
	return true
}
