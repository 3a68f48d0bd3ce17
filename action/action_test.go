package action_test

import (
	"errors"
	"testing"

	"github.com/okso-io/okso/action"
	"github.com/okso-io/okso/schemas"
)

// TestDecodeReply: exactly one JSON object, nothing before or after it.
func TestDecodeReply(t *testing.T) {
	r, err := action.DecodeReply([]byte(" {\"type\":\"result\",\"result\":{\"t\":21.5}}\n"))
	if err != nil || r.Type != "result" || string(r.Result) != `{"t":21.5}` {
		t.Fatalf("DecodeReply = %+v, %v", r, err)
	}
	for _, bad := range []string{"", "[]", `"result"`, `{"type":"result"} {}`, `{"type":"result"} x`, `{"type":`, `{"type":5}`} {
		if _, err := action.DecodeReply([]byte(bad)); !errors.Is(err, action.ErrBadReply) {
			t.Errorf("DecodeReply(%q) = %v, want ErrBadReply", bad, err)
		}
	}
}

// TestCode: each category okso writes for a code maps back to it; any
// other is E_INTERNAL.
func TestCode(t *testing.T) {
	for _, code := range []string{schemas.CodeBadRequest, schemas.CodeManifestInvalid, schemas.CodeToolNotFound,
		schemas.CodeSafetyDenied, schemas.CodeDeadlineExceeded} {
		if got := action.Code(schemas.Category(code)); got != code {
			t.Errorf("Code(%s) = %s, want %s", schemas.Category(code), got, code)
		}
	}
	for _, c := range []string{"pipeline", "fatal", "provider_failure", "", "usage "} {
		if got := action.Code(c); got != schemas.CodeInternal {
			t.Errorf("Code(%q) = %s, want E_INTERNAL", c, got)
		}
	}
}

// TestDecodeRequest: a request is read exactly.
func TestDecodeRequest(t *testing.T) {
	req, e := action.DecodeRequest([]byte(`{"action":"call_tool","tool":"read"}`))
	if e != nil || req.Action != action.CallTool || req.Tool != "read" || string(req.Arguments) != "{}" {
		t.Fatalf("DecodeRequest = %+v, %v", req, e)
	}
	for _, bad := range []string{`[]`, `{"action":"call_tool"}`, `{"action":"rm"}`, `{"action":"list_tools","x":1}`,
		`{"action":"call_tool","tool":"t","arguments":[1]}`, `{"action":"list_tools","action":"call_tool"}`} {
		if _, e := action.DecodeRequest([]byte(bad)); e == nil || e.Category != "usage" {
			t.Errorf("DecodeRequest(%s) = %v, want a usage error", bad, e)
		}
	}
}
