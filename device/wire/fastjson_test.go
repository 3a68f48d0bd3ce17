package wire

import (
	"bytes"
	"encoding/json"
	"reflect"
	"regexp"
	"testing"
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

// FuzzFastDecode: whatever the one-pass readers accept, the strict
// decoder accepts too and decodes to the same value.
func FuzzFastDecode(f *testing.F) {
	for _, s := range fastSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if e, ok := fastEnvelope(b); ok {
			var want Envelope
			if err := strictUnmarshal(b, &want); err != nil || !reflect.DeepEqual(e, want) {
				t.Fatalf("envelope %q: fast %+v, strict %+v (%v)", b, e, want, err)
			}
		}
		var c, wantC Cmd
		if fastCmd(b, &c) {
			if err := strictUnmarshal(b, &wantC); err != nil || !reflect.DeepEqual(c, wantC) {
				t.Fatalf("cmd %q: fast %+v, strict %+v (%v)", b, c, wantC, err)
			}
		}
		var a, wantA CmdAck
		if fastCmdAck(b, &a) {
			if err := strictUnmarshal(b, &wantA); err != nil || !reflect.DeepEqual(a, wantA) {
				t.Fatalf("cmd_ack %q: fast %+v, strict %+v (%v)", b, a, wantA, err)
			}
		}
	})
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
}

// FuzzValidMsgID: the hand check agrees with the ULID pattern.
func FuzzValidMsgID(f *testing.F) {
	re := regexp.MustCompile(`^[0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{26}$`)
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
			CmdAck{OK: ok, Result: raw},
		} {
			want, errW := json.Marshal(p)
			got, err := encodePayload(p)
			if (err == nil) != (errW == nil) || !bytes.Equal(got, want) {
				t.Fatalf("%#v:\nby hand %s (%v)\njson.Marshal %s (%v)", p, got, err, want, errW)
			}
		}
	})
}
