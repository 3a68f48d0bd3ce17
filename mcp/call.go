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
	"github.com/oklog/ulid/v2"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
)

// MetaRequestID is the _meta key of a result that carries the call's
// request id.
const MetaRequestID = "io.okso/request_id"

var (
	requestIDRe   = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)
	traceparentRe = regexp.MustCompile(`^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$`)
)

// correlation returns the request id and traceparent of a call: the
// client's when well formed, fresh ones otherwise.
func correlation(h http.Header) (requestID, traceparent string) {
	traceparent = h.Get("traceparent")
	if !traceparentRe.MatchString(traceparent) || strings.HasPrefix(traceparent[3:], strings.Repeat("0", 32)) {
		var b [24]byte
		_, _ = rand.Read(b[:])
		traceparent = "00-" + hex.EncodeToString(b[:16]) + "-" + hex.EncodeToString(b[16:]) + "-01"
	}
	requestID = h.Get("X-Request-Id")
	if !requestIDRe.MatchString(requestID) {
		requestID = ulid.Make().String()
	}
	return requestID, traceparent
}

// outcome is how one call ended, for the audit log.
type outcome struct {
	decision, code string
}

// call serves one tools/call: every check before NATS, the request, every
// check of the answer. It returns a JSON-RPC error only for a name that is
// no tool of the caller's.
func (g *Gateway) call(ctx context.Context, req *sdk.CallToolRequest) (sdk.Result, error) {
	start := time.Now()
	var (
		claims *auth.Claims
		header http.Header
	)
	if req.Extra != nil {
		claims = claimsOf(req.Extra.TokenInfo)
		header = req.Extra.Header
	}
	requestID, traceparent := correlation(header)
	ev := bus.AuditEvent{Actor: "gateway", RequestID: requestID}
	if claims != nil {
		ev.Tenant, ev.Subject, ev.JTI = claims.Tenant, claims.Subject, claims.ID
	}
	record := func(o outcome) {
		ev.Decision, ev.Code, ev.Duration = o.decision, o.code, time.Since(start)
		g.o.Auditor.Record(ev)
	}
	fail := func(code, msg string) (sdk.Result, error) {
		e := bus.NewError(code, msg)
		record(outcome{decisionFor(code), code})
		return errorResult(e, requestID), nil
	}
	notFound := func() (sdk.Result, error) {
		record(outcome{bus.DecisionNotFound, bus.CodeToolNotFound})
		e := bus.NewError(bus.CodeToolNotFound, "no such tool for this caller")
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "unknown tool", Data: e.JSON()}
	}

	if claims == nil {
		return fail(bus.CodeSafetyDenied, "no verified token")
	}
	name, ok := bus.ParseToolName(req.Params.Name)
	if !ok {
		return notFound()
	}
	ev.Tool, ev.NodeID = req.Params.Name, name.NodeID
	n, t := g.lookup(name.NodeID, req.Params.Name)
	switch {
	case n == nil || t == nil:
		return notFound()
	case n.rec.Tenant != claims.Tenant:
		return fail(bus.CodeSafetyDenied, "node belongs to another tenant")
	case !claims.HasScope(t.scope):
		return fail(bus.CodeSafetyDenied, "token lacks scope "+t.scope)
	case t.verb.Stream:
		return fail(bus.CodeBadRequest, "streaming tools are served at POST /mcp/tools/call")
	}
	args := req.Params.Arguments
	if len(args) == 0 || string(args) == "null" {
		args = json.RawMessage("{}")
	}
	if err := g.o.Schemas.ValidateJSON(t.verb.Input, args); err != nil {
		return fail(bus.CodeManifestInvalid, "arguments fail schema "+t.verb.Input)
	}

	body, err := json.Marshal(bus.Call{Tool: t.name, Arguments: args})
	if err != nil {
		return fail(bus.CodeBadRequest, "arguments do not encode")
	}
	cctx, cancel := context.WithTimeout(ctx, g.o.Budget)
	defer cancel()
	budget := g.o.Budget
	if d, ok := cctx.Deadline(); ok {
		budget = time.Until(d)
	}
	msg := &nats.Msg{Subject: bus.NodeCmd(name.NodeID), Data: body, Header: nats.Header{}}
	msg.Header.Set(bus.HeaderRequestID, requestID)
	msg.Header.Set(bus.HeaderTraceparent, traceparent)
	msg.Header.Set(bus.HeaderBudgetMs, strconv.FormatInt(budget.Milliseconds(), 10))
	msg.Header.Set(bus.HeaderTenant, claims.Tenant)
	msg.Header.Set(bus.HeaderSubject, claims.Subject)
	resp, err := g.o.NC.RequestMsgWithContext(cctx, msg)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return fail(bus.CodeNodeOffline, "node is offline")
	case err != nil && ctx.Err() != nil:
		return fail(bus.CodeDeadlineExceeded, "call cancelled by the client")
	case err != nil && cctx.Err() != nil:
		return fail(bus.CodeDeadlineExceeded, "node did not answer within "+g.o.Budget.String())
	case err != nil:
		g.log.Error("nats request", "node_id", name.NodeID, "err", err)
		return fail(bus.CodeInternal, "message bus unavailable")
	}
	var rep bus.Reply
	if err := json.Unmarshal(resp.Data, &rep); err != nil {
		return fail(bus.CodeInternal, "malformed reply from the device tier")
	}
	if !rep.OK {
		if rep.Error == nil {
			return fail(bus.CodeInternal, "malformed reply from the device tier")
		}
		return fail(rep.Error.Code, trimASCII(rep.Error.Message, 200))
	}
	if err := g.o.Schemas.ValidateJSON(t.verb.Output, rep.Result); err != nil {
		return fail(bus.CodeInternal, "device result fails schema "+t.verb.Output)
	}
	var who struct {
		NodeID string `json:"node_id"`
	}
	if json.Unmarshal(rep.Result, &who) != nil || who.NodeID != name.NodeID {
		return fail(bus.CodeInternal, "device answered for another node")
	}
	record(outcome{bus.DecisionAllowed, ""})
	return &sdk.CallToolResult{
		Meta:              sdk.Meta{MetaRequestID: requestID},
		Content:           []sdk.Content{&sdk.TextContent{Text: string(rep.Result)}},
		StructuredContent: rep.Result,
	}, nil
}

func errorResult(e *bus.Error, requestID string) *sdk.CallToolResult {
	return &sdk.CallToolResult{
		Meta:              sdk.Meta{MetaRequestID: requestID},
		IsError:           true,
		Content:           []sdk.Content{&sdk.TextContent{Text: string(e.JSON())}},
		StructuredContent: e,
	}
}

func decisionFor(code string) string {
	switch code {
	case bus.CodeSafetyDenied:
		return bus.DecisionDenied
	case bus.CodeManifestInvalid, bus.CodeBadRequest:
		return bus.DecisionInvalid
	case bus.CodeToolNotFound:
		return bus.DecisionNotFound
	case bus.CodeNodeOffline:
		return bus.DecisionOffline
	case bus.CodeDeadlineExceeded:
		return bus.DecisionTimeout
	case bus.CodeRateLimited:
		return bus.DecisionRateLimit
	}
	return bus.DecisionFailed
}
