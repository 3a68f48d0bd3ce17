package roles

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/internal/bearer"
	"github.com/okso-io/okso/mcp"
	"github.com/okso-io/okso/schemas"
)

// relayEvent is one event pushed on a listen call.
type relayEvent struct {
	Type      string          `json:"type"`
	ListenID  string          `json:"listen_id"`
	Tools     []string        `json:"tools"`
	RequestID string          `json:"request_id"`
	Tool      string          `json:"tool"`
	Arguments json.RawMessage `json:"arguments"`
	Meta      struct {
		Traceparent string `json:"traceparent"`
	} `json:"_meta"`
}

// listener is an agent holding a caller_tools_listen call.
type listener struct {
	events <-chan relayEvent
	id     string // the listen id
	done   <-chan *sdk.CallToolResult
	stop   context.CancelFunc
}

// relayClient connects an MCP client to url whose progress notifications
// (the relay's events) arrive on events.
func (f *fixture) relayClient(url, token string, events chan<- relayEvent) *sdk.ClientSession {
	f.t.Helper()
	c := sdk.NewClient(&sdk.Implementation{Name: "okso-test", Version: "1"}, &sdk.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *sdk.ProgressNotificationClientRequest) {
			var ev relayEvent
			if json.Unmarshal([]byte(req.Params.Message), &ev) == nil && events != nil {
				events <- ev
			}
		},
	})
	tr := &sdk.StreamableClientTransport{
		Endpoint:   url,
		HTTPClient: &http.Client{Transport: bearer.Transport{Token: token, Base: http.DefaultTransport}},
		MaxRetries: -1,
	}
	s, err := c.Connect(f.t.Context(), tr, &sdk.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		f.t.Fatalf("connect MCP client: %v", err)
	}
	f.t.Cleanup(func() { _ = s.Close() })
	return s
}

// listen opens caller_tools_listen on url and returns once it is ready.
func (f *fixture) listen(url, token string, decl string) *listener {
	f.t.Helper()
	events := make(chan relayEvent, 256)
	s := f.relayClient(url, token, events)
	ctx, stop := context.WithCancel(f.t.Context())
	done := make(chan *sdk.CallToolResult, 1)
	go func() {
		res, err := s.CallTool(ctx, &sdk.CallToolParams{Name: mcp.ToolCallerListen, Arguments: json.RawMessage(decl),
			Meta: sdk.Meta{"progressToken": "listen"}})
		if err != nil {
			res = &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{Text: err.Error()}}}
		}
		done <- res
	}()
	f.t.Cleanup(stop)
	select {
	case ev := <-events:
		if ev.Type != "caller_tools_ready" || ev.ListenID == "" {
			f.t.Fatalf("first event %+v, want caller_tools_ready", ev)
		}
		return &listener{events: events, id: ev.ListenID, done: done, stop: stop}
	case res := <-done:
		f.t.Fatalf("listen ended before it was ready: %+v", res.Content)
	case <-time.After(10 * time.Second):
		f.t.Fatal("listen never ready")
	}
	return nil
}

// next returns the listener's next event.
func (l *listener) next(t *testing.T) relayEvent {
	t.Helper()
	select {
	case ev := <-l.events:
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no relayed request reached the listener")
	}
	return relayEvent{}
}

const twoTools = `{"caller_id":"a","tools":[
	{"name":"send","description":"Sends a message.","inputSchema":{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}},
	{"name":"recall","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true}}]}`

// waitTool waits until gw lists (or no longer lists) a tool for tenant.
func waitTool(t *testing.T, gw *mcp.Gateway, tenant, name string, listed bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := gw.Wait(ctx, func(map[string]int) bool { return gw.Catalog().Has(tenant, name) == listed }); err != nil {
		t.Fatalf("%s listed = %v never came", name, listed)
	}
}

// answeredBy calls a_send through b, has listener l answer it with a
// token of its agent, and checks that the caller got the answer.
func (f *fixture) answeredBy(t *testing.T, b *sdk.ClientSession, l *listener, tok, by string) {
	t.Helper()
	out := make(chan *sdk.CallToolResult, 1)
	go func() {
		r, _ := b.CallTool(t.Context(), &sdk.CallToolParams{Name: "a_send", Arguments: json.RawMessage(`{"text":"y"}`)})
		out <- r
	}()
	ev := l.next(t)
	respond(t, f.relayClient(f.a.MCPURL(), tok, nil), l.id, ev.RequestID, `"result":{"by":"`+by+`"}`)
	if r := <-out; r == nil || r.IsError {
		t.Errorf("the call answered by the %s listen: %+v", by, r)
	}
}

func respond(t *testing.T, s *sdk.ClientSession, listenID, requestID, body string) *sdk.CallToolResult {
	t.Helper()
	args := fmt.Sprintf(`{"listen_id":%q,"request_id":%q,%s}`, listenID, requestID, body)
	res, err := s.CallTool(t.Context(), &sdk.CallToolParams{Name: mcp.ToolCallerResponse, Arguments: json.RawMessage(args)})
	if err != nil {
		t.Fatalf("caller_tool_response: %v", err)
	}
	return res
}

// TestRelay: A listens on one replica with two tools; B, another token of
// the tenant, lists and calls them on another; A gets each request and
// answers on B's replica; B gets A's result.
func TestRelay(t *testing.T) {
	f := startAllInOne(t, 0, nil)
	second := f.secondGateway(gatewayConfig{})
	mutating := []string{auth.ScopeMutating}
	tokA := f.token(auth.MintOptions{Subject: "agent-a", Scopes: mutating})
	tokB := f.token(auth.MintOptions{Subject: "agent-b", Scopes: mutating})
	a := f.listen(f.a.MCPURL(), tokA, twoTools)
	answerer := f.relayClient(second.url(), tokA, nil)
	b := f.relayClient(second.url(), tokB, nil)
	waitTool(t, second.gw, DefaultTenant, "a_send", true)
	waitTool(t, second.gw, DefaultTenant, "a_recall", true)

	call := func(tool, args string) <-chan *sdk.CallToolResult {
		out := make(chan *sdk.CallToolResult, 1)
		go func() {
			res, err := b.CallTool(t.Context(), &sdk.CallToolParams{Name: tool, Arguments: json.RawMessage(args)})
			if err != nil {
				res = &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{Text: err.Error()}}}
			}
			out <- res
		}()
		return out
	}
	wait := func(ch <-chan *sdk.CallToolResult) *sdk.CallToolResult {
		t.Helper()
		select {
		case res := <-ch:
			return res
		case <-time.After(10 * time.Second):
			t.Fatal("the relayed call never ended")
		}
		return nil
	}

	t.Run("listed with the declared safety", func(t *testing.T) {
		lt, err := b.ListTools(t.Context(), nil)
		if err != nil {
			t.Fatal(err)
		}
		found := map[string]*sdk.Tool{}
		for _, tl := range lt.Tools {
			found[tl.Name] = tl
		}
		if found["a_send"] == nil || found["a_recall"] == nil || found[mcp.ToolCallerListen] == nil {
			t.Fatalf("B lists %v", lt.Tools)
		}
		if found["a_send"].Annotations.ReadOnlyHint || !found["a_recall"].Annotations.ReadOnlyHint {
			t.Errorf("readOnlyHint of a_send %v, a_recall %v", found["a_send"].Annotations, found["a_recall"].Annotations)
		}
	})
	t.Run("a call relayed and answered on another replica", func(t *testing.T) {
		audit, err := f.nc.SubscribeSync(bus.Audit(DefaultTenant))
		if err != nil {
			t.Fatal(err)
		}
		defer audit.Unsubscribe()
		res := call("a_send", `{"text":"hi"}`)
		ev := a.next(t)
		if ev.Type != "caller_tool_request" || ev.Tool != "send" || string(ev.Arguments) != `{"text":"hi"}` {
			t.Fatalf("A got %+v", ev)
		}
		if ack := respond(t, answerer, a.id, ev.RequestID, `"result":{"sent":true}`); ack.IsError {
			t.Fatalf("A's answer refused: %v", ack.Content)
		}
		got := wait(res)
		if got.IsError {
			t.Fatalf("B's call failed: %v", got.Content)
		}
		if b, _ := json.Marshal(got.StructuredContent); string(b) != `{"sent":true}` {
			t.Errorf("B got %s, want A's result", b)
		}
		// Both the call and the answer are audited, naming the caller,
		// never with the arguments or the result.
		want := map[string]string{"a_send": "agent-b", mcp.ToolCallerResponse: "agent-a"}
		for len(want) > 0 {
			m, err := audit.NextMsg(10 * time.Second)
			if err != nil {
				t.Fatalf("audit events still missing: %v", want)
			}
			var ev bus.AuditEvent
			if err := json.Unmarshal(m.Data, &ev); err != nil {
				t.Fatal(err)
			}
			if subject, ok := want[ev.Tool]; ok && ev.Subject == subject && ev.Decision == bus.DecisionAllowed {
				if ev.Caller != "a" {
					t.Errorf("audit of %s names caller %q, want a", ev.Tool, ev.Caller)
				}
				if strings.Contains(string(m.Data), `"hi"`) || strings.Contains(string(m.Data), `"sent"`) {
					t.Errorf("audit event carries arguments or results: %s", m.Data)
				}
				delete(want, ev.Tool)
			}
		}
		t.Run("a replayed answer is refused", func(t *testing.T) {
			ack := respond(t, answerer, a.id, ev.RequestID, `"result":{"sent":true}`)
			if e := envelope(t, ack); e.Code != schemas.CodeBadRequest {
				t.Errorf("replay: %s, want E_BAD_REQUEST", e.JSON())
			}
		})
	})
	t.Run("an error answer", func(t *testing.T) {
		res := call("a_recall", `{}`)
		ev := a.next(t)
		respond(t, answerer, a.id, ev.RequestID, `"error":"nothing to recall"`)
		got := wait(res)
		if !got.IsError || len(got.Content) != 1 || got.Content[0].(*sdk.TextContent).Text != "nothing to recall" {
			t.Errorf("B got %+v, want isError with A's text", got.Content)
		}
	})
	t.Run("invalid arguments never reach A", func(t *testing.T) {
		got := wait(call("a_send", `{}`))
		if e := envelope(t, got); e.Code != schemas.CodeManifestInvalid {
			t.Errorf("invalid arguments: %s", e.JSON())
		}
		res := call("a_send", `{"text":"second"}`)
		if ev := a.next(t); string(ev.Arguments) != `{"text":"second"}` {
			t.Errorf("A got %s first, want only the valid call", ev.Arguments)
		} else {
			respond(t, answerer, a.id, ev.RequestID, `"result":{}`)
		}
		wait(res)
	})
	t.Run("only the listener may answer", func(t *testing.T) {
		res := call("a_send", `{"text":"x"}`)
		ev := a.next(t)
		if e := envelope(t, respond(t, b, a.id, ev.RequestID, `"result":{"forged":true}`)); e.Code != schemas.CodeSafetyDenied {
			t.Errorf("B answering A's request: %s, want E_SAFETY_DENIED", e.JSON())
		}
		respond(t, answerer, a.id, ev.RequestID, `"result":{"sent":true}`)
		if got := wait(res); got.IsError {
			t.Errorf("after a forged answer: %v", got.Content)
		}
	})
	t.Run("a bad declaration registers nothing", func(t *testing.T) {
		s := f.relayClient(second.url(), tokA, nil)
		for name, decl := range map[string]string{
			"okso's own namespace": `{"caller_id":"caller","tools":[{"name":"tools_listen","inputSchema":{"type":"object"}}]}`,
			"a bad caller id":      `{"caller_id":"A-1","tools":[{"name":"x","inputSchema":{"type":"object"}}]}`,
			"no tools":             `{"caller_id":"c","tools":[]}`,
			"a name twice":         `{"caller_id":"c","tools":[{"name":"x","inputSchema":{"type":"object"}},{"name":"x","inputSchema":{"type":"object"}}]}`,
			"a schema not object":  `{"caller_id":"c","tools":[{"name":"x","inputSchema":{"type":"string"}}]}`,
			"a schema that breaks": `{"caller_id":"c","tools":[{"name":"x","inputSchema":{"type":"object","properties":{"a":{"type":"nope"}}}}]}`,
			"65 tools":             `{"caller_id":"c","tools":[` + strings.Repeat(`{"name":"x","inputSchema":{"type":"object"}},`, 64) + `{"name":"y","inputSchema":{"type":"object"}}]}`,
		} {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second) // an accepted one would stay open
			res, err := s.CallTool(ctx, &sdk.CallToolParams{Name: mcp.ToolCallerListen, Arguments: json.RawMessage(decl)})
			cancel()
			if err != nil {
				t.Fatalf("%s: %v (accepted?)", name, err)
			}
			if e := envelope(t, res); e.Code != schemas.CodeManifestInvalid {
				t.Errorf("%s: %s, want E_MANIFEST_INVALID", name, e.JSON())
			}
		}
		if second.gw.Listens().Of(DefaultTenant, "c") != "" || second.gw.Listens().Of(DefaultTenant, "caller") != "" {
			t.Error("a refused declaration was registered")
		}
	})
	t.Run("another tenant neither lists nor calls", func(t *testing.T) {
		other := f.relayClient(second.url(), f.token(auth.MintOptions{Tenant: "other", Scopes: mutating}), nil)
		lt, err := other.ListTools(t.Context(), nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, tl := range lt.Tools {
			if tl.Name == "a_send" {
				t.Fatal("another tenant lists a_send")
			}
		}
		res, err := other.CallTool(t.Context(), &sdk.CallToolParams{Name: "a_send", Arguments: json.RawMessage(`{"text":"x"}`)})
		if err == nil && !res.IsError {
			t.Fatal("another tenant called a_send")
		}
	})
	t.Run("100 concurrent calls, each answered once", func(t *testing.T) {
		const n = 100
		results := make([]<-chan *sdk.CallToolResult, n)
		for i := range n {
			results[i] = call("a_send", fmt.Sprintf(`{"text":"%d"}`, i))
		}
		var answered atomic.Int32
		var wg sync.WaitGroup
		for range n {
			ev := a.next(t)
			wg.Go(func() {
				var text struct{ Text string }
				_ = json.Unmarshal(ev.Arguments, &text)
				if ack := respond(t, answerer, a.id, ev.RequestID, fmt.Sprintf(`"result":{"echo":%q}`, text.Text)); !ack.IsError {
					answered.Add(1)
				}
			})
		}
		wg.Wait()
		for i, ch := range results {
			got := wait(ch)
			if b, _ := json.Marshal(got.StructuredContent); string(b) != fmt.Sprintf(`{"echo":"%d"}`, i) {
				t.Errorf("call %d got %s", i, b)
			}
		}
		if answered.Load() != n {
			t.Errorf("%d answers accepted, want %d", answered.Load(), n)
		}
	})
	t.Run("A leaves mid-call: the call ends E_NODE_OFFLINE and the tools go", func(t *testing.T) {
		res := call("a_send", `{"text":"late"}`)
		a.next(t)
		start := time.Now()
		a.stop()
		got := wait(res)
		if e := envelope(t, got); e.Code != schemas.CodeNodeOffline {
			t.Errorf("after A left: %s, want E_NODE_OFFLINE", e.JSON())
		}
		if took := time.Since(start); took > time.Second {
			t.Errorf("the waiting call ended %v after A left", took)
		}
		waitTool(t, second.gw, DefaultTenant, "a_send", false)
		waitTool(t, f.a.gw.gw, DefaultTenant, "a_send", false)
	})
}

// TestRelayLifetimes: a relayed call past --caller-timeout, a second
// listen replacing the first, and a replica that dies holding a listen.
func TestRelayLifetimes(t *testing.T) {
	f := startAllInOne(t, 0, nil)
	mutating := []string{auth.ScopeMutating}
	tokA := f.token(auth.MintOptions{Subject: "agent-a", Scopes: mutating})
	tokB := f.token(auth.MintOptions{Subject: "agent-b", Scopes: mutating})
	envelopeOf := func(res *sdk.CallToolResult, err error) schemas.Error {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return envelope(t, res)
	}
	t.Run("timeout", func(t *testing.T) {
		short := f.secondGateway(gatewayConfig{CallerTimeout: 300 * time.Millisecond})
		a := f.listen(f.a.MCPURL(), tokA, twoTools)
		waitTool(t, short.gw, DefaultTenant, "a_send", true)
		b := f.relayClient(short.url(), tokB, nil)
		start := time.Now()
		e := envelopeOf(b.CallTool(t.Context(), &sdk.CallToolParams{Name: "a_send", Arguments: json.RawMessage(`{"text":"x"}`)}))
		if e.Code != schemas.CodeDeadlineExceeded {
			t.Errorf("unanswered call: %s, want E_DEADLINE_EXCEEDED", e.JSON())
		}
		if took := time.Since(start); took > 3*time.Second {
			t.Errorf("took %v with a 300ms caller timeout", took)
		}
		a.next(t) // it did reach A
		a.stop()
		waitTool(t, f.a.gw.gw, DefaultTenant, "a_send", false)
	})
	t.Run("a second listen replaces the first", func(t *testing.T) {
		first := f.listen(f.a.MCPURL(), tokA, twoTools)
		b := f.relayClient(f.a.MCPURL(), tokB, nil)
		waitTool(t, f.a.gw.gw, DefaultTenant, "a_send", true)
		res := make(chan schemas.Error, 1)
		go func() {
			r, err := b.CallTool(t.Context(), &sdk.CallToolParams{Name: "a_send", Arguments: json.RawMessage(`{"text":"x"}`)})
			if err != nil {
				res <- schemas.Error{Code: err.Error()}
				return
			}
			res <- envelope(t, r)
		}()
		first.next(t)
		second := f.listen(f.a.MCPURL(), tokA, twoTools)
		select {
		case e := <-res:
			if e.Code != schemas.CodeNodeOffline {
				t.Errorf("the first listen's waiting call: %s, want E_NODE_OFFLINE", e.JSON())
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the first listen's waiting call never ended")
		}
		select {
		case <-first.done:
		case <-time.After(10 * time.Second):
			t.Fatal("the first listen never ended")
		}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		gw := f.a.gw.gw
		if err := gw.Wait(ctx, func(map[string]int) bool { return gw.Listens().Of(DefaultTenant, "a") == second.id }); err != nil {
			t.Fatal("the gateway never listed the second listen's tools")
		}
		f.answeredBy(t, b, second, tokA, "second")
		second.stop()
		waitTool(t, f.a.gw.gw, DefaultTenant, "a_send", false)
	})
	t.Run("the replica holding the listen dies", func(t *testing.T) {
		holder := f.secondGateway(gatewayConfig{CallerLeaseTTL: time.Second})
		a := f.listen(holder.url(), tokA, twoTools)
		waitTool(t, f.a.gw.gw, DefaultTenant, "a_send", true)
		b := f.relayClient(f.a.MCPURL(), tokB, nil)
		res := make(chan error, 1)
		go func() {
			r, err := b.CallTool(t.Context(), &sdk.CallToolParams{Name: "a_send", Arguments: json.RawMessage(`{"text":"x"}`)})
			if err == nil && !r.IsError {
				err = errors.New("the call succeeded")
			} else if err == nil {
				if e := envelope(t, r); e.Code != schemas.CodeNodeOffline {
					err = fmt.Errorf("%s, want E_NODE_OFFLINE", e.JSON())
				}
			}
			res <- err
		}()
		a.next(t)
		start := time.Now()
		holder.nc.Close() // as if its process died: no goodbye on NATS
		select {
		case err := <-res:
			if err != nil {
				t.Error(err)
			}
		case <-time.After(15 * time.Second):
			t.Fatal("B's call still waits after the replica holding the listen died")
		}
		t.Logf("B's call ended %v after the holder died (lease 1s)", time.Since(start))
		waitTool(t, f.a.gw.gw, DefaultTenant, "a_send", false)
	})
}

// TestRelayQuotaAndListChanged: a listen is a stream of its tenant's
// quota, and other clients are told when a caller's tools come and go.
func TestRelayQuotaAndListChanged(t *testing.T) {
	f := startAllInOne(t, 0, func(c *AllInOneConfig) { c.Gateway.MaxStreamsPerTenant = 1 })
	mutating := []string{auth.ScopeMutating}
	tokA := f.token(auth.MintOptions{Subject: "agent-a", Scopes: mutating})
	tokB := f.token(auth.MintOptions{Subject: "agent-b", Scopes: mutating})
	second := f.secondGateway(gatewayConfig{Stateful: true})
	watcher, changed := f.listChangedClient(second.url(), tokB, "2025-11-25")
	listed := func(name string) bool {
		lt, err := watcher.ListTools(t.Context(), nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, tl := range lt.Tools {
			if tl.Name == name {
				return true
			}
		}
		return false
	}
	expect := func(what string, want bool) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for listed("a_send") != want {
			select {
			case <-changed:
			case <-deadline:
				t.Fatalf("no tools/list_changed that %s", what)
			}
		}
	}
	a := f.listen(f.a.MCPURL(), tokA, twoTools)
	expect("lists a_send", true)

	t.Run("a second stream of the tenant is over the quota", func(t *testing.T) {
		s := f.relayClient(f.a.MCPURL(), tokB, nil)
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		res, err := s.CallTool(ctx, &sdk.CallToolParams{Name: mcp.ToolCallerListen,
			Arguments: json.RawMessage(`{"caller_id":"b","tools":[{"name":"x","inputSchema":{"type":"object"}}]}`),
			Meta:      sdk.Meta{"progressToken": "b"}})
		if err != nil {
			t.Fatal(err)
		}
		if e := envelope(t, res); e.Code != schemas.CodeRateLimited {
			t.Errorf("a listen over the quota: %s, want E_RATE_LIMITED", e.JSON())
		}
	})
	a.stop()
	expect("a_send went", false)
}

// TestRelayGuards: what the relay refuses so that it stays a security
// boundary: a listen with no channel to reach it, another agent taking a
// caller id, an answer okso cannot carry, a listener whose token was
// revoked.
func TestRelayGuards(t *testing.T) {
	f := startAllInOne(t, 0, func(c *AllInOneConfig) { c.NATSListen = "127.0.0.1:0" })
	mutating := []string{auth.ScopeMutating}
	tokA := f.token(auth.MintOptions{Subject: "agent-a", Scopes: mutating})
	tokB := f.token(auth.MintOptions{Subject: "agent-b", Scopes: mutating})
	tokX := f.token(auth.MintOptions{Subject: "agent-x", Scopes: mutating})
	b := f.relayClient(f.a.MCPURL(), tokB, nil)
	bounded := func(s *sdk.ClientSession, p *sdk.CallToolParams) *sdk.CallToolResult {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second) // an accepted listen would stay open
		defer cancel()
		res, err := s.CallTool(ctx, p)
		if err != nil {
			t.Fatalf("%s: %v", p.Name, err)
		}
		return res
	}

	t.Run("a listen needs a progressToken", func(t *testing.T) {
		res := bounded(b, &sdk.CallToolParams{Name: mcp.ToolCallerListen, Arguments: json.RawMessage(twoTools)})
		if e := envelope(t, res); e.Code != schemas.CodeBadRequest {
			t.Errorf("a listen without a progressToken: %s, want E_BAD_REQUEST", e.JSON())
		}
	})
	a := f.listen(f.a.MCPURL(), tokA, twoTools)
	answerer := f.relayClient(f.a.MCPURL(), tokA, nil)
	waitTool(t, f.a.gw.gw, DefaultTenant, "a_send", true)

	t.Run("another agent cannot take the caller id", func(t *testing.T) {
		x := f.relayClient(f.a.MCPURL(), tokX, nil)
		res := bounded(x, &sdk.CallToolParams{Name: mcp.ToolCallerListen, Arguments: json.RawMessage(twoTools),
			Meta: sdk.Meta{"progressToken": "x"}})
		if e := envelope(t, res); e.Code != schemas.CodeSafetyDenied {
			t.Errorf("agent-x listening as a: %s, want E_SAFETY_DENIED", e.JSON())
		}
		if f.a.gw.gw.Listens().Of(DefaultTenant, "a") != a.id {
			t.Error("agent-x's attempt changed whose tools a_send are")
		}
	})
	t.Run("a request that no gateway sent is dropped", func(t *testing.T) {
		// f.nc is no gateway's connection (its reply subjects are not a
		// gateway's), as JetStream made to publish there would not be.
		body, _ := json.Marshal(bus.Call{Tool: "a_send", Arguments: json.RawMessage(`{"text":"forged"}`)})
		m := nats.NewMsg(bus.CallerReq(a.id))
		m.Data = body
		m.Header.Set(bus.HeaderTenant, DefaultTenant)
		if _, err := f.nc.RequestMsg(m, 300*time.Millisecond); err == nil {
			t.Error("a relayed call with another reply subject than a gateway's was answered")
		}
		// The listener got nothing: the next event it gets is the next
		// real call's.
		out := make(chan *sdk.CallToolResult, 1)
		go func() {
			r, _ := b.CallTool(t.Context(), &sdk.CallToolParams{Name: "a_send", Arguments: json.RawMessage(`{"text":"real"}`)})
			out <- r
		}()
		ev := a.next(t)
		if !strings.Contains(string(ev.Arguments), "real") {
			t.Fatalf("the listener got %s, want the real call", ev.Arguments)
		}
		if ack := respond(t, answerer, a.id, ev.RequestID, `"result":{}`); ack.IsError {
			t.Fatalf("answer: %v", ack.Content)
		}
		<-out
	})
	t.Run("an answer too large for NATS is refused, and the call still waits", func(t *testing.T) {
		out := make(chan *sdk.CallToolResult, 1)
		go func() {
			r, _ := b.CallTool(t.Context(), &sdk.CallToolParams{Name: "a_send", Arguments: json.RawMessage(`{"text":"big"}`)})
			out <- r
		}()
		ev := a.next(t)
		big := `"result":{"blob":"` + strings.Repeat("x", 700<<10) + `"}`
		if e := envelope(t, respond(t, answerer, a.id, ev.RequestID, big)); e.Code != schemas.CodeBadRequest {
			t.Errorf("a 700 KiB answer: %s, want E_BAD_REQUEST", e.JSON())
		}
		if ack := respond(t, answerer, a.id, ev.RequestID, `"result":{"small":true}`); ack.IsError {
			t.Fatalf("the small answer after it: %v", ack.Content)
		}
		if r := <-out; r == nil || r.IsError {
			t.Errorf("the call after a refused answer: %+v", r)
		}
	})
	t.Run("a call its caller gave up is withdrawn from the listener", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = b.CallTool(ctx, &sdk.CallToolParams{Name: "a_send", Arguments: json.RawMessage(`{"text":"never mind"}`)})
		}()
		ev := a.next(t)
		cancel()
		<-done
		if got := a.next(t); got.Type != "caller_tool_cancelled" || got.RequestID != ev.RequestID {
			t.Fatalf("after the caller gave up, the listener got %+v, want caller_tool_cancelled for %s", got, ev.RequestID)
		}
		if e := envelope(t, respond(t, answerer, a.id, ev.RequestID, `"result":{}`)); e.Code != schemas.CodeBadRequest {
			t.Errorf("an answer to a withdrawn call: %s, want E_BAD_REQUEST", e.JSON())
		}
	})
	t.Run("a revoked listener gets no more calls", func(t *testing.T) {
		revokeAt(t, f.a, "--token", tokA)
		eventually(t, "the gateway refuses the revoked token", func() bool { return listStatus(t, f.a.MCPURL(), tokA) == http.StatusUnauthorized })
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		// E_NODE_OFFLINE, or unknown tool (-32602) if the listen already
		// ended on its lease tick.
		if res, err := b.CallTool(ctx, &sdk.CallToolParams{Name: "a_send", Arguments: json.RawMessage(`{"text":"secret"}`)}); err == nil {
			if e := envelope(t, res); e.Code != schemas.CodeNodeOffline {
				t.Errorf("a call to a revoked listener: %s, want E_NODE_OFFLINE", e.JSON())
			}
		} else if ctx.Err() != nil {
			t.Fatal("a call to a revoked listener waited")
		}
		select {
		case ev := <-a.events:
			if ev.Type == "caller_tool_request" {
				t.Errorf("the revoked listener got %+v", ev)
			}
		default:
		}
		waitTool(t, f.a.gw.gw, DefaultTenant, "a_send", false)
	})
}
