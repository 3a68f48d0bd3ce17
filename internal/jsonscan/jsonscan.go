// Package jsonscan reads JSON objects of a canonical form in one pass.
//
// okso's hot messages (device frames, the NATS call and its reply, a
// JSON-RPC tools/call) are small objects whose keys are exact, lower-case
// and present at most once. encoding/json decodes them by reflection for
// 3 to 12 µs each, several times per call. The functions here delimit
// such an object's members without decoding them, and read the values
// whose decoded form is their raw bytes (plain strings, canonical
// integers, booleans), or check one whole ([Object], [Value]: valid, and
// no key written twice at any depth). A caller accepts what it recognises
// and reports false on anything else, which then goes to the strict
// decoder for its verdict. This is okso's one JSON scanner: the strict
// decoder (schemas.Decode) reads numbers with it too. One oracle judges
// every reader built on it, package jsonscantest (encoding/json, made
// strict): each reader's fuzz target checks that whatever it accepts
// encoding/json decodes strictly to the same value.
//
// Start with [Fields] (or [Members], which it is built on):
//
//	seen, ok := jsonscan.Fields(b, []string{"tool", "arguments"}, func(i int, val []byte) (ok bool) {
//		switch i {
//		case 0:
//			call.Tool, ok = jsonscan.String(val)
//		...
//	})
package jsonscan

import (
	"encoding/json"
	"math"
	"unicode/utf8"
)

// Members calls f with each member of the JSON object in b (its key's
// bytes between the quotes, its raw value) and reports whether b is one
// such object with nothing but white space around it and f accepted every
// member. Keys must be plain (see [String]); values are only delimited
// here, so f must check the ones it keeps. The slices f gets share b's
// memory.
func Members(b []byte, f func(key, val []byte) bool) bool {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return skipSpace(b, i+1) == len(b)
	}
	for {
		end, ok := plainEnd(b, i)
		if !ok {
			return false
		}
		key := b[i+1 : end-1]
		j := skipSpace(b, end)
		if j >= len(b) || b[j] != ':' {
			return false
		}
		j = skipSpace(b, j+1)
		end, ok = valueEnd(b, j)
		if !ok || !f(key, b[j:end]) {
			return false
		}
		i = skipSpace(b, end)
		if i >= len(b) {
			return false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			return skipSpace(b, i+1) == len(b)
		default:
			return false
		}
	}
}

// Fields is [Members] for an object of known keys, the shape of every
// one-pass decoder: it calls f with the index in keys of each member's
// key and the member's raw value, and reports which keys it saw (bit i for
// keys[i]) and whether b is such an object with no key outside keys (at
// most 64), none written twice, and f accepted every member.
func Fields(b []byte, keys []string, f func(i int, val []byte) bool) (seen uint64, ok bool) {
	ok = len(keys) <= 64 && Members(b, func(k, v []byte) bool {
		for i, key := range keys {
			if string(k) == key {
				if seen&(1<<i) != 0 || !f(i, v) {
					return false
				}
				seen |= 1 << i
				return true
			}
		}
		return false
	})
	return seen, ok
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// plainEnd returns the index after the JSON string at b[i] if it is
// plain: printable ASCII without escapes.
func plainEnd(b []byte, i int) (int, bool) {
	if i >= len(b) || b[i] != '"' {
		return 0, false
	}
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return j + 1, true
		case c == '\\' || c < 0x20 || c >= 0x7f:
			return 0, false
		}
	}
	return 0, false
}

// valueEnd returns the index just after the JSON value starting at b[i],
// finding its end only: whether it is valid JSON is for the caller.
func valueEnd(b []byte, i int) (int, bool) {
	if i >= len(b) {
		return 0, false
	}
	switch b[i] {
	case '"':
		for j := i + 1; j < len(b); j++ {
			switch b[j] {
			case '\\':
				j++
			case '"':
				return j + 1, true
			}
		}
		return 0, false
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1, true
				}
			case '"':
				end, ok := valueEnd(b, j)
				if !ok {
					return 0, false
				}
				j = end - 1
			}
		}
		return 0, false
	}
	j := i
	for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' &&
		b[j] != '\t' && b[j] != '\n' && b[j] != '\r' {
		j++
	}
	return j, j > i
}

// String reads a value that is a plain string: printable ASCII without
// escapes, the only strings whose decoded value is their raw bytes
// whatever the decoder.
func String(v []byte) (string, bool) {
	end, ok := plainEnd(v, 0)
	if !ok || end != len(v) {
		return "", false
	}
	return string(v[1 : end-1]), true
}

// StringBytes is [String] without the copy: the plain string's bytes
// between its quotes, sharing v's memory.
func StringBytes(v []byte) ([]byte, bool) {
	end, ok := plainEnd(v, 0)
	if !ok || end != len(v) {
		return nil, false
	}
	return v[1 : end-1], true
}

// Raw reads a value kept raw, as a json.RawMessage decodes it: any
// valid JSON. [Value] answers first, at twice encoding/json's speed for
// the usual value, and json.Valid for what it declines.
func Raw(v []byte) (json.RawMessage, bool) {
	return json.RawMessage(v), Value(v) || json.Valid(v)
}

// Int reads a value that is an integer in canonical form (no sign but a
// minus, no leading zero, no -0) and fits an int32.
func Int(v []byte) (int, bool) {
	n, ok := Int64(v)
	if !ok || n < math.MinInt32 || n > math.MaxInt32 {
		return 0, false
	}
	return int(n), true
}

// Int64 reads a value that is an integer in canonical form (no sign but a
// minus, no leading zero, no -0) of at most 18 digits, so that it fits an
// int64 whatever the digits.
func Int64(v []byte) (int64, bool) {
	d := v
	if len(d) > 0 && d[0] == '-' {
		d = d[1:]
	}
	if len(d) == 0 || len(d) > 18 || d[0] == '0' && (len(d) > 1 || len(d) < len(v)) {
		return 0, false
	}
	var n int64
	for _, c := range d {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if len(d) < len(v) {
		n = -n
	}
	return n, true
}

// Number reports whether v is exactly one JSON number (RFC 8259).
func Number(v []byte) bool {
	end, ok := NumberEnd(v, 0)
	return ok && end == len(v)
}

// NumberEnd reads the RFC 8259 number at s[i],
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?, and returns the index
// just after it; when there is none, false and the index of the byte where
// the grammar failed (len(s) when it ran out).
func NumberEnd[S []byte | string](s S, i int) (int, bool) {
	if i < len(s) && s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case i < len(s) && isDigit(s[i]):
		for i++; i < len(s) && isDigit(s[i]); i++ {
		}
	default:
		return i, false
	}
	if i < len(s) && s[i] == '.' {
		i++
		if i >= len(s) || !isDigit(s[i]) {
			return i, false
		}
		for i++; i < len(s) && isDigit(s[i]); i++ {
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if i >= len(s) || !isDigit(s[i]) {
			return i, false
		}
		for i++; i < len(s) && isDigit(s[i]); i++ {
		}
	}
	return i, true
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// Bool reads a value that is true or false.
func Bool(v []byte) (b, ok bool) {
	switch string(v) {
	case "true":
		return true, true
	case "false":
		return false, true
	}
	return false, false
}

// HTMLSafe reports whether json.Marshal writes s as it is, between
// quotes: printable ASCII but for the quote, the backslash and <, >, &
// (which it escapes for HTML).
func HTMLSafe(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c >= 0x7f, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}

// AppendString appends s as json.Marshal writes a string: quoted, with
// <, > and & escaped for HTML, invalid UTF-8 as U+FFFD, and U+2028 and
// U+2029 escaped.
func AppendString[S []byte | string](dst []byte, s S) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(string(s[i:min(len(s), i+utf8.UTFMax)]))
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[r&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// Depth returns the deepest nesting of arrays and objects in the JSON
// document doc, counted before it is decoded, without decoding it (on a
// malformed one its answer means nothing: the decoder refuses it anyway).
func Depth(doc []byte) int {
	depth, deepest, inString := 0, 0, false
	for i := 0; i < len(doc); i++ {
		switch c := doc[i]; {
		case inString && c == '\\':
			i++ // the escaped character
		case c == '"':
			inString = !inString
		case inString:
		case c == '{' || c == '[':
			depth++
			deepest = max(deepest, depth)
		case c == '}' || c == ']':
			depth--
		}
	}
	return deepest
}

// MarshalsAsIs reports whether json.Marshal writes the raw value v (a
// json.RawMessage) as it is: valid, non-empty JSON with no white space
// outside strings and nothing it escapes for HTML (<, >, &, U+2028,
// U+2029, whose encoding starts with 0xE2) anywhere. What json.Marshal
// wrote passes.
func MarshalsAsIs(v []byte) bool {
	return compactScan(v, true) && json.Valid(v)
}

// Compact reports whether the valid JSON document v has no white space
// outside its strings: json.Compact would write it as it is. (On invalid
// JSON its answer means nothing.)
func Compact(v []byte) bool { return compactScan(v, false) }

// compactScan reports whether v is non-empty and has no white space
// outside strings and, with html, none of the bytes json.Marshal escapes
// for HTML anywhere.
func compactScan(v []byte, html bool) bool {
	inString := false
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case html && (c == '<' || c == '>' || c == '&' || c == 0xE2):
			return false
		case inString && c == '\\':
			i++
		case c == '"':
			inString = !inString
		case !inString && (c == ' ' || c == '\t' || c == '\n' || c == '\r'):
			return false
		}
	}
	return len(v) > 0
}
