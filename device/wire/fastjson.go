package wire

import (
	"encoding/json"
	"strconv"

	"github.com/okso-io/okso/jsonscan"
)

// The hot frames (an envelope, a cmd, a cmd_ack) are decoded four times
// per call, and encoding/json's strict Decoder costs 5 to 12 µs each. The
// functions here read the canonical form those frames take (exact
// lower-case keys, each at most once, strings without escapes) in one
// pass, and report false on anything else, which then goes to the strict
// decoder for its verdict. Whatever they accept, they decode exactly as
// the strict decoder would (FuzzFastDecode checks it); a RawMessage they
// return shares the input's memory.

// fastEnvelope decodes the canonical form of an envelope.
func fastEnvelope(b []byte) (e Envelope, ok bool) {
	var seen [4]bool
	ok = jsonscan.Members(b, func(k, v []byte) bool {
		var i int
		var ok bool
		switch string(k) {
		case "type":
			i = 0
			e.Type, ok = jsonscan.String(v)
		case "msg_id":
			i = 1
			e.MsgID, ok = jsonscan.String(v)
		case "in_reply_to":
			i = 2
			e.InReplyTo, ok = jsonscan.String(v)
		case "payload":
			i = 3
			e.Payload, ok = jsonscan.Raw(v)
		}
		if !ok || seen[i] {
			return false
		}
		seen[i] = true
		return true
	})
	return e, ok
}

// fastCmd decodes the canonical form of a cmd payload.
func fastCmd(b []byte, c *Cmd) bool {
	var seen [5]bool
	var d Cmd
	ok := jsonscan.Members(b, func(k, v []byte) bool {
		var i int
		var ok bool
		switch string(k) {
		case "tool":
			i = 0
			d.Tool, ok = jsonscan.String(v)
		case "arguments":
			i = 1
			d.Arguments, ok = jsonscan.Raw(v)
		case "deadline_ms":
			i = 2
			d.DeadlineMs, ok = jsonscan.Int(v)
		case "request_id":
			i = 3
			d.RequestID, ok = jsonscan.String(v)
		case "deadline_at_ms":
			i = 4
			d.DeadlineAtMs, ok = scanMillis(v)
		}
		if !ok || seen[i] {
			return false
		}
		seen[i] = true
		return true
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
	if len(v) == 0 || len(v) > 15 || (v[0] == '0' && len(v) > 1) {
		return 0, false
	}
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// fastCmdAck decodes the canonical form of a successful cmd_ack payload;
// one carrying an error goes to the strict decoder.
func fastCmdAck(b []byte, a *CmdAck) bool {
	var seen [2]bool
	var d CmdAck
	ok := jsonscan.Members(b, func(k, v []byte) bool {
		var i int
		var ok bool
		switch string(k) {
		case "ok":
			i = 0
			d.OK, ok = jsonscan.Bool(v)
		case "result":
			i = 1
			d.Result, ok = jsonscan.Raw(v)
		}
		if !ok || seen[i] {
			return false
		}
		seen[i] = true
		return true
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
	b = append(b, `{"type":"`...)
	b = append(b, typ...)
	b = append(b, `","msg_id":"`...)
	b = append(b, msgID...)
	if inReplyTo != "" {
		b = append(b, `","in_reply_to":"`...)
		b = append(b, inReplyTo...)
	}
	b = append(b, `","payload":`...)
	b = append(b, payload...)
	return append(b, '}'), true
}

// encodePayload encodes a frame's payload as json.Marshal would, by hand
// for a cmd and a successful cmd_ack in their plain form.
func encodePayload(payload any) ([]byte, error) {
	switch p := payload.(type) {
	case Cmd:
		if jsonscan.HTMLSafe(p.Tool) && jsonscan.HTMLSafe(p.RequestID) && jsonscan.MarshalsAsIs(p.Arguments) {
			n := len(p.Tool) + len(p.Arguments) + len(p.RequestID) + 64
			if p.DeadlineAtMs != 0 {
				n += len(`,"deadline_at_ms":`) + 20
			}
			b := make([]byte, 0, n)
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
			return append(b, '}'), nil
		}
	case CmdAck:
		if p.OK && p.Error == nil && jsonscan.MarshalsAsIs(p.Result) {
			b := make([]byte, 0, len(p.Result)+22)
			b = append(b, `{"ok":true,"result":`...)
			b = append(b, p.Result...)
			return append(b, '}'), nil
		}
	}
	return json.Marshal(payload)
}
