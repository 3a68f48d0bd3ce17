package roles

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/internal/bearer"
	"github.com/okso-io/okso/mcp"
	"github.com/okso-io/okso/schemas"
)

// racer is one agent's MCP session, whose listens' caller_tools_ready
// events are told apart by their progress tokens.
type racer struct {
	s     *sdk.ClientSession
	mu    sync.Mutex
	ready map[string]chan relayEvent // by progress token
}

func (f *fixture) racer(url, token string) *racer {
	f.t.Helper()
	r := &racer{ready: map[string]chan relayEvent{}}
	c := sdk.NewClient(&sdk.Implementation{Name: "okso-test", Version: "1"}, &sdk.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *sdk.ProgressNotificationClientRequest) {
			var ev relayEvent
			if json.Unmarshal([]byte(req.Params.Message), &ev) != nil || ev.Type != "caller_tools_ready" {
				return
			}
			tok, _ := req.Params.ProgressToken.(string)
			r.mu.Lock()
			ch := r.ready[tok]
			r.mu.Unlock()
			if ch != nil {
				ch <- ev
			}
		},
	})
	s, err := c.Connect(f.t.Context(), &sdk.StreamableClientTransport{
		Endpoint:   url,
		HTTPClient: &http.Client{Transport: bearer.Transport{Token: token, Base: http.DefaultTransport}},
		MaxRetries: -1,
	}, &sdk.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		f.t.Fatalf("connect MCP client: %v", err)
	}
	f.t.Cleanup(func() { _ = s.Close() })
	r.s = s
	return r
}

// attempt is one listen of a race: it either became ready (and is open
// until stop) or ended with res.
type attempt struct {
	ready *relayEvent
	res   *sdk.CallToolResult
	stop  context.CancelFunc
	done  chan *sdk.CallToolResult
}

// listenAt starts a listen of decl under progress token tok once start
// closes, and returns its outcome: ready, or the call's result.
func (r *racer) listenAt(t *testing.T, start <-chan struct{}, tok, decl string) <-chan *attempt {
	ready := make(chan relayEvent, 1)
	r.mu.Lock()
	r.ready[tok] = ready
	r.mu.Unlock()
	out := make(chan *attempt, 1)
	go func() {
		ctx, stop := context.WithCancel(t.Context())
		a := &attempt{stop: stop, done: make(chan *sdk.CallToolResult, 1)}
		go func() {
			<-start
			res, err := r.s.CallTool(ctx, &sdk.CallToolParams{Name: mcp.ToolCallerListen, Arguments: json.RawMessage(decl),
				Meta: sdk.Meta{"progressToken": tok}})
			if err != nil {
				res = &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{Text: err.Error()}}}
			}
			a.done <- res
		}()
		select {
		case ev := <-ready:
			a.ready = &ev
		case res := <-a.done:
			a.res = res
		case <-time.After(10 * time.Second):
		}
		out <- a
	}()
	return out
}

// TestRelayClaimRace: two agents of one tenant listen with one caller_id
// at the same moment, on two replicas, round after round: one holds it
// and gets caller_tools_ready, the other is refused at once, never both
// open (before the claim, both were in about a quarter of the rounds).
func TestRelayClaimRace(t *testing.T) {
	f := startAllInOne(t, 0, nil)
	second := f.secondGateway(gatewayConfig{})
	mutating := []string{auth.ScopeMutating}
	agents := []*racer{
		f.racer(f.a.MCPURL(), f.token(auth.MintOptions{Subject: "agent-a", Scopes: mutating})),
		f.racer(second.url(), f.token(auth.MintOptions{Subject: "agent-b", Scopes: mutating})),
	}
	const rounds = 100
	var won [2]int
	both, neither := 0, 0
	for i := range rounds {
		callerID := fmt.Sprintf("race%d", i)
		decl := `{"caller_id":"` + callerID + `","tools":[{"name":"x","inputSchema":{"type":"object"}}]}`
		start := make(chan struct{})
		var outs [2]<-chan *attempt
		for j, r := range agents {
			outs[j] = r.listenAt(t, start, fmt.Sprintf("%s-%d", callerID, j), decl)
		}
		close(start)
		var got [2]*attempt
		for j := range got {
			got[j] = <-outs[j]
			if got[j].ready == nil && got[j].res == nil {
				t.Fatalf("round %d: agent %d's listen neither ready nor ended", i, j)
			}
		}
		open := 0
		for j, a := range got {
			if a.ready != nil {
				open++
				won[j]++
				continue
			}
			if e := envelope(t, a.res); e.Code != schemas.CodeSafetyDenied || !strings.Contains(e.Message, "held by another agent") {
				t.Errorf("round %d: agent %d's listen ended with %s, want E_SAFETY_DENIED held by another agent", i, j, e.JSON())
			}
		}
		switch open {
		case 2:
			both++
			t.Errorf("round %d: both agents' listens of %s are open", i, callerID)
		case 0:
			neither++
			t.Errorf("round %d: neither agent holds %s", i, callerID)
		}
		for _, a := range got {
			a.stop()
			if a.ready == nil {
				continue // ended already
			}
			select {
			case <-a.done:
			case <-time.After(10 * time.Second):
				t.Fatalf("round %d: a listen did not end when its client cancelled it", i)
			}
		}
	}
	t.Logf("%d rounds: agent-a (replica 1) held the caller_id in %d, agent-b (replica 2) in %d; both open in %d, neither in %d",
		rounds, won[0], won[1], both, neither)
}

// TestRelayClaimTakeover: an agent's new listen on another replica takes
// its caller_id over from its old one, whose waiting call fails
// E_NODE_OFFLINE at once; the claim in NATS names the new listen.
func TestRelayClaimTakeover(t *testing.T) {
	f := startAllInOne(t, 0, nil)
	second := f.secondGateway(gatewayConfig{})
	mutating := []string{auth.ScopeMutating}
	tokA := f.token(auth.MintOptions{Subject: "agent-a", Scopes: mutating})
	tokB := f.token(auth.MintOptions{Subject: "agent-b", Scopes: mutating})
	callers, err := bus.OpenCallers(t.Context(), f.nc, bus.CallersOptions{BindOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	holder := func() string {
		t.Helper()
		cl, err := callers.ClaimOf(t.Context(), DefaultTenant, "a")
		if err != nil {
			t.Fatal(err)
		}
		if cl == nil {
			return ""
		}
		return cl.ListenID
	}

	first := f.listen(f.a.MCPURL(), tokA, twoTools)
	if h := holder(); h != first.id {
		t.Fatalf("the claim names listen %q, want the first %s", h, first.id)
	}
	b := f.relayClient(second.url(), tokB, nil)
	waitTool(t, second.gw, DefaultTenant, "a_send", true)
	res := make(chan schemas.Error, 1)
	go func() {
		r, err := b.CallTool(t.Context(), &sdk.CallToolParams{Name: "a_send", Arguments: json.RawMessage(`{"text":"x"}`)})
		if err != nil {
			res <- schemas.Error{Code: err.Error()}
			return
		}
		res <- envelope(t, r)
	}()
	first.next(t) // the call waits on the first listen

	next := f.listen(second.url(), tokA, twoTools)
	select {
	case e := <-res: // E_NODE_OFFLINE, not the 60 s E_DEADLINE_EXCEEDED of --caller-timeout
		if e.Code != schemas.CodeNodeOffline {
			t.Errorf("the first listen's waiting call: %s, want E_NODE_OFFLINE", e.JSON())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the first listen's waiting call never ended")
	}
	select {
	case r := <-first.done:
		if b, _ := json.Marshal(r.StructuredContent); !strings.Contains(string(b), "replaced") {
			t.Errorf("the first listen ended with %s, want replaced", b)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the first listen never ended")
	}
	if h := holder(); h != next.id {
		t.Errorf("the claim names listen %q, want the new %s", h, next.id)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for _, gw := range []*mcp.Gateway{f.a.gw.gw, second.gw} {
		if err := gw.Wait(ctx, func(map[string]int) bool { return gw.Listens().Of(DefaultTenant, "a") == next.id }); err != nil {
			t.Fatal("a gateway never listed the new listen's tools")
		}
	}
	f.answeredBy(t, b, next, tokA, "next")

	// Its end releases the claim: another agent may take the id.
	gone := claimGone(t, f, "a")
	next.stop()
	<-next.done
	gone()
	if h := holder(); h != "" {
		t.Errorf("the claim names listen %q after its listen ended", h)
	}
	f.listen(second.url(), tokB, twoTools)
}

// claimGone returns a function that waits until the claim of a caller id
// of the default tenant goes (released, or lapsed), as every follower of
// okso_callers sees it.
func claimGone(t *testing.T, f *fixture, callerID string) func() {
	t.Helper()
	sub, err := f.nc.SubscribeSync("okso.v1.state." + bus.BucketCallers + "." + bus.ClaimKey(DefaultTenant, callerID))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := f.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return func() {
		t.Helper()
		for {
			m, err := sub.NextMsg(15 * time.Second)
			if err != nil {
				t.Fatalf("the claim of %s never went: %v", callerID, err)
			}
			if m.Header.Get("Nats-Marker-Reason") != "" || m.Header.Get("KV-Operation") != "" {
				return
			}
		}
	}
}

// TestRelayClaimLapse: the claim of a listen whose replica died stays
// (another agent is refused the caller_id) until its lease lapses, and
// no longer.
func TestRelayClaimLapse(t *testing.T) {
	f := startAllInOne(t, 0, nil)
	// A lease long enough that agent-x's first try, right after the
	// crash, comes well within it.
	holder := f.secondGateway(gatewayConfig{CallerLeaseTTL: 8 * time.Second})
	mutating := []string{auth.ScopeMutating}
	tokA := f.token(auth.MintOptions{Subject: "agent-a", Scopes: mutating})
	tokX := f.token(auth.MintOptions{Subject: "agent-x", Scopes: mutating})
	lapsed := claimGone(t, f, "a")
	f.listen(holder.url(), tokA, twoTools)
	waitTool(t, f.a.gw.gw, DefaultTenant, "a_send", true)
	holder.nc.Close() // as if its process died: no goodbye on NATS

	x := f.relayClient(f.a.MCPURL(), tokX, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	res, err := x.CallTool(ctx, &sdk.CallToolParams{Name: mcp.ToolCallerListen, Arguments: json.RawMessage(twoTools),
		Meta: sdk.Meta{"progressToken": "x"}})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	if e := envelope(t, res); e.Code != schemas.CodeSafetyDenied {
		t.Errorf("agent-x listening as a while the dead replica's claim lasts: %s, want E_SAFETY_DENIED", e.JSON())
	}

	lapsed() // the claim's expiry, as every follower of okso_callers sees it
	f.listen(f.a.MCPURL(), tokX, twoTools)
}
