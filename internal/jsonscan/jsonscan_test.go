package jsonscan_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/okso-io/okso/internal/jsonscan"
	"github.com/okso-io/okso/internal/jsonscan/jsonscantest"
)

var seeds = []string{
	`{"type":"cmd","msg_id":"01HZXC0000000000000000SRV0","payload":{"tool":"t","arguments":{"message":"ping"}}}`,
	` { "a" : 1 , "b" : [true,false,null] , "c" : "x\"}" } `,
	`{"a":-0}`, `{"a":05}`, `{"a":+5}`, `{"a":1e3}`, `{"a":2147483648}`, `{"a":-2147483648}`,
	`{"a":tru}`, `{"a":"\u0041"}`, `{"a\u0041":1}`, `{"a":1,}`, `{"a":1}{}`, `{"a":1}` + "\f",
	`{"a":{"b":"]}"}}`, `{"a":{"b":1,"b":2}}`, `{"a"}`, `{}`, ` {} `, `{`, ``, `[]`, `"a"`, `{"a":"é"}`, `{"a":1,"a":2}`,
}

// FuzzMembers: an object Members accepts, with each value checked by
// Value and no key written twice, is one encoding/json decodes strictly to
// the same members; Raw, Value, String, Int, Int64, Bool and Number read a
// value as it does.
func FuzzMembers(f *testing.F) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got := map[string]json.RawMessage{}
		ok := jsonscan.Members(b, func(k, v []byte) bool {
			checkScalars(t, v)
			if _, dup := got[string(k)]; dup || !jsonscan.Value(v) {
				return false
			}
			got[string(k)] = v
			return true
		})
		if ok {
			jsonscantest.Agrees(t, b, got)
		}
	})
}

// FuzzFields: an object Fields accepts, with each value checked by Value,
// is one encoding/json decodes strictly into a struct of those fields, to
// the same values; the bits it reports are the keys present.
func FuzzFields(f *testing.F) {
	for _, s := range append(seeds, `{"a":1,"b":[2],"c":{"d":3}}`, `{"c":null,"a":"x"}`, `{"a":1,"A":2}`, `{"b":1,"b":1}`) {
		f.Add([]byte(s))
	}
	type abc struct {
		A json.RawMessage `json:"a"`
		B json.RawMessage `json:"b"`
		C json.RawMessage `json:"c"`
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var got abc
		seen, ok := jsonscan.Fields(b, []string{"a", "b", "c"}, func(i int, v []byte) bool {
			*[]*json.RawMessage{&got.A, &got.B, &got.C}[i] = v
			return jsonscan.Value(v)
		})
		if !ok {
			return
		}
		jsonscantest.Agrees(t, b, got)
		for i, v := range []json.RawMessage{got.A, got.B, got.C} {
			if (seen&(1<<i) != 0) != (v != nil) {
				t.Fatalf("Fields(%q): seen %b, values %q", b, seen, got)
			}
		}
	})
}

// FuzzObject: an object Object accepts is one encoding/json decodes
// strictly (no key written twice at any depth), and f saw its members.
func FuzzObject(f *testing.F) {
	for _, s := range append(seeds, `{"a":{"b":1,"b":2}}`, `{"a":[{"b":1},{"b":2}]}`, `{"a":"\u0061","\u0061":1}`,
		`{"a":"\ud800","b":"\x","c":"é\n","d":-0.5E+3,"e":[true,false,null]}`, `{"a":1.}`, `{"a":.5}`, `{"a":-}`,
		`{"a":[1,]}`, `{"a":1e400}`, `{"a":-1e-400}`, `{"a":[1`+strings.Repeat("0", 309)+`]}`, `{"a`+"\x7f"+`":1}`, `{"a":"`+"\x01"+`"}`, `{"é":1}`, `{"a":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}`) {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got := map[string]json.RawMessage{}
		if !jsonscan.Object(b, func(k, v []byte) bool {
			got[string(k)] = v
			checkScalars(t, v)
			return true
		}) {
			return
		}
		jsonscantest.Agrees(t, b, got) // its values raw: no key written twice at any depth
	})
}

func checkScalars(t *testing.T, v []byte) {
	if raw, ok := jsonscan.Raw(v); ok { // as json.RawMessage decodes it: duplicate keys and all
		var want json.RawMessage
		if err := json.Unmarshal(v, &want); err != nil || !bytes.Equal(raw, want) {
			t.Fatalf("Raw(%q) = %q; json.Unmarshal %q, %v", v, raw, want, err)
		}
	}
	if jsonscan.Value(v) {
		jsonscantest.Agrees(t, v, json.RawMessage(v))
		var x any // numbers as float64: 1e400 is refused
		if err := jsonscantest.Strict(v, &x); err != nil {
			t.Fatalf("Value(%q) is true, but encoding/json (strict) refuses it into an any: %v", v, err)
		}
	}
	if s, ok := jsonscan.String(v); ok {
		jsonscantest.Agrees(t, v, s)
	}
	if n, ok := jsonscan.Int(v); ok {
		jsonscantest.Agrees(t, v, int32(n))
	}
	if n, ok := jsonscan.Int64(v); ok {
		jsonscantest.Agrees(t, v, n)
	}
	if x, ok := jsonscan.Bool(v); ok {
		jsonscantest.Agrees(t, v, x)
	}
	if jsonscan.Number(v) {
		jsonscantest.Agrees(t, v, json.Number(v))
	}
}

// FuzzHTMLSafe: a string HTMLSafe passes is written as it is.
func FuzzHTMLSafe(f *testing.F) {
	for _, s := range []string{"sysecho.n.echo.invoke", "a<b", "a&b", "é", "a\"b", "a\\b", "\x7f", "\u2028"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if jsonscan.HTMLSafe(s) && string(b) != `"`+s+`"` {
			t.Fatalf("HTMLSafe(%q), but json.Marshal writes %s", s, b)
		}
	})
}

// TestCanonical: the canonical forms are read, the near misses are not.
func TestCanonical(t *testing.T) {
	var keys []string
	if !jsonscan.Members([]byte(seeds[0]), func(k, v []byte) bool { keys = append(keys, string(k)); return true }) ||
		!reflect.DeepEqual(keys, []string{"type", "msg_id", "payload"}) {
		t.Fatalf("members of the canonical frame: %q", keys)
	}
	for _, c := range []struct {
		v    string
		want bool
	}{{`"abc"`, true}, {`"a\"b"`, false}, {`"é"`, false}, {`"a"x`, false}} {
		if _, ok := jsonscan.String([]byte(c.v)); ok != c.want {
			t.Errorf("String(%s) ok = %v, want %v", c.v, ok, c.want)
		}
	}
	for _, c := range []struct {
		v    string
		want bool
	}{{`0`, true}, {`-2147483648`, true}, {`2147483647`, true}, {`2147483648`, false}, {`-0`, false}, {`01`, false}, {`+1`, false}, {`1.0`, false}, {`-`, false}, {``, false}} {
		if _, ok := jsonscan.Int([]byte(c.v)); ok != c.want {
			t.Errorf("Int(%s) ok = %v, want %v", c.v, ok, c.want)
		}
	}
	for _, c := range []struct {
		v    string
		want bool
	}{{`0`, true}, {`-999999999999999999`, true}, {`999999999999999999`, true}, {`1000000000000000000`, false}, {`-0`, false}, {`-01`, false}, {`1e3`, false}} {
		if _, ok := jsonscan.Int64([]byte(c.v)); ok != c.want {
			t.Errorf("Int64(%s) ok = %v, want %v", c.v, ok, c.want)
		}
	}
}

// FuzzAppendString: AppendString writes what json.Marshal writes.
func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "ping", "a<b>&c", "é", "a\"b\\c", "\x00\b\f\n\r\t\x1f\x7f", "\u2028\u2029", "\xff\xfe", "\xe2\x80", `{"k":"v"}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := jsonscan.AppendString(nil, s); string(got) != string(want) {
			t.Fatalf("AppendString(%q) = %s, json.Marshal %s", s, got, want)
		}
		if got := jsonscan.AppendString([]byte("x"), []byte(s)); string(got) != "x"+string(want) {
			t.Fatalf("AppendString(x, %q) = %s, json.Marshal %s", s, got, want)
		}
	})
}

// FuzzCompact: for a valid document, Compact says whether json.Compact
// would write it unchanged.
func FuzzCompact(f *testing.F) {
	for _, s := range []string{`{"a":"b c"}`, `{"a": 1}`, "{\"a\":\"\\\" \"}", `[1,2]`, ` {}`, `{"a":"\\"}`, "{\n}"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		if !json.Valid(doc) {
			return
		}
		var b bytes.Buffer
		if err := json.Compact(&b, doc); err != nil {
			t.Fatal(err)
		}
		if want := bytes.Equal(b.Bytes(), doc); jsonscan.Compact(doc) != want {
			t.Fatalf("Compact(%q) = %v, json.Compact leaves it as it is: %v", doc, !want, want)
		}
	})
}

// FuzzDepth: on a valid document, Depth is the nesting encoding/json's
// tokens show.
func FuzzDepth(f *testing.F) {
	for _, s := range []string{`{}`, `[]`, `1`, `{"a":[{"b":"[{"}]}`, `["\"[",[[]]]`, `{"a\\":"{"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		if !json.Valid(doc) {
			return
		}
		d := json.NewDecoder(bytes.NewReader(doc))
		d.UseNumber()
		depth, want := 0, 0
		for {
			tok, err := d.Token()
			if err != nil {
				break
			}
			switch tok {
			case json.Delim('{'), json.Delim('['):
				depth++
				want = max(want, depth)
			case json.Delim('}'), json.Delim(']'):
				depth--
			}
		}
		if got := jsonscan.Depth(doc); got != want {
			t.Fatalf("Depth(%q) = %d, encoding/json's tokens %d", doc, got, want)
		}
	})
}

// TestValueRange: a number beyond float64's range is valid JSON, but
// encoding/json refuses to read it into an any, so Value and Object
// decline it; one that underflows reads as 0 and is kept.
func TestValueRange(t *testing.T) {
	for v, want := range map[string]bool{
		`1e308`: true, `1.7976931348623157e308`: true, `-1e-400`: true, `1` + strings.Repeat("0", 308): true,
		`1e400`: false, `-1.7976931348623159e308`: false, `2` + strings.Repeat("0", 308): false,
		`[1,{"a":1E999}]`: false,
	} {
		if got := jsonscan.Value([]byte(v)); got != want {
			t.Errorf("Value(%.40s…) = %v, want %v", v, got, want)
		}
	}
	if jsonscan.Object([]byte(`{"a":[1e400]}`), nil) {
		t.Error(`Object({"a":[1e400]}) accepts what encoding/json refuses`)
	}
}
