package jsonscan_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/okso-io/okso/internal/jsonscan"
)

var seeds = []string{
	`{"type":"cmd","msg_id":"01HZXC0000000000000000SRV0","payload":{"tool":"t","arguments":{"message":"ping"}}}`,
	` { "a" : 1 , "b" : [true,false,null] , "c" : "x\"}" } `,
	`{"a":-0}`, `{"a":05}`, `{"a":+5}`, `{"a":1e3}`, `{"a":2147483648}`, `{"a":-2147483648}`,
	`{"a":tru}`, `{"a":"\u0041"}`, `{"a\u0041":1}`, `{"a":1,}`, `{"a":1}{}`, `{"a":1}` + "\f",
	`{"a":{"b":"]}"}}`, `{"a"}`, `{}`, ` {} `, `{`, ``, `[]`, `"a"`, `{"a":"é"}`, `{"a":1,"a":2}`,
}

// FuzzMembers: an object Members accepts, with each value checked by Raw,
// is one json.Unmarshal accepts with the same members; String, Int and
// Bool read a value as json.Unmarshal does.
func FuzzMembers(f *testing.F) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got := map[string]json.RawMessage{}
		ok := jsonscan.Members(b, func(k, v []byte) bool {
			raw, ok := jsonscan.Raw(v)
			if _, dup := got[string(k)]; dup || !ok {
				return false
			}
			got[string(k)] = raw
			checkScalars(t, v)
			return true
		})
		if !ok {
			return
		}
		var want map[string]json.RawMessage
		if err := json.Unmarshal(b, &want); err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("Members(%q) = %q; json.Unmarshal %q, %v", b, got, want, err)
		}
	})
}

func checkScalars(t *testing.T, v []byte) {
	if s, ok := jsonscan.String(v); ok {
		var want string
		if err := json.Unmarshal(v, &want); err != nil || s != want {
			t.Fatalf("String(%q) = %q; json.Unmarshal %q, %v", v, s, want, err)
		}
	}
	if n, ok := jsonscan.Int(v); ok {
		var want int32
		if err := json.Unmarshal(v, &want); err != nil || n != int(want) {
			t.Fatalf("Int(%q) = %d; json.Unmarshal %d, %v", v, n, want, err)
		}
	}
	if x, ok := jsonscan.Bool(v); ok {
		var want bool
		if err := json.Unmarshal(v, &want); err != nil || x != want {
			t.Fatalf("Bool(%q) = %v; json.Unmarshal %v, %v", v, x, want, err)
		}
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
	}{{`0`, true}, {`-2147483648`, true}, {`2147483647`, true}, {`2147483648`, false}, {`-0`, false}, {`01`, false}, {`+1`, false}, {`1.0`, false}} {
		if _, ok := jsonscan.Int([]byte(c.v)); ok != c.want {
			t.Errorf("Int(%s) ok = %v, want %v", c.v, ok, c.want)
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
