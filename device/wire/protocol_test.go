package wire_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

	"github.com/okso-io/okso/device/wire"
)

const (
	id1 = "01JZ3K9V7Q8R2S4T6W8X0Y2Z4A"
	id2 = "01jz3k9v7q8r2s4t6w8x0y2z4b"
)

func TestDecodeEnvelope(t *testing.T) {
	tests := []struct {
		name string
		in   string
		ok   bool
	}{
		{"valid", `{"type":"cmd","msg_id":"` + id1 + `","payload":{"tool":"x"}}`, true},
		{"valid with in_reply_to", `{"type":"cmd_ack","msg_id":"` + id1 + `","in_reply_to":"` + id2 + `","payload":{}}`, true},
		{"valid with surrounding space", " \n{\"type\":\"hello\",\"msg_id\":\"" + id1 + "\",\"payload\":{}}\n", true},
		{"unknown field", `{"type":"cmd","msg_id":"` + id1 + `","payload":{},"extra":1}`, false},
		{"missing msg_id", `{"type":"cmd","payload":{}}`, false},
		{"msg_id too short", `{"type":"cmd","msg_id":"01JZ3K9V7Q","payload":{}}`, false},
		{"msg_id with U", `{"type":"cmd","msg_id":"01JZ3K9V7Q8R2S4T6W8X0Y2Z4U","payload":{}}`, false},
		{"msg_id not a string", `{"type":"cmd","msg_id":1,"payload":{}}`, false},
		{"bad in_reply_to", `{"type":"cmd_ack","msg_id":"` + id1 + `","in_reply_to":"x","payload":{}}`, false},
		{"missing payload", `{"type":"cmd","msg_id":"` + id1 + `"}`, false},
		{"null payload", `{"type":"cmd","msg_id":"` + id1 + `","payload":null}`, false},
		{"array payload", `{"type":"cmd","msg_id":"` + id1 + `","payload":[]}`, false},
		{"string payload", `{"type":"cmd","msg_id":"` + id1 + `","payload":"{}"}`, false},
		{"number payload", `{"type":"cmd","msg_id":"` + id1 + `","payload":1}`, false},
		{"trailing object", `{"type":"cmd","msg_id":"` + id1 + `","payload":{}}{}`, false},
		{"trailing garbage", `{"type":"cmd","msg_id":"` + id1 + `","payload":{}} x`, false},
		{"unknown type", `{"type":"bogus","msg_id":"` + id1 + `","payload":{}}`, false},
		{"missing type", `{"msg_id":"` + id1 + `","payload":{}}`, false},
		{"not an object", `[]`, false},
		{"truncated", `{"type":"cmd","msg_id":"` + id1 + `","payload":{`, false},
		{"empty", ``, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, err := wire.DecodeEnvelope([]byte(tc.in))
			if tc.ok {
				if err != nil {
					t.Fatalf("DecodeEnvelope: %v", err)
				}
				if e.MsgID != id1 {
					t.Errorf("msg_id %q, want %q", e.MsgID, id1)
				}
				return
			}
			if err == nil {
				t.Fatalf("DecodeEnvelope accepted %s as %+v", tc.in, e)
			}
			if !errors.Is(err, wire.ErrMalformed) {
				t.Errorf("error %v does not wrap ErrMalformed", err)
			}
		})
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	b, err := wire.Encode(wire.TypeCmd, id2, wire.Cmd{Tool: "t", Arguments: json.RawMessage(`{"a":1}`), DeadlineMs: 5})
	if err != nil {
		t.Fatal(err)
	}
	e, err := wire.DecodeEnvelope(b)
	if err != nil {
		t.Fatalf("DecodeEnvelope(Encode(…)): %v", err)
	}
	var c wire.Cmd
	if err := wire.DecodePayload(e, &c); err != nil {
		t.Fatal(err)
	}
	if e.Type != wire.TypeCmd || e.InReplyTo != id2 || c.Tool != "t" || c.DeadlineMs != 5 || string(c.Arguments) != `{"a":1}` {
		t.Fatalf("round trip: %+v %+v", e, c)
	}
}

func FuzzDecodeEnvelope(f *testing.F) {
	for _, s := range []string{
		`{"type":"cmd","msg_id":"` + id1 + `","payload":{"tool":"x","arguments":{}}}`,
		`{"type":"cmd_ack","msg_id":"` + id1 + `","in_reply_to":"` + id2 + `","payload":{"ok":true,"result":{"a":[1,2]}}}`,
		`{"type":"hello","msg_id":"` + id1 + `","payload":{}} `,
		`{"type":"auth","msg_id":"` + id1 + `","payload":{"token":"a\u003cb"}}`,
		`{"type":"bogus","msg_id":"` + id1 + `","payload":{}}`,
		`{"type":"cmd","msg_id":"` + id1 + `","payload":[]}`,
		`{"type":"cmd","msg_id":"` + id1 + `","payload":{}}{}`,
		`{}`,
		``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := wire.DecodeEnvelope(b)
		if err != nil {
			if !errors.Is(err, wire.ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		// Whatever is accepted re-encodes to a frame that is accepted again
		// with the same meaning.
		b2, err := wire.EncodeID(e.Type, e.MsgID, e.InReplyTo, e.Payload)
		if err != nil {
			t.Fatalf("re-encode %+v: %v", e, err)
		}
		e2, err := wire.DecodeEnvelope(b2)
		if err != nil {
			t.Fatalf("decode re-encoded %s: %v", b2, err)
		}
		if e2.Type != e.Type || e2.MsgID != e.MsgID || e2.InReplyTo != e.InReplyTo {
			t.Fatalf("round trip changed the envelope: %+v then %+v", e, e2)
		}
		var p1, p2 bytes.Buffer
		if err := json.Compact(&p1, e.Payload); err != nil {
			t.Fatalf("accepted payload is not JSON: %v", err)
		}
		if err := json.Compact(&p2, e2.Payload); err != nil {
			t.Fatal(err)
		}
		var v1, v2 any
		if json.Unmarshal(p1.Bytes(), &v1) != nil || json.Unmarshal(p2.Bytes(), &v2) != nil {
			t.Fatalf("payload does not decode: %s / %s", p1.Bytes(), p2.Bytes())
		}
		if j1, j2 := mustJSON(t, v1), mustJSON(t, v2); !bytes.Equal(j1, j2) {
			t.Fatalf("round trip changed the payload: %s then %s", j1, j2)
		}
	})
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
