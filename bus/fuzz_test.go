package bus_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/okso-io/okso/bus"
)

// FuzzDecodeCall: DecodeCall and DecodeReply decode as json.Unmarshal.
func FuzzDecodeCall(f *testing.F) {
	for _, s := range []string{
		`{"tool":"sysecho.n.echo.invoke","arguments":{"message":"ping"}}`,
		`{"ok":true,"result":{"message":"ping","node_id":"n"}}`,
		`{"ok":false,"error":{"code":"E_INTERNAL","message":"x"}}`,
		`{"ok":true,"result":null}`, `{"ok":true}`, `{"ok":false}`,
		`{"tool":"t","arguments":null}`, `{"tool":"t"}`, `{"Tool":"t"}`,
		`{"tool":"t","tool":"u"}`, `{"tool":"t\u0041"}`, `{"tool":1}`,
		` { "ok" : true , "result" : [1,{"a":"]"}] } `, `{"ok":true}x`, `{}`, `null`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var wantC bus.Call
		errC := json.Unmarshal(b, &wantC)
		if c, err := bus.DecodeCall(b); (err == nil) != (errC == nil) || err == nil && !reflect.DeepEqual(c, wantC) {
			t.Fatalf("DecodeCall(%q) = %+v, %v; json.Unmarshal %+v, %v", b, c, err, wantC, errC)
		}
		var wantR bus.Reply
		errR := json.Unmarshal(b, &wantR)
		if r, err := bus.DecodeReply(b); (err == nil) != (errR == nil) || err == nil && !reflect.DeepEqual(r, wantR) {
			t.Fatalf("DecodeReply(%q) = %+v, %v; json.Unmarshal %+v, %v", b, r, err, wantR, errR)
		}
	})
}

// FuzzEncodeCall: Call.Encode writes what json.Marshal writes.
func FuzzEncodeCall(f *testing.F) {
	f.Add("sysecho.n.echo.invoke", []byte(`{"message":"ping"}`))
	f.Add("a<b", []byte(`{"m":"<&>"}`))
	f.Add("t", []byte(` { "m" : "a b" } `))
	f.Add("t", []byte("{\"m\":\"\u2028\"}"))
	f.Add("t", []byte(`{"m":"\"<"}`))
	f.Add("t", []byte(``))
	f.Add("t", []byte(`{`))
	f.Fuzz(func(t *testing.T, tool string, args []byte) {
		c := bus.Call{Tool: tool, Arguments: args}
		want, errW := json.Marshal(c)
		got, err := c.Encode()
		if (err == nil) != (errW == nil) || !bytes.Equal(got, want) {
			t.Fatalf("Encode(%q, %q) = %s, %v; json.Marshal %s, %v", tool, args, got, err, want, errW)
		}
	})
}

// TestDecodeCallCovers: the canonical forms take the one-pass path (an
// Arguments sharing the input's memory shows it).
func TestDecodeCallCovers(t *testing.T) {
	b := []byte(`{"tool":"sysecho.n.echo.invoke","arguments":{"message":"ping"}}`)
	c, err := bus.DecodeCall(b)
	if err != nil || len(c.Arguments) == 0 || &c.Arguments[0] != &b[len(`{"tool":"sysecho.n.echo.invoke","arguments":`)] {
		t.Fatalf("call not read in one pass: %+v, %v", c, err)
	}
	b = []byte(`{"ok":true,"result":{"node_id":"n"}}`)
	r, err := bus.DecodeReply(b)
	if err != nil || len(r.Result) == 0 || &r.Result[0] != &b[len(`{"ok":true,"result":`)] {
		t.Fatalf("reply not read in one pass: %+v, %v", r, err)
	}
	if e, err := (bus.Call{Tool: "t", Arguments: json.RawMessage(`{"a":1}`)}).Encode(); err != nil || string(e) != `{"tool":"t","arguments":{"a":1}}` {
		t.Fatalf("Encode = %s, %v", e, err)
	}
}
