package bus_test

import (
	"encoding/json"
	"testing"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/schemas"
)

const node = "01hzx9k3m4p7q8r9s0t1v2w3xy"

func TestSubjects(t *testing.T) {
	for got, want := range map[string]string{
		bus.NodeCmd(node):    "okso.v1.node." + node + ".cmd",
		bus.NodeCancel(node): "okso.v1.node." + node + ".cancel",
		bus.Stream("s1"):     "okso.v1.stream.s1",
		bus.Audit("acme"):    "okso.v1.audit.acme",
	} {
		if got != want {
			t.Errorf("subject %q, want %q", got, want)
		}
	}
}

// The closed error set of DESIGN.md §5.
func TestReplies(t *testing.T) {
	got := string(bus.ErrorReply(schemas.CodeRateLimited, "too many calls"))
	want := `{"ok":false,"error":{"code":"E_RATE_LIMITED","category":"provider_failure","message":"too many calls"}}`
	if got != want {
		t.Errorf("ErrorReply = %s, want %s", got, want)
	}
	got = string(bus.ErrorReply("E_WHATEVER", "x"))
	want = `{"ok":false,"error":{"code":"E_INTERNAL","category":"fatal","message":"x"}}`
	if got != want {
		t.Errorf("ErrorReply(unknown) = %s, want %s", got, want)
	}

	result := json.RawMessage(`{"message":"ping","received_at_ms":1745236800012,"node_id":"` + node + `"}`)
	got = string(bus.OKReply(result))
	want = `{"ok":true,"result":` + string(result) + `}`
	if got != want {
		t.Errorf("OKReply = %s, want %s", got, want)
	}
	var r bus.Reply
	if err := json.Unmarshal(bus.OKReply(result), &r); err != nil {
		t.Fatal(err)
	}
	if !r.OK || string(r.Result) != string(result) || r.Error != nil {
		t.Errorf("OKReply decodes to %+v", r)
	}
	// Encoding a Reply the slow way gives the same bytes.
	slow, _ := json.Marshal(bus.Reply{OK: true, Result: result})
	if string(slow) != string(bus.OKReply(result)) {
		t.Errorf("OKReply %s differs from json.Marshal %s", bus.OKReply(result), slow)
	}
	// Whatever the result, the reply is one valid JSON document.
	for _, res := range []json.RawMessage{nil, {}, json.RawMessage("null"), json.RawMessage(`"s"`), json.RawMessage("[1,2]")} {
		if b := bus.OKReply(res); !json.Valid(b) {
			t.Errorf("OKReply(%q) = %s, not valid JSON", res, b)
		}
	}

	var e bus.Reply
	if err := json.Unmarshal(bus.ErrorReply(schemas.CodeSafetyDenied, "no"), &e); err != nil {
		t.Fatal(err)
	}
	if e.OK || e.Result != nil || e.Error == nil || e.Error.Code != schemas.CodeSafetyDenied || e.Error.Category != "unauthorized" {
		t.Errorf("ErrorReply decodes to %+v", e)
	}

	c, _ := json.Marshal(bus.Call{Tool: "sysecho." + node + ".echo.invoke", Arguments: json.RawMessage(`{"message":"ping"}`)})
	if want := `{"tool":"sysecho.` + node + `.echo.invoke","arguments":{"message":"ping"}}`; string(c) != want {
		t.Errorf("Call = %s, want %s", c, want)
	}
}
