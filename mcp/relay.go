package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/oklog/ulid/v2"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/internal/jsonscan"
	"github.com/okso-io/okso/internal/tracing"
	"github.com/okso-io/okso/schemas"
)

// The holder's side of the relay (DESIGN.md §9.3): the relay's own tools,
// caller_tools_listen (a listen: the push channel, held by the replica
// that took the call) and caller_tool_response (an answer, taken by the
// listen here or forwarded to the replica holding it), and the relayed
// calls each listen holds until its listener answers. The caller's side
// (the declarations, the relayed call and its wait) is callers.go.

// The relay's own tools.
const (
	ToolCallerListen   = "caller_tools_listen"
	ToolCallerResponse = "caller_tool_response"
)

// DefaultCallerTimeout bounds a relayed call (--caller-timeout).
const DefaultCallerTimeout = 60 * time.Second

// callerLogger is the logger of the relay's notifications/message.
const callerLogger = "okso.caller"

// maxWaiting bounds the relayed calls one listen holds unanswered; a call
// beyond it is E_RATE_LIMITED at once.
const maxWaiting = 256

var (
	callerIDPattern   = regexp.MustCompile(`^[a-z][a-z0-9]{0,15}$`)
	callerToolPattern = regexp.MustCompile(`^[a-z0-9_]{1,40}$`)
)

const listenSchema = `{
  "type": "object",
  "properties": {
    "caller_id": {"type": "string", "pattern": "^[a-z][a-z0-9]{0,15}$", "description": "names your tools for the others: {caller_id}_{tool}"},
    "tools": {
      "type": "array", "minItems": 1, "maxItems": 64,
      "items": {
        "type": "object",
        "properties": {
          "name": {"type": "string", "pattern": "^[a-z0-9_]{1,40}$"},
          "title": {"type": "string", "maxLength": 200},
          "description": {"type": "string", "maxLength": 4096},
          "inputSchema": {"type": "object"},
          "annotations": {"type": "object", "properties": {"readOnlyHint": {"type": "boolean"}}}
        },
        "required": ["name", "inputSchema"],
        "additionalProperties": false
      }
    }
  },
  "required": ["caller_id", "tools"],
  "additionalProperties": false
}`

const responseSchema = `{
  "type": "object",
  "properties": {
    "listen_id": {"type": "string", "minLength": 1, "maxLength": 64},
    "request_id": {"type": "string", "minLength": 1, "maxLength": 64},
    "result": {"description": "the tool's result: becomes the caller's structuredContent (an object) and text"},
    "error": {"type": "string", "maxLength": 4096, "description": "the tool failed: becomes an isError result with this text"}
  },
  "required": ["listen_id", "request_id"],
  "additionalProperties": false,
  "oneOf": [{"required": ["result"]}, {"required": ["error"]}]
}`

// relayEntries are the relay's two tools, which every tenant lists.
func (s *callers) relayEntries() ([]*entry, error) {
	var bad error // of the first schema that does not compile (a bug of okso's)
	mk := func(name, title, desc, schema string, session sessionCall, serve unaryCall) *entry {
		f, err := schemas.CompileForeign(json.RawMessage(schema))
		if err != nil && bad == nil {
			bad = fmt.Errorf("relay tool %s: %w", name, err)
		}
		no := false
		e := &entry{
			name:    name,
			class:   schemas.SafetyMutating,
			scope:   auth.ScopeMutating,
			input:   foreign{f: f},
			origin:  oksoOrigin,
			session: session,
			desc: &sdk.Tool{
				Name: name, Title: title, Description: desc, InputSchema: json.RawMessage(schema),
				Annotations: &sdk.ToolAnnotations{Title: title, DestructiveHint: &no},
			},
		}
		if serve != nil {
			e.invoker = serve
		}
		return e
	}
	entries := []*entry{
		mk(ToolCallerListen, "Offer your own tools to your tenant's agents",
			"Declares tools you implement yourself; the other agents of your tenant see them as {caller_id}_{tool}. "+
				"The call stays open: each call of one of your tools reaches you on it as a caller_tool_request "+
				"(a notifications/message of logger okso.caller, and a progress notification when you send a progressToken), "+
				"which you answer with caller_tool_response. Your tools leave every list when this call ends.",
			listenSchema, s.listen, nil),
		mk(ToolCallerResponse, "Answer a call of one of your tools",
			"Answers one caller_tool_request of your open caller_tools_listen call with its result or an error. "+
				"Each request is answered once.",
			responseSchema, nil, s.respond),
	}
	return entries, bad
}

// sessionCall serves a tool of okso's own on the gateway, after the
// call's checks (scope, arguments), through the SDK's door: it holds the
// call open, and pushes on the caller's session.
type sessionCall func(ctx context.Context, req *sdk.CallToolRequest, c *callCtx, args json.RawMessage) *sdk.CallToolResult

// unaryCall serves a tool of okso's own that answers once, after the
// call's checks: it is the tool's invoker; the door answers its result
// or error.
type unaryCall func(ctx context.Context, c *callCtx, args json.RawMessage) (json.RawMessage, *schemas.Error)

func (f unaryCall) invoke(ctx context.Context, c *callCtx, args json.RawMessage) (json.RawMessage, *schemas.Error) {
	result, e := f(ctx, c, args)
	if e != nil {
		return nil, c.fail(e.Code, e.Message)
	}
	return result, nil
}

// heldListens are the listens this gateway holds, by listen id. Safe for
// concurrent use.
type heldListens struct {
	mu   sync.Mutex
	byID map[string]*listen
}

// hold adds or removes a listen.
func (h *heldListens) hold(l *listen, add bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if add {
		h.byID[l.id] = l
	} else {
		delete(h.byID, l.id)
	}
}

// get returns the listen of an id this gateway holds, or nil.
func (h *heldListens) get(id string) *listen {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.byID[id]
}

// endAll ends every listen held: their waiting calls fail E_NODE_OFFLINE
// at once.
func (h *heldListens) endAll(reason string) {
	h.mu.Lock()
	ls := slices.Collect(maps.Values(h.byID))
	h.mu.Unlock()
	for _, l := range ls {
		l.end(reason)
	}
}

// listen is one open caller_tools_listen held by this gateway.
type listen struct {
	s        *callers
	id       string
	claims   *auth.Claims // the listener's token: revoked or expired, the listen ends
	tenant   string
	subject  string
	callerID string
	tools    map[string]bool // declared names

	events chan []byte // pushed to the listener, in order
	done   chan struct{}
	reason string // why it ended, set before done closes
	once   sync.Once

	mu       sync.Mutex
	waiting  map[string]waiting // by request id
	answered map[string]bool    // recently answered request ids (a replay is refused)
	order    []string           // answered ids, oldest first
	requests int
}

// waiting is a relayed call the listener has not answered yet.
type waiting struct {
	msg   *nats.Msg     // its request, to answer
	relay string        // its relay id, by which its caller withdraws it
	timer *time.Timer   // forgets it once its caller gave up
	span  *tracing.Span // its hop here; nil: tracing off
}

// maxAnswered bounds the answered ids a listen remembers.
const maxAnswered = 4096

// end ends the listen: its waiting calls fail at once, even while a
// push to a client that stopped reading holds the listen's loop.
func (l *listen) end(reason string) {
	l.once.Do(func() {
		l.mu.Lock()
		l.reason = reason
		close(l.done)
		l.mu.Unlock()
		l.failWaiting()
	})
}

// expired reports whether the listener's token may no longer be used:
// revoked, or past its expiry.
func (l *listen) expired() bool {
	c := l.claims
	return l.s.revoked(c) || (c.ExpiresAt != nil && !time.Now().Before(c.ExpiresAt.Time))
}

// listen serves caller_tools_listen: it checks the declaration, holds the
// listen until its call ends, and relays the calls of its tools.
func (s *callers) listen(ctx context.Context, req *sdk.CallToolRequest, c *callCtx, args json.RawMessage) *sdk.CallToolResult {
	var decl struct {
		CallerID string `json:"caller_id"`
		Tools    []struct {
			Name        string          `json:"name"`
			Title       string          `json:"title"`
			Description string          `json:"description"`
			InputSchema json.RawMessage `json:"inputSchema"`
			Annotations *struct {
				ReadOnlyHint bool `json:"readOnlyHint"`
			} `json:"annotations"`
		} `json:"tools"`
	}
	if err := json.Unmarshal(args, &decl); err != nil {
		return errorResult(c.fail(schemas.CodeManifestInvalid, "the declaration does not decode"), c.requestID)
	}
	l := &listen{
		s: s, id: strings.ToLower(ulid.Make().String()),
		claims: c.claims, tenant: c.claims.Tenant, subject: c.claims.Subject, callerID: decl.CallerID,
		tools:   map[string]bool{},
		events:  make(chan []byte, maxWaiting+1),
		done:    make(chan struct{}),
		waiting: map[string]waiting{}, answered: map[string]bool{},
	}
	if !validCallerID(decl.CallerID) {
		return errorResult(c.fail(schemas.CodeManifestInvalid, "caller_id "+decl.CallerID+" is one of okso's own namespaces"), c.requestID)
	}
	rec := &bus.Caller{ListenID: l.id, Tenant: l.tenant, Subject: l.subject, CallerID: decl.CallerID, Since: time.Now().UTC()}
	var names []string
	for i, t := range decl.Tools {
		if l.tools[t.Name] {
			return errorResult(c.fail(schemas.CodeManifestInvalid, fmt.Sprintf("tools[%d]: the name %s is declared twice", i, t.Name)), c.requestID)
		}
		ct := bus.CallerTool{Name: t.Name, Description: t.Description, InputSchema: t.InputSchema, ReadOnly: t.Annotations != nil && t.Annotations.ReadOnlyHint}
		if t.Description == "" {
			ct.Description = t.Title
		}
		if _, err := s.entry(rec, ct); err != nil {
			why := "is no JSON Schema object okso can check"
			var past *schemas.BoundError
			if errors.As(err, &past) {
				why = "is past a bound: " + past.Error()
			}
			return errorResult(c.fail(schemas.CodeManifestInvalid, fmt.Sprintf("tools[%d] (%s): its inputSchema %s", i, t.Name, why)), c.requestID)
		}
		l.tools[t.Name] = true
		rec.Tools = append(rec.Tools, ct)
		names = append(names, decl.CallerID+"_"+t.Name)
	}
	if req.Params.GetProgressToken() == nil {
		// Progress notifications reach every client on every revision;
		// notifications/message only those that set a log level.
		return errorResult(c.fail(schemas.CodeBadRequest, "a listen needs a progressToken in _meta: each request comes as a progress notification"), c.requestID)
	}
	c.ev.Caller = decl.CallerID
	if !s.takeSlot(l.tenant) {
		return errorResult(c.fail(schemas.CodeRateLimited, "the tenant holds as many open streams as it may"), c.requestID)
	}
	defer s.releaseSlot(l.tenant)
	// The listen ends when its client cancels it or hangs up.
	ctx, stop := s.cancellable(ctx, c.claims, nil)
	defer stop()
	reqSub, err := s.nc.Subscribe(bus.CallerReq(l.id), l.onRequest)
	if err != nil {
		return errorResult(c.fail(schemas.CodeInternal, "message bus unavailable"), c.requestID)
	}
	defer reqSub.Unsubscribe()
	respSub, err := s.nc.Subscribe(bus.CallerResp(l.id), l.onResponse)
	if err == nil {
		err = s.nc.FlushTimeout(5 * time.Second)
	}
	if err != nil {
		return errorResult(c.fail(schemas.CodeInternal, "message bus unavailable"), c.requestID)
	}
	defer respSub.Unsubscribe()
	// The caller id is this agent's only once its claim is written in
	// NATS: of two agents claiming it at once, on any replicas, one is
	// refused. The listen already hears a newer one that takes it over.
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	idClaim, err := s.bucket.Claim(pctx, bus.CallerClaim{ListenID: l.id, Tenant: l.tenant, Subject: l.subject, CallerID: l.callerID})
	cancel()
	switch {
	case errors.Is(err, bus.ErrCallerHeld):
		return errorResult(c.fail(schemas.CodeSafetyDenied, "caller_id "+l.callerID+" is held by another agent of the tenant"), c.requestID)
	case err != nil:
		s.log.Error("caller id claim", "caller_id", l.callerID, "err", err)
		return errorResult(c.fail(schemas.CodeInternal, "message bus unavailable"), c.requestID)
	}
	defer func() { // after the declaration is deleted: the next holder's tools never sit beside ours
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := idClaim.Release(dctx); err != nil {
			s.log.Warn("caller id claim not released; it lapses with its lease", "listen_id", l.id, "err", err)
		}
	}()
	s.replaceListens(ctx, l.tenant, l.callerID, l.subject, idClaim.Replaced())
	pctx, cancel = context.WithTimeout(ctx, 5*time.Second)
	err = s.bucket.Put(pctx, rec)
	cancel()
	if err != nil {
		s.log.Error("caller declaration", "err", err)
		return errorResult(c.fail(schemas.CodeInternal, "message bus unavailable"), c.requestID)
	}
	s.held.hold(l, true)
	defer s.held.hold(l, false)
	defer func() { // the tools leave every list now, not at the lease's end
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := s.bucket.Delete(dctx, l.id); err != nil {
			s.log.Warn("caller declaration not removed; it expires with its lease", "listen_id", l.id, "err", err)
		}
	}()
	defer l.failWaiting()
	c.audit(bus.DecisionAllowed, "")

	out := &pusher{session: req.Session, token: req.Params.GetProgressToken()}
	ready, _ := json.Marshal(map[string]any{"type": "caller_tools_ready", "listen_id": l.id, "tools": names})
	if err := out.push(ctx, ready); err != nil {
		l.end("the client went away")
	}
	// The lease (the claim's and the declaration's) is refreshed on a
	// goroutine of its own: a push to a client that stopped reading must
	// not let the declaration expire while the listen holds calls.
	leased := make(chan struct{})
	go func() {
		defer close(leased)
		lease := time.NewTicker(s.bucket.TTL() / 3)
		defer lease.Stop()
		for {
			select {
			case <-l.done:
				return
			case <-lease.C:
			}
			if l.expired() {
				l.end("the listener's token was revoked or expired")
				return
			}
			if !l.refresh(ctx, idClaim, rec) {
				return
			}
		}
	}()
	defer func() { <-leased }() // before the declaration and the claim are deleted
	// A ping now and then keeps proxies and clients from cutting an idle
	// listen (and resets the timeout of clients that reset it on
	// progress).
	ping := time.NewTicker(s.ping)
	defer ping.Stop()
	for {
		var ev []byte
		select {
		case <-ctx.Done():
			l.end("the listen call ended")
		case <-l.done:
		case ev = <-l.events:
		case <-ping.C:
			ev = []byte(`{"type":"caller_ping"}`)
		}
		if ev == nil {
			break
		}
		if err := out.push(ctx, ev); err != nil {
			l.end("the client went away")
		}
	}
	l.mu.Lock()
	n := l.requests
	l.mu.Unlock()
	b, _ := json.Marshal(map[string]any{"listen_id": l.id, "reason": l.reason, "requests": n})
	return &sdk.CallToolResult{
		Meta:              sdk.Meta{MetaRequestID: c.requestID},
		Content:           []sdk.Content{&sdk.TextContent{Text: string(b)}},
		StructuredContent: json.RawMessage(b),
	}
}

// refresh renews the listen's claim, then its declaration; it reports
// false, having ended the listen, when the claim is no longer the
// listen's (another listen took it over, or it lapsed): the caller id is
// no longer this listen's to serve.
func (l *listen) refresh(ctx context.Context, idClaim *bus.CallerLease, rec *bus.Caller) bool {
	ttl := l.s.bucket.TTL()
	pctx, cancel := context.WithTimeout(ctx, ttl/3)
	defer cancel()
	switch err := idClaim.Refresh(pctx); {
	case errors.Is(err, bus.ErrClaimLost):
		l.end("the listen's claim of its caller_id was taken over or lapsed")
		return false
	case err != nil:
		l.s.log.Warn("caller id claim not refreshed", "listen_id", l.id, "err", err)
	}
	if err := l.s.bucket.Put(pctx, rec); err != nil {
		l.s.log.Warn("caller declaration not refreshed", "listen_id", l.id, "err", err)
	}
	return true
}

// replaceListens ends the listen whose claim of a caller id the new one
// took over (replaced, "" when none), and every other listen of the
// caller id in the tenant by the same token subject that this gateway
// knows of: the new one replaces them (their waiting calls fail
// E_NODE_OFFLINE at once).
func (s *callers) replaceListens(ctx context.Context, tenant, callerID, subject, replaced string) {
	s.mu.Lock()
	var old []string
	if validListenID(replaced) { // read from NATS: a subject token only if it is one
		old = append(old, replaced)
	}
	for id, lc := range s.decls {
		if id != replaced && lc.rec.Tenant == tenant && lc.rec.CallerID == callerID && lc.rec.Subject == subject {
			old = append(old, id)
		}
	}
	s.mu.Unlock()
	for _, id := range old {
		msg := &nats.Msg{Subject: bus.CallerResp(id), Header: nats.Header{bus.HeaderControl: {bus.ControlReplaced},
			bus.HeaderTenant: {tenant}, bus.HeaderSubject: {subject}}}
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if _, err := s.nc.RequestMsgWithContext(rctx, msg); err != nil && !errors.Is(err, nats.ErrNoResponders) {
			s.log.Debug("replace listen", "listen_id", id, "err", err)
		}
		cancel()
	}
}

// onRequest takes one relayed call of the listen's tools.
func (l *listen) onRequest(m *nats.Msg) {
	if r := l.s.relayers; r != nil && !bus.FromRole(m, r...) {
		return // no gateway's
	}
	// The relayed call's hop at the replica holding the listen: a child
	// of the calling gateway's span, continued by the listener through
	// the event's _meta.traceparent.
	span, traceparent := l.s.tracer.Start(context.Background(), m.Header.Get(bus.HeaderTraceparent), tracing.Name("tools/call", callerTemplate),
		trace.SpanKindServer, attribute.String("mcp.method.name", "tools/call"), attribute.String("gen_ai.tool.name", callerTemplate),
		attribute.String("gen_ai.operation.name", "execute_tool"), attribute.String("okso.request_id", m.Header.Get(bus.HeaderRequestID)))
	fail := func(code, msg string) {
		span.End(code)
		l.reply(m, bus.ErrorReply(code, msg))
	}
	if l.expired() {
		l.end("the listener's token was revoked or expired")
		fail(schemas.CodeNodeOffline, "the caller's listen ended")
		return
	}
	if m.Header.Get(bus.HeaderTenant) != l.tenant {
		fail(schemas.CodeSafetyDenied, "tool belongs to another tenant")
		return
	}
	call, err := bus.DecodeCall(m.Data)
	if err != nil {
		fail(schemas.CodeBadRequest, "malformed call")
		return
	}
	tool, ok := strings.CutPrefix(call.Tool, l.callerID+"_")
	if !ok || !l.tools[tool] {
		fail(schemas.CodeToolNotFound, "the caller does not declare this tool")
		return
	}
	id := strings.ToLower(ulid.Make().String())
	if span == nil {
		traceparent = "" // the event carries a trace context only when okso traces
	}
	ev, err := requestEvent(id, tool, call.Arguments, traceparent)
	if err != nil {
		fail(schemas.CodeBadRequest, "arguments do not encode")
		return
	}
	l.mu.Lock()
	if len(l.waiting) >= maxWaiting {
		l.mu.Unlock()
		fail(schemas.CodeRateLimited, "the caller has too many calls waiting")
		return
	}
	select {
	case <-l.done:
		l.mu.Unlock()
		fail(schemas.CodeNodeOffline, "the caller's listen ended")
		return
	default:
	}
	select {
	case l.events <- ev:
	default: // the listener reads too slowly (calls given up still queued)
		l.mu.Unlock()
		fail(schemas.CodeRateLimited, "the caller has too many calls waiting")
		return
	}
	budget := l.s.timeout
	if ms, err := strconv.ParseInt(m.Header.Get(bus.HeaderBudgetMs), 10, 64); err == nil && ms > 0 && time.Duration(ms)*time.Millisecond < budget {
		budget = time.Duration(ms) * time.Millisecond
	}
	l.waiting[id] = waiting{msg: m, relay: m.Header.Get(bus.HeaderRelayID), span: span, timer: time.AfterFunc(budget, func() { l.forget(id) })}
	l.requests++
	l.mu.Unlock()
}

// callerTemplate is every caller tool's template (gen_ai.tool.name).
const callerTemplate = "caller.*"

// forget drops a waiting call whose caller gave up.
func (l *listen) forget(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if w, ok := l.waiting[id]; ok {
		w.span.End(schemas.CodeDeadlineExceeded)
		delete(l.waiting, id)
	}
}

func (l *listen) reply(m *nats.Msg, data []byte) {
	if err := m.Respond(data); err != nil {
		l.s.log.Debug("answer relayed call", "err", err)
	}
}

// withdraw drops the waiting call of a relay id, whose caller gave up,
// and tells the listener so (caller_tool_cancelled): an answer to it is
// refused as unknown.
func (l *listen) withdraw(relay string) {
	if relay == "" {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for id, w := range l.waiting {
		if w.relay != relay {
			continue
		}
		w.timer.Stop()
		w.span.End("", attribute.Bool("okso.cancelled", true))
		delete(l.waiting, id)
		ev, _ := json.Marshal(map[string]string{"type": "caller_tool_cancelled", "request_id": id})
		select {
		case l.events <- ev:
		default: // the listener reads too slowly; its answer will be refused
		}
		return
	}
}

// failWaiting ends every waiting call: the listen is over.
func (l *listen) failWaiting() {
	l.mu.Lock()
	all := l.waiting
	l.waiting = map[string]waiting{}
	l.mu.Unlock()
	for _, w := range all {
		w.timer.Stop()
		w.span.End(schemas.CodeNodeOffline)
		l.reply(w.msg, bus.ErrorReply(schemas.CodeNodeOffline, "the caller's listen ended"))
	}
}

// answer is a caller_tool_response.
type answer struct {
	RequestID string          `json:"request_id"`
	Result    json.RawMessage `json:"result,omitempty"`
	Error     *string         `json:"error,omitempty"`
}

// encode writes the answer for the replica holding its listen, its
// result as the listener wrote it: json.Marshal would compact it and
// escape HTML in it, and the text the caller gets would then depend on
// the replica the answer came in by.
func (a answer) encode() []byte {
	b := make([]byte, 0, len(a.RequestID)+len(a.Result)+64)
	b = append(b, `{"request_id":`...)
	b = jsonscan.AppendString(b, a.RequestID)
	if len(a.Result) > 0 {
		b = append(b, `,"result":`...)
		b = append(b, a.Result...)
	}
	if a.Error != nil {
		b = append(b, `,"error":`...)
		b = jsonscan.AppendString(b, *a.Error)
	}
	return append(b, '}')
}

// take answers a waiting call, for the token (tenant, subject) that sent
// the response; a non-nil error says why not.
func (l *listen) take(tenant, subject string, a answer) *schemas.Error {
	if tenant != l.tenant || subject != l.subject {
		return schemas.NewError(schemas.CodeSafetyDenied, "only the listener may answer its requests")
	}
	reply := bus.OKReply(relayedResult(a))
	if max := l.s.nc.MaxPayload(); int64(len(reply)) > max {
		// Refused before it is taken: the call still waits for an answer
		// okso can carry.
		return schemas.NewError(schemas.CodeBadRequest, fmt.Sprintf("the answer takes %d bytes relayed, more than the %d okso carries", len(reply), max))
	}
	l.mu.Lock()
	w, ok := l.waiting[a.RequestID]
	if ok {
		w.timer.Stop()
		delete(l.waiting, a.RequestID)
		l.answered[a.RequestID] = true
		l.order = append(l.order, a.RequestID)
		if len(l.order) > maxAnswered {
			delete(l.answered, l.order[0])
			l.order = l.order[1:]
		}
	}
	replay := l.answered[a.RequestID] && !ok
	l.mu.Unlock()
	switch {
	case replay:
		return schemas.NewError(schemas.CodeBadRequest, "this request was answered already")
	case !ok:
		return schemas.NewError(schemas.CodeBadRequest, "no such request is waiting: unknown, or its caller gave up")
	}
	if a.Error != nil {
		w.span.End("tool_error") // the listener's own error
	} else {
		w.span.End("")
	}
	l.reply(w.msg, reply)
	return nil
}

// requestEvent is the caller_tool_request event of one relayed call:
// {"type":"caller_tool_request","request_id","tool","arguments"} and,
// when the call is traced, "_meta":{"traceparent"}, as json.Marshal
// writes that map (keys sorted), by hand when each part is written as it
// is.
func requestEvent(id, tool string, args json.RawMessage, traceparent string) ([]byte, error) {
	if !jsonscan.HTMLSafe(id) || !jsonscan.HTMLSafe(tool) || !jsonscan.MarshalsAsIs(args) || !jsonscan.HTMLSafe(traceparent) {
		ev := map[string]any{"type": "caller_tool_request", "request_id": id, "tool": tool, "arguments": args}
		if traceparent != "" {
			ev["_meta"] = map[string]string{schemas.MetaTraceparent: traceparent}
		}
		return json.Marshal(ev)
	}
	b := make([]byte, 0, len(args)+len(id)+len(tool)+len(traceparent)+96)
	b = append(b, '{')
	if traceparent != "" {
		b = append(b, `"_meta":{"`+schemas.MetaTraceparent+`":"`...)
		b = append(b, traceparent...)
		b = append(b, `"},`...)
	}
	b = append(b, `"arguments":`...)
	b = append(b, args...)
	b = append(b, `,"request_id":"`...)
	b = append(b, id...)
	b = append(b, `","tool":"`...)
	b = append(b, tool...)
	return append(b, `","type":"caller_tool_request"}`...), nil
}

// relayedResult is the CallToolResult of an answered relayed call: the
// result as structuredContent (an object) and text, or the error as an
// isError result. It is written as json.Marshal writes the map
// {content: [{type, text}], isError | structuredContent} (keys sorted),
// by hand when the result is written as it is.
func relayedResult(a answer) json.RawMessage {
	structured := a.Error == nil && strings.HasPrefix(strings.TrimSpace(string(a.Result)), "{")
	if structured && !jsonscan.MarshalsAsIs(a.Result) {
		return marshalRelayedResult(a)
	}
	b := make([]byte, 0, 2*len(a.Result)+64)
	b = append(b, `{"content":[{"text":`...)
	if a.Error != nil {
		b = jsonscan.AppendString(b, *a.Error)
		return append(b, `,"type":"text"}],"isError":true}`...)
	}
	b = jsonscan.AppendString(b, []byte(a.Result))
	b = append(b, `,"type":"text"}]`...)
	if structured {
		b = append(b, `,"structuredContent":`...)
		b = append(b, a.Result...)
	}
	return append(b, '}')
}

// marshalRelayedResult is relayedResult by json.Marshal.
func marshalRelayedResult(a answer) json.RawMessage {
	var res map[string]any
	if a.Error != nil {
		res = map[string]any{"content": []any{map[string]any{"type": "text", "text": *a.Error}}, "isError": true}
	} else {
		res = map[string]any{"content": []any{map[string]any{"type": "text", "text": string(a.Result)}}}
		if t := strings.TrimSpace(string(a.Result)); strings.HasPrefix(t, "{") {
			res["structuredContent"] = a.Result
		}
	}
	b, _ := json.Marshal(res)
	return b
}

// acceptedResult is caller_tool_response's result: {"accepted":true,
// "request_id"} as json.Marshal writes that map.
func acceptedResult(requestID string) json.RawMessage {
	b := make([]byte, 0, len(requestID)+32)
	b = append(b, `{"accepted":true,"request_id":`...)
	b = jsonscan.AppendString(b, requestID)
	return append(b, '}')
}

// onResponse takes a response forwarded by another replica, or a newer
// listen's notice that it replaces this one.
func (l *listen) onResponse(m *nats.Msg) {
	if m.Header.Get(bus.HeaderControl) == bus.ControlCancelled { // published, no request
		if m.Header.Get(bus.HeaderTenant) == l.tenant && !bus.FromJetStream(m) {
			l.withdraw(m.Header.Get(bus.HeaderRelayID))
		}
		return
	}
	if r := l.s.relayers; r != nil && !bus.FromRole(m, r...) {
		return // no gateway's
	}
	if m.Header.Get(bus.HeaderControl) == bus.ControlReplaced {
		if m.Header.Get(bus.HeaderTenant) == l.tenant && m.Header.Get(bus.HeaderSubject) == l.subject {
			l.end("a newer listen of the same caller_id replaced it")
		}
		l.reply(m, bus.OKReply(json.RawMessage(`{}`)))
		return
	}
	var a answer
	if err := json.Unmarshal(m.Data, &a); err != nil || (a.Error == nil && len(a.Result) == 0) {
		l.reply(m, bus.ErrorReply(schemas.CodeBadRequest, "malformed response"))
		return
	}
	if e := l.take(m.Header.Get(bus.HeaderTenant), m.Header.Get(bus.HeaderSubject), a); e != nil {
		l.reply(m, bus.ErrorReply(e.Code, e.Message))
		return
	}
	l.reply(m, bus.OKReply(json.RawMessage(`{}`)))
}

// respond serves caller_tool_response: to the listen when this gateway
// holds it, forwarded to the replica that does otherwise.
func (s *callers) respond(ctx context.Context, c *callCtx, args json.RawMessage) (json.RawMessage, *schemas.Error) {
	var in struct {
		ListenID string `json:"listen_id"`
		answer
	}
	if err := json.Unmarshal(args, &in); err != nil {
		return nil, schemas.NewError(schemas.CodeManifestInvalid, "the response does not decode")
	}
	l := s.held.get(in.ListenID)
	s.mu.Lock()
	if lc := s.decls[in.ListenID]; lc != nil && lc.rec.Tenant == c.claims.Tenant {
		c.ev.Caller = lc.rec.CallerID // the answer's audit names the caller it answers for
	}
	s.mu.Unlock()
	var e *schemas.Error
	if l != nil {
		e = l.take(c.claims.Tenant, c.claims.Subject, in.answer)
	} else {
		e = s.forwardResponse(ctx, c, in.ListenID, in.answer)
	}
	if e != nil {
		return nil, e
	}
	return acceptedResult(in.RequestID), nil
}

// forwardResponse sends a response to the replica holding its listen.
func (s *callers) forwardResponse(ctx context.Context, c *callCtx, listenID string, a answer) *schemas.Error {
	if !validListenID(listenID) {
		return schemas.NewError(schemas.CodeBadRequest, "no such listen is open")
	}
	body := a.encode()
	if max := s.nc.MaxPayload(); int64(2*len(body)) > max { // relayed, the result is written twice
		return schemas.NewError(schemas.CodeBadRequest, fmt.Sprintf("the answer is larger than the %d bytes okso carries", max))
	}
	msg := &nats.Msg{Subject: bus.CallerResp(listenID), Data: body, Header: nats.Header{}}
	msg.Header.Set(bus.HeaderTenant, c.claims.Tenant)
	msg.Header.Set(bus.HeaderSubject, c.claims.Subject)
	msg.Header.Set(bus.HeaderRequestID, c.requestID)
	rctx, cancel := context.WithTimeout(ctx, s.budget)
	defer cancel()
	resp, err := s.nc.RequestMsgWithContext(rctx, msg)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return schemas.NewError(schemas.CodeNodeOffline, "no such listen is open")
	case err != nil:
		return schemas.NewError(schemas.CodeInternal, "message bus unavailable")
	}
	rep, err := bus.DecodeReply(resp.Data)
	if err != nil {
		return schemas.NewError(schemas.CodeInternal, "malformed reply from the replica holding the listen")
	}
	if !rep.OK && rep.Error != nil {
		return schemas.NewError(rep.Error.Code, trimASCII(rep.Error.Message, 200))
	}
	return nil
}

// validListenID reports whether s can be a listen id (a subject token).
func validListenID(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// pusher sends the relay's events on the listen call: as a
// notifications/message of logger okso.caller (which the SDK sends only
// to a client that set a log level) and, when the call carried a
// progressToken, as a progress notification.
type pusher struct {
	session *sdk.ServerSession
	token   any
	n       float64
}

func (p *pusher) push(ctx context.Context, ev []byte) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	//lint:ignore SA1019 deprecated from 2026-07-28; DESIGN.md §9.3 names notifications/message, and 2025 clients read it
	if err := p.session.Log(ctx, &sdk.LoggingMessageParams{Logger: callerLogger, Level: "info", Data: json.RawMessage(ev)}); err != nil {
		return err
	}
	if p.token == nil {
		return nil
	}
	p.n++
	return p.session.NotifyProgress(ctx, &sdk.ProgressNotificationParams{ProgressToken: p.token, Progress: p.n, Message: string(ev)})
}
