package schemas_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/okso-io/okso/schemas"
)

// referenceDecode is the former two-pass Decode, kept as the oracle the
// single-pass decoder must agree with.
func referenceDecode(doc []byte) (any, error) {
	if len(bytes.TrimSpace(doc)) == 0 {
		return nil, errors.New("empty JSON document")
	}
	if err := referenceCheckDuplicateKeys(doc); err != nil {
		return nil, err
	}
	return jsonschema.UnmarshalJSON(bytes.NewReader(doc))
}

// referenceCheckDuplicateKeys is the former duplicate-key walk over
// json.Decoder tokens; syntax errors are left to the decoder.
func referenceCheckDuplicateKeys(doc []byte) error {
	type frame struct {
		keys    map[string]struct{} // nil for an array
		wantKey bool
	}
	dec := json.NewDecoder(bytes.NewReader(doc))
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil
		}
		if n := len(stack); n > 0 && stack[n-1].keys != nil && stack[n-1].wantKey {
			if k, ok := tok.(string); ok {
				if _, dup := stack[n-1].keys[k]; dup {
					return fmt.Errorf("duplicate key %q in JSON object", k)
				}
				stack[n-1].keys[k] = struct{}{}
				stack[n-1].wantKey = false
				continue
			}
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{keys: map[string]struct{}{}, wantKey: true})
			continue
		case json.Delim('['):
			stack = append(stack, &frame{})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		if len(stack) == 0 {
			return nil
		}
		if top := stack[len(stack)-1]; top.keys != nil {
			top.wantKey = true
		}
	}
}

// Documents for the benchmarks: an echo result, and a metrics
// snapshot-like object of about 600 bytes with nesting and an escape.
const (
	benchEcho    = `{"message":"ping","received_at_ms":1763776800000,"node_id":"01m80hetn3a3x84z368v26yy0p"}`
	benchMetrics = `{"ts_ms":1745236800012,"node_id":"01hzx9k3m4p7q8r9s0t1v2w3xy","cpu_pct":12.5,` +
		`"mem_bytes":123456789,"mem_total_bytes":8589934592,"disk_pct":41.2,"load_1m":0.42,"load_5m":0.3,` +
		`"load_15m":0.25,"cpus":[{"core":0,"pct":10.5},{"core":1,"pct":14.25},{"core":2,"pct":9},` +
		`{"core":3,"pct":16.75}],"disks":[{"mount":"/","used_bytes":21474836480,"total_bytes":53687091200,` +
		`"read_only":false},{"mount":"/var/lib/okso","used_bytes":1073741824,"total_bytes":10737418240,` +
		`"read_only":false}],"net":{"iface":"eth0","rx_bytes":987654321,"tx_bytes":123456789},` +
		`"labels":{"site":"lab-2","rack":"r\u00e9seau 4","role":"edge"},"throttled":null}`
)

// decodeCases are the differential test inputs, also the fuzz seeds.
var decodeCases = []string{
	// Scalars and whitespace.
	"", " ", " \t\r\n ", "\v", "\f", "\u00a0", "\u0085", "\ufeff{}", "\x00",
	"null", "true", "false", " null ", "\tnull\n", "\r\n true \r\n",
	"nul", "tru", "fals", "nulL", "True", "NULL", "truex", "null null", "true,",
	// Numbers.
	"0", "-0", "0.0", "-0.0", "1", "-1", "123", "1.5", "1e400", "-1e400", "1E+2", "1e-2",
	"1.0e0", "12345678901234567890123456789012345678901234567890", "0.000000000000000000000001",
	"9007199254740993", "-9223372036854775809", "1e-400", "0e0", "0E-0",
	"01", "-01", "00", "1.", ".5", "-", "+1", "1e", "1e+", "1E-", "-.5", "1.e5", "0x10",
	"NaN", "-NaN", "Infinity", "-Infinity", "1_000", "1 2", "[1 2]", "[-]", "[01]", "[1.]",
	"1\x00", "-a", "2.a", "2ea",
	// Strings and escapes.
	`""`, `"a"`, `"\""`, `"\\"`, `"\/"`, `"\b\f\n\r\t"`, `"\u0000"`, `"\u001f"`, `"\u00e9"`,
	`"\u00E9"`, `"\uFFFD"`, `"\uffff"`, `"\ufffe"`, `"\u2028\u2029"`,
	`"\ud83d\ude00"`, `"\uD83D\uDE00"`, `"\ud800"`, `"\udc00"`, `"\ud800x"`, `"\ud800\u0041"`,
	`"\ud800\ud800"`, `"\ud800\ud800\udc00"`, `"\udc00\ud800\udc00"`, `"\ud800\\"`, `"\ud800\n"`,
	`"\udbff\udfff"`, `"\ud800\udbff"`, `"a\ud800"`, `"\ud800\u"`, `"\ud800\u12"`, `"\ud800\uzzzz"`,
	`"\u12"`, `"\u12g4"`, `"\x41"`, `"\'"`, `"\a"`, `"\U0041"`, `"\`, `"\u`, `"abc`, `"`, `"\"`,
	"\"a\x00b\"", "\"a\x1fb\"", "\"a\x7fb\"", "\"a\nb\"", "\"a\tb\"",
	"\"caf\xc3\xa9\"", "\"\xff\"", "\"\xfe\xff\"", "\"\xc3\"", "\"\xc3x\"", "\"\xe2\x82\"", "\"\xe2\x82\xac\"",
	"\"\xed\xa0\x80\"", "\"\xed\xbf\xbf\"", "\"\xc0\xaf\"", "\"\xf4\x90\x80\x80\"", "\"\xf0\x9f\x98\x80\"",
	"\"\xef\xbf\xbd\"", "\"\x80\"", "\"a\xffb\\n\xc3\xa9\"", "\"\xf0\x9f\x98\"", "\xff", "\xc3\xa9",
	// Arrays.
	"[]", "[ ]", "[\n]", "[1]", "[1,2,3]", `[[],[[]],{}]`, `[null,true,false,"x",1.5,{"a":[]}]`,
	"[", "]", "[1", "[1,", "[1,]", "[,1]", "[,]", "[1,,2]", "[1;2]", "[1:2]", "[}", "[1}", "[] []", "[]]",
	// Objects.
	"{}", "{ }", `{"a":1}`, `{ "a" : 1 , "b" : [ ] }`, `{"":0}`, `{"a":{"a":{"a":1}}}`,
	`{"a":1,"A":2}`, `{"é":1,"e\u0301":2}`,
	"{", "}", `{"a"`, `{"a":`, `{"a":1`, `{"a":1,`, `{"a":1,}`, `{,"a":1}`, `{"a" 1}`, `{"a"::1}`,
	`{a:1}`, `{'a':1}`, `{"a":1 "b":2}`, `{"a":1;"b":2}`, `{1:2}`, `{null:1}`, `{"a":1]`, `{"a"}`,
	`{"a":}`, `{}}`, `{} {}`, `{}x`, `{}/`, `{}//c`, `/*c*/{}`, "{}\x00",
	// Duplicate member names.
	`{"a":1,"a":1}`, `{"a":1,"b":2,"a":3}`, `{"a":1,"\u0061":2}`, `{"":1,"":2}`,
	`[{"a":1},{"a":2}]`, `[{"b":1,"b":2}]`, `{"a":{"b":{"c":1,"c":2}}}`, `{"a":{},"a":[]}`,
	`{"x":{"a":1},"y":{"a":1}}`, `{"a":{"a":1}}`, "{\"\xff\":1,\"\xfe\":2}", `{"\ud800":1,"\udc00":2}`,
	"{\"\xff\":1,\"\ufffd\":2}", `{"\ud800":1,"\ufffd":2}`, `{"a":1,"a":2,`, `{"a":1,"a":2}x`,
	`{"a":[1,{"a":1,"a":2}],"b":1}`, `{"a":1,"a":2,}`, `{"a":1,"a":`,
	// Nesting at and past the bound.
	strings.Repeat("[", 10000) + strings.Repeat("]", 10000),
	strings.Repeat("[", 10001) + strings.Repeat("]", 10001),
	strings.Repeat(`{"a":`, 10000) + "1" + strings.Repeat("}", 10000),
	strings.Repeat(`{"a":`, 10001) + "1" + strings.Repeat("}", 10001),
	strings.Repeat(`[{"a":`, 5000) + "1" + strings.Repeat("}]", 5000),
	strings.Repeat(`[{"a":`, 5000) + "[1]" + strings.Repeat("}]", 5000),
	strings.Repeat("[", 20000), strings.Repeat("[", 100) + strings.Repeat("]", 99),
	// Realistic documents.
	benchEcho, benchMetrics, benchEcho + "\n", benchEcho + " x", benchEcho + benchEcho,
	`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"system.echo.invoke","arguments":{"message":"ping"},"_meta":{}}}`,
}

// checkSame fails t unless schemas.Decode and referenceDecode agree on doc:
// both fail, or both succeed with deeply equal values.
func checkSame(t *testing.T, doc []byte) {
	t.Helper()
	got, err := schemas.Decode(doc)
	want, wantErr := referenceDecode(doc)
	switch {
	case err != nil && wantErr != nil:
		if got != nil {
			t.Errorf("Decode(%.80q) returned %v with error %v", doc, got, err)
		}
	case err != nil:
		t.Errorf("Decode(%.80q): %v; reference accepts it as %#v", doc, err, want)
	case wantErr != nil:
		t.Errorf("Decode(%.80q) = %#v; reference refuses it: %v", doc, got, wantErr)
	case !reflect.DeepEqual(got, want):
		t.Errorf("Decode(%.80q) = %#v, reference %#v", doc, got, want)
	}
}

func TestDecodeMatchesReference(t *testing.T) {
	for _, doc := range decodeCases {
		checkSame(t, []byte(doc))
	}
}

// The errors say what is wrong and where.
func TestDecodeErrors(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{"", "empty JSON document"},
		{" \n\t\r", "empty JSON document"},
		{`{"a":1,"a":2}`, `duplicate key "a" in JSON object`},
		{`[{"b":{"c":1,"\u0063":2}}]`, `duplicate key "c" in JSON object`},
		{`{"a":1} {}`, "trailing data after JSON value at offset 8"},
		{`[1,]`, "invalid character ']' looking for a value at offset 3"},
		{`{"a":01}`, "invalid character '1' after object member at offset 6"},
		{"\"a\x01\"", "invalid character '\\x01' in string at offset 2"},
		{"\xff", "invalid byte 0xff looking for a value at offset 0"},
		{`{"a":`, "unexpected end of JSON input"},
		{`"\q"`, "invalid character 'q' in string escape at offset 2"},
		{`[-x]`, "invalid character 'x' in number at offset 2"},
		{`[-]`, "invalid character ']' in number at offset 2"},
		{`[1.e]`, "invalid character 'e' after decimal point in number at offset 3"},
		{`[1e+]`, "invalid character ']' in exponent of number at offset 4"},
		{`[1E-x]`, "invalid character 'x' in exponent of number at offset 4"},
		{`[-1ex]`, "invalid character 'x' in exponent of number at offset 4"},
		{`-`, "unexpected end of JSON input"},
		{`1.`, "unexpected end of JSON input"},
		{strings.Repeat("[", 10001), "JSON nested deeper than 10000 levels"},
	} {
		_, err := schemas.Decode([]byte(tc.doc))
		if err == nil || err.Error() != tc.want {
			t.Errorf("Decode(%.40q) = %v, want %q", tc.doc, err, tc.want)
		}
	}
}

// The nesting bound is encoding/json's: 10000 levels are accepted.
func TestDecodeDepth(t *testing.T) {
	doc := strings.Repeat(`[{"a":`, 5000) + "1" + strings.Repeat("}]", 5000)
	if _, err := schemas.Decode([]byte(doc)); err != nil {
		t.Errorf("10000 levels: %v", err)
	}
	if _, err := schemas.Decode([]byte("[" + doc + "]")); err == nil {
		t.Error("10001 levels accepted")
	}
}

// Decoders are pooled: concurrent calls, some failing midway, must not
// see each other's state.
func TestDecodeConcurrent(t *testing.T) {
	want, err := referenceDecode([]byte(benchMetrics))
	if err != nil {
		t.Fatal(err)
	}
	bad := []byte(benchMetrics[:len(benchMetrics)/2] + `,"a":1,"a":2}]}`)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 200 {
				if _, err := schemas.Decode(bad); err == nil {
					t.Error("truncated document accepted")
					return
				}
				got, err := schemas.Decode([]byte(benchMetrics))
				if err != nil || !reflect.DeepEqual(got, want) {
					t.Errorf("Decode = %v, %v", got, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// Decoded values must not share memory with the caller's buffer, which
// may be reused once Decode returns.
func TestDecodeCopiesInput(t *testing.T) {
	doc := []byte(`{"key":["value",12.5]}`)
	v, err := schemas.Decode(doc)
	if err != nil {
		t.Fatal(err)
	}
	for i := range doc {
		doc[i] = 'x'
	}
	want := map[string]any{"key": []any{"value", json.Number("12.5")}}
	if !reflect.DeepEqual(v, want) {
		t.Errorf("after the input changed: %#v, want %#v", v, want)
	}
}

// FuzzDecode compares the single-pass decoder with the reference on
// arbitrary bytes.
func FuzzDecode(f *testing.F) {
	for _, doc := range decodeCases {
		if len(doc) < 1000 {
			f.Add([]byte(doc))
		}
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		checkSame(t, doc)
	})
}

func BenchmarkDecode(b *testing.B) {
	for _, bc := range []struct {
		name   string
		decode func([]byte) (any, error)
	}{
		{"new", schemas.Decode},
		{"reference", referenceDecode},
	} {
		for _, doc := range []struct{ name, doc string }{
			{"echo", benchEcho},
			{"metrics", benchMetrics},
		} {
			b.Run(doc.name+"/"+bc.name, func(b *testing.B) {
				in := []byte(doc.doc)
				b.SetBytes(int64(len(in)))
				b.ReportAllocs()
				for b.Loop() {
					if _, err := bc.decode(in); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
