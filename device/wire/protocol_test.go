package wire_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/schemas"
)

const (
	id1  = "01JZ3K9V7Q8R2S4T6W8X0Y2Z4A"
	id2  = "01jz3k9v7q8r2s4t6w8x0y2z4b"
	node = "01hzx9k3m4p7q8r9s0t1v2w3xy"
)

// loadSchemas returns the embedded schemas, which DecodeEnvelope checks
// frames against.
func loadSchemas(t testing.TB) *schemas.Set {
	t.Helper()
	set, err := schemas.Load()
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// TestDecodeEnvelope: the frames the envelope schema accepts are decoded,
// and every other one is refused, the smuggling shapes among them (a key
// in another case, a key written twice).
func TestDecodeEnvelope(t *testing.T) {
	set := loadSchemas(t)
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
		{"type in upper case", `{"TYPE":"cmd","msg_id":"` + id1 + `","payload":{}}`, false},
		{"type twice, once in upper case", `{"TYPE":"cmd_ack","type":"cmd","msg_id":"` + id1 + `","payload":{}}`, false},
		{"type in mixed case", `{"tYpe":"cmd","msg_id":"` + id1 + `","payload":{}}`, false},
		{"payload in title case", `{"type":"cmd","msg_id":"` + id1 + `","Payload":{}}`, false},
		{"payload twice, once in title case", `{"type":"cmd","msg_id":"` + id1 + `","payload":{},"Payload":{"tool":"x"}}`, false},
		{"type twice", `{"type":"cmd","type":"cmd_ack","msg_id":"` + id1 + `","payload":{}}`, false},
		{"type twice, the same", `{"type":"cmd","type":"cmd","msg_id":"` + id1 + `","payload":{}}`, false},
		{"type twice, escaped", `{"type":"cmd","t\u0079pe":"cmd_ack","msg_id":"` + id1 + `","payload":{}}`, false},
		{"msg_id twice", `{"type":"cmd","msg_id":"` + id1 + `","msg_id":"` + id2 + `","payload":{}}`, false},
		{"payload key twice", `{"type":"cmd","msg_id":"` + id1 + `","payload":{"tool":"a","tool":"b"}}`, false},
		{"nested key twice", `{"type":"cmd","msg_id":"` + id1 + `","payload":{"arguments":{"a":[{"b":1,"b":2}]}}}`, false},
		{"nested key twice, escaped", `{"type":"cmd","msg_id":"` + id1 + `","payload":{"a":{"k":1,"\u006b":2}}}`, false},
		{"empty in_reply_to", `{"type":"cmd_ack","msg_id":"` + id1 + `","in_reply_to":"","payload":{}}`, false},
		{"null in_reply_to", `{"type":"cmd_ack","msg_id":"` + id1 + `","in_reply_to":null,"payload":{}}`, false},
		{"cmd deadline_at_ms 0", `{"type":"cmd","msg_id":"` + id1 + `","payload":{"deadline_at_ms":0}}`, false},
		{"cmd deadline_at_ms a fraction", `{"type":"cmd","msg_id":"` + id1 + `","payload":{"deadline_at_ms":1.5}}`, false},
		{"cmd deadline_at_ms a string", `{"type":"cmd","msg_id":"` + id1 + `","payload":{"deadline_at_ms":"1"}}`, false},
		{"auth_ok server_time_ms negative", `{"type":"auth_ok","msg_id":"` + id1 + `","payload":{"server_time_ms":-1}}`, false},
		{"cmd deadline_at_ms", `{"type":"cmd","msg_id":"` + id1 + `","payload":{"deadline_at_ms":1745236802000}}`, true},
		{"cmd deadline_at_ms 1e3, an integer", `{"type":"cmd","msg_id":"` + id1 + `","payload":{"deadline_at_ms":1e3}}`, true},
		{"cmd_ack deadline_at_ms a string: not cmd's rule", `{"type":"cmd_ack","msg_id":"` + id1 + `","payload":{"deadline_at_ms":"1"}}`, true},
		{"escaped type", `{"type":"c\u006dd","msg_id":"` + id1 + `","payload":{}}`, true},
		{"keys in another case in the payload", `{"type":"cmd","msg_id":"` + id1 + `","payload":{"a":1,"A":2}}`, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, err := wire.DecodeEnvelope(set, []byte(tc.in))
			if verr := set.ValidateJSON(schemas.Envelope, []byte(tc.in)); (verr == nil) != tc.ok {
				t.Fatalf("the envelope schema says %v: the case is wrong", verr)
			}
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
	set := loadSchemas(t)
	b, err := wire.Encode(wire.TypeCmd, id2, wire.Cmd{Tool: "t", Arguments: json.RawMessage(`{"a":1}`), DeadlineMs: 5})
	if err != nil {
		t.Fatal(err)
	}
	e, err := wire.DecodeEnvelope(set, b)
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

// FuzzDecodeEnvelope: DecodeEnvelope accepts a frame exactly when the
// envelope schema does, decodes it as encoding/json reads a valid frame,
// and whatever it accepts re-encodes to a frame accepted again with the
// same meaning. The seeds are the schema's golden frames and the corpus
// in testdata/fuzz/FuzzDecodeEnvelope, smuggling shapes among them.
func FuzzDecodeEnvelope(f *testing.F) {
	for _, kind := range []string{"valid", "invalid"} {
		files, err := filepath.Glob(filepath.Join("..", "..", "schemas", "testdata", kind, "envelope@1.0.0", "*.json"))
		if err != nil || len(files) == 0 {
			f.Fatalf("no golden %s envelopes (%v)", kind, err)
		}
		for _, p := range files {
			b, err := os.ReadFile(p)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b)
		}
	}
	for _, s := range []string{
		`{"type":"cmd","msg_id":"` + id1 + `","payload":{"tool":"x","arguments":{}}}`,
		`{"type":"cmd_ack","msg_id":"` + id1 + `","in_reply_to":"` + id2 + `","payload":{"ok":true,"result":{"a":[1,2]}}}`,
		`{"type":"hello","msg_id":"` + id1 + `","payload":{}} `,
		`{"type":"auth","msg_id":"` + id1 + `","payload":{"token":"a\u003cb"}}`,
		`{"type":"bogus","msg_id":"` + id1 + `","payload":{}}`,
		`{"type":"cmd","msg_id":"` + id1 + `","payload":[]}`,
		`{"type":"cmd","msg_id":"` + id1 + `","payload":{}}{}`,
		`{"type":"cmd","type":"cmd","msg_id":"` + id1 + `","payload":{}}`,
		`{"Type":"cmd","msg_id":"` + id1 + `","payload":{}}`,
		`{"type":"cmd","msg_id":"` + id1 + `","in_reply_to":"","payload":{}}`,
		`{"type":"cmd","msg_id":"` + id1 + `","payload":{"deadline_at_ms":1.0,"x":{"y":[true,null,-0.5e-3,"\ud800"]}}}`,
		`{"type":"auth_ok","msg_id":"` + id1 + `","payload":{"server_time_ms":99999999999999999999}}`,
		`{"type":"stream","msg_id":"` + id1 + `","in_reply_to":"` + id2 + `","payload":{"event":"metric","data":{"a":1,"b":{"a":2}}}}`,
		`{}`,
		``,
	} {
		f.Add([]byte(s))
	}
	set := loadSchemas(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := wire.DecodeEnvelope(set, b)
		verr := set.ValidateJSON(schemas.Envelope, b)
		if (err == nil) != (verr == nil) {
			t.Fatalf("DecodeEnvelope: %v; the envelope schema: %v\n%q", err, verr, b)
		}
		if err != nil {
			if !errors.Is(err, wire.ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		var want wire.Envelope
		if err := json.Unmarshal(b, &want); err != nil || !reflect.DeepEqual(e, want) {
			t.Fatalf("DecodeEnvelope %+v, encoding/json %+v (%v)\n%q", e, want, err, b)
		}
		// Whatever is accepted re-encodes to a frame that is accepted again
		// with the same meaning.
		b2, err := wire.EncodeID(e.Type, e.MsgID, e.InReplyTo, e.Payload)
		if err != nil {
			t.Fatalf("re-encode %+v: %v", e, err)
		}
		e2, err := wire.DecodeEnvelope(set, b2)
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

// TestDecodePayloadExactKeys: a payload member whose name differs from
// its field's in case only, at any depth, is refused, as encoding/json
// alone would take it (and keep the last of two spellings).
func TestDecodePayloadExactKeys(t *testing.T) {
	type item struct {
		Name string `json:"name"`
	}
	type nested struct {
		Items []item          `json:"items"`
		ByKey map[string]item `json:"by_key"`
		Raw   json.RawMessage `json:"raw"`
	}
	tests := []struct {
		name    string
		payload string
		into    func() any
		ok      bool
	}{
		{"auth", `{"token":"a"}`, func() any { return new(wire.Auth) }, true},
		{"auth, token in title case", `{"Token":"a"}`, func() any { return new(wire.Auth) }, false},
		{"auth, token in two cases", `{"token":"a","Token":"b"}`, func() any { return new(wire.Auth) }, false},
		{"cmd, tool in two cases", `{"tool":"a","Tool":"b","arguments":{}}`, func() any { return new(wire.Cmd) }, false},
		{"cmd_ack, ok in two cases", `{"ok":false,"OK":true,"result":{}}`, func() any { return new(wire.CmdAck) }, false},
		{"cmd_ack error", `{"ok":false,"error":{"code":"E_INTERNAL","message":"x"}}`, func() any { return new(wire.CmdAck) }, true},
		{"cmd_ack error, code in upper case", `{"ok":false,"error":{"CODE":"E_INTERNAL"}}`, func() any { return new(wire.CmdAck) }, false},
		{"stream: data is raw", `{"event":"metric","data":{"A":1,"a":2}}`, func() any { return new(wire.StreamFrame) }, true},
		{"nested", `{"items":[{"name":"a"}],"by_key":{"K":{"name":"b"}},"raw":{"X":1}}`, func() any { return new(nested) }, true},
		{"nested, in a slice", `{"items":[{"name":"a"},{"Name":"b"}]}`, func() any { return new(nested) }, false},
		{"nested, in a map", `{"by_key":{"k":{"NAME":"b"}}}`, func() any { return new(nested) }, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := wire.DecodePayload(wire.Envelope{Payload: json.RawMessage(tc.payload)}, tc.into())
			if tc.ok != (err == nil) {
				t.Fatalf("DecodePayload(%s): %v, want ok %v", tc.payload, err, tc.ok)
			}
			if err != nil && !errors.Is(err, wire.ErrMalformed) {
				t.Errorf("error %v does not wrap ErrMalformed", err)
			}
		})
	}
}

// FuzzDecodePayloadExact: a cmd or cmd_ack payload that DecodePayload
// accepts names each member exactly as the protocol does, once.
func FuzzDecodePayloadExact(f *testing.F) {
	for _, s := range []string{`{"ok":true,"result":{}}`, `{"ok":false,"error":{"code":"E_INTERNAL"}}`, `{"OK":true}`,
		`{"ok":true,"ok":false}`, `{"tool":"t","arguments":{},"deadline_ms":5}`, `{"Tool":"t"}`, `{"tool":"t","TOOL":"u"}`,
		`{"ok":false,"error":{"Code":"x"}}`, `{"tool":"t","request_id":"r","deadline_at_ms":1}`} {
		f.Add([]byte(s))
	}
	members := map[string][]string{
		"cmd":     {"tool", "arguments", "deadline_ms", "deadline_at_ms", "request_id"},
		"cmd_ack": {"ok", "result", "error"},
		"error":   {"code", "message"},
	}
	exact := func(t *testing.T, v any, kind string) {
		m, _ := v.(map[string]any)
		for k, x := range m {
			if !slices.Contains(members[kind], k) {
				t.Fatalf("%s payload accepted with the member %q", kind, k)
			}
			if kind == "cmd_ack" && k == "error" {
				em, _ := x.(map[string]any)
				for k := range em {
					if !slices.Contains(members["error"], k) {
						t.Fatalf("cmd_ack error accepted with the member %q", k)
					}
				}
			}
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		e := wire.Envelope{Payload: b}
		var c wire.Cmd
		if wire.DecodePayload(e, &c) == nil {
			v, err := schemas.Decode(b)
			if err != nil {
				t.Fatalf("cmd payload %q accepted, which the schemas' decoder refuses: %v", b, err)
			}
			exact(t, v, "cmd")
		}
		var a wire.CmdAck
		if wire.DecodePayload(e, &a) == nil {
			v, err := schemas.Decode(b)
			if err != nil {
				t.Fatalf("cmd_ack payload %q accepted, which the schemas' decoder refuses: %v", b, err)
			}
			exact(t, v, "cmd_ack")
		}
	})
}

// TestDerivedNodeID: a node id made from entropy is a node id, the same
// for the same entropy and another for another.
func TestDerivedNodeID(t *testing.T) {
	for _, e := range [][10]byte{{}, {1}, {9: 0xff}, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}} {
		id := wire.DerivedNodeID(e)
		if !schemas.ValidNodeID(id) {
			t.Errorf("DerivedNodeID(%x) = %q: not a node id", e, id)
		}
		if again := wire.DerivedNodeID(e); again != id {
			t.Errorf("DerivedNodeID(%x) = %q, then %q", e, id, again)
		}
	}
	if a, b := wire.DerivedNodeID([10]byte{1}), wire.DerivedNodeID([10]byte{2}); a == b {
		t.Errorf("two entropies, one node id %q", a)
	}
}

// TestLabelsRoundTrip: auth_ok's features and an announce's name and
// labels survive Encode, DecodeEnvelope and DecodePayload, and the
// announce is one the manifest schema accepts.
func TestLabelsRoundTrip(t *testing.T) {
	set := loadSchemas(t)
	b, err := wire.Encode(wire.TypeAuthOK, "", wire.AuthOK{NodeID: node, Tenant: "demo", SessionID: id1,
		ServerTimeMs: 1, Features: []string{wire.FeatureDeadlineAt, wire.FeatureLabels}})
	if err != nil {
		t.Fatal(err)
	}
	e, err := wire.DecodeEnvelope(set, b)
	if err != nil {
		t.Fatal(err)
	}
	var ok wire.AuthOK
	if err := wire.DecodePayload(e, &ok); err != nil || !slices.Equal(ok.Features, []string{"deadline_at", "labels"}) {
		t.Fatalf("auth_ok round trip: %+v, %v", ok, err)
	}

	in := wire.Announce{NodeID: node, Agent: schemas.Agent{Name: "okso-agent", Version: "1"},
		Capabilities: []schemas.Capability{{CapID: "echo", Kind: schemas.KindEcho, SchemaRef: schemas.EchoInput,
			Verbs: []string{"invoke"}, SafetyClass: schemas.SafetyReadOnly}},
		Features: []string{wire.FeatureLabels}, Name: "kitchen-pi",
		Labels: map[string]string{"site": "paris", "example.com/rack": "r-12", "spare": ""}}
	if b, err = wire.Encode(wire.TypeAnnounce, "", in); err != nil {
		t.Fatal(err)
	}
	if e, err = wire.DecodeEnvelope(set, b); err != nil {
		t.Fatal(err)
	}
	if err := set.ValidateJSON(schemas.Manifest, e.Payload); err != nil {
		t.Fatalf("the manifest schema refuses the announce: %v\n%s", err, e.Payload)
	}
	var out wire.Announce
	if err := wire.DecodePayload(e, &out); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("announce round trip:\n in %+v\nout %+v", in, out)
	}

	// Without the feature the fields are left out, not sent empty: an
	// older tier's strict decoder never sees them.
	in.Features, in.Name, in.Labels = nil, "", nil
	if b, err = wire.Encode(wire.TypeAnnounce, "", in); err != nil {
		t.Fatal(err)
	}
	if e, err = wire.DecodeEnvelope(set, b); err != nil {
		t.Fatal(err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(e.Payload, &top); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"features", "name", "labels"} {
		if _, ok := top[k]; ok {
			t.Errorf("announce without the feature carries %s: %s", k, b)
		}
	}
}
