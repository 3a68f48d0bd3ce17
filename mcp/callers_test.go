package mcp

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzRelayJSON: the relay's hand-written documents (the request event,
// the relayed result, the response's acknowledgement) are byte for byte
// what json.Marshal writes of their maps, and a forwarded answer reaches
// the replica holding its listen as it was sent, its result byte for byte.
func FuzzRelayJSON(f *testing.F) {
	for _, s := range [][4]string{
		{"01kbx5q3m8v1f7r2p4w6y9z0ab", "echo", `{"message":"1"}`, ""},
		{"id", "send", `{ "text" : "a<b" }`, "failed & gone"},
		{"x\u2028", "t", `{"a":[1,2,{"b":null}]}`, "\xff"},
		{"", "", `"just text"`, ""},
		{"a", "b", `[1]`, "e"},
		{"a", "b", `  {"x":1}`, ""},
		{"a", "b", `{"s":"\u2029 é"}`, ""},
	} {
		f.Add(s[0], s[1], []byte(s[2]), s[3], false)
		f.Add(s[0], s[1], []byte(s[2]), s[3], true)
	}
	f.Fuzz(func(t *testing.T, id, tool string, raw []byte, errText string, isErr bool) {
		var args json.RawMessage
		if json.Valid(raw) {
			args = raw
		}
		// Untraced, traced, and with any text as the trace context.
		for _, tp := range []string{"", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", errText} {
			ev, err := requestEvent(id, tool, args, tp)
			m := map[string]any{"type": "caller_tool_request", "request_id": id, "tool": tool, "arguments": args}
			if tp != "" {
				m["_meta"] = map[string]string{"traceparent": tp}
			}
			want, wantErr := json.Marshal(m)
			if (err != nil) != (wantErr != nil) || !bytes.Equal(ev, want) {
				t.Fatalf("requestEvent(%q, %q, %q, %q) = %s, %v; json.Marshal %s, %v", id, tool, args, tp, ev, err, want, wantErr)
			}
		}
		a := answer{RequestID: id, Result: args}
		if isErr {
			a.Error = &errText
		}
		if got, want := relayedResult(a), marshalRelayedResult(a); !bytes.Equal(got, want) {
			t.Fatalf("relayedResult(%+v) = %s; json.Marshal %s", a, got, want)
		}
		// Strings as JSON carries them (invalid UTF-8 becomes U+FFFD), the
		// result byte for byte (a decoded one has no white space around it).
		text := func(s string) string {
			b, _ := json.Marshal(s)
			_ = json.Unmarshal(b, &s)
			return s
		}
		var back answer
		if err := json.Unmarshal(a.encode(), &back); err != nil || back.RequestID != text(a.RequestID) ||
			!bytes.Equal(back.Result, bytes.TrimSpace(a.Result)) || (back.Error == nil) != (a.Error == nil) ||
			a.Error != nil && *back.Error != text(*a.Error) {
			t.Fatalf("answer %+v encodes as %s, which decodes as %+v, %v", a, a.encode(), back, err)
		}
		want, _ := json.Marshal(map[string]any{"accepted": true, "request_id": id})
		if got := acceptedResult(id); !bytes.Equal(got, want) {
			t.Fatalf("acceptedResult(%q) = %s; json.Marshal %s", id, got, want)
		}
	})
}
