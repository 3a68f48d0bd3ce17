package mcp

import (
	"bytes"
	"encoding/json"
	"net/http"
	"reflect"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/internal/jsonscan/jsonscantest"
	"github.com/okso-io/okso/schemas"
)

const benchCall = `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"sysecho.01m80hetn3a3x84z368v26yy0p.echo.invoke",` +
	`"arguments":{"message":"bench"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",` +
	`"io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"okso-bench","version":"1"}}}}`

// TestParseFastRequest: the canonical request is taken apart; a request
// the fast path must leave to the SDK is not.
func TestParseFastRequest(t *testing.T) {
	req, ok := parseFastRequest([]byte(benchCall), nil)
	if !ok || string(req.ID) != "7" || req.Params.Name != "sysecho.01m80hetn3a3x84z368v26yy0p.echo.invoke" ||
		string(req.Params.Arguments) != `{"message":"bench"}` || len(req.Params.Meta) != 3 {
		t.Fatalf("parsed %+v, %v", req, ok)
	}
	h := http.Header{}
	h.Set("Mcp-Protocol-Version", "2026-07-28")
	h.Set("Mcp-Method", "tools/call")
	h.Set("Mcp-Name", req.Params.Name)
	if !versionFits(h, req, nil) {
		t.Error("a well-formed 2026-07-28 request does not fit")
	}
	h.Set("Mcp-Name", "other")
	if versionFits(h, req, nil) {
		t.Error("a request whose Mcp-Name differs fits")
	}
	for _, body := range []string{
		`{"jsonrpc":"2.0","id":7,"method":"tools/list"}`,
		`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"x","name":"y"}}`,
		`{"jsonrpc":"2.0","id":true,"method":"tools/call","params":{"name":"x"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"},"extra":1}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":"no"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":{}}}`,
	} {
		if _, ok := parseFastRequest([]byte(body), nil); ok {
			t.Errorf("took %s", body)
		}
	}
}

// BenchmarkFastPath is the gateway's own work on one unary call outside
// the checks and NATS: reading the request and writing the response.
func BenchmarkFastPath(b *testing.B) {
	w := resultWriter(`{"name":"okso","title":"okso fleet gateway","version":"dev"}`)
	h := http.Header{}
	h.Set("Mcp-Protocol-Version", "2026-07-28")
	h.Set("Mcp-Method", "tools/call")
	h.Set("Mcp-Name", "sysecho.01m80hetn3a3x84z368v26yy0p.echo.invoke")
	result := json.RawMessage(`{"message":"bench","received_at_ms":1795316088218,"node_id":"01m80hetn3a3x84z368v26yy0p"}`)
	body := []byte(benchCall)
	var buf bytes.Buffer
	b.ReportAllocs()
	var memo metaMemo
	for b.Loop() {
		req, ok := parseFastRequest(body, &memo)
		if !ok || !versionFits(h, req, &memo) {
			b.Fatal("not taken")
		}
		buf.Reset()
		buf.WriteString(`{"jsonrpc":"2.0","id":`)
		buf.Write(req.ID)
		w.writeToolResult(&buf, "01M80HFSRTP6P5RGFY7RW4197Q", true, result, false)
	}
}

// FuzzParseCanonicalRequest: whatever the one-pass reader takes,
// encoding/json decodes strictly to the same request (jsonscantest, the
// oracle of every one-pass reader), and the strict path takes it too and
// decodes it alike.
func FuzzParseCanonicalRequest(f *testing.F) {
	for _, s := range []string{
		benchCall,
		`{"jsonrpc":"2.0","id":"a<b","method":"tools/call","params":{"name":"x","arguments":null}}`,
		`{"jsonrpc":"2.0","id":-0,"method":"tools/call","params":{"name":"x"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":{"a":1,"a":2}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","_meta":{"k":1e400}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","_meta":{"k":null,"k":{}}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","_meta":{}}}`,
		` { "jsonrpc" : "2.0" , "id" : 1 , "method" : "tools/call" , "params" : { "name" : "x" } } `,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}{}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x\u0041"}}`,
		`{"jsonrpc":"2.0","id":12345678901,"method":"tools/call","params":{"name":"x"}}`,
	} {
		f.Add([]byte(s))
	}
	// A memo shared by every input, as the gateway's is: what it
	// remembers must not change what the reader takes.
	var memo metaMemo
	f.Fuzz(func(t *testing.T, body []byte) {
		got, ok := parseCanonicalRequest(body, nil)
		remembered, rok := parseCanonicalRequest(body, &memo)
		again, aok := parseCanonicalRequest(body, &memo)
		if rok != ok || aok != ok || !reflect.DeepEqual(remembered, got) || !reflect.DeepEqual(again, got) {
			t.Fatalf("%q: taken %v without a memo, %v and %v with one", body, ok, rok, aok)
		}
		if !ok {
			return
		}
		// The oracle of every one-pass reader: encoding/json, strictly.
		type params struct {
			Name      string                     `json:"name"`
			Arguments json.RawMessage            `json:"arguments"`
			Meta      map[string]json.RawMessage `json:"_meta"`
		}
		type request struct {
			JSONRPC string `json:"jsonrpc"`
			ID      any    `json:"id"`
			Method  string `json:"method"`
			Params  params `json:"params"`
		}
		var id any
		if err := json.Unmarshal(got.ID, &id); err != nil {
			t.Fatalf("%q: id %s, which does not decode: %v", body, got.ID, err)
		}
		jsonscantest.Agrees(t, body, request{"2.0", id, "tools/call", params(got.Params)})
		want, wantOK := parseStrictRequest(body)
		if !wantOK {
			t.Fatalf("%q: taken in one pass, refused by the strict path", body)
		}
		if got.Params.Meta == nil && want.Params.Meta != nil || got.Params.Meta != nil && want.Params.Meta == nil {
			t.Fatalf("%q: _meta %v, strict %v", body, got.Params.Meta, want.Params.Meta)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q:\none pass %+v\nstrict   %+v", body, got, want)
		}
	})
}

// TestParseCanonicalCovers: the requests okso bench and the SDK's client
// send take the one-pass reader.
func TestParseCanonicalCovers(t *testing.T) {
	for _, body := range []string{
		benchCall,
		`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"sysecho.n.echo.invoke","arguments":{"message":"ping"}}}`,
	} {
		if _, ok := parseCanonicalRequest([]byte(body), nil); !ok {
			t.Errorf("%s not read in one pass", body)
		}
	}
}

// FuzzResultNodeID: the node_id of a result that decodes strictly is read
// as json.Unmarshal reads it.
func FuzzResultNodeID(f *testing.F) {
	for _, s := range []string{
		`{"message":"ping","received_at_ms":1795316088218,"node_id":"01m80hetn3a3x84z368v26yy0p"}`,
		`{"NODE_ID":"a","node_id":"b"}`, `{"node_id":"b","Node_Id":"a"}`, `{"node_id":null}`,
		`{"node_id":"a\u0062"}`, `{"node_\u0069d":"a"}`, `{}`, `[]`, `{"x":{"node_id":"a"}}`, `{"node_id":1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		if _, err := schemas.Decode(doc); err != nil {
			return
		}
		var who struct {
			NodeID string `json:"node_id"`
		}
		wantErr := json.Unmarshal(doc, &who)
		id, ok := resultNodeID(doc)
		if ok != (wantErr == nil) || ok && id != who.NodeID {
			t.Fatalf("%s: %q, %v; json.Unmarshal %q, %v", doc, id, ok, who.NodeID, wantErr)
		}
	})
}

// sdkCall is a relayed call as the Go SDK's client sends it (2026-07-28):
// _meta first, with the client's capabilities and info.
const sdkCall = `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"_meta":{` +
	`"io.modelcontextprotocol/clientCapabilities":{"roots":{"listChanged":true}},` +
	`"io.modelcontextprotocol/clientInfo":{"name":"relaybench-caller","version":"1"},` +
	`"io.modelcontextprotocol/protocolVersion":"2026-07-28"},"name":"bench_echo","arguments":{"message":"1"}}}`

// BenchmarkFastParseSDK is the fast path's reading of a request as the Go
// SDK's client sends it: the parse and the protocol checks.
func BenchmarkFastParseSDK(b *testing.B) {
	h := http.Header{}
	h.Set("Mcp-Protocol-Version", "2026-07-28")
	h.Set("Mcp-Method", "tools/call")
	h.Set("Mcp-Name", "bench_echo")
	body := []byte(sdkCall)
	var memo metaMemo
	b.ReportAllocs()
	for b.Loop() {
		req, ok := parseFastRequest(body, &memo)
		if !ok || !versionFits(h, req, &memo) {
			b.Fatal("not taken")
		}
	}
}

// FuzzVersionFitsMemo: the client metadata a memo remembers fits as it
// does when decoded every time.
func FuzzVersionFitsMemo(f *testing.F) {
	for _, s := range [][2]string{
		{`{"roots":{"listChanged":true}}`, `{"name":"relaybench-caller","version":"1"}`},
		{`{}`, ``}, {`null`, `{"name":"a","version":"1"}`}, {`{"roots":1}`, `{}`}, {`{}`, `null`},
		{`{"sampling":{}}`, `{"name":1}`}, {`[]`, `{"name":"a"}`},
	} {
		f.Add(s[0], s[1])
	}
	var memo metaMemo
	h := http.Header{}
	h.Set("Mcp-Protocol-Version", "2026-07-28")
	h.Set("Mcp-Method", "tools/call")
	h.Set("Mcp-Name", "x")
	f.Fuzz(func(t *testing.T, caps, info string) {
		req := &fastRequest{}
		req.Params.Name = "x"
		req.Params.Meta = map[string]json.RawMessage{metaProtocolVersion: json.RawMessage(`"2026-07-28"`)}
		if caps != "" {
			req.Params.Meta[metaClientCapabilities] = json.RawMessage(caps)
		}
		if info != "" {
			req.Params.Meta[metaClientInfo] = json.RawMessage(info)
		}
		want := versionFits(h, req, nil)
		if got, again := versionFits(h, req, &memo), versionFits(h, req, &memo); got != want || again != want {
			t.Fatalf("caps %q, info %q: fits %v without a memo, %v and %v with one", caps, info, want, got, again)
		}
	})
}

// TestCompleted: a tools/call result of the SDK's path keeps every field
// okso set, content is never null, and resultType "complete" is written
// from protocol 2026-07-28 on, and never before.
func TestCompleted(t *testing.T) {
	// completed copies these fields: a field the SDK adds must be copied too.
	copied := []string{"Meta", "Content", "StructuredContent", "IsError", "InputRequests", "RequestState"}
	var exported []string
	for f := range reflect.TypeFor[sdk.CallToolResult]().Fields() {
		if f.IsExported() {
			exported = append(exported, f.Name)
		}
	}
	if !reflect.DeepEqual(exported, copied) {
		t.Fatalf("the SDK's CallToolResult has the fields %v; completed copies %v", exported, copied)
	}
	set, err := schemas.Load() // the gateway's own tools (fleet.nodes…) carry embedded schemas
	if err != nil {
		t.Fatal(err)
	}
	g, err := New(Options{NC: &nats.Conn{}, Registry: &bus.Registry{}, Schemas: set, Verifier: &auth.Verifier{}})
	if err != nil {
		t.Fatal(err)
	}
	full := func() *sdk.CallToolResult {
		return &sdk.CallToolResult{
			Meta:              sdk.Meta{MetaRequestID: "r"},
			Content:           []sdk.Content{&sdk.TextContent{Text: "t"}},
			StructuredContent: json.RawMessage(`{"a":1}`),
			IsError:           true,
			InputRequests:     sdk.InputRequestMap{"q": &sdk.ElicitParams{Message: "m"}},
			RequestState:      "s",
		}
	}
	for _, v := range sdk.SupportedProtocolVersions() {
		for _, res := range []*sdk.CallToolResult{full(), {}} {
			want, err := json.Marshal(res)
			if err != nil {
				t.Fatal(err)
			}
			if res.Content == nil {
				want = bytes.Replace(want, []byte(`"content":null`), []byte(`"content":[]`), 1)
			}
			if v >= sessionless {
				want = append(want[:len(want)-1], `,"resultType":"complete"}`...)
			}
			got, err := json.Marshal(g.completed(v, res))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(decodeNumbers(t, got), decodeNumbers(t, want)) {
				t.Errorf("%s: completed writes\n %s\nwant\n %s", v, got, want)
			}
		}
	}
}

// FuzzToolResult: what checkToolResult takes of an upstream's or a
// relayed result is what the SDK's path writes of it (decoded by the
// SDK, structuredContent as it came), member by member, numbers as
// written, and what it refuses the SDK cannot read or the gateway does
// not take.
func FuzzToolResult(f *testing.F) {
	for _, s := range []string{
		`{"content":[{"type":"text","text":"a <b>"}],"structuredContent":{"big":12345678901234567890,"one":1.0}}`,
		`{"content":[],"isError":true}`,
		`{"content":[{"type":"text","text":"x","extra":true}]}`,
		`{"content":[{"type":"text","text":"x","annotations":{"priority":0.5},"_meta":{"k":1.0}}]}`,
		`{"content":[{"type":"image","data":"aGk=","mimeType":"image/png"}]}`,
		`{"content":[{"type":"image","data":"aGk","mimeType":"image/png"}]}`,
		`{"content":[{"type":"text","text":5}]}`,
		`{"content":[{"type":"text","Text":"x"}]}`,
		`{"content":[{"type":"text","t\u0065xt":"x"}]}`,
		`{"content":[{"type":"resource_link","uri":"file:///a","name":"a"}],"isError":false}`,
		`{"content":[],"structuredContent":null}`,
		`{"structuredContent":{"a":1}}`,
		`{"content":[],"resultType":"complete"}`,
		`{"content":[],"StructuredContent":{}}`,
		`{"content":[],"_meta":{}}`,
		`[]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, result []byte) {
		got, err := checkToolResult(result, nil)
		var res sdk.CallToolResult
		sdkErr := json.Unmarshal(result, &res)
		if err != nil {
			return
		}
		if sdkErr != nil {
			t.Fatalf("%s: taken as %s, which the SDK cannot read: %v", result, got, sdkErr)
		}
		var raw struct {
			StructuredContent json.RawMessage `json:"structuredContent"`
		}
		if json.Unmarshal(result, &raw) == nil && len(raw.StructuredContent) > 0 && string(raw.StructuredContent) != "null" {
			res.StructuredContent = raw.StructuredContent
		}
		if res.Content == nil {
			res.Content = []sdk.Content{}
		}
		want, err := json.Marshal(&res)
		if err != nil {
			t.Fatalf("%s: the SDK cannot write it: %v", result, err)
		}
		if g, w := decodeNumbers(t, got), decodeNumbers(t, want); !reflect.DeepEqual(g, w) {
			t.Fatalf("%s:\n taken as %s\n the SDK writes %s", result, got, want)
		}
	})
}

// decodeNumbers decodes a JSON document, numbers as written.
func decodeNumbers(t *testing.T, doc []byte) any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(doc))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("%s: %v", doc, err)
	}
	return v
}

// FuzzParseListRequest: a tools/list the fast path takes is one
// encoding/json reads the same: the method, the id as the SDK writes it
// back, the cursor.
func FuzzParseListRequest(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`,
		`{"jsonrpc":"2.0","id":"a\u0041","method":"tools/list","params":{"cursor":"c3lz","_meta":{"progressToken":1}}}`,
		`{"jsonrpc":"2.0","id":-0,"method":"tools/list","params":{}}`,
		`{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/list"}`,
		`{"jsonrpc":"2.0","id":1.5,"method":"tools/list","params":null}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"cursor":5}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, ok := parseListRequest(body)
		if !ok {
			return
		}
		var std struct {
			JSONRPC string          `json:"jsonrpc"`
			ID      json.RawMessage `json:"id"`
			Method  string          `json:"method"`
			Params  struct {
				Cursor string `json:"cursor"`
			} `json:"params"`
		}
		if err := json.Unmarshal(body, &std); err != nil {
			t.Fatalf("taken, but encoding/json refuses it: %v", err)
		}
		var id, back any
		if json.Unmarshal(std.ID, &id) != nil || json.Unmarshal(req.id, &back) != nil || !reflect.DeepEqual(id, back) {
			t.Errorf("id %s written back as %s", std.ID, req.id)
		}
		if std.JSONRPC != "2.0" || std.Method != "tools/list" || std.Params.Cursor != req.cursor {
			t.Errorf("taken as cursor %q; encoding/json reads %+v", req.cursor, std)
		}
	})
}
