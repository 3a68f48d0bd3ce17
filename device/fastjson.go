package device

import (
	"encoding/json"
	"strconv"
)

// The hot frames (an envelope, a cmd, a cmd_ack) are decoded four times
// per call, and encoding/json's strict Decoder costs 5 to 12 µs each. The
// functions here read the canonical form those frames take (exact
// lower-case keys, each at most once, strings without escapes) in one
// pass, and report false on anything else, which then goes to the strict
// decoder for its verdict. Whatever they accept, they decode exactly as
// the strict decoder would (FuzzFastDecode checks it); a RawMessage they
// return shares the input's memory.

// members calls f with each member of the JSON object in b (key without
// quotes, raw value) and reports whether b is one such object with
// nothing but white space around it and f accepted every member. Keys
// must be plain (see plainString); values are only delimited here: f
// checks them.
func members(b []byte, f func(key string, val []byte) bool) bool {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return skipSpace(b, i+1) == len(b)
	}
	for {
		key, j, ok := plainString(b, i)
		if !ok {
			return false
		}
		j = skipSpace(b, j)
		if j >= len(b) || b[j] != ':' {
			return false
		}
		j = skipSpace(b, j+1)
		end, ok := valueEnd(b, j)
		if !ok || !f(key, b[j:end]) {
			return false
		}
		i = skipSpace(b, end)
		if i >= len(b) {
			return false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			return skipSpace(b, i+1) == len(b)
		default:
			return false
		}
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// plainString reads the JSON string at b[i] if it is plain: printable
// ASCII without escapes, the only strings whose decoded value is their
// raw bytes whatever the decoder. It returns the value and the index after
// the closing quote.
func plainString(b []byte, i int) (string, int, bool) {
	if i >= len(b) || b[i] != '"' {
		return "", 0, false
	}
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return string(b[i+1 : j]), j + 1, true
		case c == '\\' || c < 0x20 || c >= 0x7f:
			return "", 0, false
		}
	}
	return "", 0, false
}

// valueEnd returns the index just after the JSON value starting at b[i],
// finding its end only: whether it is valid JSON is for the caller.
func valueEnd(b []byte, i int) (int, bool) {
	if i >= len(b) {
		return 0, false
	}
	switch b[i] {
	case '"':
		for j := i + 1; j < len(b); j++ {
			switch b[j] {
			case '\\':
				j++
			case '"':
				return j + 1, true
			}
		}
		return 0, false
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1, true
				}
			case '"':
				end, ok := valueEnd(b, j)
				if !ok {
					return 0, false
				}
				j = end - 1
			}
		}
		return 0, false
	}
	j := i
	for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' &&
		b[j] != '\t' && b[j] != '\n' && b[j] != '\r' {
		j++
	}
	return j, j > i
}

// plainValue is a member value that is a plain string.
func plainValue(v []byte) (string, bool) {
	s, end, ok := plainString(v, 0)
	return s, ok && end == len(v)
}

// rawValue is a member value kept raw, as a json.RawMessage decodes it.
func rawValue(v []byte) (json.RawMessage, bool) {
	return json.RawMessage(v), json.Valid(v)
}

// intValue is a member value that is an integer in canonical form that
// fits an int on every platform.
func intValue(v []byte) (int, bool) {
	switch {
	case len(v) == 0 || len(v) > 10,
		v[0] != '-' && (v[0] < '0' || v[0] > '9'), // ParseInt takes a '+', JSON does not
		v[0] == '0' && len(v) > 1,
		v[0] == '-' && (len(v) == 1 || v[1] == '0'):
		return 0, false
	}
	n, err := strconv.ParseInt(string(v), 10, 32)
	return int(n), err == nil
}

// fastEnvelope decodes the canonical form of an envelope.
func fastEnvelope(b []byte) (e Envelope, ok bool) {
	var seen [4]bool
	ok = members(b, func(k string, v []byte) bool {
		var i int
		var ok bool
		switch k {
		case "type":
			i = 0
			e.Type, ok = plainValue(v)
		case "msg_id":
			i = 1
			e.MsgID, ok = plainValue(v)
		case "in_reply_to":
			i = 2
			e.InReplyTo, ok = plainValue(v)
		case "payload":
			i = 3
			e.Payload, ok = rawValue(v)
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
	var seen [4]bool
	var d Cmd
	ok := members(b, func(k string, v []byte) bool {
		var i int
		var ok bool
		switch k {
		case "tool":
			i = 0
			d.Tool, ok = plainValue(v)
		case "arguments":
			i = 1
			d.Arguments, ok = rawValue(v)
		case "deadline_ms":
			i = 2
			d.DeadlineMs, ok = intValue(v)
		case "request_id":
			i = 3
			d.RequestID, ok = plainValue(v)
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

// fastCmdAck decodes the canonical form of a successful cmd_ack payload;
// one carrying an error goes to the strict decoder.
func fastCmdAck(b []byte, a *CmdAck) bool {
	var seen [2]bool
	var d CmdAck
	ok := members(b, func(k string, v []byte) bool {
		var i int
		var ok bool
		switch k {
		case "ok":
			i = 0
			switch string(v) {
			case "true":
				d.OK, ok = true, true
			case "false":
				d.OK, ok = false, true
			}
		case "result":
			i = 1
			d.Result, ok = rawValue(v)
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
	if !htmlSafe(typ) || !htmlSafe(msgID) || !htmlSafe(inReplyTo) {
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

// htmlSafe reports whether json.Marshal writes s as it is: printable
// ASCII but for the quote, the backslash and <, >, & (escaped as HTML).
func htmlSafe(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c >= 0x7f, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}
