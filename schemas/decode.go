package schemas

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/okso-io/okso/internal/jsonscan"
)

// maxDepth is encoding/json's nesting limit: keeping it means Decode
// accepts exactly the documents the encoding/json based decoder accepted,
// and it bounds the recursion on hostile input.
const maxDepth = 10000

var (
	errEmpty = errors.New("empty JSON document")
	errEOF   = errors.New("unexpected end of JSON input")
	errDepth = fmt.Errorf("JSON nested deeper than %d levels", maxDepth)
)

// Decode decodes one JSON document for validation, keeping numbers exact.
// It returns the values encoding/json does when decoding into an any with
// UseNumber: map[string]any, []any, string, json.Number, bool and nil,
// with invalid UTF-8 and lone surrogates in strings replaced by U+FFFD.
// It accepts RFC 8259 JSON only, with nothing but white space after the
// value.
//
// An object with a duplicate member name is an error: the validator would
// see only the last value, while the raw document, forwarded as is, may be
// read first-wins by its consumer (a smuggling risk).
//
// Decode runs once per tool call leg, so it is one pass over a single copy
// of doc: keys, strings without escapes and numbers share that copy
// instead of each being allocated.
func Decode(doc []byte) (any, error) {
	d := decoders.Get().(*decoder)
	d.s, d.i, d.depth = string(doc), 0, 0
	v, err := d.document()
	d.release()
	return v, err
}

// member is a decoded object member waiting for its object's map.
type member struct {
	key string
	val any
}

// decoder is the state of one Decode. The elems and members stacks collect
// the contents of the arrays and objects being decoded, so that each slice
// and map is made once, at its final size; they are reused through the
// pool, as is buf, where escaped strings are unescaped.
type decoder struct {
	s       string
	i       int
	depth   int
	elems   []any
	members []member
	buf     []byte
}

var decoders = sync.Pool{New: func() any { return new(decoder) }}

// maxPooledScratch bounds the scratch a pooled decoder keeps, so that one
// huge document does not pin its memory for good.
const maxPooledScratch = 1 << 12

// release clears what an error may have left on the stacks (it would pin
// the document) and returns d to the pool.
func (d *decoder) release() {
	clear(d.elems)
	clear(d.members)
	d.elems, d.members, d.s = d.elems[:0], d.members[:0], ""
	if cap(d.elems) <= maxPooledScratch && cap(d.members) <= maxPooledScratch && cap(d.buf) <= 16*maxPooledScratch {
		decoders.Put(d)
	}
}

func (d *decoder) document() (any, error) {
	d.skipSpace()
	if d.i == len(d.s) {
		return nil, errEmpty
	}
	v, err := d.value()
	if err != nil {
		return nil, err
	}
	d.skipSpace()
	if d.i < len(d.s) {
		return nil, fmt.Errorf("trailing data after JSON value at offset %d", d.i)
	}
	return v, nil
}

// skipSpace skips the four white space characters of RFC 8259.
func (d *decoder) skipSpace() {
	i := d.i
	for i < len(d.s) {
		switch d.s[i] {
		case ' ', '\n', '\r', '\t':
			i++
		default:
			d.i = i
			return
		}
	}
	d.i = i
}

// syntaxError describes the unexpected byte at offset i.
func (d *decoder) syntaxError(i int, where string) error {
	if i >= len(d.s) {
		return errEOF
	}
	c := d.s[i]
	if c >= utf8.RuneSelf {
		return fmt.Errorf("invalid byte 0x%02x %s at offset %d", c, where, i)
	}
	return fmt.Errorf("invalid character %s %s at offset %d", strconv.QuoteRune(rune(c)), where, i)
}

// value decodes the value at d.i, which follows any white space.
func (d *decoder) value() (any, error) {
	if d.i >= len(d.s) {
		return nil, errEOF
	}
	switch c := d.s[d.i]; {
	case c == '{':
		return d.object()
	case c == '[':
		return d.array()
	case c == '"':
		s, err := d.str()
		if err != nil {
			return nil, err
		}
		return s, nil
	case c == '-' || '0' <= c && c <= '9':
		return d.number()
	case c == 't':
		return true, d.literal("true")
	case c == 'f':
		return false, d.literal("false")
	case c == 'n':
		return nil, d.literal("null")
	default:
		return nil, d.syntaxError(d.i, "looking for a value")
	}
}

func (d *decoder) literal(lit string) error {
	for k := 0; k < len(lit); k++ {
		if d.i+k >= len(d.s) || d.s[d.i+k] != lit[k] {
			return d.syntaxError(d.i+k, "in literal "+lit)
		}
	}
	d.i += len(lit)
	return nil
}

// number checks the RFC 8259 number at d.i and returns its text: the
// validator compares numbers exactly, so they are never rounded.
func (d *decoder) number() (any, error) {
	start := d.i
	end, ok := jsonscan.NumberEnd(d.s, start)
	if !ok {
		return nil, d.syntaxError(end, numberPart(d.s, start, end))
	}
	d.i = end
	return json.Number(d.s[start:end]), nil
}

// numberPart names, for an error, the part of the number starting at
// s[start] that the byte at end breaks: a number starts with a minus or a
// digit, so end > start.
func numberPart(s string, start, end int) string {
	switch c := s[end-1]; {
	case c == '.':
		return "after decimal point in number"
	case c == 'e' || c == 'E' || (c == '+' || c == '-') && end-1 > start:
		return "in exponent of number"
	}
	return "in number"
}

func (d *decoder) array() (any, error) {
	if d.depth++; d.depth > maxDepth {
		return nil, errDepth
	}
	d.i++ // [
	d.skipSpace()
	if d.i < len(d.s) && d.s[d.i] == ']' {
		d.i++
		d.depth--
		return []any{}, nil
	}
	base := len(d.elems)
	for {
		v, err := d.value()
		if err != nil {
			return nil, err
		}
		d.elems = append(d.elems, v)
		d.skipSpace()
		if d.i < len(d.s) && d.s[d.i] == ']' {
			d.i++
			break
		}
		if d.i >= len(d.s) || d.s[d.i] != ',' {
			return nil, d.syntaxError(d.i, "after array element")
		}
		d.i++
		d.skipSpace()
	}
	a := make([]any, len(d.elems)-base)
	copy(a, d.elems[base:])
	clear(d.elems[base:])
	d.elems = d.elems[:base]
	d.depth--
	return a, nil
}

func (d *decoder) object() (any, error) {
	if d.depth++; d.depth > maxDepth {
		return nil, errDepth
	}
	d.i++ // {
	d.skipSpace()
	if d.i < len(d.s) && d.s[d.i] == '}' {
		d.i++
		d.depth--
		return map[string]any{}, nil
	}
	base := len(d.members)
	for {
		if d.i >= len(d.s) || d.s[d.i] != '"' {
			return nil, d.syntaxError(d.i, "looking for an object key")
		}
		k, err := d.str()
		if err != nil {
			return nil, err
		}
		d.skipSpace()
		if d.i >= len(d.s) || d.s[d.i] != ':' {
			return nil, d.syntaxError(d.i, "after object key")
		}
		d.i++
		d.skipSpace()
		v, err := d.value()
		if err != nil {
			return nil, err
		}
		d.members = append(d.members, member{k, v})
		d.skipSpace()
		if d.i < len(d.s) && d.s[d.i] == '}' {
			d.i++
			break
		}
		if d.i >= len(d.s) || d.s[d.i] != ',' {
			return nil, d.syntaxError(d.i, "after object member")
		}
		d.i++
		d.skipSpace()
	}
	ms := d.members[base:]
	m := make(map[string]any, len(ms))
	for _, mb := range ms {
		n := len(m)
		m[mb.key] = mb.val
		if len(m) == n { // the map did not grow: the key was already there

			return nil, fmt.Errorf("duplicate key %q in JSON object", mb.key)
		}
	}
	clear(ms)
	d.members = d.members[:base]
	d.depth--
	return m, nil
}

// str decodes the string at d.i. A string with no escape and valid UTF-8,
// the usual case, is a substring of the document copy.
func (d *decoder) str() (string, error) {
	s := d.s
	start := d.i + 1
	var high byte // the bits of every byte seen: ASCII only if < 0x80
	for i := start; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"':
			if high < utf8.RuneSelf || utf8.ValidString(s[start:i]) {
				d.i = i + 1
				return s[start:i], nil
			}
			return d.unescape(start)
		case c == '\\':
			return d.unescape(start)
		case c < 0x20:
			return "", d.syntaxError(i, "in string")
		}
		high |= c
	}
	return "", errEOF
}

// unescape decodes the string whose content begins at start, as
// encoding/json does: invalid UTF-8 bytes and surrogate escapes that are
// not a valid pair each become U+FFFD.
func (d *decoder) unescape(start int) (string, error) {
	s := d.s
	b := d.buf[:0]
	i := start
	for i < len(s) {
		c := s[i]
		switch {
		case c == '"':
			d.i, d.buf = i+1, b
			return string(b), nil
		case c < 0x20:
			return "", d.syntaxError(i, "in string")
		case c < utf8.RuneSelf && c != '\\':
			b = append(b, c)
			i++
		case c >= utf8.RuneSelf:
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				b = utf8.AppendRune(b, utf8.RuneError)
			} else {
				b = append(b, s[i:i+size]...)
			}
			i += size
		case i+1 >= len(s):
			return "", errEOF
		default:
			switch e := s[i+1]; e {
			case '"', '\\', '/':
				b = append(b, e)
			case 'b':
				b = append(b, '\b')
			case 'f':
				b = append(b, '\f')
			case 'n':
				b = append(b, '\n')
			case 'r':
				b = append(b, '\r')
			case 't':
				b = append(b, '\t')
			case 'u':
				r, err := d.hex4(i + 2)
				if err != nil {
					return "", err
				}
				i += 6
				if utf16.IsSurrogate(r) {
					if r2, ok := u4At(s, i); ok {
						if pair := utf16.DecodeRune(r, r2); pair != utf8.RuneError {
							b = utf8.AppendRune(b, pair)
							i += 6
							continue
						}
					}
					r = utf8.RuneError
				}
				b = utf8.AppendRune(b, r)
				continue
			default:
				return "", d.syntaxError(i+1, "in string escape")
			}
			i += 2
		}
	}
	return "", errEOF
}

// hex4 decodes the four hex digits of a \u escape at s[i:].
func (d *decoder) hex4(i int) (rune, error) {
	var r rune
	for k := i; k < i+4; k++ {
		if k >= len(d.s) {
			return 0, errEOF
		}
		h := unhex(d.s[k])
		if h < 0 {
			return 0, d.syntaxError(k, `in \u escape`)
		}
		r = r<<4 | h
	}
	return r, nil
}

// u4At returns the code unit of the \uXXXX escape at s[i:], if there is one.
func u4At(s string, i int) (rune, bool) {
	if i+6 > len(s) || s[i] != '\\' || s[i+1] != 'u' {
		return 0, false
	}
	var r rune
	for k := i + 2; k < i+6; k++ {
		h := unhex(s[k])
		if h < 0 {
			return 0, false
		}
		r = r<<4 | h
	}
	return r, true
}

func unhex(c byte) rune {
	switch {
	case '0' <= c && c <= '9':
		return rune(c - '0')
	case 'a' <= c && c <= 'f':
		return rune(c - 'a' + 10)
	case 'A' <= c && c <= 'F':
		return rune(c - 'A' + 10)
	}
	return -1
}
