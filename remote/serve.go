package remote

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/internal/jsonscan"
	"github.com/okso-io/okso/internal/tracing"
	"github.com/okso-io/okso/schemas"
)

// maxAttempts bounds the calls of one request to an idempotent tool.
const maxAttempts = 3

// retryWait is the first wait before a retry; it doubles, jittered.
const retryWait = 50 * time.Millisecond

// onCall takes one request of the upstream's subject. It runs on the
// subscription's goroutine, so it only admits the call and hands it on,
// to run in calls (ended when a stopping tier's grace has passed).
func (s *upstream) onCall(calls context.Context, m *nats.Msg) {
	if r := s.t.o.Requesters; r != nil && !bus.FromRole(m, r...) {
		s.log.Warn("dropped a message on the upstream's subject that no gateway sent", "reply", m.Reply)
		return
	}
	if m.Header.Get(bus.HeaderProbe) != "" {
		// Another replica asks whether this one serves the upstream.
		if err := m.Respond(bus.OKReply(json.RawMessage(`{}`))); err != nil {
			s.log.Debug("answer probe", "err", err)
		}
		return
	}
	select {
	case s.sem <- struct{}{}:
	default:
		s.answer(m, s.event(m, time.Now()), schemas.CodeRateLimited, "the upstream has too many calls in flight")
		return
	}
	// Admitted only while the session serves: its end waits for the
	// calls admitted, and a callback that runs as it unsubscribes must
	// not add one while it waits.
	s.admitMu.Lock()
	if !s.admitting {
		s.admitMu.Unlock()
		<-s.sem
		s.answer(m, s.event(m, time.Now()), schemas.CodeNodeOffline, "the upstream is not connected")
		return
	}
	s.calls.Add(1)
	s.admitMu.Unlock()
	go func() {
		defer s.calls.Done()
		defer func() { <-s.sem }()
		s.serve(calls, m)
	}()
}

// event starts the audit event of a request.
func (s *upstream) event(m *nats.Msg, start time.Time) bus.AuditEvent {
	return bus.AuditEvent{
		Time:      start,
		Actor:     "remote",
		Tenant:    m.Header.Get(bus.HeaderTenant),
		Subject:   m.Header.Get(bus.HeaderSubject),
		Upstream:  s.cfg.Name,
		RequestID: m.Header.Get(bus.HeaderRequestID),
	}
}

// serve runs one call: it checks the request, calls the upstream (again,
// for an idempotent tool after a transient failure, within the budget),
// and answers with the upstream's CallToolResult or an error envelope.
// The call ends when calls does (a stopping tier's grace has passed),
// answered E_NODE_OFFLINE.
func (s *upstream) serve(calls context.Context, m *nats.Msg) {
	start := time.Now()
	ev := s.event(m, start)
	call, err := bus.DecodeCall(m.Data)
	if err != nil {
		s.answer(m, ev, schemas.CodeBadRequest, "malformed call")
		return
	}
	up, tool, ok := schemas.ParseRemoteToolName(call.Tool)
	if !ok || up != s.cfg.Name {
		s.answer(m, ev, schemas.CodeToolNotFound, "no such tool on this upstream")
		return
	}
	ev.Tool = call.Tool
	// The upstream's own hop of the trace, whose context it is given.
	span, traceparent := s.t.o.Tracer.Start(calls, m.Header.Get(bus.HeaderTraceparent), tracing.Name("tools/call", up+".*"),
		trace.SpanKindClient, attribute.String("mcp.method.name", "tools/call"), attribute.String("gen_ai.tool.name", up+".*"),
		attribute.String("gen_ai.operation.name", "execute_tool"), attribute.String("okso.request_id", ev.RequestID))
	outcome := ""
	defer func() {
		span.End(outcome)
		s.t.counted(up, outcome)
	}()
	answer := func(code, msg string) {
		outcome = code
		s.answer(m, ev, code, msg)
	}
	d, ok := bus.CallDeadline(start, s.cfg.Timeout, m.Header.Get(bus.HeaderBudgetMs), m.Header.Get(bus.HeaderDeadline), s.t.o.MaxClockSkew)
	if !ok {
		answer(schemas.CodeDeadlineExceeded, "the call's deadline passed before it reached the remote tier")
		return
	}
	ctx, cancel := context.WithTimeout(calls, d)
	defer cancel()
	meta := func() map[string]any { // a fresh map per attempt: a client may write into it
		meta := map[string]any{schemas.MetaRequestID: ev.RequestID}
		if traceparent != "" {
			meta[schemas.MetaTraceparent] = traceparent
		}
		return meta
	}
	wait := retryWait
	var sv *served
	for attempt := 1; ; attempt++ {
		// Between two sessions (a stdio process died and is being
		// started again) the call waits for the next, within its budget.
		if sv = s.acquire(ctx, sv); sv == nil {
			switch {
			case calls.Err() != nil:
				answer(schemas.CodeNodeOffline, "the remote tier is stopping")
			case ctx.Err() != nil:
				answer(schemas.CodeDeadlineExceeded, message(schemas.CodeDeadlineExceeded))
			default:
				answer(schemas.CodeNodeOffline, "the upstream is not connected")
			}
			return
		}
		rt, ok := sv.tools[tool]
		if !ok {
			sv.conn.release()
			answer(schemas.CodeToolNotFound, "the upstream does not list this tool now")
			return
		}
		res, err := sv.conn.client.Call(ctx, tool, call.Arguments, meta())
		sv.conn.release()
		if err == nil {
			reply := bus.OKReply(res)
			if max := s.t.o.NC.MaxPayload(); int64(len(reply)) > max {
				s.log.Warn("upstream result too large for NATS", "tool", call.Tool, "bytes", len(reply), "max", max)
				answer(schemas.CodeInternal, "the upstream's result is larger than okso carries")
				return
			}
			ev.Decision, ev.Duration = bus.DecisionAllowed, time.Since(start)
			s.t.o.Auditor.Record(ev)
			if isToolError(res) {
				outcome = "tool_error" // the upstream's own isError
			}
			if err := m.Respond(reply); err != nil {
				s.log.Warn("answer call", "err", err)
			}
			return
		}
		code, transient := Classify(err)
		switch {
		case calls.Err() != nil:
			answer(schemas.CodeNodeOffline, "the remote tier is stopping")
			return
		case ctx.Err() != nil:
			code, transient = schemas.CodeDeadlineExceeded, false
		}
		if transient {
			s.kickList()
		}
		left := time.Until(deadlineOf(ctx))
		if !rt.Idempotent || !transient || attempt >= maxAttempts || left <= wait {
			s.log.Debug("upstream call failed", "tool", call.Tool, "attempt", attempt, "err", scrub(err))
			answer(code, message(code))
			return
		}
		select {
		case <-ctx.Done():
			answer(schemas.CodeDeadlineExceeded, message(schemas.CodeDeadlineExceeded))
			return
		case <-time.After(wait/2 + rand.N(wait/2+1)):
		}
		wait *= 2
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// kickList asks the session to list the upstream again, to find out
// whether it is still there.
func (s *upstream) kickList() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func deadlineOf(ctx context.Context) time.Time {
	d, _ := ctx.Deadline()
	return d
}

// answer audits a refused or failed call and answers its envelope.
func (s *upstream) answer(m *nats.Msg, ev bus.AuditEvent, code, msg string) {
	ev.Decision, ev.Code, ev.Duration = bus.DecisionFor(code), code, time.Since(ev.Time)
	s.t.o.Auditor.Record(ev)
	if err := m.Respond(bus.ErrorReply(code, msg)); err != nil {
		s.log.Warn("answer call", "err", err)
	}
}

// message is what a failed upstream call tells the caller: okso's words,
// never the upstream's (DESIGN.md §5).
func message(code string) string {
	switch code {
	case schemas.CodeNodeOffline:
		return "the upstream is unreachable"
	case schemas.CodeDeadlineExceeded:
		return "the upstream did not answer within the call's budget"
	case schemas.CodeToolNotFound:
		return "the upstream does not know the tool"
	case schemas.CodeManifestInvalid:
		return "the upstream refused the arguments"
	case schemas.CodeSafetyDenied:
		return "the upstream refused okso's credentials"
	}
	return "the upstream failed"
}

// isToolError reports whether an upstream's CallToolResult is its own
// error (isError), as the MCP conventions' error.type says it.
func isToolError(res json.RawMessage) bool {
	if isErr, ok := quickIsToolError(res); ok {
		return isErr
	}
	return decodeIsToolError(res)
}

// quickIsToolError is isToolError's one pass over a result of the form
// every Client returns: a valid object, no key written twice, isError
// (if there) a boolean written exactly so. ok is false on anything else,
// which decodeIsToolError then reads; what it accepts, decodeIsToolError
// answers the same (FuzzIsToolError).
func quickIsToolError(res json.RawMessage) (isErr, ok bool) {
	ok = jsonscan.Object(res, func(k, v []byte) bool {
		if !strings.EqualFold(string(k), "isError") {
			return true
		}
		if string(k) != "isError" { // encoding/json's match, not ours
			return false
		}
		b, plain := jsonscan.Bool(v)
		isErr = b
		return plain
	})
	return isErr, ok
}

// decodeIsToolError is isToolError with encoding/json, for every result.
func decodeIsToolError(res json.RawMessage) bool {
	var r struct {
		IsError bool `json:"isError"`
	}
	return json.Unmarshal(res, &r) == nil && r.IsError
}
