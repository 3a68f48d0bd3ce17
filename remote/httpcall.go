package remote

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/internal/jsonscan"
)

// A call to a Streamable HTTP upstream does not go through the SDK's
// session: the tier passes the upstream's result on as bytes, and the
// SDK would decode it into a CallToolResult (and its content into Go
// values) only for the tier to encode it again, with two goroutines
// between the request and its answer. The call is one POST on the
// session's connections, shaped exactly as the SDK shapes its own
// requests of the session: the same headers and per-request _meta, which
// httpCaller takes from the SDK's tools/list request (the tier always
// lists before it serves a call). Until it has seen one, a call goes
// through the SDK. A stateless upstream that serves 2025-11-25 besides
// the session's 2026-07-28 is called in 2025-11-25, which costs it less
// (plainCalls).

// maxResultBytes bounds what a call reads of an upstream's answer: far
// more than NATS carries (the tier refuses a larger result anyway), and
// far less than would hurt.
const maxResultBytes = 8 << 20

// streamEndWait bounds how long a call waits for an event stream to end
// after its answer, so that the connection can carry the next call.
const streamEndWait = 100 * time.Millisecond

// plainRevision is the revision of a call to an upstream that serves
// its requests each on its own (stateless) in 2025-11-25 as well as in
// 2026-07-28: such a call carries no _meta of the client's protocol
// version, identity and capabilities, which a server of 2026-07-28 reads
// and checks on every request, nor gets its identity back in every
// result; the SDKs' stateless servers (Go SDK, mcp-go) spend about half
// the CPU on it (federation-bench, issue 34).
const plainRevision = "2025-11-25"

// callShape is how the SDK's session shapes a request to the upstream.
type callShape struct {
	header   http.Header                // Mcp-Protocol-Version, Mcp-Session-Id
	meta     map[string]json.RawMessage // the per-request _meta of 2026-07-28 and later
	standard bool                       // Mcp-Method and Mcp-Name headers
}

// modern reports whether the shape is of 2026-07-28 or later, whose
// requests stand each on its own.
func (s *callShape) modern() bool { return s.header.Get("Mcp-Protocol-Version") >= "2026-07-28" }

// httpCaller makes the calls of one HTTP session.
type httpCaller struct {
	url   string
	hc    *http.Client
	shape atomic.Pointer[callShape] // the session's
	// calls is the calls' shape once plainCalls has found it: the
	// session's, or one of plainRevision. Nil: the session's.
	calls atomic.Pointer[callShape]
	next  atomic.Uint64
	// lost ends the SDK's session when the upstream says it lost it
	// (404), so that the tier connects again.
	lost func()
}

// learn keeps the shape of req, the SDK's tools/list request of the
// session, which the upstream answered 200.
func (h *httpCaller) learn(req *http.Request) {
	if h.shape.Load() != nil || req.Method != http.MethodPost || req.GetBody == nil {
		return
	}
	body, err := req.GetBody()
	if err != nil {
		return
	}
	var msg struct {
		Method string `json:"method"`
		Params struct {
			Meta map[string]json.RawMessage `json:"_meta"`
		} `json:"params"`
	}
	err = json.NewDecoder(io.LimitReader(body, 1<<20)).Decode(&msg)
	body.Close()
	if err != nil || msg.Method != "tools/list" {
		return
	}
	s := &callShape{header: http.Header{}, meta: map[string]json.RawMessage{}, standard: req.Header.Get("Mcp-Method") != ""}
	for _, k := range []string{"Mcp-Protocol-Version", "Mcp-Session-Id"} {
		if v := req.Header.Get(k); v != "" {
			s.header.Set(k, v)
		}
	}
	for k, v := range msg.Params.Meta {
		if k != "progressToken" {
			s.meta[k] = v
		}
	}
	h.shape.CompareAndSwap(nil, s)
}

// call calls tool; ok is false when the session's shape is not known
// yet, and the SDK must make the call.
func (h *httpCaller) call(ctx context.Context, tool string, args json.RawMessage, meta map[string]any) (_ json.RawMessage, ok bool, _ error) {
	s := h.calls.Load()
	if s == nil {
		s = h.shape.Load()
	}
	if s == nil {
		return nil, false, nil
	}
	id := h.id()
	body, err := s.request(id, tool, args, meta)
	if err != nil {
		return nil, true, err
	}
	res, err := h.send(ctx, s, id, "tools/call", tool, body, toolResultOf)
	return res, true, err
}

// plainCalls finds out, once the session's shape is known, how the
// session's calls are best shaped. In a session of 2026-07-28 it asks
// the upstream for its tools/list in plainRevision, without a session
// (read-only, so asking costs nothing but the request): an upstream that
// answers with its tools serves each request on its own in either
// revision, as it declares, and the calls take that revision's shape; a
// refusal (a stateful upstream wants its session; one of 2026-07-28
// alone, that revision) keeps the session's. When nothing answered
// (ctx ended, the connection failed), it decides nothing, and the next
// listing asks again.
func (h *httpCaller) plainCalls(ctx context.Context) {
	s := h.shape.Load()
	if s == nil || h.calls.Load() != nil {
		return
	}
	if !s.modern() {
		h.calls.CompareAndSwap(nil, s)
		return
	}
	plain := &callShape{header: http.Header{"Mcp-Protocol-Version": {plainRevision}}, meta: map[string]json.RawMessage{}}
	id := h.id()
	body := []byte(`{"jsonrpc":"2.0","id":"` + id + `","method":"tools/list","params":{}}`)
	_, err := h.send(ctx, plain, id, "tools/list", "", body, toolsOf)
	var ue *url.Error
	switch {
	case err == nil:
		h.calls.CompareAndSwap(nil, plain)
	case ctx.Err() != nil || errors.As(err, &ue):
		// Unanswered: undecided.
	default:
		h.calls.CompareAndSwap(nil, s)
	}
}

// toolsOf checks that raw is a ListToolsResult, with a list of tools.
func toolsOf(raw json.RawMessage) (json.RawMessage, error) {
	var r struct {
		Tools []json.RawMessage `json:"tools"`
	}
	if err := json.Unmarshal(raw, &r); err != nil || r.Tools == nil {
		return nil, errors.New("not a list of tools")
	}
	return raw, nil
}

// ping asks the upstream whether it is there, with a ping shaped as the
// session's requests are (in a 2026-07-28 session, with that revision's
// _meta and headers). It returns nil when the upstream answered with a
// JSON-RPC response, a result or an error object, whatever the HTTP
// status that carried it: 2026-07-28 has no ping, and the SDK's
// stateless server answers 404 and -32601 (400 and -32602 to a ping
// without the revision's _meta). Its error says why not: the request
// failed (refused, reset, unanswered within ctx), or what answered was
// not JSON-RPC (a proxy's 502 page, say). ok is false when the session's
// shape is not known yet.
//
// It is not the SDK's ping, because the SDK's error cannot tell an
// answer from a failure: it wraps a transport's refusal, a 502 among
// them, in a JSON-RPC error object of its own (-32005 "rejected by
// transport"), and does not read the body of a 5xx.
func (h *httpCaller) ping(ctx context.Context) (ok bool, _ error) {
	s := h.shape.Load()
	if s == nil {
		return false, nil
	}
	id := h.id()
	_, err := h.send(ctx, s, id, "ping", "", s.ping(id), nil)
	var rpc *jsonrpc.Error
	if errors.As(err, &rpc) { // only ever the upstream's own (see answer)
		return true, nil
	}
	return true, err
}

// id is the id of the session's next request of the tier's own.
func (h *httpCaller) id() string { return "okso-" + strconv.FormatUint(h.next.Add(1), 10) }

// send POSTs body, a request of method (and, for tools/call, of the tool
// name) with id, and returns its answer's result, passed through result
// when it is not nil; when ctx ends first, the upstream is told to stop.
func (h *httpCaller) send(ctx context.Context, s *callShape, id, method, name string, body []byte,
	result func(json.RawMessage) (json.RawMessage, error)) (json.RawMessage, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	s.setHeaders(req.Header)
	if s.standard {
		req.Header.Set("Mcp-Method", method)
		if name != "" {
			req.Header.Set("Mcp-Name", name)
		}
	}
	resp, err := h.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			h.cancel(s, id)
		}
		return nil, err
	}
	res, err := h.answer(ctx, s, id, resp)
	if err != nil && ctx.Err() != nil {
		h.cancel(s, id)
	}
	if err == nil && result != nil {
		res, err = result(res)
	}
	return res, err
}

// request is the JSON-RPC request of a call.
func (s *callShape) request(id, tool string, args json.RawMessage, meta map[string]any) ([]byte, error) {
	buf := make([]byte, 0, 256+len(args))
	buf = append(buf, `{"jsonrpc":"2.0","id":"`...)
	buf = append(buf, id...)
	buf = append(buf, `","method":"tools/call","params":{"name":`...)
	buf = jsonscan.AppendString(buf, tool)
	buf = append(buf, `,"arguments":`...)
	buf = append(buf, args...)
	buf = append(buf, ',')
	buf, err := s.appendMeta(buf, meta)
	if err != nil {
		return nil, err
	}
	return append(buf, "}}"...), nil
}

// ping is the JSON-RPC request of a ping.
func (s *callShape) ping(id string) []byte {
	buf := make([]byte, 0, 256)
	buf = append(buf, `{"jsonrpc":"2.0","id":"`...)
	buf = append(buf, id...)
	buf = append(buf, `","method":"ping","params":{`...)
	buf, _ = s.appendMeta(buf, nil) // nil: nothing of the tier's to encode, no error
	return append(buf, "}}"...)
}

// appendMeta appends the request's _meta member: the session's
// per-request _meta, and meta (which wins over it).
func (s *callShape) appendMeta(buf []byte, meta map[string]any) ([]byte, error) {
	buf = append(buf, `"_meta":{`...)
	first := true
	member := func(k string, v []byte) {
		if !first {
			buf = append(buf, ',')
		}
		first = false
		buf = jsonscan.AppendString(buf, k)
		buf = append(buf, ':')
		buf = append(buf, v...)
	}
	for k, v := range s.meta {
		if _, ours := meta[k]; !ours {
			member(k, v)
		}
	}
	for k, v := range meta {
		b, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("encode _meta %s: %w", k, err)
		}
		member(k, b)
	}
	return append(buf, '}'), nil
}

func (s *callShape) setHeaders(h http.Header) {
	h.Set("Content-Type", "application/json")
	h.Set("Accept", "application/json, text/event-stream")
	for k, v := range s.header {
		h[k] = v
	}
}

// answer reads the answer to request id from resp, a JSON body or an
// event stream, and closes resp's body. A *jsonrpc.Error in its error is
// always the upstream's own answer: the error object it answered, with
// whatever HTTP status.
func (h *httpCaller) answer(ctx context.Context, s *callShape, id string, resp *http.Response) (json.RawMessage, error) {
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 300 {
		err := fmt.Errorf("%s", http.StatusText(resp.StatusCode))
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		// The error object, of whatever id: an upstream that refuses a
		// request it could not read answers id null, which the SDK's
		// decoder refuses.
		var msg struct {
			Version string         `json:"jsonrpc"`
			Error   *jsonrpc.Error `json:"error"`
		}
		if json.Unmarshal(body, &msg) == nil && msg.Version == "2.0" && msg.Error != nil {
			err = msg.Error
		}
		if resp.StatusCode == http.StatusNotFound && s.header.Get("Mcp-Session-Id") != "" {
			h.lost()
			err = fmt.Errorf("%w: %w", mcp.ErrSessionMissing, err)
		}
		return nil, &HTTPStatusError{Status: resp.StatusCode, Err: err}
	}
	ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	switch ct {
	case "application/json":
		body, err := io.ReadAll(io.LimitReader(resp.Body, maxResultBytes+1))
		if err != nil {
			return nil, err
		}
		if len(body) > maxResultBytes {
			return nil, errors.New("answer larger than okso reads")
		}
		res, mine, err := h.message(ctx, s, id, body)
		if err == nil && !mine {
			err = errors.New("the upstream answered another request")
		}
		return res, err
	case "text/event-stream":
		return h.stream(ctx, s, id, resp.Body)
	}
	return nil, fmt.Errorf("the upstream answered %s to a request", strconv.Quote(ct))
}

// stream reads an event stream until the answer to request id, then to
// its end (briefly: so that the connection carries the next call).
func (h *httpCaller) stream(ctx context.Context, s *callShape, id string, body io.ReadCloser) (json.RawMessage, error) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 4096), maxResultBytes)
	var data []byte
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) > 0 {
			if rest, ok := bytes.CutPrefix(line, []byte("data:")); ok {
				if len(data) > 0 {
					data = append(data, '\n')
				}
				data = append(data, bytes.TrimPrefix(rest, []byte(" "))...)
			}
			continue
		}
		if len(data) == 0 {
			continue // an event without data: a priming event, say
		}
		res, mine, err := h.message(ctx, s, id, data)
		data = data[:0]
		if !mine && err == nil {
			continue
		}
		t := time.AfterFunc(streamEndWait, func() { body.Close() })
		_, _ = io.Copy(io.Discard, io.LimitReader(body, 64<<10))
		t.Stop()
		return res, err
	}
	// The stream ended, or broke, before the answer: as a connection
	// reset before the answer, the upstream went away.
	err := sc.Err()
	if err == nil {
		err = io.ErrUnexpectedEOF
	}
	return nil, &url.Error{Op: "read answer", URL: h.url, Err: err}
}

// message handles one JSON-RPC message of the answer: mine is true when
// it is the answer to request id, with its result or error (the
// upstream's error object, a *jsonrpc.Error). A request of the upstream
// is answered as the SDK's client would answer it; a notification is
// dropped.
func (h *httpCaller) message(ctx context.Context, s *callShape, id string, data []byte) (_ json.RawMessage, mine bool, _ error) {
	if res, ok := quickAnswer(data, id); ok {
		return res, true, nil
	}
	return h.decodeMessage(s, id, data)
}

// decodeMessage is message with encoding/json, for every answer.
func (h *httpCaller) decodeMessage(s *callShape, id string, data []byte) (_ json.RawMessage, mine bool, _ error) {
	var msg struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Result json.RawMessage `json:"result"`
		Error  *jsonrpc.Error  `json:"error"`
	}
	if err := json.Unmarshal(data, &msg); err != nil {
		return nil, true, fmt.Errorf("malformed answer: %w", err)
	}
	if msg.Method != "" {
		if len(msg.ID) > 0 {
			go h.reply(s, msg.ID, msg.Method)
		}
		return nil, false, nil
	}
	if string(msg.ID) != `"`+id+`"` {
		return nil, false, nil
	}
	if msg.Error != nil {
		return nil, true, msg.Error
	}
	return msg.Result, true, nil
}

// quickAnswer is message's one pass over the answer it reads nearly
// always: an object of exactly the members jsonrpc "2.0", id (the
// request's, a plain string) and result, valid JSON with no key written
// twice. ok is false on anything else, which message then decodes; what
// it accepts, message's decoding reads the same (FuzzQuickAnswer).
func quickAnswer(data []byte, id string) (res json.RawMessage, ok bool) {
	var seen uint8
	ok = jsonscan.Members(data, func(k, v []byte) bool {
		var bit uint8
		switch string(k) {
		case "jsonrpc":
			bit = 1
			if string(v) != `"2.0"` {
				return false
			}
		case "id":
			bit = 2
			if got, ok := jsonscan.StringBytes(v); !ok || string(got) != id {
				return false
			}
		case "result":
			bit = 4
			res = v
		default:
			return false
		}
		if seen&bit != 0 {
			return false
		}
		seen |= bit
		return true
	})
	if !ok || seen != 7 || !jsonscan.Value(res) {
		return nil, false
	}
	return res, true
}

// toolResultKeys are the members of a CallToolResult that toolResultOf
// reads.
var toolResultKeys = [...]string{"content", "structuredContent", "isError", "resultType"}

// quickToolResult is toolResultOf's one pass over a result that
// quickAnswer accepted (valid JSON, no key written twice): the members
// it reads written exactly so, content's blocks objects with a plain
// type. ok is false on anything else, which toolResultOf then decodes;
// what it accepts, toolResultOf's decoding answers the same
// (FuzzQuickAnswer).
func quickToolResult(raw json.RawMessage) (_ json.RawMessage, ok bool, _ error) {
	var content, structured json.RawMessage
	var isError bool
	var resultType []byte
	ok = jsonscan.Members(raw, func(k, v []byte) bool {
		switch string(k) {
		case "content":
			content = v
		case "structuredContent":
			structured = v
		case "isError":
			isError, ok = jsonscan.Bool(v)
			return ok
		case "resultType":
			resultType, ok = jsonscan.StringBytes(v)
			return ok
		default:
			for _, key := range toolResultKeys {
				if strings.EqualFold(string(k), key) { // encoding/json's match
					return false
				}
			}
		}
		return true
	})
	if !ok || len(content) > 0 && content[0] != '[' {
		return nil, false, nil
	}
	if len(resultType) > 0 && string(resultType) != "complete" {
		return nil, true, fmt.Errorf("result of type %s", strconv.Quote(string(resultType)))
	}
	var blocks []json.RawMessage
	if len(content) > 0 {
		if err := json.Unmarshal(content, &blocks); err != nil {
			return nil, false, nil
		}
	}
	for _, c := range blocks {
		var kind []byte
		seen := false
		if !jsonscan.Members(c, func(k, v []byte) bool {
			switch {
			case string(k) == "type":
				if seen {
					return false
				}
				seen = true
				kind, ok = jsonscan.StringBytes(v)
				return ok
			case strings.EqualFold(string(k), "type"):
				return false
			}
			return true
		}) {
			return nil, false, nil
		}
		if !contentKind(string(kind)) {
			return nil, true, fmt.Errorf("result content of type %s", strconv.Quote(string(kind)))
		}
	}
	return appendToolResult(blocks, structured, isError), true, nil
}

// contentKind reports whether kind is a content block's type that MCP
// defines.
func contentKind(kind string) bool {
	switch kind {
	case "text", "image", "audio", "resource_link", "resource":
		return true
	}
	return false
}

// appendToolResult writes a CallToolResult as the tier passes it on.
func appendToolResult(content []json.RawMessage, structured json.RawMessage, isError bool) json.RawMessage {
	size := len(`{"content":[],"structuredContent":,"isError":true}`) + len(structured)
	for _, c := range content {
		size += len(c) + 1
	}
	out := make([]byte, 0, size)
	out = append(out, `{"content":[`...)
	for i, c := range content {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, c...)
	}
	out = append(out, ']')
	if len(structured) > 0 && string(structured) != "null" {
		out = append(out, `,"structuredContent":`...)
		out = append(out, structured...)
	}
	if isError {
		out = append(out, `,"isError":true`...)
	}
	return append(out, '}')
}

// toolResultOf is an upstream's CallToolResult as the tier passes it on:
// content, structuredContent and isError, without the _meta; content
// must be a list of content blocks of the kinds MCP defines.
func toolResultOf(raw json.RawMessage) (json.RawMessage, error) {
	if out, ok, err := quickToolResult(raw); ok {
		return out, err
	}
	return decodeToolResult(raw)
}

// decodeToolResult is toolResultOf with encoding/json, for every result.
func decodeToolResult(raw json.RawMessage) (json.RawMessage, error) {
	var r struct {
		Content           []json.RawMessage `json:"content"`
		StructuredContent json.RawMessage   `json:"structuredContent"`
		IsError           bool              `json:"isError"`
		ResultType        string            `json:"resultType"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("malformed result: %w", err)
	}
	if r.ResultType != "" && r.ResultType != "complete" {
		// input_required: the upstream asks the client for an
		// elicitation or a sampling, which okso does not relay.
		return nil, fmt.Errorf("result of type %s", strconv.Quote(r.ResultType))
	}
	for _, c := range r.Content {
		var block struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(c, &block); err != nil {
			return nil, fmt.Errorf("malformed result content: %w", err)
		}
		if !contentKind(block.Type) {
			return nil, fmt.Errorf("result content of type %s", strconv.Quote(block.Type))
		}
	}
	return appendToolResult(r.Content, r.StructuredContent, r.IsError), nil
}

// reply answers a request the upstream made during a call: the tier's
// client has no roots and serves nothing else, as the SDK's client
// without handlers would say.
func (h *httpCaller) reply(s *callShape, id json.RawMessage, method string) {
	var body []byte
	switch method {
	case "ping":
		body = fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%s,"result":{}}`, id)
	case "roots/list":
		body = fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%s,"result":{"roots":[]}}`, id)
	default:
		body = fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%s,"error":{"code":%d,"message":"method not found"}}`, id, jsonrpc.CodeMethodNotFound)
	}
	h.post(s, "", body)
}

// cancel tells the upstream that request id is no longer awaited.
func (h *httpCaller) cancel(s *callShape, id string) {
	go h.post(s, "notifications/cancelled", fmt.Appendf(nil,
		`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"%s","reason":"the call's deadline passed"}}`, id))
}

// post sends one message the upstream does not answer (a notification
// of method, or a response when method is ""), bounded in time.
func (h *httpCaller) post(s *callShape, method string, body []byte) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(body))
	if err != nil {
		return
	}
	s.setHeaders(req.Header)
	if s.standard && method != "" {
		req.Header.Set("Mcp-Method", method)
	}
	resp, err := h.hc.Do(req)
	if err != nil {
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
}
