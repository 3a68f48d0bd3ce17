package mcp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/internal/jsonscan"
	"github.com/okso-io/okso/internal/tracing"
	"github.com/okso-io/okso/schemas"
)

// Keys of a result's _meta: MetaRequestID carries the call's request id
// (every result), MetaError the error envelope of a failed call.
const (
	MetaRequestID = schemas.MetaRequestID
	MetaError     = schemas.MetaError
)

var (
	requestIDRe   = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)
	traceparentRe = regexp.MustCompile(`^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$`)
)

// zeroTraceID is the trace id W3C Trace Context calls invalid.
const zeroTraceID = "00000000000000000000000000000000"

// correlation returns the request id and traceparent of a call: the
// client's when well formed (the traceparent of its _meta, as MCP
// 2026-07-28 carries it, else of its HTTP header; given says it was),
// fresh ones otherwise. A fresh traceparent is not sampled (flags 00):
// okso records no trace data unless --otlp-endpoint, and a sampled one
// would have NATS look for a trace destination in every request's
// headers, which costs it a header map per message.
func correlation(h http.Header, metaTraceparent string) (requestID, traceparent string, given bool) {
	traceparent = metaTraceparent
	if !validTraceparent(traceparent) {
		traceparent = h.Get("Traceparent") // canonical: Get then need not allocate the key
	}
	if given = validTraceparent(traceparent); !given {
		var b [24]byte
		_, _ = rand.Read(b[:])
		t := make([]byte, 0, 55)
		t = append(t, "00-"...)
		t = hex.AppendEncode(t, b[:16])
		t = append(t, '-')
		t = hex.AppendEncode(t, b[16:])
		traceparent = string(append(t, "-00"...))
	}
	requestID = h.Get("X-Request-Id")
	if !requestIDRe.MatchString(requestID) {
		requestID = bus.NewRequestID()
	}
	return requestID, traceparent, given
}

// validTraceparent reports whether tp is a W3C traceparent okso
// continues.
func validTraceparent(tp string) bool {
	return traceparentRe.MatchString(tp) && tp[3:35] != zeroTraceID
}

// msgRegistryDown is the message of every answer that needs the
// registry while the gateway's NATS connection is down.
const msgRegistryDown = "registry unavailable: the gateway lost its NATS connection"

// callCtx is one call as the gateway sees it, whatever door it came in by.
type callCtx struct {
	g           *Gateway
	start       time.Time
	claims      *auth.Claims
	name        string
	entry       *entry    // the tool, from the one lookup of the call; nil: none
	elsewhere   string    // no tool of the caller's tenant, but another tenant's: its canonical name
	offline     *bus.Node // no tool of anyone's, but of a node of the caller's tenant that left
	requestID   string
	traceparent string
	// rpcID is the id by which the caller may cancel the call from any
	// replica (cancel.go), as canonicalID writes it; nil: the one of the
	// request's context, if any.
	rpcID []byte
	ev    bus.AuditEvent
	span  *tracing.Span // nil: tracing off
}

// newCall starts a call of the tool name by the caller of claims: it
// looks the tool up in the catalog, once for the whole call (nothing is
// audited yet; check does that).
func (g *Gateway) newCall(claims *auth.Claims, name string, h http.Header, metaTraceparent string) *callCtx {
	c := &callCtx{g: g, start: time.Now(), claims: claims, name: name}
	var given bool
	c.requestID, c.traceparent, given = correlation(h, metaTraceparent)
	c.ev = bus.AuditEvent{Actor: "gateway", RequestID: c.requestID}
	if claims != nil {
		c.ev.Tenant, c.ev.Subject, c.ev.JTI = claims.Tenant, claims.Subject, claims.ID
		c.entry, c.elsewhere = g.shelf.lookup(claims.Tenant, name)
		if c.entry == nil && c.elsewhere == "" {
			c.offline = g.devices.offlineNode(claims.Tenant, name)
		}
	}
	if g.o.Tracer != nil {
		key, _ := templateOf(c.entry)
		tool := key.label()
		parent := c.traceparent
		if !given {
			parent = "" // a trace of its own, sampled as the tracer decides
		}
		c.span, c.traceparent = g.o.Tracer.Start(context.Background(), parent, tracing.Name("tools/call", tool),
			trace.SpanKindServer, attribute.String("mcp.method.name", "tools/call"), attribute.String("gen_ai.tool.name", tool),
			attribute.String("gen_ai.operation.name", "execute_tool"), attribute.String("okso.request_id", c.requestID),
			attribute.String("mcp.protocol.version", h.Get("Mcp-Protocol-Version")))
	}
	return c
}

// audit records the call's decision once.
func (c *callCtx) audit(decision, code string) {
	c.ev.Decision, c.ev.Code, c.ev.Duration = decision, code, time.Since(c.start)
	c.g.o.Auditor.Record(c.ev)
	c.g.metrics.observe(c.entry, code, c.ev.Duration)
	if c.span != nil && c.rpcID != nil {
		c.span.End(code, attribute.String("jsonrpc.request.id", rpcIDText(c.rpcID)))
		return
	}
	c.span.End(code)
}

// fail audits and returns an error envelope.
func (c *callCtx) fail(code, msg string) *schemas.Error {
	c.audit(bus.DecisionFor(code), code)
	return schemas.NewError(code, msg)
}

// check runs every check that comes before NATS: token, tool, scope,
// arguments, on the entry newCall found. It returns the arguments to send.
// A non-nil error is audited already. decoded is args as schemas.Decode
// decodes them, when the caller has that already (nil otherwise).
func (c *callCtx) check(args json.RawMessage, decoded any) (json.RawMessage, *schemas.Error) {
	if c.claims == nil {
		return nil, c.fail(schemas.CodeSafetyDenied, "no verified token")
	}
	if c.g.gate.revoked(c.claims) { // revoked since the request came in
		return nil, c.fail(schemas.CodeSafetyDenied, "token revoked")
	}
	if c.g.link.isDown() {
		return nil, c.fail(schemas.CodeInternal, msgRegistryDown)
	}
	e := c.entry
	switch {
	case e == nil && c.elsewhere != "":
		c.ev.Tool = c.elsewhere // canonical, whichever name the caller used
		return nil, c.fail(schemas.CodeSafetyDenied, "tool belongs to another tenant")
	case e == nil && c.offline != nil:
		c.ev.Tool, c.ev.NodeID = trimASCII(c.name, schemas.MaxToolName), c.offline.NodeID
		return nil, c.fail(schemas.CodeNodeOffline,
			"node is offline since "+c.offline.LastSeen.Format(time.RFC3339))
	case e == nil:
		c.ev.Tool = trimASCII(c.name, schemas.MaxToolName) // what the caller asked for, bounded
		return nil, c.fail(schemas.CodeToolNotFound, "no such tool for this caller")
	}
	c.ev.Tool = e.name
	e.origin.audit(&c.ev)
	if !c.claims.HasScope(e.scope) {
		return nil, c.fail(schemas.CodeSafetyDenied, "token lacks scope "+e.scope)
	}
	if len(args) == 0 || string(args) == "null" {
		args, decoded = json.RawMessage("{}"), nil
	}
	var err error
	if decoded != nil {
		err = e.input.validateValue(decoded)
	} else {
		err = e.input.validate(args)
	}
	if err != nil {
		return nil, c.fail(schemas.CodeManifestInvalid, e.input.explain(err))
	}
	return args, nil
}

// hop is how a call reaches what serves its tool over NATS.
type hop struct {
	subject string
	budget  time.Duration // 0: the gateway's
	// offline is the message of E_NODE_OFFLINE when no one serves the
	// subject, or when the call's context ended with errOwnerGone.
	offline string
	header  nats.Header // more headers, or nil
	// gaveUp, when set, is called when the call was given up (its
	// context ended) before an answer came.
	gaveUp func()
}

// errOwnerGone ends the context of a call whose tool's owner went away
// while it waited (a caller's listen ended): the call answers
// E_NODE_OFFLINE.
var errOwnerGone = errors.New("the tool's owner went away")

// request sends the call to the subject that serves the tool and returns
// the reply.
// Headers carry the correlation, the caller and the remaining budget, both
// relative and as an absolute deadline.
//
// A call is at most once (DESIGN.md §2): it is never handed to a NATS
// connection that is not connected, which would keep it in its reconnect
// buffer and send it when the link returns, after its caller was told it
// failed. Should the link drop between that check and the send, the
// absolute deadline makes the tier refuse the late request.
func (c *callCtx) request(ctx context.Context, args json.RawMessage, h hop) (*bus.Reply, *schemas.Error) {
	body, err := bus.Call{Tool: c.entry.name, Arguments: args}.Encode()
	if err != nil {
		return nil, c.fail(schemas.CodeBadRequest, "arguments do not encode")
	}
	budget := c.g.o.Budget
	if h.budget > 0 {
		budget = h.budget
	}
	cctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	deadline, _ := cctx.Deadline()
	msg := &nats.Msg{Subject: h.subject, Data: body, Header: make(nats.Header, len(h.header)+6)}
	for k, v := range h.header {
		msg.Header[k] = v
	}
	// The six values share one array, and the two numbers one string:
	// nats.Header.Set would allocate each its own (a call's headers are
	// a fifth of the gateway's allocations otherwise).
	var digits [40]byte
	n := strconv.AppendInt(digits[:0], time.Until(deadline).Milliseconds(), 10)
	budgetLen := len(n)
	numbers := string(strconv.AppendInt(n, deadline.UnixMilli(), 10))
	values := []string{c.requestID, c.traceparent, numbers[:budgetLen], numbers[budgetLen:], c.claims.Tenant, c.claims.Subject}
	for i, k := range [...]string{bus.HeaderRequestID, bus.HeaderTraceparent, bus.HeaderBudgetMs, bus.HeaderDeadline,
		bus.HeaderTenant, bus.HeaderSubject} {
		msg.Header[k] = values[i : i+1 : i+1]
	}
	if !c.g.o.NC.IsConnected() {
		return nil, c.fail(schemas.CodeInternal, msgRegistryDown)
	}
	resp, err := c.g.o.NC.RequestMsgWithContext(cctx, msg)
	if h.gaveUp != nil && cctx.Err() != nil { // Err takes a lock: asked only of a call that may be withdrawn
		h.gaveUp()
	}
	switch {
	case err != nil && errors.Is(context.Cause(cctx), errOwnerGone),
		errors.Is(err, nats.ErrNoResponders):
		return nil, c.fail(schemas.CodeNodeOffline, h.offline)
	case err != nil && errors.Is(context.Cause(ctx), errFleetBudget):
		return nil, c.fail(schemas.CodeDeadlineExceeded, "no answer within the fleet budget")
	case err != nil && ctx.Err() != nil:
		return nil, c.fail(schemas.CodeDeadlineExceeded, "call cancelled by the client")
	case err != nil && cctx.Err() != nil:
		return nil, c.fail(schemas.CodeDeadlineExceeded, "no answer within "+budget.String())
	case err != nil:
		c.g.log.Error("nats request", "subject", h.subject, "err", err)
		return nil, c.fail(schemas.CodeInternal, "message bus unavailable")
	}
	rep, err := bus.DecodeReply(resp.Data)
	if err != nil || (!rep.OK && rep.Error == nil) {
		return nil, c.fail(schemas.CodeInternal, "malformed reply from the tier serving the tool")
	}
	if !rep.OK {
		return nil, c.fail(rep.Error.Code, trimASCII(rep.Error.Message, 200))
	}
	return &rep, nil
}

// checkDocument validates a structured result (a device's) against the
// entry's output schema, and checks that it names the node that was
// addressed (nodeID).
func (c *callCtx) checkDocument(result json.RawMessage, nodeID string) (json.RawMessage, *schemas.Error) {
	if out := c.entry.output; out != nil {
		if err := out.validate(result); err != nil {
			return nil, c.fail(schemas.CodeInternal, "result fails the tool's output schema")
		}
	}
	if id, ok := resultNodeID(result); !ok || id != nodeID {
		return nil, c.fail(schemas.CodeInternal, "device answered for another node")
	}
	return result, nil
}

// checkToolResult checks a CallToolResult (an upstream's, or a relayed
// one) against the entry's output schema, and returns the result to
// answer (see checkToolResult).
func (c *callCtx) checkToolResult(result json.RawMessage) (json.RawMessage, *schemas.Error) {
	out := c.entry.output
	result, err := checkToolResult(result, out)
	if err != nil {
		// Explained, never the validator's whole error: its text can
		// be as large as the result.
		why := err.Error()
		if out != nil {
			why = out.explain(err)
		}
		// An upstream's, or a caller tool's relayed back: the log says which.
		c.g.log.Warn(c.entry.origin.source+" result refused", append(c.entry.origin.attrs(), "tool", c.entry.name, "err", why)...)
		return nil, c.fail(schemas.CodeInternal, "result fails the tool's output schema")
	}
	return result, nil
}

// resultNodeID reads the node_id of a result that passed its schema, as
// json.Unmarshal into a struct would (the last key equal to node_id under
// case folding wins), in one pass when the key is written exactly.
func resultNodeID(result []byte) (string, bool) {
	var id string
	ok := jsonscan.Members(result, func(k, v []byte) bool {
		switch {
		case string(k) == "node_id":
			var plain bool
			id, plain = jsonscan.String(v)
			return plain
		case len(k) == len("node_id") && strings.EqualFold(string(k), "node_id"):
			return false
		}
		return true
	})
	if ok {
		return id, true
	}
	var who struct {
		NodeID string `json:"node_id"`
	}
	err := json.Unmarshal(result, &who)
	return who.NodeID, err == nil
}

// unary runs a whole unary call after check: the entry's invoker, then
// the audit of its success.
func (c *callCtx) unary(ctx context.Context, args json.RawMessage) (json.RawMessage, *schemas.Error) {
	result, e := c.entry.invoker.invoke(ctx, c, args)
	if e != nil {
		return nil, e
	}
	c.audit(bus.DecisionAllowed, "")
	return result, nil
}

// call serves one MCP tools/call. It returns a JSON-RPC error only for a
// name that is no tool of the caller's; every other failure is an isError
// result carrying the envelope.
func (g *Gateway) call(ctx context.Context, req *sdk.CallToolRequest) (sdk.Result, error) {
	var (
		claims *auth.Claims
		header http.Header
	)
	if req.Extra != nil {
		claims = claimsOf(req.Extra.TokenInfo)
		header = req.Extra.Header
	}
	metaTP, _ := req.Params.Meta[schemas.MetaTraceparent].(string)
	c := g.newCall(claims, req.Params.Name, header, metaTP)
	c.rpcID, _ = ctx.Value(rpcIDKey{}).([]byte)
	args, e := c.check(req.Params.Arguments, nil)
	if e != nil {
		if e.Code == schemas.CodeToolNotFound {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "unknown tool", Data: e.JSON()}
		}
		return errorResult(e, c.requestID), nil
	}
	switch {
	case c.entry.stream != nil:
		return g.subscribeMCP(ctx, req, c, args)
	case c.entry.session != nil:
		return c.entry.session(ctx, req, c, args), nil
	}
	if c.entry.reports {
		ctx = withProgress(ctx, req)
	}
	result, e := c.unary(ctx, args)
	if e != nil {
		return errorResult(e, c.requestID), nil
	}
	if c.entry.shape == shapeToolResult {
		var res sdk.CallToolResult
		if err := json.Unmarshal(result, &res); err != nil {
			c.g.log.Warn(c.entry.origin.source+" result unreadable", append(c.entry.origin.attrs(), "tool", c.entry.name, "err", err)...)
			return errorResult(schemas.NewError(schemas.CodeInternal, "result fails the tool's output schema"), c.requestID), nil
		}
		res.Meta = sdk.Meta{MetaRequestID: c.requestID}
		// The SDK decodes structuredContent into Go values (numbers into
		// float64): it goes on as it came, as the fast path writes it.
		var raw struct {
			StructuredContent json.RawMessage `json:"structuredContent"`
		}
		if json.Unmarshal(result, &raw) == nil && len(raw.StructuredContent) > 0 && string(raw.StructuredContent) != "null" {
			res.StructuredContent = raw.StructuredContent
		}
		return &res, nil
	}
	return &sdk.CallToolResult{
		Meta:              sdk.Meta{MetaRequestID: c.requestID},
		Content:           []sdk.Content{&sdk.TextContent{Text: string(result)}},
		StructuredContent: result,
	}, nil
}

// errorResult is a failed call as MCP carries it (DESIGN.md §5): isError,
// the envelope as its text and in _meta, and no structuredContent, which
// clients check against the tool's outputSchema (an envelope never
// matches it, and the client would throw instead of showing the error).
func errorResult(e *schemas.Error, requestID string) *sdk.CallToolResult {
	doc := e.JSON()
	return &sdk.CallToolResult{
		Meta:    sdk.Meta{MetaRequestID: requestID, MetaError: json.RawMessage(doc)},
		IsError: true,
		Content: []sdk.Content{&sdk.TextContent{Text: string(doc)}},
	}
}
