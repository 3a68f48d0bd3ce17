package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	sdkauth "github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/internal/jsonscan"
	"github.com/okso-io/okso/schemas"
)

// The fast path answers the hot request of a stateless gateway, a unary
// tools/call, without the SDK's per-request session: the SDK builds a
// whole server session for each stateless POST and decodes the body twice
// with a fresh 32 KiB buffer each time, which costs more than the device
// hop itself. The fast path runs exactly the same checks ([callCtx.check],
// [callCtx.unary]) and answers with the same JSON-RPC response as the SDK
// would, as application/json (which every Streamable HTTP client must
// accept). Anything it does not recognise as that canonical request,
// streaming tools included, goes to the SDK unchanged.

// sessionless is the first protocol version whose requests carry their
// client's metadata in _meta and name their method in headers (SEP-2575).
const sessionless = "2026-07-28"

// fastVersions are the protocol versions the fast path serves: every one
// the SDK speaks.
var fastVersions = func() map[string]bool {
	m := map[string]bool{}
	for _, v := range sdk.SupportedProtocolVersions() {
		m[v] = true
	}
	return m
}()

// fastRequest is a tools/call JSON-RPC request in its canonical form.
type fastRequest struct {
	ID     json.RawMessage `json:"id"`
	Params struct {
		Name      string                     `json:"name"`
		Arguments json.RawMessage            `json:"arguments"`
		Meta      map[string]json.RawMessage `json:"_meta"`
	} `json:"params"`
	// args are the arguments as the parse decoded them (schemas.Decode),
	// for their check; nil when null or absent.
	args any
}

// Keys of a sessionless request's _meta.
const (
	metaProtocolVersion    = "io.modelcontextprotocol/protocolVersion"
	metaClientInfo         = "io.modelcontextprotocol/clientInfo"
	metaClientCapabilities = "io.modelcontextprotocol/clientCapabilities"
)

// versionFits reports whether the request's protocol version, as its
// header and its _meta say, is one the fast path answers exactly as the
// SDK would: before 2026-07-28, no per-request version in _meta; from
// 2026-07-28, the version in both, the method and tool name headers, and
// client metadata of the shapes the SDK decodes. Anything else is the
// SDK's to answer (or refuse). The decodes of the client metadata go
// through memo (nil: none).
func versionFits(h http.Header, req *fastRequest, memo *metaMemo) bool {
	return metaFits(h, "tools/call", req.Params.Name, req.Params.Meta, memo)
}

// metaFits is versionFits for a request of method, of the name given
// (none for a method without one: the Mcp-Name header must be absent),
// whose _meta is meta.
func metaFits(h http.Header, method, name string, meta map[string]json.RawMessage, memo *metaMemo) bool {
	header := h.Get("Mcp-Protocol-Version")
	raw, inMeta := meta[metaProtocolVersion]
	if header < sessionless {
		return !inMeta
	}
	v, plain := jsonscan.String(raw) // a plain string decodes to its bytes
	_, named := h[http.CanonicalHeaderKey("Mcp-Name")]
	if !plain && json.Unmarshal(raw, &v) != nil || v != header ||
		h.Get("Mcp-Method") != method || h.Get("Mcp-Name") != name || name == "" && named {
		return false
	}
	if c, ok := meta[metaClientCapabilities]; !ok || !memo.passes(memoCaps, c, capsDecode) {
		return false
	}
	if ci, ok := meta[metaClientInfo]; ok && !memo.passes(memoInfo, ci, infoDecode) {
		return false
	}
	return true
}

// capsDecode reports whether a _meta's client capabilities decode as the
// SDK decodes them.
func capsDecode(c []byte) bool {
	var caps struct {
		sdk.ClientCapabilities
		//lint:ignore SA1019 the SDK still decodes roots (deprecated in 2026-07-28): so must the fast path
		Roots *sdk.RootCapabilities `json:"roots,omitempty"`
	}
	return json.Unmarshal(c, &caps) == nil && string(c) != "null"
}

// infoDecode reports whether a _meta's client info decodes as the SDK
// decodes it.
func infoDecode(ci []byte) bool {
	var info sdk.Implementation
	return json.Unmarshal(ci, &info) == nil && string(ci) != "null"
}

// metaValueDecodes reports whether a _meta value decodes as the strict
// path decodes it (not null), and as the SDK does, into Go values: what
// it cannot (a number beyond float64, say) it refuses.
func metaValueDecodes(v []byte) bool {
	if decodeStrict(v) == nil {
		return false
	}
	var x any
	return json.Unmarshal(v, &x) == nil
}

// metaMemo remembers the _meta values the fast path found to decode. A
// client sends the same _meta (its protocol version, capabilities and
// info) with every request, and decoding those values as the strict path
// and the SDK do costs more than the rest of the request. Each verdict is
// a function of the value's bytes alone, so a remembered pass stands for
// decoding them again. Only passes of values up to maxMemoValue bytes are
// remembered, at most maxMemo of each kind: when full, a kind starts
// again empty. The zero value is empty; a nil *metaMemo remembers
// nothing. It is safe for concurrent use.
type metaMemo struct {
	mu     sync.Mutex
	passed [memoKinds]map[string]struct{}
}

// memoKind names the decode a value passed.
type memoKind uint8

const (
	memoValue memoKind = iota // metaValueDecodes
	memoCaps                  // capsDecode
	memoInfo                  // infoDecode
	memoKinds
)

// Bounds of a metaMemo.
const (
	maxMemo      = 256
	maxMemoValue = 1 << 10
)

// passes reports whether raw passes decode, which is the decode of kind:
// from memory, or by running it.
func (m *metaMemo) passes(kind memoKind, raw []byte, decode func([]byte) bool) bool {
	if m == nil || len(raw) > maxMemoValue {
		return decode(raw)
	}
	m.mu.Lock()
	_, ok := m.passed[kind][string(raw)]
	m.mu.Unlock()
	if ok {
		return true
	}
	if !decode(raw) {
		return false
	}
	m.mu.Lock()
	if len(m.passed[kind]) >= maxMemo || m.passed[kind] == nil {
		m.passed[kind] = make(map[string]struct{})
	}
	m.passed[kind][string(raw)] = struct{}{}
	m.mu.Unlock()
	return true
}

var fastBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// fastCall serves the requests the fast path recognises and hands every
// other to next (the SDK), with its body intact. A stateless gateway
// reads every POST here: a notifications/cancelled is relayed to the
// replica serving the request it names (see cancel.go), and a request
// goes on with its JSON-RPC id in its context, so that a handler can be
// cancelled that way. Every gateway refuses a JSON-RPC batch (protocol
// 2025-03-26 and before) of more than maxBatch messages.
func (g *Gateway) fastCall(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			next.ServeHTTP(w, r)
			return
		}
		body, err := readBody(w, r, maxMCPBody)
		if err != nil {
			// The SDK's answers for a body it cannot read.
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				http.Error(w, fmt.Sprintf("request body exceeds %d bytes", mbe.Limit), http.StatusRequestEntityTooLarge)
				return
			}
			http.Error(w, "failed to read body: "+err.Error(), http.StatusBadRequest)
			return
		}
		if n, ok := batchLen(body); ok && n > maxBatch && batches(r.Header.Get("Mcp-Protocol-Version")) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":null,"error":{"code":%d,"message":"a batch of %d messages: at most %d"}}`,
				jsonrpc.CodeInvalidRequest, n, maxBatch)
			return
		}
		if g.o.Stateful {
			r.Body = io.NopCloser(bytes.NewReader(body))
			next.ServeHTTP(w, r)
			return
		}
		sound := acceptable(r)
		if id, ok := cancelledID(body); ok && sound && methodFits(r.Header, "notifications/cancelled") {
			g.cancels.relay(w, r, id)
			return
		}
		var req *fastRequest
		ok := false
		if sound && !g.o.NoFastPath {
			req, ok = parseFastRequest(body, &g.fastMeta)
			if ok && !versionFits(r.Header, req, &g.fastMeta) {
				ok = false
			}
			if ok && g.serveFast(w, r, req) {
				return
			}
			if !ok && g.serveFastList(w, r, body) {
				return
			}
		}
		var id []byte
		if ok {
			id = req.ID
		} else {
			id, ok = callID(body)
		}
		if ok {
			r = r.WithContext(context.WithValue(r.Context(), rpcIDKey{}, id))
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r)
	})
}

// methodFits reports whether a request's Mcp-Method header is as the SDK
// requires it of a message of method: from protocol 2026-07-28 on, there
// and equal to it (the SDK answers any other with an error of its own).
func methodFits(h http.Header, method string) bool {
	return h.Get("Mcp-Protocol-Version") < sessionless || h.Get("Mcp-Method") == method
}

// maxBatch bounds the messages of one JSON-RPC batch (protocol
// 2025-03-26 has them): each call of a batch runs, so an unbounded one
// would let one HTTP request run thousands.
const maxBatch = 16

// batches reports whether the SDK takes a JSON-RPC batch of protocol
// version v (a request's header; none: 2025-03-26). It answers a batch
// of a later version, or of a version it does not speak, with an error
// of its own, which the gateway leaves it to write.
func batches(v string) bool {
	return v == "" || v < "2025-06-18" && fastVersions[v]
}

// batchLen returns the number of messages of a JSON-RPC batch; ok is
// false for a body that is no batch (a single message, or not JSON).
func batchLen(body []byte) (int, bool) {
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '[' {
		return 0, false
	}
	var msgs []json.RawMessage
	if json.Unmarshal(trimmed, &msgs) != nil {
		return 0, false
	}
	return len(msgs), true
}

// bodyReadTimeout bounds the time a client takes to send a request's
// body, once its headers are in (http.Server's ReadHeaderTimeout bounds
// those).
const bodyReadTimeout = 10 * time.Second

// readBody reads a request's body, at most limit bytes, within
// bodyReadTimeout. The connection's read deadline is lifted again after:
// a response may stream for long, and net/http's watch for a client that
// hangs up reads under the same deadline.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(bodyReadTimeout))
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	_ = rc.SetReadDeadline(time.Time{})
	return body, err
}

// acceptable checks what the SDK checks before it reads a stateless
// POST; a request failing any check goes to the SDK for its exact answer.
func acceptable(r *http.Request) bool {
	if r.Header.Get("Last-Event-ID") != "" { // the SDK refuses it on a POST
		return false
	}
	if v := r.Header.Get("Mcp-Protocol-Version"); v != "" && !fastVersions[v] {
		return false
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/json" { // the usual form, parsed below otherwise
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			return false
		}
	}
	jsonOK, streamOK := streamableAccepts(r.Header.Values("Accept"))
	if !jsonOK || !streamOK {
		return false
	}
	// The SDK's DNS-rebinding guard: a loopback listener answers only
	// loopback host names.
	if la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok && la != nil {
		local := false
		if ta, ok := la.(*net.TCPAddr); ok {
			local = ta.IP.IsLoopback()
		} else {
			local = isLoopback(la.String())
		}
		if local && !isLoopback(r.Host) {
			return false
		}
	}
	return true
}

// parseFastRequest accepts exactly {"jsonrpc":"2.0","id":ID,"method":
// "tools/call","params":{"name":NAME,"arguments":{...},"_meta":{...}}}
// with a string or integer id, no duplicate or unknown keys at either
// level, and nothing after it. The decodes of _meta values go through
// memo (nil: none).
func parseFastRequest(body []byte, memo *metaMemo) (*fastRequest, bool) {
	if jsonscan.Depth(body) > maxFastDepth {
		return nil, false
	}
	if req, ok := parseCanonicalRequest(body, memo); ok {
		return req, true
	}
	return parseStrictRequest(body)
}

// parseStrictRequest is parseFastRequest for any request, canonical or
// not: a strict decode, then the struct.
func parseStrictRequest(body []byte) (*fastRequest, bool) {
	doc, err := schemas.Decode(body) // refuses duplicate keys and trailing data
	top, ok := doc.(map[string]any)
	if err != nil || !ok || len(top) != 4 || top["jsonrpc"] != "2.0" || top["method"] != "tools/call" {
		return nil, false
	}
	id, ok := canonicalID(top["id"]) // as the SDK writes it back
	if !ok {
		return nil, false
	}
	params, ok := top["params"].(map[string]any)
	if !ok {
		return nil, false
	}
	for k, v := range params {
		switch k {
		case "name":
			if _, ok := v.(string); !ok {
				return nil, false
			}
		case "arguments":
			if _, ok := v.(map[string]any); !ok && v != nil {
				return nil, false
			}
		case "_meta":
			if _, ok := v.(map[string]any); !ok {
				return nil, false
			}
		default:
			return nil, false
		}
	}
	if _, ok := params["name"]; !ok {
		return nil, false
	}
	req := new(fastRequest)
	// Every key is known and exact, so the case-insensitive struct
	// decoder cannot pick a different member.
	if json.Unmarshal(body, req) != nil {
		return nil, false
	}
	req.ID = id
	if args, ok := params["arguments"].(map[string]any); ok {
		req.args = args
	}
	// The SDK decodes _meta into Go values: what it cannot (a number
	// beyond float64, say) it refuses, so the fast path leaves it to it.
	for _, raw := range req.Params.Meta {
		var v any
		if json.Unmarshal(raw, &v) != nil {
			return nil, false
		}
	}
	return req, true
}

// parseCanonicalRequest reads, in one pass, a request in the form the
// clients send (exact keys, each once, a plain tool name, a plain or
// small integer id) and decodes it as parseFastRequest's strict path
// would; anything else it leaves to that path. Arguments and _meta values
// are still decoded strictly (a _meta value through memo, nil: none), so
// a duplicate key or a number beyond float64 in them is refused as
// before. Arguments share body's memory.
func parseCanonicalRequest(body []byte, memo *metaMemo) (*fastRequest, bool) {
	req := new(fastRequest)
	var params []byte
	seen, ok := jsonscan.Fields(body, []string{"jsonrpc", "id", "method", "params"}, func(i int, v []byte) (ok bool) {
		switch i {
		case 0:
			ok = string(v) == `"2.0"`
		case 1:
			if s, isString := jsonscan.String(v); isString {
				req.ID, _ = json.Marshal(s)
				ok = true
			} else if n, isInt := jsonscan.Int(v); isInt {
				req.ID, ok = strconv.AppendInt(nil, int64(n), 10), true
			}
		case 2:
			ok = string(v) == `"tools/call"`
		case 3:
			params, ok = v, true
		}
		return ok
	})
	if !ok || seen != 0b1111 {
		return nil, false
	}
	seen, ok = jsonscan.Fields(params, []string{"name", "arguments", "_meta"}, func(i int, v []byte) (ok bool) {
		switch i {
		case 0:
			req.Params.Name, ok = jsonscan.String(v)
		case 1:
			req.Params.Arguments = v
			if string(v) == "null" {
				return true
			}
			req.args, ok = decodeStrict(v).(map[string]any)
		case 2:
			req.Params.Meta = map[string]json.RawMessage{}
			ok = jsonscan.Members(v, func(mk, mv []byte) bool {
				if _, dup := req.Params.Meta[string(mk)]; dup || !memo.passes(memoValue, mv, metaValueDecodes) {
					return false
				}
				req.Params.Meta[string(mk)] = mv
				return true
			})
		}
		return ok
	})
	return req, ok && seen&1 != 0 // a name
}

// decodeStrict decodes a JSON value as the strict path does, nil when it
// refuses it (or when it is null).
func decodeStrict(v []byte) any {
	doc, err := schemas.Decode(v)
	if err != nil {
		return nil
	}
	return doc
}

// maxFastDepth bounds the nesting of a request the fast path takes, well
// under the SDK's own limit (1000), beyond which the SDK refuses it.
const maxFastDepth = 64

// serveFast runs one unary call; it reports false, having written
// nothing, when the tool streams (the SDK serves those).
func (g *Gateway) serveFast(w http.ResponseWriter, r *http.Request, req *fastRequest) bool {
	claims := claimsOf(sdkauth.TokenInfoFromContext(r.Context()))
	sessionless := r.Header.Get("Mcp-Protocol-Version") >= sessionless
	var metaTP string
	if raw, ok := req.Params.Meta[schemas.MetaTraceparent]; ok {
		metaTP, _ = jsonscan.String(raw)
	}
	c := g.newCall(claims, req.Params.Name, r.Header, metaTP)
	c.rpcID = req.ID
	switch {
	case c.entry != nil && (c.entry.stream != nil || c.entry.session != nil || c.entry.reports):
		return false
	case c.entry == nil && c.elsewhere == "" && sessionless:
		return false // the SDK answers an unknown tool with an HTTP status of its own
	}
	buf := fastBufs.Get().(*bytes.Buffer)
	defer func() {
		if buf.Cap() <= 64<<10 {
			buf.Reset()
			fastBufs.Put(buf)
		}
	}()
	buf.Reset()
	buf.WriteString(`{"jsonrpc":"2.0","id":`)
	buf.Write(req.ID)
	args, e := c.check(req.Params.Arguments, req.args)
	switch {
	case e != nil && e.Code == schemas.CodeToolNotFound:
		buf.WriteString(`,"error":{"code":`)
		fmt.Fprint(buf, jsonrpc.CodeInvalidParams)
		buf.WriteString(`,"message":"unknown tool","data":`)
		buf.Write(e.JSON())
		buf.WriteString("}}")
	case e != nil:
		g.results.writeToolResult(buf, c.requestID, sessionless, e.JSON(), true)
	default:
		result, e := c.unary(r.Context(), args)
		switch {
		case e != nil:
			g.results.writeToolResult(buf, c.requestID, sessionless, e.JSON(), true)
		case c.entry.shape == shapeToolResult:
			g.results.writeUpstreamResult(buf, c.requestID, sessionless, result)
		default:
			g.results.writeToolResult(buf, c.requestID, sessionless, result, false)
		}
	}
	// As h.Set would, with the two values in one array.
	h, values := w.Header(), []string{"no-cache, no-transform", "application/json"}
	h["Cache-Control"], h["Content-Type"] = values[:1:1], values[1:]
	_, _ = w.Write(buf.Bytes())
	return true
}

// resultWriter writes the fast path's results as the SDK would: it is
// the gateway's sdk.Implementation as JSON (the server info of a
// sessionless request's _meta).
type resultWriter []byte

// writeToolResult appends `,"result":{...}}` as the SDK encodes a
// CallToolResult (with the server's info in _meta and resultType for a
// sessionless request): for a result, doc as its text content and
// structured content; for a failure (isError), the envelope doc as its
// text content and in _meta, and no structured content (see
// errorResult).
func (w resultWriter) writeToolResult(buf *bytes.Buffer, requestID string, sessionless bool, doc []byte, isError bool) {
	w.writeResultMeta(buf, sessionless)
	if isError {
		buf.WriteString(`"` + MetaError + `":`)
		buf.Write(doc) // okso wrote it, compact
		buf.WriteByte(',')
	}
	buf.WriteString(`"` + MetaRequestID + `":`)
	writeJSONString(buf, requestID)
	buf.WriteString(`},"content":[{"type":"text","text":`)
	writeJSONString(buf, doc)
	buf.WriteString(`}]`)
	if isError {
		buf.WriteString(`,"isError":true`)
		endResult(buf, sessionless)
		return
	}
	buf.WriteString(`,"structuredContent":`)
	if jsonscan.Compact(doc) { // doc is valid: it passed its schema
		buf.Write(doc)
	} else if json.Compact(buf, doc) != nil {
		buf.WriteString("null")
	}
	endResult(buf, sessionless)
}

// endResult appends the end of a result and of its response, with, for
// a sessionless request, resultType "complete": protocol 2026-07-28
// requires it of every result, and the SDK writes it after the other
// members of a tools/call result (see [Gateway.completed]).
func endResult(buf *bytes.Buffer, sessionless bool) {
	if sessionless {
		buf.WriteString(`,"resultType":"complete"}}`)
		return
	}
	buf.WriteString("}}")
}

// writeResultMeta appends `,"result":{"_meta":{` and, for a sessionless
// request, the server's info.
func (w resultWriter) writeResultMeta(buf *bytes.Buffer, sessionless bool) {
	buf.WriteString(`,"result":{"_meta":{`)
	if sessionless {
		buf.WriteString(`"io.modelcontextprotocol/serverInfo":`)
		buf.Write(w)
		buf.WriteByte(',')
	}
}

// writeUpstreamResult appends `,"result":{...}}` for an upstream's
// CallToolResult, which checkResult found to be one JSON object of the
// members the remote tier passes on (neither _meta nor resultType): the
// gateway's _meta, then the upstream's members as they are.
func (w resultWriter) writeUpstreamResult(buf *bytes.Buffer, requestID string, sessionless bool, result []byte) {
	w.writeResultMeta(buf, sessionless)
	buf.WriteString(`"` + MetaRequestID + `":`)
	writeJSONString(buf, requestID)
	buf.WriteByte('}')
	body := bytes.TrimSpace(result)
	body = bytes.TrimSpace(body[1 : len(body)-1]) // the members, without the braces
	if len(body) > 0 {
		buf.WriteByte(',')
		buf.Write(body)
	}
	endResult(buf, sessionless)
}

// writeJSONString appends s as a JSON string, escaped as encoding/json
// escapes it.
func writeJSONString[S []byte | string](buf *bytes.Buffer, s S) {
	buf.Write(jsonscan.AppendString(buf.AvailableBuffer(), s))
}

// streamableAccepts reports whether the Accept values admit JSON and an
// event stream, as the SDK reads them.
func streamableAccepts(values []string) (jsonOK, streamOK bool) {
	for _, v := range values {
		for part := range strings.SplitSeq(v, ",") {
			base, _, _ := strings.Cut(part, ";")
			switch strings.ToLower(strings.TrimSpace(base)) {
			case "application/json", "application/*":
				jsonOK = true
			case "text/event-stream", "text/*":
				streamOK = true
			case "*/*":
				jsonOK, streamOK = true, true
			}
		}
	}
	return jsonOK, streamOK
}

// isLoopback reports whether addr (host or host:port) names the loopback.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = strings.Trim(addr, "[]")
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}
