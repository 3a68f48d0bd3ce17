package wire

import (
	"encoding/json"
	"strconv"

	"github.com/okso-io/okso/internal/jsonscan"
)

// The hot frames (an envelope, a cmd, a cmd_ack) are decoded four times
// per call, and the general validator and encoding/json's strict Decoder
// cost 5 to 15 µs each. The functions here read the canonical form those
// frames take (exact lower-case keys, each at most once, strings without
// escapes) in one pass, and report false on anything else, which then goes
// to the general path for its verdict. Whatever they accept, the general
// path accepts too and decodes to the same value (FuzzFastDecode,
// FuzzDecodeEnvelope); a RawMessage they return shares the input's memory.

// fastEnvelope decodes the canonical form of an envelope that the
// envelope schema accepts: the four members it names, each at most once
// and type, msg_id and payload present, a known type, ULIDs, and a
// payload that is an object whose every key, at every depth, is plain and
// written once, and whose member the schema constrains for this type, if
// present, is a plain integer of at least 1 (see [payloadInt]).
func fastEnvelope(b []byte) (e Envelope, ok bool) {
	const hasType, hasMsgID, hasPayload = 1 << 0, 1 << 1, 1 << 3
	seen, ok := jsonscan.Fields(b, []string{"type", "msg_id", "in_reply_to", "payload"}, func(i int, v []byte) (ok bool) {
		switch i {
		case 0:
			e.Type, ok = knownType(v)
		case 1:
			e.MsgID, ok = msgID(v)
		case 2:
			e.InReplyTo, ok = msgID(v)
		case 3:
			e.Payload, ok = v, len(v) > 0 && v[0] == '{'
		}
		return ok
	})
	const required = hasType | hasMsgID | hasPayload
	if !ok || seen&required != required || !plainObject(e.Payload, payloadInt(e.Type)) {
		return Envelope{}, false
	}
	return e, true
}

// knownType reads a type of the closed set, written plainly, and returns
// the package's constant for it (no copy of the frame's bytes).
func knownType(v []byte) (string, bool) {
	s, ok := jsonscan.StringBytes(v)
	if !ok {
		return "", false
	}
	for _, t := range [...]string{TypeCmd, TypeCmdAck, TypeStream, TypeCancel, TypeHello, TypeAuth,
		TypeAuthOK, TypeAnnounce, TypeAnnounceOK, TypeError} {
		if string(s) == t {
			return t, true
		}
	}
	return "", false
}

// msgID reads a ULID written plainly.
func msgID(v []byte) (string, bool) {
	s, ok := jsonscan.StringBytes(v)
	if !ok || !validMsgID(string(s)) { // no copy: the conversion is only read
		return "", false
	}
	return string(s), true
}

// payloadInt names the payload member that the envelope schema, for an
// envelope of type typ, requires to be an integer of at least 1 when it
// is present (its allOf, one if/then per type); "" when there is none.
// TestFastPathKnowsTheSchema reads the schema to keep the two in step.
func payloadInt(typ string) string {
	switch typ {
	case TypeAuthOK:
		return "server_time_ms"
	case TypeCmd:
		return "deadline_at_ms"
	}
	return ""
}

// plainObject reports whether p is exactly one JSON object whose keys, at
// every depth, are plain and each written once in its object (within
// [jsonscan.Object]'s bounds), and whose top-level member named intKey,
// if any, is a plain integer of at least 1 (up to 18 digits). What it
// accepts, the schemas' decoder accepts and reads the same; false means
// only that it cannot tell.
func plainObject(p []byte, intKey string) bool {
	return len(p) > 0 && p[0] == '{' && jsonscan.Object(p, func(k, v []byte) bool {
		if intKey == "" || string(k) != intKey {
			return true
		}
		n, ok := jsonscan.Int64(v)
		return ok && n >= 1
	})
}

// fastCmd decodes the canonical form of a cmd payload.
func fastCmd(b []byte, c *Cmd) bool {
	var d Cmd
	_, ok := jsonscan.Fields(b, []string{"tool", "arguments", "deadline_ms", "request_id", "deadline_at_ms", "traceparent"},
		func(i int, v []byte) (ok bool) {
			switch i {
			case 0:
				d.Tool, ok = jsonscan.String(v)
			case 1:
				d.Arguments, ok = v, jsonscan.Value(v) // no key written twice: the strict decoder refuses one
			case 2:
				d.DeadlineMs, ok = jsonscan.Int(v)
			case 3:
				d.RequestID, ok = jsonscan.String(v)
			case 4:
				d.DeadlineAtMs, ok = scanMillis(v)
			case 5:
				d.Traceparent, ok = jsonscan.String(v)
			}
			return ok
		})
	if ok {
		*c = d
	}
	return ok
}

// scanMillis reads a value that is a JSON integer from 0 to 10^15 written
// plainly (no sign, no leading zero, no fraction or exponent): a time in
// Unix milliseconds. Anything else is left to the strict decoder.
func scanMillis(v []byte) (int64, bool) {
	n, ok := jsonscan.Int64(v)
	return n, ok && n >= 0 && n < 1e15
}

// fastCmdAck decodes the canonical form of a successful cmd_ack payload;
// one carrying an error goes to the strict decoder.
func fastCmdAck(b []byte, a *CmdAck) bool {
	var d CmdAck
	_, ok := jsonscan.Fields(b, []string{"ok", "result"}, func(i int, v []byte) (ok bool) {
		if i == 0 {
			d.OK, ok = jsonscan.Bool(v)
		} else {
			d.Result, ok = v, jsonscan.Value(v)
		}
		return ok
	})
	if ok {
		*a = d
	}
	return ok
}

// appendEnvelope appends the frame {"type","msg_id","in_reply_to"?,
// "payload"} as json.Marshal writes it, given a payload json.Marshal
// wrote; it reports false when a string needs escaping.
func appendEnvelope(b []byte, typ, msgID, inReplyTo string, payload []byte) ([]byte, bool) {
	if !jsonscan.HTMLSafe(typ) || !jsonscan.HTMLSafe(msgID) || !jsonscan.HTMLSafe(inReplyTo) {
		return nil, false
	}
	b = appendHead(b, typ, msgID, inReplyTo)
	b = append(b, payload...)
	return append(b, '}'), true
}

// appendHead appends a frame up to its payload, `{"type":...,"payload":`,
// for strings that need no escaping.
func appendHead(b []byte, typ, msgID, inReplyTo string) []byte {
	b = append(b, `{"type":"`...)
	b = append(b, typ...)
	b = append(b, `","msg_id":"`...)
	b = append(b, msgID...)
	if inReplyTo != "" {
		b = append(b, `","in_reply_to":"`...)
		b = append(b, inReplyTo...)
	}
	return append(b, `","payload":`...)
}

// encodePayload encodes a frame's payload as json.Marshal would, by hand
// for a cmd and a successful cmd_ack in their plain form.
func encodePayload(payload any) ([]byte, error) {
	if n, ok := payloadSize(payload); ok {
		if b, ok := appendPayload(make([]byte, 0, n), payload); ok {
			return b, nil
		}
	}
	return json.Marshal(payload)
}

// payloadSize is room enough for the payload as appendPayload writes it;
// false for a payload it does not write.
func payloadSize(payload any) (int, bool) {
	switch p := payload.(type) {
	case Cmd:
		n := len(p.Tool) + len(p.Arguments) + len(p.RequestID) + len(p.Traceparent) + 80
		if p.DeadlineAtMs != 0 {
			n += len(`,"deadline_at_ms":`) + 20
		}
		return n, true
	case CmdAck:
		return len(p.Result) + 22, true
	}
	return 0, false
}

// appendPayload appends a cmd or a successful cmd_ack payload in its
// plain form as json.Marshal writes it; it reports false, for any other
// payload, or one that json.Marshal would write otherwise.
func appendPayload(b []byte, payload any) ([]byte, bool) {
	switch p := payload.(type) {
	case Cmd:
		if jsonscan.HTMLSafe(p.Tool) && jsonscan.HTMLSafe(p.RequestID) && jsonscan.HTMLSafe(p.Traceparent) && jsonscan.MarshalsAsIs(p.Arguments) {
			b = append(b, `{"tool":"`...)
			b = append(b, p.Tool...)
			b = append(b, `","arguments":`...)
			b = append(b, p.Arguments...)
			b = append(b, `,"deadline_ms":`...)
			b = strconv.AppendInt(b, int64(p.DeadlineMs), 10)
			if p.DeadlineAtMs != 0 {
				b = append(b, `,"deadline_at_ms":`...)
				b = strconv.AppendInt(b, p.DeadlineAtMs, 10)
			}
			if p.RequestID != "" {
				b = append(b, `,"request_id":"`...)
				b = append(b, p.RequestID...)
				b = append(b, '"')
			}
			if p.Traceparent != "" {
				b = append(b, `,"traceparent":"`...)
				b = append(b, p.Traceparent...)
				b = append(b, '"')
			}
			return append(b, '}'), true
		}
	case CmdAck:
		if p.OK && p.Error == nil && jsonscan.MarshalsAsIs(p.Result) {
			b = append(b, `{"ok":true,"result":`...)
			b = append(b, p.Result...)
			return append(b, '}'), true
		}
	}
	return b, false
}
