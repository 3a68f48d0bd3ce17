package bus_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/okso-io/okso/bus"
)

// FuzzParseToolName must never panic, and a name it accepts must round-trip
// through String and be safe to put in a NATS subject.
func FuzzParseToolName(f *testing.F) {
	for _, s := range []string{
		"sysecho." + node + ".echo.invoke",
		"sys." + node + ".metrics.subscribe",
		"sysecho." + node + ".echo",
		"sysecho." + node + ".echo.invoke.x",
		"sysecho.01hzx9k3m4p7q8r9s0t1v2w3xu.echo.invoke",
		"SYSECHO." + node + ".echo.invoke",
		"sysecho.." + node + ".invoke",
		"sysecho." + node + ".echo.>",
		"",
		strings.Repeat("a.", 40),
	} {
		f.Add(s)
	}
	// The DESIGN.md §2 regexes, as the reference for the hand-written checks.
	toolRe := regexp.MustCompile(`^[a-z0-9_]+(\.[a-z0-9_]+){3}$`)
	nodeIDRe := regexp.MustCompile(`^[0-9a-hjkmnp-tv-z]{26}$`)
	f.Fuzz(func(t *testing.T, s string) {
		tn, ok := bus.ParseToolName(s)
		want := len(s) <= bus.MaxToolName && toolRe.MatchString(s) && nodeIDRe.MatchString(strings.Split(s, ".")[1])
		if ok != want {
			t.Fatalf("ParseToolName(%q) ok=%v, the regexes say %v", s, ok, want)
		}
		if seg := strings.Split(s+".", ".")[0]; bus.ValidNodeID(seg) != nodeIDRe.MatchString(seg) {
			t.Fatalf("ValidNodeID(%q) = %v, the regex says otherwise", seg, bus.ValidNodeID(seg))
		}
		if !ok {
			if tn != (bus.ToolName{}) {
				t.Fatalf("rejected %q but returned %+v", s, tn)
			}
			return
		}
		if tn.String() != s {
			t.Fatalf("ParseToolName(%q).String() = %q", s, tn.String())
		}
		if len(s) > bus.MaxToolName {
			t.Fatalf("accepted %d chars", len(s))
		}
		if !bus.ValidNodeID(tn.NodeID) {
			t.Fatalf("accepted node id %q", tn.NodeID)
		}
		for _, p := range []string{tn.KindShort, tn.NodeID, tn.CapID, tn.Verb} {
			if p == "" || strings.Trim(p, "abcdefghijklmnopqrstuvwxyz0123456789_") != "" {
				t.Fatalf("accepted segment %q in %q", p, s)
			}
		}
		if subj := bus.NodeCmd(tn.NodeID); strings.ContainsAny(subj, "*> \t\r\n") || strings.Count(subj, ".") != 4 {
			t.Fatalf("node id %q makes subject %q", tn.NodeID, subj)
		}
	})
}

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

// FuzzValidTenant: the hand check is the regexp it replaced.
func FuzzValidTenant(f *testing.F) {
	re := regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	for _, s := range []string{"demo", "", "a b", "a.b", "A-Z_09", strings.Repeat("x", 64), strings.Repeat("x", 65), "é", "a\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := bus.ValidTenant(s), re.MatchString(s); got != want {
			t.Fatalf("ValidTenant(%q) = %v, the regexp says %v", s, got, want)
		}
	})
}
