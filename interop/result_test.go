package interop

import (
	"encoding/json"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// outcome is what a client script's request came to: a result, or an
// exception the client threw (an McpError carries the JSON-RPC code and
// data).
type outcome struct {
	Result *callResult   `json:"result"`
	Error  *clientThrown `json:"error"`
}

type callResult struct {
	Meta    map[string]json.RawMessage `json:"_meta"`
	IsError bool                       `json:"isError"`
	Content []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	StructuredContent json.RawMessage `json:"structuredContent"`
}

// String is the result as JSON, for messages.
func (r *callResult) String() string {
	b, _ := json.Marshal(r)
	return string(b)
}

type clientThrown struct {
	Name    string          `json:"name"`
	Code    int             `json:"code"`    // a JSON-RPC error's
	SDKCode string          `json:"sdkCode"` // the v2 client's own error's (SdkErrorCode)
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data"`
}

// envelope is okso's error envelope (DESIGN §5).
type envelope struct {
	Code     string `json:"code"`
	Category string `json:"category"`
	Message  string `json:"message"`
}

// categoryOf is DESIGN §5's table: the category of each code.
func categoryOf(code string) (string, bool) {
	switch code {
	case "E_BAD_REQUEST":
		return "usage", true
	case "E_MANIFEST_INVALID":
		return "invalid_arguments", true
	case "E_TOOL_NOT_FOUND":
		return "tool_not_found", true
	case "E_SAFETY_DENIED":
		return "unauthorized", true
	case "E_NODE_OFFLINE", "E_RATE_LIMITED":
		return "provider_failure", true
	case "E_DEADLINE_EXCEEDED":
		return "timeout", true
	case "E_INTERNAL":
		return "fatal", true
	}
	return "", false
}

// parseEnvelope decodes an error envelope: exactly code, category and
// message, all strings, the category the code's, the message ASCII.
func parseEnvelope(doc []byte) (envelope, string) {
	var m map[string]any
	if err := json.Unmarshal(doc, &m); err != nil {
		return envelope{}, "not a JSON object: " + err.Error()
	}
	if keys := slices.Sorted(maps.Keys(m)); !slices.Equal(keys, []string{"category", "code", "message"}) {
		return envelope{}, "members " + strings.Join(keys, ",") + ", want exactly code, category and message"
	}
	var e envelope
	if err := json.Unmarshal(doc, &e); err != nil {
		return envelope{}, "members are not strings: " + err.Error()
	}
	if c, ok := categoryOf(e.Code); !ok || c != e.Category {
		return e, "code " + e.Code + " with category " + e.Category + ", not a pair of DESIGN §5"
	}
	for _, r := range e.Message {
		if r < 0x20 || r > 0x7e {
			return e, "message is not printable ASCII"
		}
	}
	return e, ""
}

// wantError checks that a call failed as okso's contract says a failed
// call fails: a result (never an exception in the client) with isError,
// the envelope JSON as its first text content, the same envelope in
// _meta["io.okso/error"], no structuredContent, and the given code. It
// returns the envelope.
func wantError(t *testing.T, what string, o outcome, code string) envelope {
	t.Helper()
	if o.Error != nil {
		t.Errorf("%s: the client threw %s %q (data %s); want a result with isError and the %s envelope",
			what, o.Error.Name, o.Error.Message, o.Error.Data, code)
		return envelope{}
	}
	r := o.Result
	if r == nil {
		t.Errorf("%s: no result", what)
		return envelope{}
	}
	if !r.IsError {
		t.Errorf("%s: isError is false; want an isError result with %s", what, code)
	}
	if len(r.StructuredContent) > 0 && string(r.StructuredContent) != "null" {
		t.Errorf("%s: a failed call carries structuredContent %s (clients check it against the tool's outputSchema)",
			what, r.StructuredContent)
	}
	if len(r.Content) == 0 || r.Content[0].Type != "text" {
		t.Errorf("%s: want the envelope as the first (text) content, got %s", what, r)
		return envelope{}
	}
	e, bad := parseEnvelope([]byte(r.Content[0].Text))
	if bad != "" {
		t.Errorf("%s: content[0].text %q is no error envelope: %s", what, r.Content[0].Text, bad)
	}
	if e.Code != code {
		t.Errorf("%s: code %q (%s), want %s", what, e.Code, e.Message, code)
	}
	if meta, ok := r.Meta["io.okso/error"]; !ok {
		t.Errorf(`%s: no _meta["io.okso/error"] in %s`, what, r)
	} else if me, bad := parseEnvelope(meta); bad != "" || !reflect.DeepEqual(me, e) {
		t.Errorf(`%s: _meta["io.okso/error"] %s is not the envelope of the content, %s %s`, what, meta, r.Content[0].Text, bad)
	}
	return e
}

// wantResult checks that a call succeeded: a result without isError whose
// structuredContent (which the client has checked against the tool's
// outputSchema) is also its text content. It decodes structuredContent
// into v.
func wantResult(t *testing.T, what string, o outcome, v any) bool {
	t.Helper()
	if o.Error != nil {
		t.Errorf("%s: the client threw %s %q (data %s)", what, o.Error.Name, o.Error.Message, o.Error.Data)
		return false
	}
	r := o.Result
	if r == nil || r.IsError {
		t.Errorf("%s: want a result, got %s", what, r)
		return false
	}
	if len(r.Content) == 0 || r.Content[0].Type != "text" {
		t.Errorf("%s: no text content: %s", what, r)
		return false
	}
	var text, structured any
	if json.Unmarshal([]byte(r.Content[0].Text), &text) != nil || json.Unmarshal(r.StructuredContent, &structured) != nil ||
		!reflect.DeepEqual(text, structured) {
		t.Errorf("%s: structuredContent %s and the text %q differ", what, r.StructuredContent, r.Content[0].Text)
		return false
	}
	if _, ok := r.Meta["io.okso/request_id"]; !ok {
		t.Errorf(`%s: no _meta["io.okso/request_id"]`, what)
	}
	if err := json.Unmarshal(r.StructuredContent, v); err != nil {
		t.Errorf("%s: structuredContent %s: %v", what, r.StructuredContent, err)
		return false
	}
	return true
}
