package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	sdkauth "github.com/modelcontextprotocol/go-sdk/auth"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/internal/jsonscan"
	"github.com/okso-io/okso/schemas"
)

// maxCallBody bounds the body of POST /mcp/tools/call.
const maxCallBody = 64 << 10

// callBody is the body of POST /mcp/tools/call (seed 001 §3).
type callBody struct {
	Tool      string          `json:"tool"`
	Arguments json.RawMessage `json:"arguments"`
}

// decodeCallBody decodes the body strictly: exactly the keys "tool" and
// "arguments" (no case variants, no duplicates, nothing else), a tool
// name, arguments that are an object, and no trailing data.
func decodeCallBody(raw []byte, err error) (callBody, error) {
	var b callBody
	if err != nil {
		return b, errors.New("body too large, too slow or unreadable")
	}
	doc, err := schemas.Decode(raw) // refuses duplicate keys and trailing data
	obj, ok := doc.(map[string]any)
	if err != nil || !ok {
		return b, errors.New("body is not a JSON object {tool, arguments}")
	}
	for k := range obj {
		if k != "tool" && k != "arguments" {
			return b, errors.New("body has a field other than tool and arguments")
		}
	}
	tool, ok := obj["tool"].(string)
	if !ok || tool == "" {
		return b, errors.New("tool is required")
	}
	if a, ok := obj["arguments"]; ok && a != nil {
		if _, ok := a.(map[string]any); !ok {
			return b, errors.New("arguments must be an object")
		}
	}
	if err := json.Unmarshal(raw, &b); err != nil { // keys are exact: cannot differ now
		return b, errors.New("body is not a JSON object {tool, arguments}")
	}
	return b, nil
}

// httpStatus maps an error code to the REST door's HTTP status.
func httpStatus(code string) int {
	switch code {
	case schemas.CodeBadRequest, schemas.CodeManifestInvalid:
		return http.StatusBadRequest
	case schemas.CodeToolNotFound:
		return http.StatusNotFound
	case schemas.CodeSafetyDenied:
		return http.StatusForbidden
	case schemas.CodeNodeOffline:
		return http.StatusServiceUnavailable
	case schemas.CodeDeadlineExceeded:
		return http.StatusGatewayTimeout
	case schemas.CodeRateLimited:
		return http.StatusTooManyRequests
	}
	return http.StatusInternalServerError
}

func writeError(w http.ResponseWriter, status int, e *schemas.Error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(e.JSON())
}

// accepts reports whether the Accept header admits mediaType; with
// allowAny, an absent header or */* does too.
func accepts(r *http.Request, mediaType string, allowAny bool) bool {
	h := r.Header.Values("Accept")
	if len(h) == 0 {
		return allowAny
	}
	for _, v := range h {
		for _, part := range strings.Split(v, ",") {
			mt, _, err := mime.ParseMediaType(strings.TrimSpace(part))
			if err != nil {
				continue
			}
			if mt == mediaType || (allowAny && (mt == "*/*" || mt == "application/*")) {
				return true
			}
		}
	}
	return false
}

// serveToolsCall is POST /mcp/tools/call: a streaming tool as Server-Sent
// Events (seed 001), or a unary tool as plain JSON, for clients that do
// not speak MCP.
func (g *Gateway) serveToolsCall(w http.ResponseWriter, r *http.Request) {
	claims := claimsOf(sdkauth.TokenInfoFromContext(r.Context()))
	body, err := decodeCallBody(readBody(w, r, maxCallBody))
	c := g.newCall(claims, body.Tool, r.Header, "")
	w.Header().Set("X-Request-Id", c.requestID)
	if err != nil {
		writeError(w, http.StatusBadRequest, c.fail(schemas.CodeBadRequest, err.Error()))
		return
	}
	args, e := c.check(body.Arguments, nil)
	if e != nil {
		writeError(w, httpStatus(e.Code), e)
		return
	}
	if c.entry.session != nil {
		writeError(w, http.StatusBadRequest, c.fail(schemas.CodeBadRequest, "this tool is served over MCP tools/call only"))
		return
	}
	if c.entry.stream == nil {
		if !accepts(r, "application/json", true) {
			writeError(w, http.StatusNotAcceptable, c.fail(schemas.CodeBadRequest, "unary tools answer with Accept: application/json"))
			return
		}
		// The call may be cancelled from any replica, as an MCP one is
		// (cancel.go), by a notifications/cancelled naming its request id
		// (X-Request-Id) as a string.
		c.rpcID = jsonscan.AppendString(nil, c.requestID)
		result, e := c.unary(r.Context(), args)
		if e != nil {
			writeError(w, httpStatus(e.Code), e)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(result)
		return
	}
	if !accepts(r, "text/event-stream", false) {
		writeError(w, http.StatusNotAcceptable, c.fail(schemas.CodeBadRequest, "streaming tools need Accept: text/event-stream"))
		return
	}
	s, e, err := c.entry.stream.open(r.Context(), c, args)
	if e != nil {
		writeError(w, httpStatus(e.Code), e)
		return
	}
	out := newSSESink(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if errors.Is(err, errQuota) {
		_ = out.send(r.Context(), "close", closeData(bus.StreamRateLimited))
		return
	}
	_ = out.rc.Flush()
	code := s.pump(r.Context(), out, g.o.PingInterval, g.o.IdleTimeout, metricEvent)
	c.finishStream(s, code)
}

func metricEvent(f []byte) (string, []byte) { return "metric", f }

// finishStream releases a stream and audits how it ended.
func (c *callCtx) finishStream(s *stream, code int) {
	s.close(code != bus.StreamDeviceOffline)
	c.ev.Decision, c.ev.Code = bus.DecisionStreamClosed, strconv.Itoa(code)
	c.ev.Duration = time.Since(c.start)
	c.g.o.Auditor.Record(c.ev)
}

func closeData(code int) []byte {
	return fmt.Appendf(nil, `{"code":%d,"reason":%q}`, code, bus.StreamReason(code))
}

// sseSink writes events to an HTTP response, flushing each.
type sseSink struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	buf []byte
}

func newSSESink(w http.ResponseWriter) *sseSink {
	return &sseSink{w: w, rc: http.NewResponseController(w)}
}

func (s *sseSink) send(_ context.Context, event string, data []byte) error {
	s.buf = append(s.buf[:0], "event: "...)
	s.buf = append(s.buf, event...)
	s.buf = append(s.buf, "\ndata: "...)
	s.buf = append(s.buf, data...)
	s.buf = append(s.buf, "\n\n"...)
	if _, err := s.w.Write(s.buf); err != nil {
		return err
	}
	return s.rc.Flush()
}

func (s *sseSink) setWriteDeadline(t time.Time) error { return s.rc.SetWriteDeadline(t) }

// subscribeMCP serves a streaming tool over MCP: each frame is a progress
// notification of the call (message = the frame JSON) until the client
// cancels or the stream ends; the result says how it ended.
func (g *Gateway) subscribeMCP(ctx context.Context, req *sdk.CallToolRequest, c *callCtx, args json.RawMessage) (sdk.Result, error) {
	token := req.Params.GetProgressToken()
	if token == nil {
		return errorResult(c.fail(schemas.CodeBadRequest, "a subscribe call needs a progress token in _meta"), c.requestID), nil
	}
	ctx, stop := g.cancels.cancellable(ctx, c.claims, nil)
	defer stop()
	s, e, err := c.entry.stream.open(ctx, c, args)
	if e != nil {
		return errorResult(e, c.requestID), nil
	}
	code := bus.StreamRateLimited
	var frames int64
	if !errors.Is(err, errQuota) {
		out := &progressSink{session: req.Session, token: token}
		if hc, ok := ctx.Value(httpCallKey{}).(*httpCall); ok && !g.o.Stateful {
			out.rc = hc.rc
		}
		code = s.pump(ctx, out, g.o.PingInterval, g.o.IdleTimeout, metricEvent)
		frames = s.count.Load()
		c.finishStream(s, code)
	}
	// The result describes how the stream ended (its outputSchema); it is
	// not an error envelope, so it is not marked isError.
	res := map[string]any{"code": code, "reason": bus.StreamReason(code), "frames": frames}
	b, _ := json.Marshal(res)
	return &sdk.CallToolResult{
		Meta:              sdk.Meta{MetaRequestID: c.requestID},
		Content:           []sdk.Content{&sdk.TextContent{Text: string(b)}},
		StructuredContent: json.RawMessage(b),
	}, nil
}

// progressSink sends metric events as progress notifications; pings and the
// close event have no MCP form (the call's result carries the close).
type progressSink struct {
	session *sdk.ServerSession
	token   any
	n       float64

	// rc, when the request context carries it, bounds the SDK's own write
	// of each notification (which does not watch the context).
	rc *http.ResponseController

	mu       sync.Mutex
	deadline time.Time
	cancel   context.CancelFunc // of the send in progress
}

func (p *progressSink) send(ctx context.Context, event string, data []byte) error {
	if event != "metric" {
		return nil
	}
	p.mu.Lock()
	parent := ctx
	ctx, cancel := context.WithCancel(parent)
	if !p.deadline.IsZero() {
		ctx, cancel = context.WithDeadline(parent, p.deadline)
	}
	p.cancel = cancel
	p.mu.Unlock()
	defer cancel()
	p.n++
	err := p.session.NotifyProgress(ctx, &sdk.ProgressNotificationParams{
		ProgressToken: p.token, Progress: p.n, Message: string(data),
	})
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return errDeadline
	}
	return err
}

func (p *progressSink) setWriteDeadline(t time.Time) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.deadline = t
	if p.cancel != nil && !t.IsZero() && !t.After(time.Now()) {
		p.cancel()
	}
	if p.rc != nil {
		_ = p.rc.SetWriteDeadline(t)
	}
	return nil
}

// httpCall is what a tool handler may need of the HTTP request that
// carried its call, which the SDK's handlers do not see: the response's
// controller (write deadlines for streamed notifications) and when the
// client hung up (the request context's Done).
//
// Only a stateless gateway's handlers can use it: a stateful session's
// handlers run in the context of the request that created the session.
type httpCall struct {
	rc     *http.ResponseController
	hungUp <-chan struct{}
}

type httpCallKey struct{}

func withHTTPCall(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hc := &httpCall{rc: http.NewResponseController(w), hungUp: r.Context().Done()}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), httpCallKey{}, hc)))
	})
}
