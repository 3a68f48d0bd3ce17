package roles

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device/agent"
	"github.com/okso-io/okso/mcp"
	"github.com/okso-io/okso/schemas"
)

// sdkGateway starts a second gateway on the fixture's NATS with the fast
// path off, so that every request takes the SDK's path; it returns its
// MCP URL.
func (f *fixture) sdkGateway() string {
	f.t.Helper()
	return f.secondGateway(gatewayConfig{NoFastPath: true}).url()
}

// secondGateway starts another gateway replica on the fixture's NATS and
// returns once it lists every node the first one lists.
func (f *fixture) secondGateway(cfg gatewayConfig) *gatewayPart {
	f.t.Helper()
	cfg.Addr = "127.0.0.1:0"
	if cfg.Budget == 0 {
		cfg.Budget = 5 * time.Second
	}
	p, err := newGatewayPart(f.t.Context(), f.a.c, f.a.nats, cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { _ = p.gw.Run(ctx); done <- struct{}{} }()
	go func() { _ = p.http.srv.Serve(p.http.ln); done <- struct{}{} }()
	f.t.Cleanup(func() {
		cancel()
		_ = p.http.srv.Close()
		<-done
		<-done
		p.close()
	})
	wctx, wcancel := context.WithTimeout(f.t.Context(), 10*time.Second)
	defer wcancel()
	select {
	case <-p.gw.Ready():
	case <-wctx.Done():
		f.t.Fatal("second gateway never loaded the registry")
	}
	for id := range f.a.gw.gw.Devices().IDs() {
		if err := p.gw.Wait(wctx, func(map[string]int) bool { return p.gw.Devices().Listed(id) }); err != nil {
			f.t.Fatalf("second gateway never listed node %s", id)
		}
	}
	return p
}

// mcpAnswer is one HTTP answer to a POST /mcp, with the JSON-RPC message
// taken out of its SSE event when the answer is a stream.
type mcpAnswer struct {
	status  int
	ctype   string // media type only
	message any    // the decoded JSON-RPC message, or nil
	raw     []byte // the JSON-RPC message as sent, when message is set
	text    string // the body, when it is no JSON-RPC message
}

func postMCP(t *testing.T, url, token string, hdr map[string]string, body string) mcpAnswer {
	t.Helper()
	a, err := doMCP(t.Context(), url, token, hdr, body)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// doMCP is postMCP for any goroutine: it returns its error.
func doMCP(ctx context.Context, url, token string, hdr map[string]string, body string) (mcpAnswer, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	req.Header.Set("X-Request-Id", "fast-path-test")
	req.Header.Set("Authorization", "Bearer "+token)
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return mcpAnswer{}, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	a := mcpAnswer{status: resp.StatusCode, ctype: strings.TrimSpace(strings.Split(resp.Header.Get("Content-Type"), ";")[0])}
	data := raw
	if a.ctype == "text/event-stream" {
		data = nil
		sc := bufio.NewScanner(bytes.NewReader(raw))
		for sc.Scan() {
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				data = []byte(d)
				break
			}
		}
	}
	if json.Unmarshal(data, &a.message) != nil {
		a.message, a.text = nil, string(raw)
	} else {
		a.raw = data
	}
	return a, nil
}

// TestFastPathMatchesSDK sends the same requests to a gateway with the fast
// path and to one without it: every answer must carry the same status and
// the same JSON-RPC message, and the canonical unary calls must take the
// fast path (application/json) while everything else is the SDK's.
func TestFastPathMatchesSDK(t *testing.T) {
	f := startAllInOne(t, 0, nil)
	// Each call is made twice (once per gateway): lift the echo's 10 calls/s.
	id, _ := f.connectDevice(DefaultTenant, func(_ string, o *agent.Options) {
		for i := range o.Capabilities {
			o.Capabilities[i].Constraints.RateLimitRPS = 10000
		}
	})
	other := f.device("tenant-b", nil, nil)
	sdkURL := f.sdkGateway()
	ro := f.token(auth.MintOptions{})
	rw := f.token(auth.MintOptions{Scopes: []string{auth.ScopeReadOnly, auth.ScopeMutating}})

	call := func(id, name, args string) string {
		a := ""
		if args != "" {
			a = `,"arguments":` + args
		}
		return `{"jsonrpc":"2.0","id":` + id + `,"method":"tools/call","params":{"name":"` + name + `"` + a + `}}`
	}
	echo := echoName(id)
	const newMeta = `"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}`
	callMeta := func(id, name, args, meta string) string {
		return `{"jsonrpc":"2.0","id":` + id + `,"method":"tools/call","params":{"name":"` + name +
			`","arguments":` + args + `,"_meta":{` + meta + `}}}`
	}
	sessionless := func(name string) map[string]string {
		return map[string]string{"Mcp-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": name}
	}
	for _, tc := range []struct {
		name  string
		token string
		hdr   map[string]string
		body  string
		fast  bool // the fast gateway answers with application/json
		check func(t *testing.T, a mcpAnswer)
	}{
		{name: "echo", body: call("1", echo, `{"message":"hello <&> \"q\""}`), fast: true, check: wantResult(id, false)},
		{name: "string id", body: call(`"abc"`, echo, `{"message":"x"}`), fast: true, check: wantResult(id, false)},
		{name: "negative id", body: call("-7", echo, `{"message":"x"}`), fast: true, check: wantResult(id, false)},
		{name: "metrics snapshot", body: call("2", "sys."+id+".metrics.snapshot", `{}`), fast: true, check: wantResult(id, false)},
		{name: "no arguments", body: call("3", "sys."+id+".metrics.snapshot", ""), fast: true, check: wantResult(id, false)},
		{name: "null arguments", body: call("3", "sys."+id+".metrics.snapshot", "null"), fast: true, check: wantResult(id, false)},
		{name: "progress token ignored", body: `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"` + echo +
			`","arguments":{"message":"x"},"_meta":{"progressToken":"p"}}}`, fast: true, check: wantResult(id, false)},
		{name: "no header version", hdr: map[string]string{"Mcp-Protocol-Version": ""}, body: call("5", echo, `{"message":"x"}`),
			fast: true, check: wantResult(id, false)},
		{name: "gpio write allowed", token: rw, body: call("6", "gpio."+id+".pin.write", `{"level":1}`), fast: true, check: wantResult(id, false)},
		{name: "extra argument", body: call("7", echo, `{"message":"x","extra":1}`), fast: true, check: wantCode(schemas.CodeManifestInvalid)},
		{name: "duplicate argument", body: call("7", echo, `{"message":"x","message":"y"}`), check: wantHTTP(http.StatusOK)},
		{name: "missing scope", body: call("8", "gpio."+id+".pin.write", `{"level":1}`), fast: true, check: wantCode(schemas.CodeSafetyDenied)},
		{name: "other tenant", body: call("9", echoName(other), `{"message":"x"}`), fast: true, check: wantCode(schemas.CodeSafetyDenied)},
		{name: "unknown tool", body: call("10", "sysecho.nope-node.echo.invoke", `{}`), fast: true, check: wantRPCError(-32602)},
		{name: "malformed name", body: call("11", "not a tool", `{}`), fast: true, check: wantRPCError(-32602)},
		// Not canonical: the SDK answers, through either gateway.
		{name: "subscribe streams", body: call("12", "sys."+id+".metrics.subscribe", `{"interval_ms":1000}`),
			check: wantCode(schemas.CodeBadRequest)},
		{name: "duplicate top-level key", body: `{"jsonrpc":"2.0","id":13,"id":14,"method":"tools/call","params":{"name":"` + echo + `","arguments":{"message":"x"}}}`},
		{name: "unknown params key", body: `{"jsonrpc":"2.0","id":15,"method":"tools/call","params":{"name":"` + echo + `","arguments":{"message":"x"},"task":{}}}`},
		{name: "fractional id", body: call("1.5", echo, `{"message":"x"}`)},
		{name: "null id", body: call("null", echo, `{"message":"x"}`)},
		{name: "notification", body: `{"jsonrpc":"2.0","method":"tools/call","params":{"name":"` + echo + `"}}`},
		{name: "batch", body: "[" + call("16", echo, `{"message":"x"}`) + "]", check: wantHTTP(http.StatusBadRequest)},
		// tools/list: the page as the page cache holds it.
		{name: "tools/list", body: `{"jsonrpc":"2.0","id":17,"method":"tools/list"}`, fast: true, check: wantHTTP(http.StatusOK)},
		{name: "tools/list read-write", token: rw, body: `{"jsonrpc":"2.0","id":"l","method":"tools/list","params":{}}`, fast: true},
		{name: "tools/list empty cursor", body: `{"jsonrpc":"2.0","id":50,"method":"tools/list","params":{"cursor":""}}`, fast: true},
		{name: "tools/list after a cursor", body: `{"jsonrpc":"2.0","id":51,"method":"tools/list","params":{"cursor":"` +
			base64.RawURLEncoding.EncodeToString([]byte("sys")) + `","_meta":{"progressToken":1}}}`, fast: true},
		{name: "tools/list bad cursor", body: `{"jsonrpc":"2.0","id":52,"method":"tools/list","params":{"cursor":"!"}}`},
		{name: "tools/list unknown params key", body: `{"jsonrpc":"2.0","id":53,"method":"tools/list","params":{"x":1}}`},
		{name: "tools/list null params", body: `{"jsonrpc":"2.0","id":54,"method":"tools/list","params":null}`},
		{name: "tools/list cursor not a string", body: `{"jsonrpc":"2.0","id":55,"method":"tools/list","params":{"cursor":5}}`},
		{name: "sessionless tools/list", hdr: map[string]string{"Mcp-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/list"},
			body: `{"jsonrpc":"2.0","id":56,"method":"tools/list","params":{"_meta":{` + newMeta + `}}}`, fast: true},
		{name: "sessionless tools/list with Mcp-Name", hdr: map[string]string{"Mcp-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/list", "Mcp-Name": "x"},
			body: `{"jsonrpc":"2.0","id":57,"method":"tools/list","params":{"_meta":{` + newMeta + `}}}`},
		{name: "sessionless tools/list without _meta", hdr: map[string]string{"Mcp-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/list"},
			body: `{"jsonrpc":"2.0","id":58,"method":"tools/list"}`},
		{name: "trailing data", body: call("18", echo, `{"message":"x"}`) + "{}"},
		{name: "not json", body: `{"jsonrpc":`, check: wantHTTP(http.StatusBadRequest)},
		{name: "arguments not an object", body: call("19", echo, `[1]`)},
		// Protocol 2026-07-28: the version in _meta and the header, the
		// method and name headers, the client's metadata.
		{name: "sessionless echo", hdr: sessionless(echo), body: callMeta("26", echo, `{"message":"x"}`, newMeta),
			fast: true, check: wantResult(id, false)},
		{name: "sessionless with client info", hdr: sessionless(echo),
			body: callMeta("27", echo, `{"message":"x"}`, newMeta+`,"io.modelcontextprotocol/clientInfo":{"name":"c","version":"1"}`),
			fast: true, check: wantResult(id, false)},
		{name: "sessionless denied", hdr: sessionless("gpio." + id + ".pin.write"),
			body: callMeta("28", "gpio."+id+".pin.write", `{"level":1}`, newMeta), fast: true, check: wantCode(schemas.CodeSafetyDenied)},
		{name: "sessionless unknown tool", hdr: sessionless("sysecho.nope-node.echo.invoke"),
			body: callMeta("29", "sysecho.nope-node.echo.invoke", `{}`, newMeta), check: wantRPCError(-32602)},
		{name: "sessionless without _meta", hdr: sessionless(echo), body: call("25", echo, `{"message":"x"}`)},
		{name: "sessionless without Mcp-Name", hdr: map[string]string{"Mcp-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call"},
			body: callMeta("30", echo, `{"message":"x"}`, newMeta)},
		{name: "sessionless wrong Mcp-Name", hdr: sessionless(echoName(other)), body: callMeta("31", echo, `{"message":"x"}`, newMeta)},
		{name: "sessionless wrong Mcp-Method", hdr: map[string]string{"Mcp-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/list", "Mcp-Name": echo},
			body: callMeta("32", echo, `{"message":"x"}`, newMeta)},
		{name: "sessionless version mismatch", hdr: sessionless(echo),
			body: callMeta("33", echo, `{"message":"x"}`, `"io.modelcontextprotocol/protocolVersion":"2025-11-25","io.modelcontextprotocol/clientCapabilities":{}`)},
		{name: "sessionless without capabilities", hdr: sessionless(echo),
			body: callMeta("34", echo, `{"message":"x"}`, `"io.modelcontextprotocol/protocolVersion":"2026-07-28"`)},
		{name: "sessionless bad client info", hdr: sessionless(echo),
			body: callMeta("35", echo, `{"message":"x"}`, newMeta+`,"io.modelcontextprotocol/clientInfo":{"name":5}`)},
		{name: "old version with _meta version", body: callMeta("36", echo, `{"message":"x"}`, newMeta)},
		// What the SDK refuses, the fast path leaves to it.
		{name: "deep _meta", body: callMeta("40", echo, `{"message":"x"}`, `"deep":`+strings.Repeat("[", 70)+strings.Repeat("]", 70))},
		{name: "_meta number beyond float64", body: callMeta("41", echo, `{"message":"x"}`, `"big":1e400`)},
		{name: "Last-Event-ID on a POST", hdr: map[string]string{"Last-Event-ID": "1"}, body: call("42", echo, `{"message":"x"}`)},
		// Ids come back as the SDK writes them.
		{name: "id -0", body: call("-0", echo, `{"message":"x"}`), fast: true, check: wantResult(id, false)},
		{name: "id with escapes", body: call(`"a\u0041\t"`, echo, `{"message":"x"}`), fast: true, check: wantResult(id, false)},
		{name: "unsupported version", hdr: map[string]string{"Mcp-Protocol-Version": "1999-01-01"},
			body: call("20", echo, `{"message":"x"}`), check: wantHTTP(http.StatusBadRequest)},
		{name: "wrong accept", hdr: map[string]string{"Accept": "application/json"},
			body: call("21", echo, `{"message":"x"}`), check: wantHTTP(http.StatusBadRequest)},
		{name: "wrong content type", hdr: map[string]string{"Content-Type": "text/plain"},
			body: call("22", echo, `{"message":"x"}`), check: wantHTTP(http.StatusUnsupportedMediaType)},
		{name: "foreign host", hdr: map[string]string{"Host": "evil.example"},
			body: call("23", echo, `{"message":"x"}`), check: wantHTTP(http.StatusForbidden)},
		{name: "body too large", body: call("24", echo, `{"message":"`+strings.Repeat("x", 1<<20)+`"}`),
			check: wantHTTP(http.StatusRequestEntityTooLarge)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok := tc.token
			if tok == "" {
				tok = ro
			}
			fast := postMCP(t, f.a.MCPURL(), tok, tc.hdr, tc.body)
			slow := postMCP(t, sdkURL, tok, tc.hdr, tc.body)
			// The SDK answers a call with an event stream (JSON only for
			// some 400s); the fast path with application/json and 200.
			if took := fast.status == http.StatusOK && fast.ctype == "application/json"; took != tc.fast {
				t.Errorf("fast path taken: %v, want %v (answer %d %s %v)", took, tc.fast, fast.status, fast.ctype, fast.message)
			}
			if slow.status == http.StatusOK && slow.ctype == "application/json" {
				t.Errorf("the SDK gateway answered with JSON: %v", slow.message)
			}
			if fast.status != slow.status {
				t.Errorf("status: fast %d, SDK %d", fast.status, slow.status)
			}
			if !reflect.DeepEqual(normalise(fast.message), normalise(slow.message)) {
				t.Errorf("message differs:\n fast %v\n SDK  %v", fast.message, slow.message)
			}
			if fast.message == nil && fast.text != slow.text {
				t.Errorf("body differs:\n fast %q\n SDK  %q", fast.text, slow.text)
			}
			if tc.check != nil {
				tc.check(t, fast)
			}
		})
	}
}

// normalise drops what legitimately differs between two answers to the
// same call: the time a device received it and the metric values.
func normalise(m any) any {
	b, _ := json.Marshal(m)
	var v map[string]any
	if json.Unmarshal(b, &v) != nil {
		return m
	}
	res, _ := v["result"].(map[string]any)
	if sc, ok := res["structuredContent"].(map[string]any); ok && res["isError"] == nil {
		for k := range sc {
			if k != "node_id" && k != "message" {
				sc[k] = "*"
			}
		}
		res["content"] = "*"
	}
	return v
}

func wantResult(nodeID string, isError bool) func(*testing.T, mcpAnswer) {
	return func(t *testing.T, a mcpAnswer) {
		t.Helper()
		m, _ := a.message.(map[string]any)
		res, _ := m["result"].(map[string]any)
		sc, _ := res["structuredContent"].(map[string]any)
		if res == nil || (res["isError"] == true) != isError || sc["node_id"] != nodeID {
			t.Fatalf("want a result of node %s (isError %v), got %v", nodeID, isError, a.message)
		}
		meta, _ := res["_meta"].(map[string]any)
		if meta["io.okso/request_id"] != "fast-path-test" {
			t.Errorf("result _meta %v lacks the request id", meta)
		}
		content, _ := res["content"].([]any)
		if len(content) != 1 {
			t.Fatalf("content %v: want one item", res["content"])
		}
		item, _ := content[0].(map[string]any)
		var fromText any
		if item["type"] != "text" || json.Unmarshal([]byte(item["text"].(string)), &fromText) != nil ||
			!reflect.DeepEqual(fromText, res["structuredContent"]) {
			t.Errorf("text content %v differs from structuredContent %v", item, sc)
		}
	}
}

func wantCode(code string) func(*testing.T, mcpAnswer) {
	return func(t *testing.T, a mcpAnswer) {
		t.Helper()
		m, _ := a.message.(map[string]any)
		res, _ := m["result"].(map[string]any)
		meta, _ := res["_meta"].(map[string]any)
		env, _ := meta[mcp.MetaError].(map[string]any)
		if res["isError"] != true || env["code"] != code || res["structuredContent"] != nil {
			t.Fatalf("want an isError result with %s in _meta and no structuredContent, got %v", code, a.message)
		}
		content, _ := res["content"].([]any)
		item, _ := content[0].(map[string]any)
		var fromText any
		if json.Unmarshal([]byte(item["text"].(string)), &fromText) != nil || !reflect.DeepEqual(fromText, env) {
			t.Errorf("text content %v differs from the envelope %v", item, env)
		}
	}
}

func wantRPCError(code float64) func(*testing.T, mcpAnswer) {
	return func(t *testing.T, a mcpAnswer) {
		t.Helper()
		m, _ := a.message.(map[string]any)
		e, _ := m["error"].(map[string]any)
		if e["code"] != code {
			t.Fatalf("want JSON-RPC error %v, got %v", code, a.message)
		}
		if d, _ := e["data"].(map[string]any); d["code"] != schemas.CodeToolNotFound {
			t.Errorf("error data %v: want the %s envelope", e["data"], schemas.CodeToolNotFound)
		}
	}
}

func wantHTTP(status int) func(*testing.T, mcpAnswer) {
	return func(t *testing.T, a mcpAnswer) {
		t.Helper()
		if a.status != status {
			t.Fatalf("status %d, want %d (%s)", a.status, status, a.text)
		}
	}
}

// mayDiffer reports whether two answers to the same call may rightly
// differ in the value of a member, wherever it is (text content that is
// JSON included): the device's clock when the call reached it, and the id
// the relay gives each relayed call (in caller_tool_response's answer).
func mayDiffer(member string) bool { return member == "received_at_ms" || member == "request_id" }

// comparable decodes a JSON-RPC message for comparison: numbers as
// written, and the values of mayDiffer's members replaced by "*".
func comparable(t *testing.T, raw []byte) any {
	t.Helper()
	v, err := decodeNumbers(raw)
	if err != nil {
		t.Fatalf("answer %s: %v", raw, err)
	}
	return masked(v)
}

func decodeNumbers(raw []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	err := d.Decode(&v)
	return v, err
}

// masked replaces the values of mayDiffer's members in v by "*"; a string
// that is a JSON document holding such a member becomes that document,
// masked.
func masked(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if mayDiffer(k) {
				v[k] = "*"
			} else {
				v[k] = masked(x)
			}
		}
	case []any:
		for i, x := range v {
			v[i] = masked(x)
		}
	case string:
		doc, err := decodeNumbers([]byte(v))
		if err != nil {
			return v
		}
		before, _ := json.Marshal(doc)
		after, _ := json.Marshal(masked(doc))
		if !bytes.Equal(before, after) {
			return map[string]any{"masked JSON text": masked(doc)}
		}
	}
	return v
}

// revisionCall is a tools/call request as a client of revision v sends
// it: its headers, and its body (from 2026-07-28, with the client's
// metadata in _meta).
func revisionCall(v, id, name, args string) (map[string]string, string) {
	hdr := map[string]string{"Mcp-Protocol-Version": v}
	meta := ""
	if v >= "2026-07-28" {
		hdr["Mcp-Method"], hdr["Mcp-Name"] = "tools/call", name
		meta = `,"_meta":{"io.modelcontextprotocol/protocolVersion":"` + v + `","io.modelcontextprotocol/clientCapabilities":{},` +
			`"io.modelcontextprotocol/clientInfo":{"name":"okso-test","version":"1"}}`
	}
	return hdr, `{"jsonrpc":"2.0","id":` + id + `,"method":"tools/call","params":{"name":"` + name + `","arguments":` + args + meta + `}}`
}

// sameAnswer fails the test unless the fast path's answer and the SDK's
// carry the same status and the same JSON-RPC message, member by member
// and numbers as written, but for mayDiffer's; fast says whether the fast
// path must have answered (application/json) or left the call to the SDK.
func sameAnswer(t *testing.T, fast, slow mcpAnswer, wantFast bool) {
	t.Helper()
	if took := fast.status == http.StatusOK && fast.ctype == "application/json"; took != wantFast {
		t.Errorf("fast path taken: %v, want %v (answer %d %s %s)", took, wantFast, fast.status, fast.ctype, fast.raw)
	}
	if fast.status != slow.status {
		t.Errorf("status: fast %d, SDK %d", fast.status, slow.status)
	}
	if fast.raw == nil || slow.raw == nil {
		t.Fatalf("no JSON-RPC message:\n fast %q\n SDK  %q", fast.text, slow.text)
	}
	if f, s := comparable(t, fast.raw), comparable(t, slow.raw); !reflect.DeepEqual(f, s) {
		t.Errorf("answers differ:\n fast %s\n SDK  %s", fast.raw, slow.raw)
	}
}

// sdkReference serves a bare SDK server, stateless and introduced as the
// gateway introduces itself, whose one tool, "ref", answers with the
// tools/call result or the JSON-RPC error its arguments hold
// ({"result": …} or {"error": …}); it returns its URL. Handed a result
// okso wrote, less what the SDK adds itself (resultType, and the
// server's info in _meta), it answers what the SDK writes of that result
// on the request's revision.
func sdkReference(t *testing.T) string {
	t.Helper()
	srv := sdk.NewServer(&sdk.Implementation{Name: "okso", Title: "okso fleet gateway", Version: Version}, nil)
	srv.AddTool(&sdk.Tool{Name: "ref", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(_ context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			var in struct {
				Result json.RawMessage `json:"result"`
				Error  *jsonrpc.Error  `json:"error"`
			}
			if err := json.Unmarshal(req.Params.Arguments, &in); err != nil {
				return nil, err
			}
			if in.Error != nil {
				return nil, in.Error
			}
			var res sdk.CallToolResult
			if err := json.Unmarshal(in.Result, &res); err != nil {
				return nil, err
			}
			// A structuredContent goes on as written (okso's results do).
			var raw struct {
				StructuredContent json.RawMessage `json:"structuredContent"`
			}
			if err := json.Unmarshal(in.Result, &raw); err == nil && raw.StructuredContent != nil {
				res.StructuredContent = raw.StructuredContent
			}
			return &res, nil
		})
	ts := httptest.NewServer(sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return srv },
		&sdk.StreamableHTTPOptions{Stateless: true}))
	t.Cleanup(ts.Close)
	return ts.URL
}

// reference returns the bare SDK server's answer (see sdkReference) to
// what a client of revision v would send it to have it answer as okso
// answered in a, with the same id.
func reference(t *testing.T, url, v string, a mcpAnswer) mcpAnswer {
	t.Helper()
	var msg map[string]json.RawMessage
	if err := json.Unmarshal(a.raw, &msg); err != nil {
		t.Fatalf("answer %s: %v", a.raw, err)
	}
	args := `{"error":` + string(msg["error"]) + `}`
	if msg["result"] != nil {
		var res map[string]json.RawMessage
		if err := json.Unmarshal(msg["result"], &res); err != nil {
			t.Fatalf("result %s: %v", msg["result"], err)
		}
		delete(res, "resultType")
		var meta map[string]json.RawMessage
		if err := json.Unmarshal(res["_meta"], &meta); err == nil {
			delete(meta, "io.modelcontextprotocol/serverInfo")
			res["_meta"], _ = json.Marshal(meta)
		}
		b, _ := json.Marshal(res)
		args = `{"result":` + string(b) + `}`
	}
	hdr, body := revisionCall(v, string(msg["id"]), "ref", args)
	return postMCP(t, url, "", hdr, body)
}

// TestFastPathMatchesSDKEachRevision sends the same calls, on every
// protocol revision the SDK speaks, to a gateway's fast path and to a
// gateway without one (the SDK's path), and compares the answers member
// by member (DESIGN.md §8: what okso writes by hand is what the SDK would
// write): a device tool's result, failures as isError envelopes (from the
// device, from the gateway's checks and from an upstream), an unknown
// tool, bad arguments, an upstream's results, and the relay's answers
// (a relayed call's result or error, and caller_tool_response's own).
func TestFastPathMatchesSDKEachRevision(t *testing.T) {
	f := startAllInOne(t, 0, nil)
	id, _ := f.connectDevice(DefaultTenant, func(id string, o *agent.Options) {
		for i := range o.Capabilities {
			o.Capabilities[i].Constraints.RateLimitRPS = 10000
		}
		echo := agent.Echo(id)
		o.Handlers["echo.invoke"] = func(ctx context.Context, args json.RawMessage) (any, error) {
			if string(args) == `{"message":"fail"}` {
				return nil, schemas.NewError(schemas.CodeInternal, "the device failed")
			}
			return echo(ctx, args)
		}
	})
	remotes, err := bus.OpenRemotes(t.Context(), f.nc, bus.RemotesOptions{})
	if err != nil {
		t.Fatal(err)
	}
	standUpstream(t, f.nc, "up", map[string]func(json.RawMessage) string{
		"echo": upstreamEcho,
		"fails": func(json.RawMessage) string {
			return `{"content":[{"type":"text","text":"the upstream says no"}],"isError":true}`
		},
		// What an HTTP upstream may send, passed on by the remote tier
		// as it came: annotations, _meta and unknown members in content,
		// numbers beyond float64 and written unusually.
		"rich": func(json.RawMessage) string {
			return `{"content":[{"type":"text","text":"a <b> & c","annotations":{"audience":["user"],"priority":0.5},"_meta":{"k":1}},` +
				`{"type":"image","data":"aGk=","mimeType":"image/png"},{"type":"text","text":"x","extra":true}],` +
				`"structuredContent":{"big":12345678901234567890,"one":1.0,"hundred":1e2,"html":"<&>"}}`
		},
	})
	obj := json.RawMessage(`{"type":"object"}`)
	f.putRemote(remotes, &bus.Remote{Upstream: "up", Transport: "stdio", Tenants: []string{DefaultTenant}, TimeoutMs: 2000,
		Tools: []bus.RemoteTool{
			{Name: "echo", InputSchema: json.RawMessage(echoInput), OutputSchema: json.RawMessage(echoOutput), Safety: schemas.SafetyReadOnly},
			{Name: "fails", InputSchema: obj, Safety: schemas.SafetyReadOnly},
			{Name: "rich", InputSchema: obj, Safety: schemas.SafetyReadOnly},
		}}, DefaultTenant, "up.rich", true)
	mutating := []string{auth.ScopeMutating}
	tokA := f.token(auth.MintOptions{Subject: "agent-a", Scopes: mutating})
	tokB := f.token(auth.MintOptions{Subject: "agent-b", Scopes: mutating})
	a := f.listen(f.a.MCPURL(), tokA, twoTools)
	sdkGW := f.secondGateway(gatewayConfig{NoFastPath: true})
	for _, tool := range []string{"up.rich", "a_send"} {
		waitTool(t, sdkGW.gw, DefaultTenant, tool, true)
	}
	ro := f.token(auth.MintOptions{})
	ref := sdkReference(t)

	for _, v := range sdk.SupportedProtocolVersions() {
		t.Run(v, func(t *testing.T) {
			for _, tc := range []struct {
				name, tool, args string
				fast             bool // the fast path answers it
			}{
				{name: "device tool", tool: echoName(id), args: `{"message":"hello <&> \"q\""}`, fast: true},
				{name: "device tool fails", tool: echoName(id), args: `{"message":"fail"}`, fast: true},
				{name: "missing scope", tool: "gpio." + id + ".pin.write", args: `{"level":1}`, fast: true},
				// From 2026-07-28 the SDK answers it with an HTTP status of its own.
				{name: "unknown tool", tool: "sysecho.nope-node.echo.invoke", args: `{}`, fast: v < "2026-07-28"},
				{name: "bad arguments", tool: echoName(id), args: `{"message":"x","extra":1}`, fast: true},
				{name: "upstream tool", tool: "up.echo", args: `{"message":"hi"}`, fast: true},
				{name: "upstream tool fails", tool: "up.fails", args: `{}`, fast: true},
				{name: "upstream rich result", tool: "up.rich", args: `{}`, fast: true},
				{name: "relayed tool bad arguments", tool: "a_send", args: `{}`, fast: true},
			} {
				t.Run(tc.name, func(t *testing.T) {
					tok := ro
					if strings.HasPrefix(tc.tool, "a_") {
						tok = tokB
					}
					hdr, body := revisionCall(v, "7", tc.tool, tc.args)
					fast := postMCP(t, f.a.MCPURL(), tok, hdr, body)
					slow := postMCP(t, sdkGW.url(), tok, hdr, body)
					sameAnswer(t, fast, slow, tc.fast)
					sameAnswer(t, slow, reference(t, ref, v, slow), false)
				})
			}
			// The relay: B calls A's tool, A answers; the call's answer and
			// caller_tool_response's are compared.
			relayed := func(t *testing.T, url, answer string) (call, ack mcpAnswer) {
				t.Helper()
				got := make(chan mcpAnswer, 1)
				failed := make(chan error, 1)
				go func() {
					hdr, body := revisionCall(v, `"relayed"`, "a_send", `{"text":"hi"}`)
					a, err := doMCP(t.Context(), url, tokB, hdr, body)
					if err != nil {
						failed <- err
						return
					}
					got <- a
				}()
				ev := a.next(t)
				for ev.Type != "caller_tool_request" {
					ev = a.next(t) // a caller_ping
				}
				args := `{"listen_id":"` + a.id + `","request_id":"` + ev.RequestID + `",` + answer + `}`
				hdr, body := revisionCall(v, "8", mcp.ToolCallerResponse, args)
				ack = postMCP(t, url, tokA, hdr, body)
				select {
				case call = <-got:
				case err := <-failed:
					t.Fatal(err)
				case <-time.After(10 * time.Second):
					t.Fatal("the relayed call never ended")
				}
				return call, ack
			}
			for _, tc := range []struct{ name, answer string }{
				{"object result", `"result":{"sent":true,"big":12345678901234567890,"one":1.0,"html":"<&>"}`},
				{"string result", `"result":"sent <&>"`},
				{"array result", `"result":[1,2.50,"x"]`},
				{"error", `"error":"it broke <&>"`},
			} {
				t.Run("relayed "+tc.name, func(t *testing.T) {
					fastCall, fastAck := relayed(t, f.a.MCPURL(), tc.answer)
					slowCall, slowAck := relayed(t, sdkGW.url(), tc.answer)
					sameAnswer(t, fastCall, slowCall, true)
					sameAnswer(t, fastAck, slowAck, true)
					sameAnswer(t, slowCall, reference(t, ref, v, slowCall), false)
					sameAnswer(t, slowAck, reference(t, ref, v, slowAck), false)
				})
			}
			// A cancellation the gateway relays itself, answered as the
			// SDK answers it, or left to the SDK.
			t.Run("cancel notification", func(t *testing.T) {
				body := `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"gone","reason":"test"}}`
				for _, method := range []string{"notifications/cancelled", "", "tools/call"} {
					hdr := map[string]string{"Mcp-Protocol-Version": v, "Mcp-Method": method}
					got := postMCP(t, f.a.MCPURL(), ro, hdr, body)
					want := postMCP(t, ref, "", hdr, body)
					if got.status != want.status || got.text != want.text || !bytes.Equal(got.raw, want.raw) {
						t.Errorf("Mcp-Method %q: %d %q %s, want the SDK's %d %q %s", method, got.status, got.text, got.raw, want.status, want.text, want.raw)
					}
				}
			})
			t.Run("response to no waiting request", func(t *testing.T) {
				hdr, body := revisionCall(v, "9", mcp.ToolCallerResponse, `{"listen_id":"`+a.id+`","request_id":"nope","result":{}}`)
				fast := postMCP(t, f.a.MCPURL(), tokA, hdr, body)
				slow := postMCP(t, sdkGW.url(), tokA, hdr, body)
				sameAnswer(t, fast, slow, true)
				sameAnswer(t, slow, reference(t, ref, v, slow), false)
			})
		})
	}
}
