// Package action is seed 002's action protocol (DESIGN.md §9.2, §12):
// one request, a JSON object with an action discriminator, on a
// process's stdin, and one JSON object on its stdout, {"type":"result",
// ...} or {"type":"error","error":{name, category, message}}. The remote
// tier speaks it to action upstreams and serves it (okso endpoint); the
// device agent speaks it to the commands that serve an operator's kinds.
// This package is the protocol's codec and its mapping to DESIGN.md §5's
// codes, written once for both.
package action

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/okso-io/okso/schemas"
)

// The actions of the protocol.
const (
	ListTools    = "list_tools"
	DescribeTool = "describe_tool"
	CallTool     = "call_tool"
)

// Request is one request of the protocol.
type Request struct {
	Action    string          `json:"action"`
	Tool      string          `json:"tool,omitempty"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
	Meta      map[string]any  `json:"_meta,omitempty"`
}

// Descriptor is a tool as the protocol describes it.
type Descriptor struct {
	Name         string          `json:"name"`
	Description  string          `json:"description"`
	Command      string          `json:"command"` // indicative: how to run it by hand
	Origin       string          `json:"origin"`  // "local" or "remote"
	Safety       string          `json:"safety"`
	InputSchema  json.RawMessage `json:"input_schema"`
	ResultSchema json.RawMessage `json:"result_schema"`
}

// Error is the error object of the protocol, with DESIGN.md §5's
// category.
type Error struct {
	Name     string `json:"name"`
	Category string `json:"category"`
	Message  string `json:"message"`
}

func (e *Error) Error() string { return e.Category + ": " + e.Message }

// Reply is any reply of the protocol, as read.
type Reply struct {
	Type   string          `json:"type"`
	Tools  []Descriptor    `json:"tools"`
	Tool   json.RawMessage `json:"tool"` // a descriptor (describe_tool) or a name (call_tool)
	Result json.RawMessage `json:"result"`
	Error  json.RawMessage `json:"error"`
}

// ErrBadReply: what a process wrote was not exactly one JSON object of
// the protocol.
var ErrBadReply = errors.New("reply is not one JSON object of the action protocol")

// DecodeReply reads a process's whole stdout: exactly one JSON object,
// white space around it allowed, and nothing else.
func DecodeReply(b []byte) (*Reply, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	var v json.RawMessage
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("%w: not JSON", ErrBadReply)
	}
	if !IsObject(v) {
		return nil, fmt.Errorf("%w: not an object", ErrBadReply)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: more after the object", ErrBadReply)
	}
	var r Reply
	if err := json.Unmarshal(v, &r); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadReply, err)
	}
	return &r, nil
}

// IsObject reports whether v is a JSON object.
func IsObject(v json.RawMessage) bool {
	v = bytes.TrimSpace(v)
	return len(v) > 0 && v[0] == '{'
}

// Usage is an error of the request itself.
func Usage(msg string) *Error {
	return &Error{Name: "okso", Category: schemas.Category(schemas.CodeBadRequest), Message: msg}
}

// FromEnvelope is an okso error envelope as the protocol carries it.
func FromEnvelope(e *schemas.Error) *Error {
	return &Error{Name: "okso", Category: e.Category, Message: e.Message}
}

// Code maps a category of the protocol to DESIGN.md §5's code: a
// category okso writes for a code maps back to it, and any other
// (seed 002's pipeline, fatal, or one of the command's own) is
// E_INTERNAL. provider_failure, shared by E_NODE_OFFLINE and
// E_RATE_LIMITED, is the node's own failure here: E_INTERNAL.
func Code(category string) string {
	switch category {
	case schemas.Category(schemas.CodeBadRequest):
		return schemas.CodeBadRequest
	case schemas.Category(schemas.CodeManifestInvalid):
		return schemas.CodeManifestInvalid
	case schemas.Category(schemas.CodeToolNotFound):
		return schemas.CodeToolNotFound
	case schemas.Category(schemas.CodeSafetyDenied):
		return schemas.CodeSafetyDenied
	case schemas.Category(schemas.CodeDeadlineExceeded):
		return schemas.CodeDeadlineExceeded
	}
	return schemas.CodeInternal
}

// DecodeRequest reads a request exactly: one JSON object, no key twice,
// a known action, a tool where the action needs one, and arguments that
// are an object ({} when it has none).
func DecodeRequest(raw []byte) (Request, *Error) {
	v, err := schemas.Decode(raw)
	m, ok := v.(map[string]any)
	if err != nil || !ok {
		return Request{}, Usage("the request is not one JSON object")
	}
	var req Request
	for k, val := range m {
		switch k {
		case "action":
			req.Action, ok = val.(string)
		case "tool":
			req.Tool, ok = val.(string)
		case "arguments":
			_, ok = val.(map[string]any)
			if ok {
				req.Arguments, _ = json.Marshal(val)
			}
		default:
			return Request{}, Usage("the request has a member the protocol does not define")
		}
		if !ok {
			return Request{}, Usage("request member " + k + " has the wrong type (arguments must be an object)")
		}
	}
	switch req.Action {
	case ListTools:
	case DescribeTool, CallTool:
		if req.Tool == "" {
			return Request{}, Usage("action " + req.Action + " needs a tool")
		}
	default:
		return Request{}, Usage("action must be list_tools, describe_tool or call_tool")
	}
	if req.Arguments == nil {
		req.Arguments = json.RawMessage(`{}`)
	}
	return req, nil
}
