package wire

import (
	"bytes"
	"encoding/json"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"testing"

	"github.com/oklog/ulid/v2"

	"github.com/okso-io/okso/internal/jsonscan/jsonscantest"
	"github.com/okso-io/okso/schemas"
)

// fastSeeds are the hot frames in their canonical form and near misses.
var fastSeeds = []string{
	`{"type":"cmd","msg_id":"01HZXC0000000000000000SRV0","payload":{"tool":"sysecho.n.echo.invoke","arguments":{"message":"ping"},"deadline_ms":2000,"request_id":"01HZXC0000000000000000REQ0"}}`,
	`{"type":"cmd_ack","msg_id":"01HZXC0000000000000000DEV0","in_reply_to":"01HZXC0000000000000000SRV0","payload":{"ok":true,"result":{"message":"ping","received_at_ms":1745236800012,"node_id":"n"}}}`,
	` { "type" : "cmd" , "msg_id" : "x" , "payload" : { } } `,
	`{"type":"cmd","msg_id":"01HZXC0000000000000000SRV0","payload":{"tool":"sysecho.n.echo.invoke","arguments":{"message":"ping"},"deadline_ms":2000,"deadline_at_ms":1745236802012,"request_id":"01HZXC0000000000000000REQ0"}}`,
	`{"tool":"t","arguments":{},"deadline_ms":5,"deadline_at_ms":0}`,
	`{"tool":"t","deadline_at_ms":-1745236802012}`,
	`{"tool":"t","deadline_at_ms":01745236802012}`,
	`{"tool":"t","deadline_at_ms":1745236802012.5}`,
	`{"tool":"t","deadline_at_ms":1e12}`,
	`{"tool":"t","deadline_at_ms":999999999999999}`,
	`{"tool":"t","deadline_at_ms":9223372036854775808}`,
	`{"tool":"t","deadline_at_ms":"1745236802012"}`,
	`{"tool":"t","deadline_at_ms":1,"deadline_at_ms":2}`,
	`{"tool":"t","arguments":null,"deadline_ms":-5}`,
	`{"tool":"t","deadline_ms":+5}`,
	`{"tool":"t","deadline_ms":05}`,
	`{"tool":"t","deadline_ms":-0}`,
	`{"tool":"t","deadline_ms":1e3}`,
	`{"tool":"t","deadline_ms":2147483648}`,
	`{"ok":false,"error":{"code":"E_INTERNAL"}}`,
	`{"ok":true,"result":"a\"b}"}`,
	`{"ok":true,"ok":false}`,
	`{"ok":true,"result":{"a":1,"a":2}}`,
	`{"tool":"t","arguments":[{"a":{"b":1,"b":2}}]}`,
	`{"OK":true}`,
	`{"type":"cmd","Type":"cmd_ack"}`,
	`{"type":"c\u006dd","msg_id":"x","payload":{}}`,
	`{"type":"cmd","msg_id":"x","payload":{"a":[1,{"b":"]}"}]}}`,
	`{"type":"cmd","msg_id":"x","payload":{}}{}`,
	`{"type":"cmd","msg_id":"x","payload":{}}` + "\f",
	`{"type":"cmd","msg_id":"x","payload":{"a":tru}}`,
	`{"type":"cmd","msg_id":"x","payload":null}`,
	`{"type":null,"msg_id":"x","payload":{}}`,
	`{}`, ` {} `, `{`, ``, `[]`, `{"a"}`, `{"type":"cmd",}`,
}

// FuzzFastDecode: whatever the one-pass readers accept, encoding/json
// decodes strictly to the same value (jsonscantest, the oracle of every
// one-pass reader), and the general path accepts too and decodes alike:
// the envelope schema and encoding/json for an envelope, the strict
// decoder for a payload.
func FuzzFastDecode(f *testing.F) {
	for _, s := range fastSeeds {
		f.Add([]byte(s))
	}
	set, err := schemas.Load()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if e, ok := fastEnvelope(b); ok {
			jsonscantest.Agrees(t, b, e)
			if err := set.ValidateJSON(schemas.Envelope, b); err != nil {
				t.Fatalf("envelope %q: fast %+v, refused by the schema: %v", b, e, err)
			}
		}
		var c, wantC Cmd
		if fastCmd(b, &c) {
			jsonscantest.Agrees(t, b, c)
			if err := strictUnmarshal(b, &wantC); err != nil || !reflect.DeepEqual(c, wantC) {
				t.Fatalf("cmd %q: fast %+v, strict %+v (%v)", b, c, wantC, err)
			}
		}
		var a, wantA CmdAck
		if fastCmdAck(b, &a) {
			jsonscantest.Agrees(t, b, a)
			if err := strictUnmarshal(b, &wantA); err != nil || !reflect.DeepEqual(a, wantA) {
				t.Fatalf("cmd_ack %q: fast %+v, strict %+v (%v)", b, a, wantA, err)
			}
		}
	})
}

// FuzzPlainObject: an object plainObject accepts is one encoding/json
// decodes strictly and the schemas' decoder reads (valid JSON, no key
// written twice at any depth), and its member intKey, when present, is an
// integer of at least 1.
func FuzzPlainObject(f *testing.F) {
	for _, s := range []string{
		`{}`, ` {}`, `{"a":1}`, `{"a":1,"a":2}`, `{"a":{"b":1,"b":2}}`, `{"a":[{"b":1},{"b":2}]}`, `{"a":"\u0061","\u0061":1}`,
		`{"k":1}`, `{"k":0}`, `{"k":01}`, `{"k":1.0}`, `{"k":1e3}`, `{"k":-1}`, `{"k":"1"}`, `{"k":1234567890123456789}`,
		`{"x":{"k":"a"}}`, `{"a":"\ud800","b":"\x","c":"é\n","d":-0.5E+3,"e":[true,false,null]}`,
		`{"a":1}x`, `{"a":1}}`, `{"a":tru}`, `{"a":01}`, `{"a":1.}`, `{"a":.5}`, `{"a":-}`, `{"a":[1,]}`, `{"a":1,}`,
		`{"a` + "\x7f" + `":1}`, `{"a":"` + "\x01" + `"}`, `{"é":1}`,
	} {
		f.Add([]byte(s), true)
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, b []byte, withKey bool) {
		intKey := ""
		if withKey {
			intKey = "k"
		}
		if !plainObject(b, intKey) {
			return
		}
		var doc map[string]any
		if err := jsonscantest.Strict(b, &doc); err != nil {
			t.Fatalf("plainObject accepts %q, which encoding/json (strict) refuses: %v", b, err)
		}
		v, err := schemas.Decode(b)
		if err != nil {
			t.Fatalf("plainObject accepts %q, which the schemas' decoder refuses: %v", b, err)
		}
		m, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("plainObject accepts %q, which is no object", b)
		}
		if k, ok := m[intKey]; ok && intKey != "" {
			n, isNum := k.(json.Number)
			i, err := strconv.ParseInt(string(n), 10, 64)
			if !isNum || err != nil || i < 1 {
				t.Fatalf("plainObject accepts %q, whose %s is not an integer of at least 1", b, intKey)
			}
		}
	})
}

// TestFastPathKnowsTheSchema: the one-pass envelope reader knows every
// keyword of the envelope schema it stands in for: its four members and
// which are required, the closed set of types, the ULID pattern, and the
// payload members constrained per type. A change to the schema fails here
// until the reader follows it.
func TestFastPathKnowsTheSchema(t *testing.T) {
	set, err := schemas.Load()
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := set.Raw(schemas.Envelope)
	v, err := schemas.Decode(raw)
	if err != nil {
		t.Fatal(err)
	}
	doc := v.(map[string]any)
	// keysOf returns m's keywords, annotations left out.
	keysOf := func(v any) []string {
		m, _ := v.(map[string]any)
		var ks []string
		for k := range m {
			if k != "$schema" && k != "$id" && k != "title" && k != "description" && k != "$comment" {
				ks = append(ks, k)
			}
		}
		slices.Sort(ks)
		return ks
	}
	at := func(v any, path ...string) any {
		for _, p := range path {
			m, _ := v.(map[string]any)
			v = m[p]
		}
		return v
	}
	want := func(what string, got, want any) {
		t.Helper()
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: %v, the fast path knows %v", what, got, want)
		}
	}
	want("the envelope's keywords", keysOf(doc), []string{"additionalProperties", "allOf", "properties", "required", "type"})
	want("type", doc["type"], "object")
	want("additionalProperties", doc["additionalProperties"], false)
	want("required", doc["required"], []any{"type", "msg_id", "payload"})
	want("properties", keysOf(doc["properties"]), []string{"in_reply_to", "msg_id", "payload", "type"})
	want("type's keywords", keysOf(at(doc, "properties", "type")), []string{"enum"})
	var types []string
	for _, typ := range at(doc, "properties", "type", "enum").([]any) {
		types = append(types, typ.(string))
	}
	slices.Sort(types)
	known := []string{TypeHello, TypeAuth, TypeAuthOK, TypeAnnounce, TypeAnnounceOK, TypeCmd, TypeCmdAck,
		TypeStream, TypeCancel, TypeError}
	slices.Sort(known)
	want("the types", types, known)
	for _, typ := range types {
		if got, ok := knownType([]byte(`"` + typ + `"`)); !ok || got != typ {
			t.Errorf("type %q is unknown to the fast path", typ)
		}
	}
	for _, id := range []string{"msg_id", "in_reply_to"} {
		want(id, at(doc, "properties", id), map[string]any{"type": "string", "pattern": ulidPattern})
	}
	want("payload", at(doc, "properties", "payload"), map[string]any{"type": "object"})
	rules := map[string]string{}
	for _, a := range doc["allOf"].([]any) {
		want("an allOf entry's keywords", keysOf(a), []string{"if", "then"})
		want("an if's keywords", keysOf(at(a, "if")), []string{"properties"})
		want("an if's properties", keysOf(at(a, "if", "properties")), []string{"type"})
		want("an if's type", keysOf(at(a, "if", "properties", "type")), []string{"const"})
		want("a then's keywords", keysOf(at(a, "then")), []string{"properties"})
		want("a then's properties", keysOf(at(a, "then", "properties")), []string{"payload"})
		want("a then's payload", keysOf(at(a, "then", "properties", "payload")), []string{"properties"})
		typ, _ := at(a, "if", "properties", "type", "const").(string)
		members := at(a, "then", "properties", "payload", "properties").(map[string]any)
		want(typ+": constrained payload members", len(members), 1)
		for k, rule := range members {
			want(typ+"'s payload member "+k, rule, map[string]any{"type": "integer", "minimum": json.Number("1")})
			rules[typ] = k
		}
	}
	for _, typ := range types {
		want(typ+": the payload member that must be a positive integer", payloadInt(typ), rules[typ])
	}
}

// FuzzAppendEnvelope: a frame written by hand is byte for byte the one
// json.Marshal writes.
func FuzzAppendEnvelope(f *testing.F) {
	f.Add(TypeCmd, "01HZXC0000000000000000SRV0", "", []byte(`{"tool":"t","arguments":{"a":"<b>"}}`))
	f.Add(TypeCmdAck, "01HZXC0000000000000000DEV0", "01HZXC0000000000000000SRV0", []byte(`{"ok":true}`))
	f.Add("a\"b", "&", "\u00e9", []byte(`null`))
	f.Add(TypeCmd, "a&b", "<c>", []byte(`{}`))
	f.Fuzz(func(t *testing.T, typ, msgID, inReplyTo string, payload []byte) {
		p, err := json.Marshal(json.RawMessage(payload))
		if err != nil {
			return
		}
		want, err := json.Marshal(Envelope{Type: typ, MsgID: msgID, InReplyTo: inReplyTo, Payload: p})
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := appendEnvelope(nil, typ, msgID, inReplyTo, p); ok && !bytes.Equal(got, want) {
			t.Fatalf("by hand %s\njson.Marshal %s", got, want)
		}
		if got, err := EncodeID(typ, msgID, inReplyTo, json.RawMessage(payload)); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("EncodeID %s (%v)\njson.Marshal %s", got, err, want)
		}
	})
}

// TestFastDecodeCovers: the canonical frames take the one-pass readers.
func TestFastDecodeCovers(t *testing.T) {
	e, ok := fastEnvelope([]byte(fastSeeds[0]))
	var c Cmd
	if !ok || !fastCmd(e.Payload, &c) || c.DeadlineMs != 2000 || string(c.Arguments) != `{"message":"ping"}` {
		t.Fatalf("cmd frame not read in one pass: %+v %+v", e, c)
	}
	e, ok = fastEnvelope([]byte(fastSeeds[3]))
	c = Cmd{}
	if !ok || !fastCmd(e.Payload, &c) || c.DeadlineAtMs != 1745236802012 || c.RequestID != "01HZXC0000000000000000REQ0" {
		t.Fatalf("cmd frame with deadline_at_ms not read in one pass: %+v %+v", e, c)
	}
	e, ok = fastEnvelope([]byte(fastSeeds[1]))
	var a CmdAck
	if !ok || !fastCmdAck(e.Payload, &a) || !a.OK || e.InReplyTo != "01HZXC0000000000000000SRV0" {
		t.Fatalf("cmd_ack frame not read in one pass: %+v %+v", e, a)
	}
	// Every frame either end writes in the course of a session, as Encode
	// writes it, takes the one-pass reader.
	node := "01hzx9k3m4p7q8r9s0t1v2w3xy"
	for _, f := range []struct {
		typ     string
		payload any
	}{
		{TypeHello, Hello{Proto: Subprotocol, AuthDeadlineMs: DefaultAuthTimeoutMs, MaxFrameBytes: DefaultMaxFrameBytes}},
		{TypeAuth, Auth{Token: "eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJ4In0.c2ln"}},
		{TypeAuthOK, AuthOK{NodeID: node, Tenant: "acme", SessionID: NewMsgID(), ServerTimeMs: 1745236800000}},
		{TypeAnnounce, map[string]any{"node_id": node, "agent": map[string]string{"name": "okso-mock", "version": "1.0.0"},
			"features": []string{FeatureDeadlineAt}, "capabilities": []map[string]any{{"cap_id": "echo", "kind": "system.echo",
				"schema_ref": "mcp://schemas/system.echo.invoke.input@1.0.0", "verbs": []string{"invoke"},
				"safety_class": "read_only", "constraints": map[string]any{"rate_limit_rps": 10, "max_concurrency": 4}}}}},
		{TypeAnnounceOK, AnnounceOK{Tools: []string{"sysecho." + node + ".echo.invoke"}}},
		{TypeCmd, Cmd{Tool: "sys." + node + ".metrics.subscribe", Arguments: json.RawMessage(`{"interval_ms":1000}`)}},
		{TypeCmd, Cmd{Tool: "sysecho." + node + ".echo.invoke", Arguments: json.RawMessage(`{"message":"m"}`), DeadlineMs: 2000,
			RequestID: "01HZXC0000000000000000REQ0", Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}},
		{TypeStream, StreamFrame{Event: "metric", Data: json.RawMessage(`{"ts_ms":1745236800000,"node_id":"` + node +
			`","cpu_pct":12.5,"mem_bytes":1,"mem_total_bytes":2,"disk_pct":3,"load_1m":0.1,"load_5m":0.2,"load_15m":0.3}`)}},
		{TypeCancel, Cancel{}},
		{TypeCmdAck, CmdAck{Error: &AckError{Code: "E_DEADLINE_EXCEEDED"}}},
		{TypeError, ErrorFrame{Code: "E_BAD_REQUEST", Message: "malformed envelope"}},
	} {
		b, err := Encode(f.typ, NewMsgID(), f.payload)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := fastEnvelope(b); !ok {
			t.Errorf("%s frame not read in one pass: %s", f.typ, b)
		}
	}
}

// ulidPattern is the envelope schema's pattern of msg_id and in_reply_to.
const ulidPattern = `^[0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{26}$`

// FuzzValidMsgID: the hand check agrees with the ULID pattern.
func FuzzValidMsgID(f *testing.F) {
	re := regexp.MustCompile(ulidPattern)
	for _, s := range []string{"01HZXC0000000000000000SRV0", "01hzxc0000000000000000srv0", "01HZXC0000000000000000SRVI",
		"01HZXC0000000000000000SRV", "01HZXC0000000000000000SRV0@", "01HZXC0000000000000000SR[0", "01HZXC0000000000000000SR\x100"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := validMsgID(s), re.MatchString(s); got != want {
			t.Fatalf("validMsgID(%q) = %v, the pattern says %v", s, got, want)
		}
	})
}

// FuzzEncodePayload: a cmd or cmd_ack payload written by hand is byte for
// byte the one json.Marshal writes.
func FuzzEncodePayload(f *testing.F) {
	f.Add("sysecho.n.echo.invoke", []byte(`{"message":"ping"}`), 2000, int64(1745236802012), "01HZXC0000000000000000REQ0", true)
	f.Add("t<", []byte(` {"a":"<"} `), -1, int64(-1), "", false)
	f.Add("t", []byte(``), 0, int64(0), "r&", true)
	f.Add("t", []byte(`{"a":"\u2028"}`), 0, int64(0), "", true)
	f.Fuzz(func(t *testing.T, tool string, raw []byte, deadline int, deadlineAt int64, reqID string, ok bool) {
		for _, p := range []any{
			Cmd{Tool: tool, Arguments: raw, DeadlineMs: deadline, DeadlineAtMs: deadlineAt, RequestID: reqID},
			Cmd{Tool: tool, Arguments: raw, DeadlineMs: deadline, RequestID: reqID, Traceparent: reqID},
			CmdAck{OK: ok, Result: raw},
		} {
			want, errW := json.Marshal(p)
			got, err := encodePayload(p)
			if (err == nil) != (errW == nil) || !bytes.Equal(got, want) {
				t.Fatalf("%#v:\nby hand %s (%v)\njson.Marshal %s (%v)", p, got, err, want, errW)
			}
			if errW != nil {
				continue
			}
			// And the whole frame, written in one buffer.
			frame, err := EncodeID(TypeCmdAck, "01HZXC0000000000000000DEV0", reqID, p)
			wantFrame, errF := json.Marshal(Envelope{Type: TypeCmdAck, MsgID: "01HZXC0000000000000000DEV0", InReplyTo: reqID, Payload: want})
			if err != nil || errF != nil || !bytes.Equal(frame, wantFrame) {
				t.Fatalf("%#v:\nEncodeID %s (%v)\njson.Marshal %s (%v)", p, frame, err, wantFrame, errF)
			}
		}
	})
}

// TestNewMsgID: a fresh msg_id is a ULID of this millisecond, and two
// are never the same.
func TestNewMsgID(t *testing.T) {
	before := ulid.Now()
	seen := map[string]bool{}
	for range 1000 {
		id := NewMsgID()
		u, err := ulid.ParseStrict(id)
		if !validMsgID(id) || err != nil || u.Time() < before || u.Time() > ulid.Now() || seen[id] {
			t.Fatalf("NewMsgID() = %q (%v): not a fresh ULID", id, err)
		}
		seen[id] = true
	}
}
