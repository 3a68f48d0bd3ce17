package mcp

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzDecodeCallBody: the body decoder of POST /mcp/tools/call never
// panics, and what it accepts is a tool name with object (or absent)
// arguments and nothing else.
func FuzzDecodeCallBody(f *testing.F) {
	for _, s := range []string{
		`{"tool":"sys.01hzx9k3m4p7q8r9s0t1v2w3xy.metrics.subscribe","arguments":{"interval_ms":5000}}`,
		`{"tool":"x"}`,
		`{"tool":"x","arguments":null}`,
		`{"tool":"x","arguments":[]}`,
		`{"tool":"x","arguments":{},"extra":1}`,
		`{"TOOL":"x"}`,
		`{"tool":"x"}{}`,
		`{"tool":""}`,
		``,
		`[]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		b, err := decodeCallBody(body, nil)
		if err != nil {
			return
		}
		if b.Tool == "" {
			t.Fatalf("accepted a body without a tool: %q", body)
		}
		if bytes.Contains(bytes.ToLower(body), []byte(`"tool"`)) && !bytes.Contains(body, []byte(`"tool"`)) {
			t.Fatalf("accepted a case variant of the tool key: %q", body)
		}
		a := bytes.TrimSpace(b.Arguments)
		if len(a) > 0 && string(a) != "null" && (a[0] != '{' || !json.Valid(a)) {
			t.Fatalf("accepted arguments that are not an object: %q", a)
		}
	})
}

func TestDecodeCallBody(t *testing.T) {
	for _, c := range []struct {
		body string
		ok   bool
	}{
		{`{"tool":"x","arguments":{"a":1}}`, true},
		{`{"tool":"x"}`, true},
		{`{"tool":"x","arguments":null}`, true},
		{`{"TOOL":"x"}`, false},
		{`{"tool":"x","Arguments":{}}`, false},
		{`{"tool":"x","tool":"y"}`, false},
		{`{"tool":"x","arguments":[]}`, false},
		{`{"tool":"x","arguments":"{}"}`, false},
		{`{"tool":1}`, false},
		{`{"tool":"x"} {}`, false},
		{`{"tool":"x","more":1}`, false},
		{`null`, false},
	} {
		_, err := decodeCallBody([]byte(c.body), nil)
		if (err == nil) != c.ok {
			t.Errorf("%s: err %v, want ok=%v", c.body, err, c.ok)
		}
	}
}
