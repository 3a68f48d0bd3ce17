// Package wire is okso.v1, the WebSocket protocol a device tier and its
// devices speak (DESIGN.md §3): the envelope and its payloads, their
// codec, the close codes, the frame limits, and the write guard that both
// ends put on a connection. The device tier (package
// github.com/okso-io/okso/device/tier) and the device end (package
// github.com/okso-io/okso/device/agent) each import wire and never each
// other: they meet only on a socket.
//
// A frame is built with [Encode] (or [EncodeID]) and read with
// [DecodeEnvelope], then [DecodePayload] for the payload its type names:
//
//	b, err := wire.Encode(wire.TypeAuth, "", wire.Auth{Token: token})
//	...
//	e, err := wire.DecodeEnvelope(set, frame) // set: the loaded schemas
//	if err == nil && e.Type == wire.TypeCmd {
//		var cmd wire.Cmd
//		err = wire.DecodePayload(e, &cmd)
//	}
//
// Everything here is safe for concurrent use.
package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/oklog/ulid/v2"

	"github.com/okso-io/okso/internal/ids"
	"github.com/okso-io/okso/internal/jsonscan"
	"github.com/okso-io/okso/schemas"
)

// Subprotocol is the WebSocket subprotocol of the device protocol.
const Subprotocol = "okso.v1"

// Path is where the tier serves the device protocol.
const Path = "/v1/device/ws"

// Envelope types (the closed set of DESIGN.md §3).
const (
	TypeHello      = "hello"
	TypeAuth       = "auth"
	TypeAuthOK     = "auth_ok"
	TypeAnnounce   = "announce"
	TypeAnnounceOK = "announce_ok"
	TypeCmd        = "cmd"
	TypeCmdAck     = "cmd_ack"
	TypeStream     = "stream"
	TypeCancel     = "cancel"
	TypeError      = "error"
)

// Close codes.
const (
	CloseNormal     = 1000
	CloseGoingAway  = 1001 // tier shutting down: reconnect elsewhere
	CloseMalformed  = 4400 // malformed or unexpected frame
	CloseAuthFailed = 4401 // authentication failed or late
	CloseForbidden  = 4403 // token valid but not allowed
	CloseLiveness   = 4408 // missed pings
	CloseReplaced   = 4409 // a newer session of the same node
	CloseTooLarge   = 4413 // frame larger than the limit
	CloseTooMany    = 4429 // too many connection attempts
)

// CloseMeaning says what a close code of the protocol means, for a log
// line; "" for a code the protocol does not define.
func CloseMeaning(code int) string {
	switch code {
	case CloseNormal:
		return "normal closure"
	case CloseGoingAway:
		return "tier shutting down"
	case CloseMalformed:
		return "malformed or unexpected frame"
	case CloseAuthFailed:
		return "authentication failed or late"
	case CloseForbidden:
		return "token valid but not allowed"
	case CloseLiveness:
		return "missed pings"
	case CloseReplaced:
		return "a newer session of the same node"
	case CloseTooLarge:
		return "frame larger than the limit"
	case CloseTooMany:
		return "too many connection attempts"
	}
	return ""
}

// FeatureDeadlineAt, in an announce's features, says the device reads
// auth_ok's server_time_ms and refuses a cmd whose deadline_at_ms has
// passed. Devices that do not announce it get cmds without deadline_at_ms,
// which a strict decoder of the older protocol would refuse.
const FeatureDeadlineAt = "deadline_at"

// FeatureLabels, in an announce's features, says the announce may carry
// the node's name and labels ([Announce]). A device sends it, and them,
// only to a tier whose auth_ok lists it in [AuthOK].Features: an older
// tier decodes the announce strictly and would refuse the session.
const FeatureLabels = "labels"

// FeatureTrace, offered in auth_ok's features and announced by a device
// that takes it, puts the call's W3C trace context in each cmd
// (Cmd.Traceparent): a strict decoder of the older protocol would refuse
// the member.
const FeatureTrace = "trace"

// FeatureLocalTools, in auth_ok's features, says the tier accepts
// capabilities of kind local.tool and their description (DESIGN.md §12).
// A device announces its local tools only to a tier that offers it: an
// older tier refuses the whole manifest (4400).
const FeatureLocalTools = "local_tools"

// Defaults of the protocol.
const (
	DefaultMaxFrameBytes = 64 << 10
	DefaultAuthTimeoutMs = 5000
	DefaultDeadlineMs    = 2000
)

// Envelope is one frame: {"type","msg_id","in_reply_to"?,"payload"}.
type Envelope struct {
	Type      string          `json:"type"`
	MsgID     string          `json:"msg_id"`
	InReplyTo string          `json:"in_reply_to,omitempty"`
	Payload   json.RawMessage `json:"payload"`
}

// Payloads.
type (
	Hello struct {
		Proto          string `json:"proto"`
		AuthDeadlineMs int    `json:"auth_deadline_ms"`
		MaxFrameBytes  int    `json:"max_frame_bytes"`
	}
	Auth struct {
		Token string `json:"token"`
	}
	// AuthOK confirms authentication. ServerTimeMs is the tier's clock
	// (Unix milliseconds) as it sends the frame, which a device keeps to
	// read the deadline_at_ms of later cmds; a tier older than it sends
	// none.
	//
	// Features are the announce features the tier takes: a device names
	// one in its announce only when its tier listed it here (deadline_at
	// excepted, which server_time_ms implies: it came before the list).
	// Devices read auth_ok leniently, so older ones ignore the list.
	AuthOK struct {
		NodeID       string   `json:"node_id"`
		Tenant       string   `json:"tenant"`
		SessionID    string   `json:"session_id"`
		ServerTimeMs int64    `json:"server_time_ms,omitempty"`
		Features     []string `json:"features,omitempty"`
	}
	// Announce is the device's manifest (the schema manifest@1.0.0).
	// Name and Labels go only with [FeatureLabels] in Features, which
	// goes only to a tier that offered it.
	Announce struct {
		NodeID       string               `json:"node_id"`
		Agent        schemas.Agent        `json:"agent"`
		Capabilities []schemas.Capability `json:"capabilities"`
		Features     []string             `json:"features,omitempty"`
		Name         string               `json:"name,omitempty"`
		Labels       map[string]string    `json:"labels,omitempty"`
	}
	AnnounceOK struct {
		Tools []string `json:"tools"`
	}
	// Cmd asks the device to run a tool. DeadlineMs is 0 for a streaming
	// verb (it runs until cancelled). DeadlineAtMs, when set, is when the
	// tier gives up on the cmd, on the tier's clock (Unix milliseconds, as
	// auth_ok's server_time_ms): a device that reads it after then must
	// not start the cmd. It is set only for devices that announced
	// [FeatureDeadlineAt]. RequestID correlates the call with the
	// gateway's and the tier's logs.
	Cmd struct {
		Tool         string          `json:"tool"`
		Arguments    json.RawMessage `json:"arguments"`
		DeadlineMs   int             `json:"deadline_ms"`
		DeadlineAtMs int64           `json:"deadline_at_ms,omitempty"`
		RequestID    string          `json:"request_id,omitempty"`
		// Traceparent, sent only to a device that announced
		// [FeatureTrace], is the W3C trace context of the tier's hop of
		// the call: the device's own work is its child.
		Traceparent string `json:"traceparent,omitempty"`
	}
	CmdAck struct {
		OK     bool            `json:"ok"`
		Result json.RawMessage `json:"result,omitempty"`
		Error  *AckError       `json:"error,omitempty"`
	}
	AckError struct {
		Code    string `json:"code"`
		Message string `json:"message,omitempty"`
	}
	StreamFrame struct {
		Event string          `json:"event"`
		Data  json.RawMessage `json:"data"`
	}
	Cancel struct{}
	// ErrorFrame is the payload of an error envelope, sent before a close.
	ErrorFrame struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
)

// validMsgID reports whether s is a ULID: 26 characters of Crockford's
// base 32 (I, L, O and U excluded), in either case.
func validMsgID(s string) bool {
	if len(s) != 26 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i] | 0x20 // lower case for letters; digits keep their value
		switch {
		case s[i] >= '0' && s[i] <= '9':
		case c >= 'a' && c <= 'z' && c != 'i' && c != 'l' && c != 'o' && c != 'u':
		default:
			return false
		}
	}
	return true
}

// NewMsgID returns a fresh ULID for an envelope ([ids.New]: the hot path's
// one allocation; ids of the same millisecond are unique but not ordered,
// and nothing orders msg_ids).
func NewMsgID() string { return ids.New() }

// NewNodeID returns a fresh node id: a ULID in lower case.
func NewNodeID() string { return strings.ToLower(ulid.Make().String()) }

// DerivedNodeID returns the node id whose ULID has a zero timestamp and
// entropy as its random part: a node id made from a key rather than
// drawn, the same for the same entropy (a simulated device's across
// restarts). Its leading zeros tell it from a drawn one.
func DerivedNodeID(entropy [10]byte) string {
	var u ulid.ULID
	copy(u[6:], entropy[:])
	return strings.ToLower(u.String())
}

// ErrMalformed is wrapped by every decoding failure.
var ErrMalformed = errors.New("malformed envelope")

// DecodeEnvelope decodes one frame as its contract, the envelope schema
// (schemas.Envelope in set), reads it: it accepts a frame exactly when
// set.ValidateJSON(schemas.Envelope, b) does. A key in another case
// ("TYPE", "Payload") or written twice, at any depth, an unknown type, a
// msg_id or in_reply_to that is not a ULID, a payload that is not an
// object or whose fields the schema constrains per type are out of bounds,
// or trailing data: each is an error wrapping [ErrMalformed]. Such frames
// are how a peer would smuggle a meaning past a check that reads the
// frame differently; both ends refuse them.
//
// Frames in the canonical form Encode writes take a one-pass reader
// derived from the schema (FuzzDecodeEnvelope proves the two agree);
// others are validated by the schema itself. The payload may share b's
// memory.
func DecodeEnvelope(set *schemas.Set, b []byte) (Envelope, error) {
	if e, ok := fastEnvelope(b); ok {
		return e, nil
	}
	if err := set.ValidateJSON(schemas.Envelope, b); err != nil {
		return Envelope{}, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	// Valid, so every key is one of the four, exactly, and written once:
	// encoding/json's case-insensitive matching finds nothing to merge.
	var e Envelope
	if err := json.Unmarshal(b, &e); err != nil {
		return Envelope{}, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return e, nil
}

// DecodePayload decodes an envelope's payload strictly into v: a member
// v has no field for, or one whose name differs from its field's in case
// only ("Tool", "OK"), at any depth, is an error wrapping [ErrMalformed],
// as is a key written twice. A raw message in v may share the payload's
// memory.
func DecodePayload(e Envelope, v any) error {
	switch v := v.(type) {
	case *Cmd:
		if fastCmd(e.Payload, v) {
			return nil
		}
	case *CmdAck:
		if fastCmdAck(e.Payload, v) {
			return nil
		}
	}
	return strictUnmarshal(e.Payload, v)
}

// strictUnmarshal is encoding/json's strict decoding (no unknown field,
// no trailing data) made exact: encoding/json matches a key to a field
// whatever its case, and keeps the last of keys that match one field, so
// the keys are checked against the fields' names too.
func strictUnmarshal(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if len(bytes.TrimSpace(b[d.InputOffset():])) > 0 {
		return fmt.Errorf("%w: trailing data", ErrMalformed)
	}
	doc, err := schemas.Decode(b) // refuses a key written twice
	if err == nil {
		err = exactKeys(doc, reflect.TypeOf(v))
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return nil
}

var rawMessageType = reflect.TypeFor[json.RawMessage]()

// exactKeys checks that every key of the objects of doc, a document
// encoding/json decoded into a value of type t, names a field of t's
// structs exactly, as its json tag (or Go name) spells it.
func exactKeys(doc any, t reflect.Type) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		m, _ := doc.(map[string]any)
		for k, v := range m {
			f, ok := jsonscan.FieldByName(t, k)
			if !ok {
				return fmt.Errorf("no field %q", k)
			}
			if err := exactKeys(v, f.Type); err != nil {
				return err
			}
		}
	case reflect.Slice, reflect.Array:
		if t == rawMessageType {
			return nil
		}
		a, _ := doc.([]any)
		for _, v := range a {
			if err := exactKeys(v, t.Elem()); err != nil {
				return err
			}
		}
	case reflect.Map:
		m, _ := doc.(map[string]any)
		for _, v := range m {
			if err := exactKeys(v, t.Elem()); err != nil {
				return err
			}
		}
	}
	return nil
}

// Encode builds a frame with a fresh msg_id.
func Encode(typ, inReplyTo string, payload any) ([]byte, error) {
	return EncodeID(typ, NewMsgID(), inReplyTo, payload)
}

// EncodeID builds a frame with the given msg_id.
func EncodeID(typ, msgID, inReplyTo string, payload any) ([]byte, error) {
	// The hot frames are written in one buffer, payload and all.
	if n, ok := payloadSize(payload); ok && jsonscan.HTMLSafe(typ) && jsonscan.HTMLSafe(msgID) && jsonscan.HTMLSafe(inReplyTo) {
		size := len(`{"type":"","msg_id":"","in_reply_to":"","payload":}`) + len(typ) + len(msgID) + len(inReplyTo) + n
		b := appendHead(make([]byte, 0, size), typ, msgID, inReplyTo)
		if b, ok := appendPayload(b, payload); ok {
			return append(b, '}'), nil
		}
	}
	p, err := encodePayload(payload)
	if err != nil {
		return nil, fmt.Errorf("encode %s payload: %w", typ, err)
	}
	size := len(`{"type":"","msg_id":"","in_reply_to":"","payload":}`) + len(typ) + len(msgID) + len(inReplyTo) + len(p)
	if b, ok := appendEnvelope(make([]byte, 0, size), typ, msgID, inReplyTo, p); ok {
		return b, nil
	}
	return json.Marshal(Envelope{Type: typ, MsgID: msgID, InReplyTo: inReplyTo, Payload: p})
}
