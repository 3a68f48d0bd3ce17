package bus_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/oklog/ulid/v2"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/schemas"
)

const node = "01hzx9k3m4p7q8r9s0t1v2w3xy"

func TestParseToolName(t *testing.T) {
	fresh := strings.ToLower(ulid.Make().String())
	// The cap_id that makes sysecho.<node>.<cap_id>.invoke 64 characters long.
	cap64 := strings.Repeat("e", bus.MaxToolName-len("sysecho."+node+"..invoke"))
	valid := []struct {
		name string
		want bus.ToolName
	}{
		{"sysecho." + node + ".echo.invoke", bus.ToolName{"sysecho", node, "echo", "invoke"}},
		{"sys." + fresh + ".metrics.subscribe", bus.ToolName{"sys", fresh, "metrics", "subscribe"}},
		{"a." + node + ".b.c", bus.ToolName{"a", node, "b", "c"}},
		{"x_1." + node + ".cap_2.verb_3", bus.ToolName{"x_1", node, "cap_2", "verb_3"}},
		// Exactly 64 characters.
		{"sysecho." + node + "." + cap64 + ".invoke", bus.ToolName{"sysecho", node, cap64, "invoke"}},
	}
	for _, tc := range valid {
		got, ok := bus.ParseToolName(tc.name)
		if !ok || got != tc.want {
			t.Errorf("ParseToolName(%q) = %+v, %v; want %+v", tc.name, got, ok, tc.want)
			continue
		}
		if got.String() != tc.name {
			t.Errorf("String() = %q, want %q", got.String(), tc.name)
		}
	}
	if n := len(valid[4].name); n != bus.MaxToolName {
		t.Fatalf("boundary case is %d chars, want %d", n, bus.MaxToolName)
	}

	for _, name := range []string{
		"",
		"sysecho." + node + ".echo",              // 3 segments
		"sysecho." + node + ".echo.invoke.extra", // 5 segments
		"sysecho." + node,                        // 2 segments
		"sysecho",                                // 1 segment
		"SYSECHO." + node + ".echo.invoke",       // upper-case kind
		"sysecho." + strings.ToUpper(node) + ".echo.invoke", // upper-case node id
		"sysecho." + node + ".Echo.invoke",
		"sysecho." + node + ".echo.INVOKE",
		"sysecho." + node + "." + cap64 + "e.invoke",                   // 65 chars
		"sysecho." + node + "." + strings.Repeat("e", 200) + ".invoke", // far too long
		"sysecho.01hzx9k3m4p7q8r9s0t1v2w3xu.echo.invoke",               // 'u' is not Crockford
		"sysecho.01hzx9k3m4p7q8r9s0t1v2w3xl.echo.invoke",               // 'l'
		"sysecho.01hzx9k3m4p7q8r9s0t1v2w3xi.echo.invoke",               // 'i'
		"sysecho.01hzx9k3m4p7q8r9s0t1v2w3xo.echo.invoke",               // 'o'
		"sysecho.01hzx9k3m4p7q8r9s0t1v2w3x.echo.invoke",                // 25 chars
		"sysecho.01hzx9k3m4p7q8r9s0t1v2w3xyz.echo.invoke",              // 27 chars
		"sysecho.01hzx9k3m4p7q8r9s0t1v2w3x_.echo.invoke",               // underscore in id
		"sysecho.node.echo.invoke",
		".." + node + ".echo.invoke",
		"." + node + ".echo.invoke",            // empty kind
		"sysecho.." + node + ".invoke",         // empty segment
		"sysecho." + node + "..invoke",         // empty cap
		"sysecho." + node + ".echo.",           // empty verb
		"sysecho." + node + ".echo.invoke.",    // trailing dot
		".sysecho." + node + ".echo.invoke",    // leading dot
		"sysecho." + node + ".echo.invoke\n",   // trailing newline
		" sysecho." + node + ".echo.invoke",    // leading space
		"sysecho." + node + ".ec-ho.invoke",    // dash
		"sysecho." + node + ".echo.inv*ke",     // NATS wildcard
		"sysecho." + node + ".echo.>",          // NATS wildcard
		"sysecho." + node + ".echo.invoké",     // non-ASCII
		"sysecho\x00." + node + ".echo.invoke", // NUL
	} {
		if got, ok := bus.ParseToolName(name); ok {
			t.Errorf("ParseToolName(%q) accepted: %+v", name, got)
		}
	}
}

func TestValidNodeIDAndTenant(t *testing.T) {
	for s, want := range map[string]bool{
		node:                                  true,
		strings.ToLower(ulid.Make().String()): true,
		strings.ToUpper(node):                 false,
		"":                                    false,
		node[:25]:                             false,
		node + "0":                            false,
		"01hzx9k3m4p7q8r9s0t1v2w3xu":          false,
	} {
		if got := bus.ValidNodeID(s); got != want {
			t.Errorf("ValidNodeID(%q) = %v, want %v", s, got, want)
		}
	}
	for s, want := range map[string]bool{
		"acme":                  true,
		"A-b_9":                 true,
		strings.Repeat("a", 64): true,
		strings.Repeat("a", 65): false,
		"":                      false,
		"a.b":                   false,
		"*":                     false,
		">":                     false,
		"a b":                   false,
	} {
		if got := bus.ValidTenant(s); got != want {
			t.Errorf("ValidTenant(%q) = %v, want %v", s, got, want)
		}
	}
}

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
